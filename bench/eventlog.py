"""Where a run's seconds go, from Spark's event log: per streaming query (and the rest), its
micro-batches and how Spark split their time, its jobs, tasks, task seconds and the JVM's CPU
seconds in them; or, with ``--timeline``, how the process's wall time splits between
micro-batches, Spark jobs and neither (a long process of many short queries: a test suite).

    python bench/eventlog.py EVENT_LOG [--query PREFIX]
    python bench/eventlog.py EVENT_LOG [EVENT_LOG ...] --timeline

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

``--timeline``: the application's wall seconds from its start to its end, split by what ran at
each moment: some micro-batch of some query (with a Spark job running, or without: planning,
commits, a foreachBatch function's Python), or none (with a Spark job: batch work such as
reads or generated data; without: the driver's Python, or nothing at all); then the counts of
queries started, micro-batches, jobs and tasks, the micro-batches' median and total seconds,
the time from the application's start to its first query and from each query's start to its
first micro-batch. Several logs (the processes a command started): a line per application,
then the sums.
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


def _ms(stamp: str) -> float:
    """Milliseconds since the epoch of a progress event's ISO time (``...T01:02:03.456Z``)."""
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


@dataclass
class Timeline:
    name: str = ""  # the application's name and id
    start_ms: float = 0.0
    end_ms: float = 0.0
    first_query_ms: float | None = None  # the first query's start
    queries: int = 0
    batches: list[float] = field(default_factory=list)  # each micro-batch's seconds
    empty_batches: int = 0
    jobs: int = 0
    tasks: int = 0
    # (start, end) in ms of each micro-batch and each Spark job
    batch_spans: list[tuple[float, float]] = field(default_factory=list)
    job_spans: list[tuple[float, float]] = field(default_factory=list)
    # seconds from each query's start to the start of its first micro-batch
    first_batch_waits: list[float] = field(default_factory=list)

    def split(self) -> dict[tuple[bool, bool], float]:
        """Seconds of the application's span by (some micro-batch running, some job running)."""
        edges = []  # (time, +1 or -1, kind): sorted, ends come before starts at one time
        for kind, spans in (("batch", self.batch_spans), ("job", self.job_spans)):
            for start, end in spans:
                start, end = max(start, self.start_ms), min(end, self.end_ms)
                if end > start:
                    edges += [(start, 1, kind), (end, -1, kind)]
        edges.sort()
        running = {"batch": 0, "job": 0}
        out = dict.fromkeys([(b, j) for b in (True, False) for j in (True, False)], 0.0)
        at = self.start_ms
        for time, step, kind in edges:
            out[running["batch"] > 0, running["job"] > 0] += (time - at) / 1000
            running[kind] += step
            at = time
        out[running["batch"] > 0, running["job"] > 0] += (self.end_ms - at) / 1000
        return out


def timeline(path: Path) -> Timeline:
    found = Timeline()
    open_jobs: dict[int, float] = {}
    started: dict[str, float] = {}  # run id: start, until its first micro-batch
    last = 0.0
    for event in events(path):
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            found.start_ms = event["Timestamp"]
            found.name = f"{event.get('App Name', '?')} ({event.get('App ID', '?')})"
            last = max(last, found.start_ms)
        elif kind == "SparkListenerApplicationEnd":
            found.end_ms = event["Timestamp"]
        elif kind == "SparkListenerJobStart":
            found.jobs += 1
            open_jobs[event["Job ID"]] = event["Submission Time"]
            last = max(last, event["Submission Time"])
        elif kind == "SparkListenerJobEnd":
            start = open_jobs.pop(event["Job ID"], None)
            if start is not None:
                found.job_spans.append((start, event["Completion Time"]))
            last = max(last, event["Completion Time"])
        elif kind == "SparkListenerTaskEnd":
            found.tasks += 1
        elif kind.endswith("QueryStartedEvent"):
            found.queries += 1
            started[event["runId"]] = _ms(event["timestamp"])
            if found.first_query_ms is None:
                found.first_query_ms = started[event["runId"]]
            last = max(last, started[event["runId"]])
        elif kind.endswith("QueryProgressEvent"):
            progress = event["progress"]
            start = _ms(progress["timestamp"])
            if progress["runId"] in started:
                found.first_batch_waits.append((start - started.pop(progress["runId"])) / 1000)
            seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
            found.batch_spans.append((start, start + seconds * 1000))
            found.batches.append(seconds)
            rows = sum(s.get("numInputRows") or 0 for s in progress.get("sources") or [])
            found.empty_batches += not rows
            last = max(last, start + seconds * 1000)
    # (a log cut short, its process killed: up to its last event with a time)
    found.end_ms = found.end_ms or last
    found.job_spans += [(start, found.end_ms) for start in open_jobs.values()]
    return found


