"""Silver benchmark: silver.events with the quality rules on and off.

    python bench/silver.py [--events 1000000] [--runs 3] [--max-files-per-trigger N] [--root DIR]

Generates the events and runs bronze once (both kept under the bench root for the next run),
then times, ``--runs`` times each and interleaved, the ``silver.events`` flow in available-now
mode on fresh silver tables and checkpoints:

- on: the flow as declared: every quality rule flags its rows, drop rules send rows to
  silver.quarantine before the watermark, great-expectations validates every micro-batch and its
  results go to ops.quality_results, fail rules are enforced;
- rules only: the flow as declared without the great-expectations validation (a breakdown:
  what flagging and the quarantine split cost, apart from validation);
- off: the same flow with no rules at all (no flagging, no quarantine split, no validation):
  watermark, deduplication and the exactly-once append only.

Prints rows/s of each (medians) and ends with ``silver quality ratio: <on / off>`` (throughput
with quality on over throughput with it off; 1.0 means validation is free).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.settings import load_settings  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--max-files-per-trigger",
        type=int,
        default=0,
        help="bronze.events files per silver micro-batch (0: all in one)",
    )
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    args = parser.parse_args(argv)

    from lakehouse.runner import pipeline, run_flows, run_layers
    from lakehouse.session import build_session
    from lakehouse.storage import table_store
    from lakehouse.tools import generate as gen

    root = Path(args.root) / f"silver-{args.events}"
    settings = load_settings("local", overrides={"root": str(root)})
    spark = build_session(settings, app_name="bench-silver")
    store = table_store(spark, settings)
    manifest = root / "landing" / gen.MANIFEST
    quiet = open(os.devnull, "w")  # noqa: SIM115 (progress events may arrive after a run)
    if (
        not manifest.exists()
        or json.loads(manifest.read_text())["runs"][0]["params"]["events"] != args.events
        or not store.exists("bronze.events")
    ):
        shutil.rmtree(root, ignore_errors=True)
        gen.generate(spark, root, gen.params_from_settings(settings, events=args.events))
        print("bronze ...", flush=True)
        run_layers(spark, settings, ["bronze"], out=quiet)
    bronze_rows = store.read("bronze.events").count()
    run_settings = settings.with_overrides(
        {"trigger.max_files_per_trigger": args.max_files_per_trigger}
    )

    declared = pipeline().flow("silver.events")
    flows = {
        "on": declared,
        "rules only": dataclasses.replace(declared, before_write=None),
        "off": dataclasses.replace(
            declared,
            params=lambda s: {"watermark": s.watermarks.events, "quality": ()},
            before_write=None,
        ),
    }

    def silver_once(quality: str) -> tuple[float, int]:
        for sub in ("tables/silver", "tables/ops", "checkpoints/silver"):
            shutil.rmtree(root / sub, ignore_errors=True)
        started = time.perf_counter()
        [report] = run_flows(spark, run_settings, [flows[quality]], out=quiet)
        elapsed = time.perf_counter() - started
        kept = store.read("silver.events").count()
        quarantined = store.read("silver.quarantine").count()
        # the books, each run: nothing lost whichever way quality is set
        assert kept + quarantined + report.duplicates + report.late_rows == bronze_rows, report
        return elapsed, report.batches

    silver_once("on")  # warm-up: JIT, Python workers, great-expectations imports
    times: dict[str, list[float]] = {quality: [] for quality in flows}
    for run in range(args.runs):  # interleaved, so a noisy minute hurts both alike
        line = []
        for quality in flows:
            elapsed, batches = silver_once(quality)
            times[quality].append(elapsed)
            line.append(f"quality {quality} {elapsed:.1f} s")
        print(f"run {run + 1}: {', '.join(line)} ({batches} micro-batches)", flush=True)
    on, rules, off = (statistics.median(times[q]) for q in flows)
    print(f"bronze.events rows: {bronze_rows:,} ({args.events:,} generated events)")
    print(f"quality on:  {bronze_rows / on:,.0f} rows/s (median {on:.1f} s of {args.runs})")
    print(
        f"quality on without great-expectations: {bronze_rows / rules:,.0f} rows/s "
        f"(median {rules:.1f} s; the rules flag, split and quarantine rows, nothing validates)"
    )
    print(f"quality off: {bronze_rows / off:,.0f} rows/s (median {off:.1f} s of {args.runs})")
    print(f"silver quality ratio: {off / on:.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
