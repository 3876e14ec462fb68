"""The benchmark suite: each layer, each gold flow and the whole pipeline against batch floors.

    python bench/run.py [--events 1000000] [--runs 3] [--root DIR] [--units a,b,...]
                        [--output bench/RESULTS.md]      (or: make bench)

Generates the landing files once and builds a base lake (bronze and silver) once, both kept
under ``--root`` for the next run. Then, ``--runs`` rounds, each unit in its own fresh process
on a fresh lake (inputs linked read-only from the base) in available-now mode:

- ``bronze``, ``silver``, ``gold``: one layer on the base's input; ``gold.<flow>``: one gold
  flow alone; ``pipeline``: ``run --layer all`` from the landing files;
- ``floor.bronze``: the landing JSON read with the explicit schemas and written as Parquet in
  one batch job; ``floor.silver``: bronze rows deduplicated by id (and impressions left-joined
  to clicks within the hour) in batch; ``floor.gold``: the gold aggregations (session windows,
  5-minute and hourly windows, hourly ad and country figures, 30-minute activity spans) in batch.

Per unit it prints and writes to ``--output`` (medians of the rounds): input rows, wall seconds
of the work (the JVM start and the Spark session are not counted; they are the same few seconds
for every unit), rows/s, peak state rows (the largest total over one micro-batch, summed over
the unit's flows), peak memory of the whole process tree (Python driver, JVM, Python workers; the sum of
the processes' PSS, so pages the forked workers share count once), and
the ratio to its reference: reference seconds / unit seconds (1.0 = as fast as the reference).
References: bronze, silver, gold vs their floors; gold.sessions_custom vs gold.sessions; the
pipeline vs the sum of the three floors.
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

from results import log_stats, machine, write_head  # noqa: E402

from lakehouse.settings import load_settings  # noqa: E402

MARK = "BENCH-RESULT "
REFERENCES = {
    "bronze": "floor.bronze",
    "silver": "floor.silver",
    "gold": "floor.gold",
    "gold.sessions_custom": "gold.sessions",
    "pipeline": ("floor.bronze", "floor.silver", "floor.gold"),
}


def gold_flow_names() -> list[str]:
    from lakehouse.runner import layer_flows

    FLOWS = layer_flows("gold")

    return [f.name for f in FLOWS]


def all_units() -> list[str]:
    return [
        "floor.bronze",
        "bronze",
        "floor.silver",
        "silver",
        "floor.gold",
        "gold",
        *gold_flow_names(),
        "pipeline",
    ]


# ---- child: one unit in its own process -----------------------------------------------------


def _settings(root: Path):
    return load_settings("local", overrides={"root": str(root)})


def _link(base: Path, work: Path, *relative: str) -> None:
    for rel in relative:
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(base / rel, target_is_directory=True)


def input_rows(unit: str, base) -> int:
    """The rows a unit reads, each input counted once: landing lines for bronze (and the
    pipeline), bronze rows for silver, silver rows for gold, a gold flow's own input."""
    from lakehouse.runner import layer_flows

    FLOWS = layer_flows("gold")
    from lakehouse.generate import MANIFEST

    if unit in ("bronze", "pipeline", "floor.bronze"):
        totals = json.loads((base.landing_path() / MANIFEST).read_text())["totals"]
        return sum(t["lines"] for t in totals.values())
    if unit in ("silver", "floor.silver"):
        return sum(log_stats(base, f"bronze.{s}")[0] for s in ("events", "impressions", "clicks"))
    if unit in ("gold", "floor.gold"):
        return sum(log_stats(base, t)[0] for t in ("silver.events", "silver.ad_attribution"))
    (flow,) = [f for f in FLOWS if f.name == unit]
    return sum(log_stats(base, i.table)[0] for i in flow.inputs)


def _peak_state_rows(settings) -> int:
    from lakehouse.status import read_table

    progress = read_table(settings, "ops.stream_progress")
    if progress.empty or progress["state_rows"].isna().all():
        return 0
    per_batch = progress.groupby(["flow", "batch_id"])["state_rows"].sum()
    return int(per_batch.groupby(level="flow").max().sum())


def prepare(root: Path, events: int) -> None:
    """Landing files for ``events`` and the base lake (bronze + silver), unless already there."""
    from lakehouse import generate as gen
    from lakehouse.runner import run_layers
    from lakehouse.session import build_session

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


