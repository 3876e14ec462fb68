"""The benchmark suite: each layer, each gold flow and the whole pipeline against batch floors.

    python bench/run.py [--events 1000000] [--runs 3] [--root DIR] [--units a,b,...]
                        [--scaling 100000,1000000,3000000] [--event-log DIR]
                        [--output bench/RESULTS.md]      (or: make bench)

Generates the landing files once and builds a base lake (bronze and silver) once, both kept
under ``--root`` for the next run. Then, ``--runs`` rounds, each unit in its own fresh process
on a fresh lake (inputs linked read-only from the base) in available-now mode:

- ``bronze``, ``silver``, ``gold``: one layer on the base's input; ``gold.<flow>``: one gold
  flow alone; ``pipeline``: ``run --layer all`` from the landing files;
- ``floor.bronze``, ``floor.silver``, ``floor.gold``: the *contract floors*, hand-written
  batch jobs that write the same tables by the same contract (bench/floors.py): what the
  layer costs without streaming;
- ``raw.bronze``, ``raw.silver``, ``raw.gold``: the *raw floors*, the parse and storage limit
  (the landing JSON into Parquet with the explicit schemas; bronze deduplicated; the gold
  aggregations), with no quarantine, rules or exactly-once books.

Per unit it prints and writes to ``--output`` (medians of the rounds): input rows, wall seconds
of the work (the JVM start and the Spark session are not counted; they are the same few seconds
for every unit), CPU seconds of the work (the Python driver, the JVM and the Python workers),
rows/s, peak state rows (the largest total over one micro-batch, summed over the unit's flows),
peak memory of the whole process tree (the sum of the processes' PSS, so pages the forked
workers share count once), and the ratio to its reference: reference seconds / unit seconds
(1.0 = as fast as the reference). References: each layer its contract floor, the pipeline the
sum of the three, gold.sessions_custom gold.sessions; ``raw ratio`` the same against the raw
floors.

``--scaling N,M,...``: the whole pipeline alone at each size (median of ``--runs``): seconds and
microseconds per event. ``--event-log DIR``: Spark's event log of every unit run, one folder
per unit and round, for ``bench/eventlog.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
sys.path.insert(0, str(PROJECT))

from results import log_stats, machine, write_head, write_section  # noqa: E402

from lakehouse.settings import load_settings  # noqa: E402

MARK = "BENCH-RESULT "
LAYERS = ("bronze", "silver", "gold")
REFERENCES = {
    **{layer: f"floor.{layer}" for layer in LAYERS},
    "gold.sessions_custom": "gold.sessions",
    "pipeline": tuple(f"floor.{layer}" for layer in LAYERS),
}
RAW_REFERENCES = {
    **{layer: f"raw.{layer}" for layer in LAYERS},
    "pipeline": tuple(f"raw.{layer}" for layer in LAYERS),
}


def gold_flow_names() -> list[str]:
    from lakehouse.runner import pipeline

    return [f.name for f in pipeline().layer("gold")]


def all_units() -> list[str]:
    units = []
    for layer in LAYERS:
        units += [f"raw.{layer}", f"floor.{layer}", layer]
    return [*units, *gold_flow_names(), "pipeline"]


# ---- child: one unit in its own process -----------------------------------------------------


def _settings(root: Path, event_log: str | None = None):
    overrides: dict[str, str] = {"root": str(root)}
    if event_log:
        Path(event_log).mkdir(parents=True, exist_ok=True)
        overrides["spark_conf.spark.eventLog.enabled"] = "true"
        overrides["spark_conf.spark.eventLog.dir"] = Path(event_log).absolute().as_uri()
        overrides["spark_conf.spark.eventLog.compress"] = "false"  # bench/eventlog.py reads it
    return load_settings("local", overrides=overrides)


def _link(base: Path, work: Path, *relative: str) -> None:
    for rel in relative:
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(base / rel, target_is_directory=True)


def _layer(unit: str) -> str:
    """The layer whose input a unit reads (the pipeline reads the landing files, as bronze)."""
    name = unit.split(".")[-1] if unit.startswith(("floor.", "raw.")) else unit.split(".")[0]
    return "bronze" if name == "pipeline" else name


def input_rows(unit: str, base) -> int:
    """The rows a unit reads, each input counted once: landing lines for bronze (and the
    pipeline), bronze rows for silver, silver rows for gold, a gold flow's own input."""
    from lakehouse.runner import pipeline
    from lakehouse.tools.generate import MANIFEST

    layer = _layer(unit)
    if layer == "bronze":
        totals = json.loads((base.landing_path() / MANIFEST).read_text())["totals"]
        return sum(t["lines"] for t in totals.values())
    if layer == "silver":
        return sum(log_stats(base, f"bronze.{s}")[0] for s in ("events", "impressions", "clicks"))
    if unit in ("gold", "floor.gold", "raw.gold"):
        return sum(log_stats(base, t)[0] for t in ("silver.events", "silver.ad_attribution"))
    flow = pipeline().flow(unit)
    return sum(log_stats(base, i.table)[0] for i in flow.inputs)


