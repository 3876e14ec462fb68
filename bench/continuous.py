"""Continuous mode: does the pipeline keep up with live data, and does gold stay fresh?

    python bench/continuous.py [--rate 2000] [--minutes 10] [--interval 5] [--runs 1]
                               [--source files|kafka] [--root DIR] [--conf KEY=VALUE ...]
                               [--output bench/RESULTS.md]

With ``--source kafka`` the generator produces to Kafka topics instead of writing landing
files, and bronze reads them (``bronze.source = "kafka"``): a broker of its own is started
first (``lakehouse kafka start``, under the run's root, on a free port) and stopped at the end.

Starts, on a fresh lake, ``lakehouse generate --follow`` (``--rate`` events per second with
current event times, a file per source every ``--interval`` seconds) and ``lakehouse run
--layer all --trigger continuous`` (every layer's flows together, a micro-batch every
``trigger.interval``, 5 seconds), both as separate processes. Every 30 seconds it reads, from
the Delta logs (row counts and column maxima of the files' statistics, no table scan), the
generator's manifest and ops.stream_progress:

- bronze rows, the rows/s since the last sample (bursty: a micro-batch lands at once) and the
  backlog: rows the landed files hold for bronze.events that it does not have yet;
- lag of bronze.events and silver.events: now minus their latest event time;
- gold freshness, as the issue defines it: now minus the end of the latest closed window of
  gold.user_activity_5m. A window is closed once the flow's watermark (latest event time minus
  10 minutes) passes its end, so this saws between about 10 and 15 minutes plus the pipeline's
  lag. Also shown: gold lag, now minus the flow's latest event time (its watermark plus the
  10 minutes), which is the same figure without the 5-minute sawtooth; now minus the start of
  the newest window in the table (written from its first micro-batch on, update mode), and now
  minus the end of the latest closed session of gold.sessions (the first appears after about
  25 minutes of run).

Prints one line per sample and a summary per run: whether bronze kept up (its rows/s, at
least 95% of the generated rate, as the least-squares slope of its rows over the second half's
samples: bronze reads in bursts, so the rate between two samples would measure where they fall
in a burst as much as the rate) and whether gold freshness stayed bounded: every sample at most
the floor the design sets (the events watermark plus the 5-minute window) plus ``--lag-allowance``
seconds (300: 1,200 s with the default settings), and a closed window in the second half. A
comparison of the two halves' maxima is no test: the first closed window appears partway
through the first half, which then holds less than one 5-minute sawtooth, so its maximum is
low by up to 5 minutes while nothing grows. The halves' maxima of freshness and gold lag are
printed for the reader to see a trend. With ``--runs`` above 1, a table of the runs and their
medians. Writes the "Continuous mode" section of ``--output`` (the runs, and the samples of the
last run). Exit 1 when a run failed either test.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from results import log_stats, machine, write_section  # noqa: E402

from lakehouse.ops.status import read_table  # noqa: E402
from lakehouse.settings import duration_seconds, load_settings  # noqa: E402
from lakehouse.tools import kafka  # noqa: E402
from lakehouse.tools.generate import MANIFEST  # noqa: E402
from lakehouse.tools.processes import free_port  # noqa: E402

SAMPLE_S = 30
FIRST_FILES_S = 600


def _age(now: pd.Timestamp, latest: pd.Timestamp | None) -> float | None:
    return None if latest is None else (now - latest).total_seconds()


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.0f}"


WINDOW = pd.Timedelta(minutes=5)  # gold.user_activity_5m's window


def _gold_watermark(settings) -> pd.Timestamp | None:
    """The watermark of gold.user_activity_5m's flow, from ops.stream_progress (naive UTC).
    The latest closed window ends at this watermark rounded down to 5 minutes."""
    progress = read_table(settings, "ops.stream_progress")
    if progress.empty:
        return None
    marks = progress.loc[progress["flow"] == "gold.user_activity_5m", "watermark"].dropna()
    marks = marks[marks > pd.Timestamp("2000-01-01", tz="UTC")]  # 0 until the first data
    if marks.empty:
        return None
    return marks.max().tz_convert(None)


def _landed_bronze_rows(root: Path) -> int:
    """Rows the landed files hold for bronze.events, from the generator's manifest."""
    manifest = root / "landing" / MANIFEST
    if not manifest.exists():
        return 0
    return int(json.loads(manifest.read_text())["totals"]["events"]["bronze_rows"])