def _floor(spark, settings, base_settings, unit: str) -> int:
    """A batch floor; the rows it wrote."""
    from pyspark.sql import functions as F

    from bronze.sources import SCHEMAS, SOURCES
    from lakehouse.storage import table_store

    out = settings.root / "floor"
    written = 0
    if unit == "floor.bronze":
        for source in SOURCES:
            path = str(base_settings.landing_path(source))
            frame = spark.read.schema(SCHEMAS[source]).json(path)
            frame.write.parquet(str(out / source))
            written += spark.read.parquet(str(out / source)).count()
        return written
    store = table_store(spark, base_settings)
    frames = {}
    if unit == "floor.silver":
        events = store.read("bronze.events").where(
            "event_id IS NOT NULL AND event_time IS NOT NULL"
        )
        frames["events"] = events.dropDuplicates(["event_id"])
        imp = store.read("bronze.impressions").dropDuplicates(["impression_id"]).alias("i")
        clk = store.read("bronze.clicks").dropDuplicates(["click_id"]).alias("c")
        frames["ad_attribution"] = imp.join(
            clk,
            F.expr(
                "c.impression_id = i.impression_id AND c.click_time >= i.impression_time"
                " AND c.click_time <= i.impression_time + interval 1 hour"
            ),
            "left",
        ).select("i.*", "c.click_id", "c.click_time")
    elif unit == "floor.gold":
        ev = store.read("silver.events")
        purchase = (F.col("event_type") == "purchase").cast("long")
        revenue = F.when(F.col("event_type") == "purchase", F.col("amount")).otherwise(0.0)
        frames["sessions"] = ev.groupBy(
            "user_id", F.session_window("event_time", "15 minutes")
        ).agg(F.count("*").alias("events"), F.sum(purchase), F.sum(revenue))
        five = ev.groupBy("user_id", F.window("event_time", "5 minutes")).agg(
            F.count("*").alias("events"), F.sum(purchase), F.sum(revenue)
        )
        frames["user_activity_5m"] = five
        frames["user_activity_hourly"] = five.groupBy(
            "user_id", F.window("window.start", "1 hour")
        ).agg(F.sum("events"), F.avg("events"), F.max("events"))
        frames["revenue_by_country_hourly"] = ev.groupBy(
            F.coalesce("country", F.lit("unknown")), F.window("event_time", "1 hour")
        ).agg(F.count("*"), F.sum(purchase), F.sum(revenue))
        frames["user_activity_spans"] = ev.groupBy(
            "user_id", "event_type", F.session_window("event_time", "30 minutes")
        ).agg(F.min("event_time"), F.max("event_time"), F.count("*"))
        ads = store.read("silver.ad_attribution")
        frames["ad_performance_hourly"] = ads.groupBy(
            "ad_id", F.window("impression_time", "1 hour")
        ).agg(F.count("*"), F.count("click_id"))
    for name, frame in frames.items():
        frame.write.parquet(str(out / name))
        written += spark.read.parquet(str(out / name)).count()
    return written


def child(unit: str, root: Path, work: Path) -> dict:
    from lakehouse.runner import layer_flows, run_flows, run_layers
    from lakehouse.session import build_session

    base = root / "base"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings, base_settings = _settings(work), _settings(base)
    if unit in ("bronze", "pipeline", "floor.bronze"):
        _link(base, work, "landing")
    elif unit in ("silver", "floor.silver"):
        _link(base, work, "tables/bronze")
    else:
        _link(base, work, "tables/silver")
    spark = build_session(settings, app_name=f"bench-{unit}")
    quiet = open(os.devnull, "w")  # noqa: SIM115 (progress events may arrive after a run)
    started = time.perf_counter()
    if unit.startswith("floor."):
        _floor(spark, settings, base_settings, unit)
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "input_rows": input_rows(unit, base_settings), "state_rows": 0}
    if unit in ("bronze", "silver", "gold", "pipeline"):
        layers = ["bronze", "silver", "gold"] if unit == "pipeline" else [unit]
        reports = run_layers(spark, settings, layers, out=quiet)
    else:
        (flow,) = [f for f in layer_flows("gold") if f.name == unit]
        reports = run_flows(spark, settings, [flow], out=quiet)
    seconds = time.perf_counter() - started
    assert all(r.error is None for r in reports), reports
    return {
        "seconds": seconds,
        "input_rows": input_rows(unit, base_settings),
        "state_rows": _peak_state_rows(settings),
    }