def timeline_lines(found: list[Timeline]) -> list[str]:
    """The split of one application's wall time; of several (each process a command started),
    one line each, then their sums (process seconds: they may overlap)."""
    import statistics

    lines = []
    if len(found) > 1:
        for one in sorted(found, key=lambda t: t.start_ms):
            wall = (one.end_ms - one.start_ms) / 1000
            lines.append(
                f"{one.name[:60]:60} wall {wall:>7.1f} s, to its first query "
                f"{_to_first_query(one):>6.1f} s, {len(one.batches):>4} micro-batches "
                f"{sum(one.batches):>7.1f} s"
            )
    total = sum((t.end_ms - t.start_ms) / 1000 for t in found)
    splits = [t.split() for t in found]
    split = {k: sum(one[k] for one in splits) for k in splits[0]}
    rows = [
        ("in a micro-batch, a Spark job running", split[True, True]),
        ("in a micro-batch, no Spark job", split[True, False]),
        ("no micro-batch, a Spark job running", split[False, True]),
        ("no micro-batch, no Spark job", split[False, False]),
    ]
    what = "wall time of the application" if len(found) == 1 else f"of {len(found)} applications"
    lines.append(f"{what:42} {total:>9.1f} s")
    lines += [f"  {name:40} {s:>9.1f} s {100 * s / total:>5.1f} %" for name, s in rows]
    lines.append(
        f"  {'from the start to the first query':40} "
        f"{sum(_to_first_query(t) for t in found):>9.1f} s"
    )
    batches = [b for t in found for b in t.batches]
    median = statistics.median(batches) if batches else 0.0
    lines += [
        f"queries started {sum(t.queries for t in found):,}; micro-batches {len(batches):,} "
        f"({sum(t.empty_batches for t in found):,} without rows), median {median:.2f} s, "
        f"sum {sum(batches):,.1f} s; Spark jobs {sum(t.jobs for t in found):,}, "
        f"tasks {sum(t.tasks for t in found):,}"
    ]
    waits = [w for t in found for w in t.first_batch_waits]
    if waits:
        lines.append(
            f"from a query's start to its first micro-batch: median "
            f"{statistics.median(waits):.2f} s, sum {sum(waits):,.1f} s ({len(waits):,} queries)"
        )
    return lines


def _to_first_query(found: Timeline) -> float:
    """Seconds from the application's start to its first query's (all of it without one)."""
    end = found.end_ms if found.first_query_ms is None else found.first_query_ms
    return (end - found.start_ms) / 1000


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
    parser.add_argument(
        "log",
        type=Path,
        nargs="+",
        help="an event log file, or a rolling log's folder (several with --timeline)",
    )
    parser.add_argument("--query", default="", help="only queries whose name starts so")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="the wall time split by what ran: micro-batches, Spark jobs, neither",
    )
    args = parser.parse_args(argv)
    for log in args.log:
        if not log.exists():
            parser.error(f"no event log at {log}")
    if args.timeline:
        print("\n".join(timeline_lines([timeline(log) for log in args.log])))
        return 0
    if len(args.log) > 1:
        parser.error("one event log at a time, but with --timeline")
    print("\n".join(table(summarize(args.log[0]), args.query)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
