"""Where a run's seconds go, from Spark's event log: per streaming query (and the rest), its
micro-batches and how Spark split their time, its jobs, tasks, task seconds and the JVM's CPU
seconds in them.

    python bench/eventlog.py EVENT_LOG [--query PREFIX]

Turn the log on for a run with ``--conf spark_conf.spark.eventLog.enabled=true --conf
spark_conf.spark.eventLog.dir=file:///tmp/events`` (``bench/run.py --event-log DIR`` does it
per unit); EVENT_LOG is one of the files (or folders, for a rolling log) it writes there.

Columns: ``batches`` micro-batches (with rows / without), then the sums over them of Spark's
parts of a micro-batch (``durationMs``): ``offsets`` (latestOffset: what the sources hold, a
Delta source's snapshot), ``plan`` (getBatch and queryPlanning), ``batch`` (addBatch: the
stateful operators, the sink, a foreachBatch function), ``log`` (walCommit and commitOffsets);
then the query's Spark ``jobs``, their ``tasks``, the tasks' seconds (``task s``) and the JVM's
CPU seconds in them (``jvm cpu s``): task seconds well above CPU seconds are spent outside the
JVM (Python workers, I/O) or waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PARTS = {
    "offsets": ("latestOffset",),
    "plan": ("getBatch", "queryPlanning"),
    "batch": ("addBatch",),
    "log": ("walCommit", "commitOffsets"),
}


@dataclass
class Query:
    batches: int = 0
    empty_batches: int = 0
    parts_ms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    jobs: int = 0
    tasks: int = 0
    task_ms: float = 0.0
    cpu_ms: float = 0.0


def events(path: Path) -> Iterator[dict]:
    """The events of a log file, or of every file of a rolling log's folder, in order."""
    files = sorted(path.glob("events_*")) if path.is_dir() else [path]
    for file in files:
        with open(file) as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def owner(properties: dict) -> str:
    """The streaming query a job ran for (the first line of its description), else where it
    was called from."""
    description = (properties.get("spark.job.description") or "").split("\n")[0]
    if description.startswith("Delta: "):  # Delta's own jobs inside a query's batch
        description = description.removeprefix("Delta: ").split(" ")[0]
    return description or f"({properties.get('callSite.short', '?').split(' at ')[0]})"


def summarize(path: Path) -> dict[str, Query]:
    queries: dict[str, Query] = defaultdict(Query)
    stage_owner: dict[int, str] = {}
    for event in events(path):
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            name = owner(event.get("Properties") or {})
            queries[name].jobs += 1
            for stage in event["Stage Infos"]:
                stage_owner[stage["Stage ID"]] = name
        elif kind == "SparkListenerTaskEnd":
            query = queries[stage_owner.get(event["Stage ID"], "(unknown)")]
            metrics = event.get("Task Metrics") or {}
            query.tasks += 1
            query.task_ms += metrics.get("Executor Run Time", 0)
            query.cpu_ms += metrics.get("Executor CPU Time", 0) / 1e6
        elif kind.endswith("QueryProgressEvent"):
            progress = event["progress"]
            query = queries[progress.get("name") or progress["id"]]
            query.batches += 1
            rows = sum(s.get("numInputRows") or 0 for s in progress.get("sources") or [])
            query.empty_batches += not rows
            for part, keys in PARTS.items():
                query.parts_ms[part] += sum(progress["durationMs"].get(k, 0) for k in keys)
    return dict(queries)


def table(queries: dict[str, Query], prefix: str = "") -> list[str]:
    header = (
        f"{'query':34} {'batches':>9} {'offsets':>8} {'plan':>7} {'batch':>8} {'log':>6} "
        f"{'jobs':>5} {'tasks':>6} {'task s':>8} {'jvm cpu s':>9}"
    )
    lines = [header]
    ordered = sorted(queries.items(), key=lambda kv: -kv[1].task_ms)
    totals = Query()
    for name, q in ordered:
        if not name.startswith(prefix):
            continue
        batches = f"{q.batches - q.empty_batches}/{q.empty_batches}" if q.batches else ""
        parts = [f"{q.parts_ms[p] / 1000:.1f}" if q.batches else "" for p in PARTS]
        lines.append(
            f"{name[:34]:34} {batches:>9} {parts[0]:>8} {parts[1]:>7} {parts[2]:>8} "
            f"{parts[3]:>6} {q.jobs:>5} {q.tasks:>6} {q.task_ms / 1000:>8.1f} "
            f"{q.cpu_ms / 1000:>9.1f}"
        )
        totals.jobs += q.jobs
        totals.tasks += q.tasks
        totals.task_ms += q.task_ms
        totals.cpu_ms += q.cpu_ms
    lines.append(
        f"{'all':34} {'':>9} {'':>8} {'':>7} {'':>8} {'':>6} {totals.jobs:>5} "
        f"{totals.tasks:>6} {totals.task_ms / 1000:>8.1f} {totals.cpu_ms / 1000:>9.1f}"
    )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="an event log file, or a rolling log's folder")
    parser.add_argument("--query", default="", help="only queries whose name starts so")
    args = parser.parse_args(argv)
    if not args.log.exists():
        parser.error(f"no event log at {args.log}")
    print("\n".join(table(summarize(args.log), args.query)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
