"""Where a small micro-batch's seconds go, each layer's flows running together as in a job.

    python bench/batch_steps.py [--events 1500] [--hours 1.5] [--root DIR]

Generates ``--events`` over ``--hours`` (the test profile's 5-minute landing files), runs
bronze and silver one landing file or table version per micro-batch and gold two, one layer
after the other in one Spark session (the flows of a layer at once, as ``lakehouse run``
starts them), then prints each layer's wall seconds and, per flow, the median micro-batch:
Spark's ``durationMs`` parts (from ``ops.stream_progress``) and the steps its ``foreachBatch``
records (compute, before_write, write, wait_side, write_side). bench/latency.py runs one flow
at a time instead. Run it from two trees, one after the other, to compare them.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPARK_PARTS = ("addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets")
STEP_PARTS = ("compute", "before_write", "write", "wait_side", "write_side")
FILES_PER_BATCH = {"bronze": 1, "silver": 1, "gold": 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1500)
    parser.add_argument("--hours", type=float, default=1.5)
    parser.add_argument("--root", type=Path, help="lake to create (default: a temporary one)")
    args = parser.parse_args(argv)

    import pandas as pd

    from lakehouse.ops.status import read_table
    from lakehouse.progress import Progress
    from lakehouse.runner import run_layers
    from lakehouse.session import build_session
    from lakehouse.settings import load_settings
    from lakehouse.storage.streams import BATCH_STEPS
    from lakehouse.tools import generate as gen

    root = args.root or Path(tempfile.mkdtemp(prefix="batch-steps-"))
    shutil.rmtree(root, ignore_errors=True)
    settings = load_settings("test", overrides={"root": str(root)})
    spark = build_session(settings, app_name="batch-steps")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    params = gen.params_from_settings(
        settings, events=args.events, hours=args.hours, late_fraction=0.02, seed=41
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    for layer, files in FILES_PER_BATCH.items():
        started = time.perf_counter()
        layer_settings = settings.with_overrides({"trigger.max_files_per_trigger": files})
        run_layers(spark, layer_settings, [layer], out=io.StringIO())
        print(f"{layer} {time.perf_counter() - started:.1f} s", flush=True)

    spark_parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    progress = read_table(settings, "ops.stream_progress")
    for row in progress.itertuples():
        if pd.isna(row.operator_index) or row.operator_index == 0:  # one row per batch
            durations = json.loads(row.durations_ms)
            for part in SPARK_PARTS:
                spark_parts[row.flow][part].append(durations.get(part, 0) / 1000)
    header = "flow".ljust(32) + "".join(p.rjust(14) for p in SPARK_PARTS + STEP_PARTS)
    print(f"\nmedian seconds per micro-batch\n{header}")
    for flow in sorted(spark_parts):
        steps = BATCH_STEPS.get(flow, [])
        cells = [statistics.median(spark_parts[flow][p]) for p in SPARK_PARTS]
        cells += [
            statistics.median(s.get(p, 0.0) for s in steps) if steps else 0.0 for p in STEP_PARTS
        ]
        print(flow.ljust(32) + "".join(f"{c:14.3f}" for c in cells))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