def _peak_state_rows(settings) -> int:
    from lakehouse.ops.status import read_table

    progress = read_table(settings, "ops.stream_progress")
    if progress.empty or progress["state_rows"].isna().all():
        return 0
    per_batch = progress.groupby(["flow", "batch_id"])["state_rows"].sum()
    return int(per_batch.groupby(level="flow").max().sum())


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds of a process and its descendants so far, with those of the descendants
    that ended and were waited for (the Python workers, forked by the JVM's daemon)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0, [pid or os.getpid()]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo.extend(int(c) for c in children.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / ticks


def prepare(root: Path, events: int) -> None:
    """Landing files for ``events`` and the base lake (bronze + silver), unless already there."""
    from lakehouse.runner import run_layers
    from lakehouse.session import build_session
    from lakehouse.tools import generate as gen

    base = root / "base"
    ready = base / ".ready"
    if ready.exists() and ready.read_text() == str(events):
        return
    shutil.rmtree(root, ignore_errors=True)
    settings = _settings(base)
    spark = build_session(settings, app_name="bench-prepare")
    print(f"generating {events:,} events and building bronze and silver once ...", flush=True)
    gen.generate(spark, base, gen.params_from_settings(settings, events=events))
    with open(os.devnull, "w") as quiet:
        run_layers(spark, settings, ["bronze", "silver"], out=quiet)
    ready.write_text(str(events))
    spark.stop()


def child(unit: str, root: Path, work: Path, event_log: str | None) -> dict:
    import floors

    from lakehouse.runner import pipeline, run_flows, run_layers
    from lakehouse.session import build_session

    base = root / "base"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings, base_settings = _settings(work, event_log), _settings(base)
    layer = _layer(unit)
    if layer == "bronze":
        _link(base, work, "landing")
    elif layer == "silver":
        _link(base, work, "tables/bronze")
    else:
        _link(base, work, "tables/silver")
    spark = build_session(settings, app_name=f"bench-{unit}")
    quiet = open(os.devnull, "w")  # noqa: SIM115 (progress events may arrive after a run)
    cpu, started = tree_cpu_seconds(), time.perf_counter()
    state_rows = 0
    if unit.startswith("floor."):
        floors.CONTRACT[layer](spark, base_settings, work)
    elif unit.startswith("raw."):
        floors.raw(spark, base_settings, work, layer)
    else:
        if unit in (*LAYERS, "pipeline"):
            reports = run_layers(
                spark, settings, LAYERS if unit == "pipeline" else [unit], out=quiet
            )
        else:
            flow = pipeline().flow(unit)
            reports = run_flows(spark, settings, [flow], out=quiet)
        assert all(r.error is None for r in reports), reports
    seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
    if not unit.startswith(("floor.", "raw.")):
        state_rows = _peak_state_rows(settings)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "input_rows": input_rows(unit, base_settings),
        "state_rows": state_rows,
    }


