"""Small micro-batch latency: each flow's median micro-batch, one landing file per batch.

    python bench/latency.py [--events 8000] [--hours 2] [--flows PREFIX ...] [--root DIR]

Continuous mode and frequent schedules run small micro-batches, where fixed costs per batch
dominate. This generates ``--events`` over ``--hours`` (default 8,000 over 2 hours: about 330
events per 5-minute landing file, 24 files per source), then runs every flow of bronze, silver
and gold (or those whose names start with one of ``--flows``), one flow at a time, admitting one file
(bronze) or one table version (silver, gold) per micro-batch, and prints per flow the median
micro-batch seconds over the batches that read rows, where they go (Spark's ``durationMs``
parts from ``ops.stream_progress``: addBatch is the sink; and inside a ``foreachBatch`` sink,
the batch's own computation, the flow's step before writing (the quality rules), the writes
and commits of its tables, the wait for great-expectations' results and their write), and ends
with:

    small batch seconds: bronze=<slowest bronze flow> silver=<slowest silver flow>
    gold=<slowest gold flow but sessions_custom> sessions_custom=<x>
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.settings import load_settings  # noqa: E402

SPARK_PARTS = (
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "addBatch",
    "walCommit",
    "commitOffsets",
)
STEP_PARTS = ("compute", "before_write", "write", "wait_side", "write_side")


def flow_latencies(settings, flow: str) -> dict[str, float]:
    """Median seconds of a flow's micro-batches that read rows: the whole batch, Spark's parts
    of it, and the foreachBatch steps recorded for it."""
    from lakehouse.storage import deltafiles as dfiles
    from lakehouse.storage.streams import BATCH_STEPS

    table = dfiles.open_table(settings.table_path("ops.stream_progress"))
    frame = table.to_pandas(filters=[("flow", "=", flow)])
    frame = frame[frame["input_rows"] > 0].drop_duplicates(["query_id", "batch_id"])
    if frame.empty:
        return {}
    result = {"batches": float(len(frame)), "rows": float(frame["input_rows"].median())}
    result["batch"] = frame["batch_duration_ms"].median() / 1000
    parts = [json.loads(d) for d in frame["durations_ms"]]
    for part in SPARK_PARTS:
        result[part] = statistics.median(p.get(part, 0) for p in parts) / 1000
    read = set(frame["batch_id"])
    steps = [s for s in BATCH_STEPS.get(flow, ()) if s["batch_id"] in read]
    for part in STEP_PARTS:
        if any(part in s for s in steps):
            result[part] = statistics.median(s.get(part, 0.0) for s in steps)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=8_000)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--flows", nargs="*", default=[], help="flow name prefixes")
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    args = parser.parse_args(argv)

    from lakehouse.progress import Progress
    from lakehouse.runner import pipeline, run_flows
    from lakehouse.session import build_session
    from lakehouse.tools import generate as gen

    root = Path(args.root) / f"latency-{args.events}"
    shutil.rmtree(root, ignore_errors=True)
    settings = load_settings(
        "local",
        overrides={"root": str(root), "trigger.max_files_per_trigger": 1},
    )
    spark = build_session(settings, app_name="bench-latency")
    params = gen.params_from_settings(settings, events=args.events, hours=args.hours)
    gen.generate(spark, root, params, progress=lambda s: Progress(s, io.StringIO()))
    print(
        f"small micro-batches: {args.events:,} events over {args.hours:g} hours, one landing "
        "file or table version per micro-batch, one flow at a time, "
        "medians in seconds"
    )
    header = ["flow", "batches", "rows", "batch", *SPARK_PARTS, *STEP_PARTS]
    print(" ".join(f"{h:>{26 if i == 0 else 12}}" for i, h in enumerate(header)))
    slowest: dict[str, float] = {}
    for flow in pipeline().flows:
        if args.flows and not flow.name.startswith(tuple(args.flows)):
            continue
        started = time.perf_counter()
        run_flows(spark, settings, [flow], out=io.StringIO())
        figures = flow_latencies(settings, flow.name)
        cells = [f"{flow.name:>26}"]
        for h in header[1:]:
            value = figures.get(h)
            cells.append(f"{'-' if value is None else f'{value:.3f}':>12}")
        print(" ".join(cells), f"  ({time.perf_counter() - started:.0f} s)", flush=True)
        group = "sessions_custom" if flow.name == "gold.sessions_custom" else flow.layer
        slowest[group] = max(slowest.get(group, 0.0), figures.get("batch", 0.0))
    spark.stop()
    print(
        "small batch seconds: "
        + " ".join(
            f"{g}={slowest.get(g, float('nan')):.2f}"
            for g in ("bronze", "silver", "gold", "sessions_custom")
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
