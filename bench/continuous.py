"""Continuous mode: does the pipeline keep up with live data, and does gold stay fresh?

    python bench/continuous.py [--rate 2000] [--minutes 10] [--interval 5] [--root DIR]

Starts, on a fresh lake, ``lakehouse generate --follow`` (``--rate`` events per second with
current event times, a file per source every ``--interval`` seconds) and ``lakehouse run
--layer all --trigger continuous`` (every layer's flows together, a micro-batch every
``trigger.interval``, 5 seconds), both as separate processes. Every 30 seconds it reads, from
the Delta logs only (row counts and column maxima of the files' statistics, no table scan):

- bronze rows and the rows/s since the last sample (bursty: a micro-batch lands at once);
- lag of bronze.events and silver.events: now minus their latest event time;
- gold freshness: now minus the start of the newest 5-minute window in gold.user_activity_5m
  (update mode: a window's row is written from its first micro-batch on, so this saws between
  0 and 5 minutes plus the pipeline's lag), and now minus the end of the latest closed session
  of gold.sessions (append mode: a session closes once the 10-minute watermark passes its end,
  15 minutes after its last event, so the first one appears after about 25 minutes of run).

Prints one line per sample and a summary: whether bronze kept up (its rows/s over the second
half against the generated rate) and whether gold freshness (of the 5-minute table) stayed
bounded: its maximum over the second half no more than a minute above the first half's. Exit 1
when either fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from lakehouse.settings import load_settings  # noqa: E402
from lakehouse.storage import deltafiles as dfiles  # noqa: E402

SAMPLE_S = 30


def _stats(settings, table: str, column: str) -> tuple[int, pd.Timestamp | None]:
    """(rows, max of ``column``) of a table from its log's file statistics."""
    path = settings.table_path(table)
    if not dfiles.is_delta_table(path):
        return 0, None
    actions = pa.table(dfiles.open_table(path).get_add_actions(flatten=True)).to_pandas()
    if actions.empty:
        return 0, None
    rows = int(actions["num_records"].sum())
    maxima = actions.get(f"max.{column}")
    if maxima is None or maxima.isna().all():
        return rows, None
    latest = pd.Timestamp(maxima.max())
    return rows, latest.tz_convert(None) if latest.tzinfo else latest


def _age(now: pd.Timestamp, latest: pd.Timestamp | None) -> float | None:
    return None if latest is None else (now - latest).total_seconds()


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.0f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds per landing file")
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        help="a settings override for both processes, KEY=VALUE (repeatable), e.g. "
        "spark_conf.spark.python.authenticate.socketTimeout=60s",
    )
    args = parser.parse_args(argv)

    root = Path(args.root) / "continuous"
    shutil.rmtree(root, ignore_errors=True)
    settings = load_settings("local", overrides={"root": str(root)})
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    common = ["--root", str(root), "--profile", "local"]
    for override in args.conf:
        common += ["--conf", override]
    logs = root / "logs"
    logs.mkdir(parents=True)
    generator = subprocess.Popen(
        [lakehouse, "generate", *common, "--follow", "--rate", str(args.rate)]
        + ["--interval", str(args.interval)],
        stdout=open(logs / "generate.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    time.sleep(args.interval * 2)  # the first files, so every flow has its input
    pipeline = subprocess.Popen(
        [lakehouse, "run", *common, "--layer", "all", "--trigger", "continuous"],
        stdout=open(logs / "run.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    samples = []
    started = time.monotonic()
    previous = (started, 0)
    print(
        f"{'t s':>6} {'bronze rows':>12} {'rows/s':>8} {'bronze lag s':>13} {'silver lag s':>13}"
        f" {'gold 5m fresh s':>16} {'sessions fresh s':>17}",
        flush=True,
    )
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(SAMPLE_S)
            if pipeline.poll() is not None or generator.poll() is not None:
                print("a process ended early: see", logs, file=sys.stderr)
                return 1
            now = pd.Timestamp.now(tz="UTC").tz_localize(None)
            rows, bronze_latest = _stats(settings, "bronze.events", "event_time")
            _, silver_latest = _stats(settings, "silver.events", "event_time")
            _, session_end = _stats(settings, "gold.sessions", "session_end")
            _, window_start = _stats(settings, "gold.user_activity_5m", "window_start")
            t = time.monotonic()
            rate = (rows - previous[1]) / (t - previous[0])
            previous = (t, rows)
            sample = {
                "t": t - started,
                "rows": rows,
                "rate": rate,
                "bronze_lag": _age(now, bronze_latest),
                "silver_lag": _age(now, silver_latest),
                "sessions_fresh": _age(now, session_end),
                "fresh_5m": _age(now, window_start),
            }
            samples.append(sample)
            print(
                f"{sample['t']:>6.0f} {rows:>12,} {rate:>8,.0f} {_fmt(sample['bronze_lag']):>13}"
                f" {_fmt(sample['silver_lag']):>13} {_fmt(sample['fresh_5m']):>16}"
                f" {_fmt(sample['sessions_fresh']):>17}",
                flush=True,
            )
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

    if len(samples) < 2:
        print("fewer than 2 samples: run for a minute or more", file=sys.stderr)
        return 1
    half = len(samples) // 2
    first, second = samples[:half], samples[half:]
    # micro-batches land in bursts: the rate over the whole second half, not a median of samples
    kept_rate = (second[-1]["rows"] - first[-1]["rows"]) / (second[-1]["t"] - first[-1]["t"])
    # events land with lines for duplicates and faults: about 1.03 lines per event
    keeps_up = kept_rate >= 0.95 * args.rate
    fresh = [s["fresh_5m"] for s in second if s["fresh_5m"] is not None]
    fresh_before = [s["fresh_5m"] for s in first if s["fresh_5m"] is not None]
    bounded = bool(fresh) and (not fresh_before or max(fresh) <= max(fresh_before) + 60)
    print(
        f"bronze rows/s over the second half: {kept_rate:,.0f} for {args.rate:,.0f} "
        f"events/s generated: {'keeps up' if keeps_up else 'FALLS BEHIND'}"
    )
    print(
        "gold.user_activity_5m freshness (s), max over the first / second half: "
        f"{_fmt(max(fresh_before) if fresh_before else None)} / "
        f"{_fmt(max(fresh) if fresh else None)}: {'bounded' if bounded else 'NOT BOUNDED'}"
    )
    return 0 if keeps_up and bounded else 1


if __name__ == "__main__":
    sys.exit(main())