# ---- parent: rounds, process-tree memory, the table ------------------------------------------


def _tree_pss_kb(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            # PSS: pages shared between the forked Python workers are counted once
            with open(f"/proc/{current}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo.extend(int(c) for c in children.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_unit(unit: str, root: Path, event_log: str | None = None) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", unit, "--root", str(root)]
    if event_log:
        command += ["--event-log", event_log]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_pss_kb(process.pid))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    sampler.join()
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"bench unit {unit} failed:\n{stderr[-4000:]}")
    result = json.loads(lines[-1][len(MARK) :])
    result["rss_mb"] = peak[0] / 1024
    return result


def _reference_seconds(medians: dict[str, dict], ref) -> float | None:
    refs = ref if isinstance(ref, tuple) else (ref,)
    if ref is None or not all(r in medians for r in refs):
        return None
    return sum(medians[r]["seconds"] for r in refs)


def table(units: list[str], medians: dict[str, dict]) -> list[str]:
    header = (
        "| unit | input rows | wall s | CPU s | rows/s | peak state rows | peak memory MiB "
        "| reference | ratio | raw ratio |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for unit in units:
        m = medians[unit]
        ref = REFERENCES.get(unit)
        ref_s = _reference_seconds(medians, ref)
        raw_s = _reference_seconds(medians, RAW_REFERENCES.get(unit))
        ref_name = " + ".join(ref) if isinstance(ref, tuple) else (ref or "")
        ratio = "" if ref_s is None else f"{ref_s / m['seconds']:.2f}"
        raw_ratio = "" if raw_s is None else f"{raw_s / m['seconds']:.2f}"
        lines.append(
            f"| {unit} | {m['input_rows']:,} | {m['seconds']:.1f} | {m['cpu_seconds']:.1f} | "
            f"{m['input_rows'] / m['seconds']:,.0f} | {m['state_rows']:,} | {m['rss_mb']:,.0f} | "
            f"{ref_name} | {ratio} | {raw_ratio} |"
        )
    return lines


def rounds(units, root: Path, runs: int, event_log: str | None, label: str = "") -> dict:
    """``runs`` rounds of ``units`` interleaved (a noisy minute hurts every unit alike); the
    medians per unit, and the failures. A unit that fails (on a loaded machine a Python worker
    can miss Spark's connect-back timeout) is tried once more, then counted as failed."""
    results: dict[str, list[dict]] = {unit: [] for unit in units}
    failures: dict[str, int] = {unit: 0 for unit in units}
    for round_ in range(runs):
        for unit in units:
            log = str(Path(event_log) / f"{unit}-{round_ + 1}") if event_log else None
            for attempt in (1, 2):
                try:
                    result = run_unit(unit, root, log)
                    break
                except RuntimeError as exc:
                    failures[unit] += 1
                    print(
                        f"round {round_ + 1}/{runs} {label}{unit}: FAILED (attempt {attempt}): "
                        f"{str(exc).strip().splitlines()[-1]}",
                        flush=True,
                    )
            else:
                continue
            results[unit].append(result)
            print(
                f"round {round_ + 1}/{runs} {label}{unit}: {result['seconds']:.1f} s, "
                f"CPU {result['cpu_seconds']:.1f} s, {result['input_rows']:,} rows, "
                f"peak memory {result['rss_mb']:,.0f} MiB",
                flush=True,
            )
    medians = {
        unit: {key: statistics.median(r[key] for r in runs_) for key in runs_[0]}
        for unit, runs_ in results.items()
        if runs_
    }
    for unit, runs_ in results.items():
        if runs_:
            medians[unit]["all_seconds"] = [r["seconds"] for r in runs_]
    return {"medians": medians, "failures": {u: n for u, n in failures.items() if n}}


def _prepared(args, events: int) -> Path:
    root = Path(args.root) / f"suite-{events}"
    subprocess.run(
        [sys.executable, __file__, "--prepare", "--events", str(events), "--root", args.root],
        check=True,
    )
    return root


def scaling(args, sizes: list[int]) -> list[str]:
    """The whole pipeline at each size: one line each, and the table of them."""
    lines = [
        "| events | input rows | wall s | CPU s | µs per event | per-round s |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for events in sizes:
        done = rounds(["pipeline"], _prepared(args, events), args.runs, None, f"{events:,} ")
        m = done["medians"].get("pipeline")
        if m is None:
            lines.append(f"| {events:,} | | failed | | | |")
            continue
        per_event = m["seconds"] / events * 1e6
        each = ", ".join(f"{s:.1f}" for s in m["all_seconds"])
        lines.append(
            f"| {events:,} | {m['input_rows']:,} | {m['seconds']:.1f} | {m['cpu_seconds']:.1f} "
            f"| {per_event:.1f} | {each} |"
        )
        print(f"scaling: {events:,} events in {m['seconds']:.1f} s ({per_event:.1f} µs/event)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    parser.add_argument("--units", help="comma-separated units (default: all)")
    parser.add_argument("--scaling", help="comma-separated event counts for the pipeline alone")
    parser.add_argument("--event-log", help="folder for Spark's event log of every unit run")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    args.root = str(Path(args.root).resolve())  # the lakes link to the base by absolute path
    if args.child:  # one unit, in this process
        root = Path(args.root)
        result = child(args.child, root, root / "work" / args.child, args.event_log)
        print(MARK + json.dumps(result), flush=True)
        return 0
    if args.prepare:
        prepare(Path(args.root) / f"suite-{args.events}", args.events)
        return 0
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.scaling:
        sizes = [int(n.replace("_", "")) for n in args.scaling.split(",")]
        lines = scaling(args, sizes)
        print("\n".join(lines))
        write_section(
            Path(args.output),
            "Scaling: the whole pipeline",
            [
                f"`python bench/run.py --scaling {args.scaling} --runs {args.runs}` on {when}, "
                f"{machine()}. `run --layer all` from the landing files in its own process, "
                f"median of {args.runs}; CPU seconds of the driver, the JVM and the Python "
                "workers.",
                "",
                *lines,
            ],
        )
        return 0
    units = args.units.split(",") if args.units else all_units()
    unknown = set(units) - set(all_units())
    if unknown:
        parser.error(
            f"unknown unit(s) {', '.join(sorted(unknown))}; known: {', '.join(all_units())}"
        )
    done = rounds(units, _prepared(args, args.events), args.runs, args.event_log)
    medians, failures = done["medians"], done["failures"]
    units = [unit for unit in units if unit in medians]
    lines = table(units, medians)
    print("\n".join(lines))
    document = [
        "# Benchmark results",
        "",
        f"`python bench/run.py --events {args.events} --runs {args.runs}"
        + (f" --units {args.units}" if args.units else "")
        + f"` on {when}.",
        "",
        f"Machine: {machine()}.",
        "",
        f"Medians of {args.runs} run(s) per unit, each in its own process on a fresh lake, in "
        "available-now mode. Wall and CPU seconds exclude the JVM start and the Spark session. "
        "Ratio: reference seconds / unit seconds; references are the contract floors (the "
        "same tables from hand-written batch jobs), raw ratio against the raw floors (the "
        "parse and storage limit).",
        "",
        *lines,
        "",
        "Per round, wall seconds: "
        + "; ".join(
            f"{u} {', '.join(f'{s:.1f}' for s in medians[u]['all_seconds'])}" for u in units
        )
        + ".",
        "",
    ]
    if failures:
        note = ", ".join(f"{unit} {n}" for unit, n in failures.items())
        document += [f"Failed runs, tried again (unit and failures): {note}.", ""]
        print(f"failed runs: {note}")
    # the sections other benches write (bench/continuous.py: "## Continuous mode") stay
    write_head(Path(args.output), "\n".join(document))
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