def run_once(args, root: Path) -> dict:
    """One run: the samples and the summary."""
    shutil.rmtree(root, ignore_errors=True)
    settings = load_settings("local", overrides={"root": str(root)})
    delay = pd.Timedelta(seconds=duration_seconds(settings.watermarks.events))
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    common = ["--root", str(root), "--profile", "local"]
    for override in args.conf:
        common += ["--conf", override]
    logs = root / "logs"
    logs.mkdir(parents=True)
    broker = None
    produce = []
    if args.source == "kafka":
        broker = kafka.Broker(root / "kafka", free_port())
        kafka.start(broker)
        common += ["--conf", f"kafka.bootstrap_servers={broker.bootstrap}"]
        common += ["--conf", "bronze.source=kafka"]
        produce = ["--sink", "kafka"]
    generator = subprocess.Popen(
        [lakehouse, "generate", *common, *produce, "--follow", "--rate", str(args.rate)]
        + ["--interval", str(args.interval)],
        stdout=open(logs / "generate.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # the first files, so every flow has its input: the generator builds the 2 hours of
    # sessions before its start first (a minute or more at 2,000 events/s)
    waited = time.monotonic()
    while _landed_bronze_rows(root) == 0:
        if generator.poll() is not None or time.monotonic() - waited > FIRST_FILES_S:
            raise SystemExit(f"the generator wrote nothing in {FIRST_FILES_S} s: see {logs}")
        time.sleep(1)
    print(f"the generator's first records after {time.monotonic() - waited:.0f} s", flush=True)
    pipeline = subprocess.Popen(
        [lakehouse, "run", *common, "--layer", "all", "--trigger", "continuous"],
        stdout=open(logs / "run.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    samples = []
    started = time.monotonic()
    previous = (started, 0)
    print(" ".join(f"{title:>{width}}" for title, width in COLUMNS), flush=True)
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(SAMPLE_S)
            if pipeline.poll() is not None or generator.poll() is not None:
                raise SystemExit(f"a process ended early: see {logs}")
            now = pd.Timestamp.now(tz="UTC").tz_localize(None)
            landed = _landed_bronze_rows(root)
            rows, bronze_latest = log_stats(settings, "bronze.events", "event_time")
            _, silver_latest = log_stats(settings, "silver.events", "event_time")
            _, session_end = log_stats(settings, "gold.sessions", "session_end")
            _, window_start = log_stats(settings, "gold.user_activity_5m", "window_start")
            watermark = _gold_watermark(settings)
            t = time.monotonic()
            rate = (rows - previous[1]) / (t - previous[0])
            previous = (t, rows)
            sample = {
                "t": t - started,
                "rows": rows,
                "rate": rate,
                "backlog": max(0, landed - rows),
                "bronze_lag": _age(now, bronze_latest),
                "silver_lag": _age(now, silver_latest),
                "fresh_closed": _age(now, None if watermark is None else watermark.floor(WINDOW)),
                "gold_lag": _age(now, None if watermark is None else watermark + delay),
                "fresh_5m": _age(now, window_start),
                "sessions_fresh": _age(now, session_end),
            }
            samples.append(sample)
            print(_sample_line(sample), flush=True)
    finally:
        # Ctrl-C to the command itself (not its JVM): the queries stop after their micro-batch
        # and the generator writes its last file; whatever is left after 2 minutes is killed
        for process in (pipeline, generator):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in (pipeline, generator):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=120)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if broker is not None:
            kafka.stop(broker)

    if len(samples) < 2:
        raise SystemExit("fewer than 2 samples: run for a minute or more")
    half = len(samples) // 2
    first, second = samples[:half], samples[half:]
    # Bronze takes the landed files in bursts, its backlog swinging by up to 250,000 rows (two
    # minutes of data): a rate between two samples moves by that much with where they fall in
    # the swing, and with a bronze interval as long as the sampling every sample falls at the
    # same point of a burst. The least-squares slope of bronze's rows over every sample of the
    # second half is the rate it keeps, whatever the phase of the bursts.
    kept_rate = _slope([s["t"] for s in second], [s["rows"] for s in second])
    start, end = second[0], second[-1]

    def peak(part: list[dict], key: str) -> float | None:
        values = [s[key] for s in part if s[key] is not None]
        return max(values) if values else None

    fresh = (peak(first, "fresh_closed"), peak(second, "fresh_closed"))
    # The design's floor: a window closes once the watermark, 10 minutes behind the newest
    # event, passes its end, up to 5 minutes after the newest event left it
    limit = (delay + WINDOW).total_seconds() + args.lag_allowance
    summary = {
        "rate": kept_rate,
        "span": (start["t"], end["t"]),
        "keeps_up": kept_rate >= 0.95 * args.rate,
        "backlog": (peak(first, "backlog"), peak(second, "backlog")),
        "bronze_lag": (peak(first, "bronze_lag"), peak(second, "bronze_lag")),
        "gold_lag": (peak(first, "gold_lag"), peak(second, "gold_lag")),
        "fresh": fresh,
        "limit": limit,
        "bounded": fresh[1] is not None and max(v for v in fresh if v is not None) <= limit,
    }
    print(
        f"bronze rows/s from t={start['t']:.0f} s to t={end['t']:.0f} s (the least-squares "
        f"slope of its rows over the second half's samples): "
        f"{kept_rate:,.0f} for {args.rate:,.0f} events/s generated: "
        f"{'keeps up' if summary['keeps_up'] else 'FALLS BEHIND'}"
    )
    print(
        "gold.user_activity_5m closed-window freshness (s), max over the first / second half: "
        f"{_pair(fresh)} (gold lag {_pair(summary['gold_lag'])}), limit {limit:,.0f}: "
        f"{'bounded' if summary['bounded'] else 'NOT BOUNDED'}",
        flush=True,
    )
    return {"samples": samples, **summary}


COLUMNS = [
    ("t s", 6),
    ("bronze rows", 12),
    ("rows/s", 8),
    ("backlog", 8),
    ("bronze lag s", 13),
    ("silver lag s", 13),
    ("gold closed fresh s", 20),
    ("gold lag s", 11),
    ("newest 5m s", 12),
    ("sessions fresh s", 17),
]


def _sample_values(s: dict) -> list[str]:
    return [
        f"{s['t']:.0f}",
        f"{s['rows']:,}",
        f"{s['rate']:,.0f}",
        f"{s['backlog']:,}",
        *(_fmt(s[k]) for k in ("bronze_lag", "silver_lag", "fresh_closed", "gold_lag")),
        _fmt(s["fresh_5m"]),
        _fmt(s["sessions_fresh"]),
    ]


def _slope(x: list[float], y: list[float]) -> float:
    """The least-squares slope of ``y`` over ``x``."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum(
        (a - mx) ** 2 for a in x
    )


def _sample_line(s: dict) -> str:
    return " ".join(
        f"{v:>{width}}" for v, (_, width) in zip(_sample_values(s), COLUMNS, strict=True)
    )


def _pair(values: tuple) -> str:
    return " / ".join(_fmt(v) for v in values)


def _median(values) -> float | None:
    """The median of the values a run has (a run can end before gold's first window closes)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def section(args, argv: list[str], runs: list[dict]) -> list[str]:
    """The "Continuous mode" section of bench/RESULTS.md."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"`{' '.join(['python bench/continuous.py', *argv])}` on {when}.",
        "",
        f"Machine: {machine()}.",
        "",
        f"`generate --follow{' --sink kafka' if args.source == 'kafka' else ''}` "
        f"({args.rate:,.0f} events/s) and `run --layer all --trigger "
        "continuous` (every flow in one driver) side by side, "
        f"{args.minutes:g} minutes per run, a sample every {SAMPLE_S} s. Pairs are the maxima "
        "over the first / second half of a run. Keeps up: bronze rows/s (the least-squares "
        "slope of its rows over the second half) at least 95% of the generated rate. "
        "Bounded: every freshness sample at most "
        f"{runs[0]['limit']:,.0f} s (the events watermark, the 5-minute window and "
        f"{args.lag_allowance:,.0f} s of lag). Gold lag: now minus the newest event time gold "
        "has seen (freshness without the 5-minute sawtooth).",
        "",
        "| run | bronze rows/s (from / to t s) | backlog rows | bronze lag s "
        "| gold closed-window freshness s | gold lag s | keeps up | bounded |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for i, r in enumerate(runs, start=1):
        lines.append(
            f"| {i} | {r['rate']:,.0f} ({r['span'][0]:.0f} / {r['span'][1]:.0f}) | "
            f"{_pair(r['backlog'])} | {_pair(r['bronze_lag'])} | "
            f"{_pair(r['fresh'])} | {_pair(r['gold_lag'])} | "
            f"{'yes' if r['keeps_up'] else 'no'} | {'yes' if r['bounded'] else 'no'} |"
        )
    if len(runs) > 1:
        lines.append(
            f"| median | {statistics.median(r['rate'] for r in runs):,.0f} | | | "
            f"{_fmt(_median(r['fresh'][1] for r in runs))} (second half) | "
            f"{_fmt(_median(r['gold_lag'][1] for r in runs))} (second half) | | |"
        )
    lines += [
        "",
        f"Samples of run {len(runs)}:",
        "",
        "| " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|" + "---:|" * len(COLUMNS),
    ]
    for s in runs[-1]["samples"]:
        lines.append("| " + " | ".join(_sample_values(s)) + " |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds per landing file")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--source",
        choices=["files", "kafka"],
        default="files",
        help="what bronze reads: landing files, or Kafka topics on a broker the bench starts",
    )
    parser.add_argument(
        "--lag-allowance",
        type=float,
        default=300.0,
        help="seconds of pipeline lag gold freshness may add to the design's floor (the events "
        "watermark plus the 5-minute window) and still count as bounded",
    )
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        help="a settings override for both processes, KEY=VALUE (repeatable), e.g. "
        "spark_conf.spark.python.authenticate.socketTimeout=60s",
    )
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"), help="'' to not write")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}", flush=True)
        runs.append(run_once(args, Path(args.root) / "continuous"))
    if args.output:
        title = "Continuous mode" + (" from Kafka" if args.source == "kafka" else "")
        write_section(Path(args.output), title, section(args, argv, runs))
        print(f"written to {args.output}")
    return 0 if all(r["keeps_up"] and r["bounded"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
