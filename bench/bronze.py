"""Bronze benchmark: landing JSON to bronze Delta, against a one-batch JSON-to-Parquet floor.

    python bench/bronze.py [--events 1000000] [--runs 3] [--root DIR]

Generates the events once (kept under the bench root for the next run), then times, ``--runs``
times each, on fresh tables and checkpoints:

- bronze: the ``bronze.events`` flow end to end in available-now mode (JSON lines parsed with the
  explicit schema, rescued data, quarantine split, exactly-once Delta commits);
- floor: ``spark.read.schema(...).json(landing/events)`` written as Parquet in one batch job
  (with the explicit schema too: inferring it adds a pass and would flatter the ratio; that
  floor is printed as well).

Prints rows/s of each (medians) and ends with ``bronze ratio: <bronze / floor>``.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    args = parser.parse_args(argv)

    from lakehouse.runner import pipeline

    FLOWS = pipeline().layer("bronze")
    from bronze.sources import SCHEMAS
    from lakehouse.runner import run_flows
    from lakehouse.session import build_session
    from lakehouse.tools import generate as gen

    root = Path(args.root) / f"bronze-{args.events}"
    settings = load_settings("local", overrides={"root": str(root)})
    spark = build_session(settings, app_name="bench-bronze")
    manifest = root / "landing" / gen.MANIFEST
    if (
        not manifest.exists()
        or json.loads(manifest.read_text())["runs"][0]["params"]["events"] != args.events
    ):
        shutil.rmtree(root, ignore_errors=True)
        gen.generate(spark, root, gen.params_from_settings(settings, events=args.events))
    lines = json.loads(manifest.read_text())["totals"]["events"]["lines"]
    flow = next(f for f in FLOWS if f.name == "bronze.events")
    landing = str(settings.landing_path("events").absolute())

    quiet = open(os.devnull, "w")  # noqa: SIM115 (progress events may arrive after a run)

    def bronze_once() -> float:
        for sub in ("tables", "checkpoints"):
            shutil.rmtree(root / sub, ignore_errors=True)
        started = time.perf_counter()
        reports = run_flows(spark, settings, [flow], out=quiet)
        elapsed = time.perf_counter() - started
        assert reports[0].input_rows == lines, (reports, lines)
        return elapsed

    def floor_once(infer: bool = False) -> float:
        out = root / "floor-parquet"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        reader = spark.read if infer else spark.read.schema(SCHEMAS["events"])
        reader.json(landing).write.parquet(str(out))
        return time.perf_counter() - started

    bronze_once()  # warm-up: JIT, Python workers, imports
    floor_once()
    bronze, floor, inferred = [], [], []
    for run in range(args.runs):  # interleaved, so a noisy minute hurts all three alike
        bronze.append(bronze_once())
        floor.append(floor_once())
        inferred.append(floor_once(infer=True))
        print(
            f"run {run + 1}: bronze {bronze[-1]:.1f} s, floor {floor[-1]:.1f} s, "
            f"floor with schema inference {inferred[-1]:.1f} s",
            flush=True,
        )
    b, f, i = (statistics.median(x) for x in (bronze, floor, inferred))
    print(f"lines: {lines:,} (landing/events, {args.events:,} events + faults)")
    print(f"bronze: {lines / b:,.0f} rows/s (median {b:.1f} s of {args.runs})")
    print(
        f"floor:  {lines / f:,.0f} rows/s (median {f:.1f} s; read.json with the schema + Parquet)"
    )
    print(f"floor, schema inferred: {lines / i:,.0f} rows/s (median {i:.1f} s; ratio {i / b:.2f})")
    print(f"bronze ratio: {f / b:.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