# ---- parent: rounds, process-tree RSS, the table ----------------------------------------------


def _tree_rss_kb(pid: int) -> int:
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


def run_unit(unit: str, root: Path) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        unit,
        "--root",
        str(root),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_rss_kb(process.pid))
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


def table(units: list[str], medians: dict[str, dict]) -> list[str]:
    def reference_seconds(unit: str) -> float | None:
        ref = REFERENCES.get(unit)
        if ref is None:
            return None
        refs = ref if isinstance(ref, tuple) else (ref,)
        if not all(r in medians for r in refs):
            return None
        return sum(medians[r]["seconds"] for r in refs)

    header = "| unit | input rows | wall s | rows/s | peak state rows | peak memory MiB | reference | ratio |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---|---:|"]
    for unit in units:
        m = medians[unit]
        ref = REFERENCES.get(unit)
        ref_s = reference_seconds(unit)
        ref_name = " + ".join(ref) if isinstance(ref, tuple) else (ref or "")
        ratio = "" if ref_s is None else f"{ref_s / m['seconds']:.2f}"
        lines.append(
            f"| {unit} | {m['input_rows']:,} | {m['seconds']:.1f} | "
            f"{m['input_rows'] / m['seconds']:,.0f} | {m['state_rows']:,} | {m['rss_mb']:,.0f} | "
            f"{ref_name} | {ratio} |"
        )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    parser.add_argument("--units", help="comma-separated units (default: all)")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    args.root = str(Path(args.root).resolve())  # the lakes link to the base by absolute path
    if args.child:  # one unit, in this process
        root = Path(args.root)
        result = child(args.child, root, root / "work" / args.child.replace(":", "-"))
        print(MARK + json.dumps(result), flush=True)
        return 0
    root = Path(args.root) / f"suite-{args.events}"
    if args.prepare:
        prepare(root, args.events)
        return 0
    units = args.units.split(",") if args.units else all_units()
    unknown = set(units) - set(all_units())
    if unknown:
        parser.error(
            f"unknown unit(s) {', '.join(sorted(unknown))}; known: {', '.join(all_units())}"
        )
    subprocess.run(
        [sys.executable, __file__, "--prepare", "--events", str(args.events), "--root", args.root],
        check=True,
    )
    results: dict[str, list[dict]] = {unit: [] for unit in units}
    failures: dict[str, int] = {unit: 0 for unit in units}
    for round_ in range(args.runs):  # interleaved: a noisy minute hurts every unit alike
        for unit in units:
            # a unit that fails (on a loaded machine, a Python worker can miss Spark's
            # connect-back timeout) is tried once more, then counted as failed: an hour of
            # figures is not thrown away for one run
            for attempt in (1, 2):
                try:
                    result = run_unit(unit, root)
                    break
                except RuntimeError as exc:
                    failures[unit] += 1
                    print(
                        f"round {round_ + 1}/{args.runs} {unit}: FAILED (attempt {attempt}): "
                        f"{str(exc).strip().splitlines()[-1]}",
                        flush=True,
                    )
            else:
                continue
            results[unit].append(result)
            print(
                f"round {round_ + 1}/{args.runs} {unit}: {result['seconds']:.1f} s, "
                f"{result['input_rows']:,} rows, peak memory {result['rss_mb']:,.0f} MiB",
                flush=True,
            )
    medians = {
        unit: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for unit, runs in results.items()
        if runs
    }
    units = [unit for unit in units if unit in medians]
    lines = table(units, medians)
    print("\n".join(lines))
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
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
        "available-now mode. Wall seconds exclude the JVM start and the Spark session. Ratio: "
        "reference seconds / unit seconds.",
        "",
        *lines,
        "",
    ]
    failed = {unit: n for unit, n in failures.items() if n}
    if failed:
        note = ", ".join(f"{unit} {n}" for unit, n in failed.items())
        document += [f"Failed runs, tried again (unit and failures): {note}.", ""]
        print(f"failed runs: {note}")
    # the sections other benches write (bench/continuous.py: "## Continuous mode") stay
    write_head(Path(args.output), "\n".join(document))
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
