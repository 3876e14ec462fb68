"""``lakehouse status``: the state of a lake at a glance, read from the Delta logs and the
runner's books (ops.runs, ops.stream_progress, ops.quality_results) with delta-rs and pandas.
It starts no Spark, so it answers in a second even while flows run.

Sections: every table (version, rows and files from the log, last write); the last run of each
flow; per stateful operator its state rows and memory in the latest micro-batch and their
growth over the recent ones; quality rules that failed; up to when each gold table's rows are
final (ops.completeness); rows dropped as late or duplicate.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import TextIO

import pandas as pd
import pyarrow as pa

from lakehouse.ops.maintain import lake_tables
from lakehouse.redaction import redact
from lakehouse.settings import Settings
from lakehouse.storage import deltafiles as dfiles
from lakehouse.text import aligned

RECENT = 5  # micro-batches over which state growth is shown


def read_table(settings: Settings, name: str) -> pd.DataFrame:
    """A (small) table of the lake as pandas; empty when it does not exist yet."""
    path = settings.table_path(name)
    if not dfiles.is_delta_table(path):
        return pd.DataFrame()
    return dfiles.read_arrow(path).to_pandas()


def last_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The latest ops.runs row of each flow, by flow name."""
    # (stable: a run's rows share its start, and a flow's own row comes after its restarts)
    runs = runs.sort_values("started_at", kind="stable")
    return runs.groupby("flow").tail(1).sort_values("flow")


def current_marks(settings: Settings) -> pd.DataFrame:
    """Per gold table, its complete-through mark now (the latest of ops.completeness): table,
    column, complete_through, flow, recorded_at; by table."""
    from lakehouse.runner.monitoring import COMPLETENESS_TABLE

    marks = read_table(settings, COMPLETENESS_TABLE)
    if marks.empty:
        return marks
    marks = marks.sort_values(["complete_through", "recorded_at"]).groupby("table").tail(1)
    return marks.sort_values("table", ignore_index=True)


def _when(ms_or_time) -> str:
    if ms_or_time is None or pd.isna(ms_or_time):
        return "-"
    if isinstance(ms_or_time, int | float):
        ms_or_time = pd.Timestamp(int(ms_or_time), unit="ms", tz="UTC")
    return pd.Timestamp(ms_or_time).strftime("%Y-%m-%d %H:%M:%S")


def _print_table(header: list[str], rows: list[list], out: TextIO, right: set[int]) -> None:
    print("\n".join(aligned(header, rows, right)), file=out)


def table_rows(settings: Settings) -> list[list]:
    """Per table: name, version, rows, files, last write (UTC)."""
    rows = []
    for name, path in lake_tables(settings):
        table = dfiles.open_table(path)
        adds = pa.table(table.get_add_actions(flatten=True))
        records = sum(n for n in adds.column("num_records").to_pylist() if n is not None)
        last = table.history(1)[0].get("timestamp")
        rows.append([name, table.version(), f"{records:,}", adds.num_rows, _when(last)])
    return rows


def kafka_backlog(settings: Settings) -> list[list]:
    """Per bronze flow reading Kafka: its topic, the records on the broker, the next offset its
    last committed micro-batch leaves off at per partition, and the records not read yet."""
    from lakehouse import checkpoints, kafka_client
    from lakehouse.runner import layer_flows

    client = settings.kafka.client_options()
    on_broker = {
        t.topic: t for t in kafka_client.topics(settings.kafka.bootstrap_servers, options=client)
    }
    rows = []
    for flow in layer_flows("bronze"):
        topic = settings.topic(flow.inputs[0].source)
        found = on_broker.get(topic)
        if found is None:
            rows.append([flow.name, topic, "no such topic", "", ""])
            continue
        read = checkpoints.committed_offsets(settings.checkpoint_path(flow.layer, flow.flow))
        done = ((read or [None])[0] or {}).get(topic, {})
        ends = dict(enumerate(found.ends))
        # a partition the checkpoint has no offset for is read from its first record kept
        behind = sum(end - int(done.get(str(p), found.offsets[p][0])) for p, end in ends.items())
        at = " ".join(f"{p}:{done.get(str(p), '-')}" for p in ends) if read else "not started"
        rows.append([flow.name, topic, f"{found.records:,}", at, f"{behind:,}"])
    return rows


def print_kafka_backlog(settings: Settings, out: TextIO) -> None:
    from lakehouse.kafka_client import KafkaError

    print(f"\nkafka at {settings.kafka.bootstrap_servers}: records bronze has not read", file=out)
    try:
        rows = kafka_backlog(settings)
    except KafkaError as exc:
        print(f"  {redact(str(exc))}", file=out)
        return
    header = ["flow", "topic", "records", "committed up to (partition:offset)", "not read"]
    _print_table(header, rows, out, {2, 4})


def print_status(settings: Settings, out: TextIO | None = None) -> None:
    """Every section of ``lakehouse status``, in order, to ``out`` (stdout by default)."""
    out = out or sys.stdout
    print(f"lake {settings.root} at {_when(dt.datetime.now(dt.UTC))} UTC", file=out)
    _print_lake_tables(settings, out)
    if settings.bronze.source == "kafka":
        print_kafka_backlog(settings, out)
    _print_last_runs(settings, out)
    progress = read_table(settings, "ops.stream_progress")
    _print_state(progress, out)
    _print_failed_rules(settings, out)
    _print_marks(settings, out)
    _print_drops(progress, out)


def _print_lake_tables(settings: Settings, out: TextIO) -> None:
    """Every table with its version, rows, files and last write, or how to make some."""
    print("\ntables", file=out)
    tables = table_rows(settings)
    if not tables:
        print("  none yet: run `lakehouse generate` and `lakehouse run --layer all`", file=out)
        return
    header = ["table", "version", "rows", "files", "last write (UTC)"]
    _print_table(header, tables, out, {1, 2, 3})


def _print_last_runs(settings: Settings, out: TextIO) -> None:
    """The last run of each flow (ops.runs): its status, time, batches, input rows, error."""
    runs = read_table(settings, "ops.runs")
    print("\nlast run per flow", file=out)
    if runs.empty:
        print("  no runs recorded yet", file=out)
        return
    rows = [
        [
            r.flow,
            r.status,
            _when(r.started_at),
            f"{(r.ended_at - r.started_at).total_seconds():.1f}",
            int(r.batches),
            f"{int(r.input_rows):,}",
            redact(r.error or "")[:80],
        ]
        for r in last_runs(runs).itertuples()
    ]
    header = ["flow", "status", "started (UTC)", "seconds", "batches", "input rows", "error"]
    _print_table(header, rows, out, {3, 4, 5})


def _operators(progress: pd.DataFrame) -> pd.DataFrame:
    """The rows of ops.stream_progress about a stateful operator (empty when there are none)."""
    return progress if progress.empty else progress.dropna(subset=["operator"])


def _print_state(progress: pd.DataFrame, out: TextIO) -> None:
    """Per stateful operator: its state now and how it grew over the last RECENT batches."""
    print(f"\nstate per stateful operator (growth over the last {RECENT} micro-batches)", file=out)
    operators = _operators(progress)
    if operators.empty:
        print("  no stateful micro-batches recorded yet", file=out)
        return
    header = ["flow", "operator", "state rows", "growth", "memory MiB", "watermark (UTC)"]
    _print_table(header, _state_rows(operators), out, {2, 3, 4})


def _state_rows(operators: pd.DataFrame) -> list[list]:
    """Per flow and operator, from its latest micro-batch: state rows, their growth since
    RECENT micro-batches before, state memory and the watermark."""
    rows = []
    for (flow, index), group in operators.groupby(["flow", "operator_index"], sort=True):
        group = group.sort_values(["timestamp", "batch_id"])
        now, before = group.iloc[-1], group.iloc[max(0, len(group) - RECENT)]
        growth = int(now.state_rows) - int(before.state_rows)
        rows.append(
            [
                flow,
                f"{int(index)} {now.operator}",
                f"{int(now.state_rows):,}",
                f"{growth:+,}",
                f"{(now.state_memory_bytes or 0) / 2**20:.1f}",
                _when(now.watermark),
            ]
        )
    return rows


def _print_failed_rules(settings: Settings, out: TextIO) -> None:
    """The quality rules that failed (ops.quality_results), with micro-batches and rows."""
    quality = read_table(settings, "ops.quality_results")
    print("\nquality rules that failed", file=out)
    failed = None if quality.empty else quality[~quality["success"].astype(bool)]
    if failed is None or failed.empty:
        print("  none", file=out)
        return
    summary = failed.groupby(["table", "rule", "action"], as_index=False).agg(
        batches=("batch_id", "nunique"), rows=("unexpected_count", "sum")
    )
    rows = [
        [r.table, r.rule, r.action, r.batches, f"{int(r.rows):,}"] for r in summary.itertuples()
    ]
    _print_table(["table", "rule", "action", "micro-batches", "rows"], rows, out, {3, 4})


def _print_marks(settings: Settings, out: TextIO) -> None:
    """Per gold table, up to when its rows are final (:func:`current_marks`)."""
    print(
        "\ngold rows final before (ops.completeness: the flow's watermark after its last "
        "micro-batch)",
        file=out,
    )
    marks = current_marks(settings)
    if marks.empty:
        print("  no mark yet: no gold micro-batch has moved a watermark", file=out)
        return
    rows = [
        [r.table, r.column, _when(r.complete_through), _when(r.recorded_at)]
        for r in marks.itertuples()
    ]
    _print_table(["table", "rows whose", "are before", "as of"], rows, out, set())


def _print_drops(progress: pd.DataFrame, out: TextIO) -> None:
    """Per flow, the rows its stateful operators dropped as late or duplicate, over every run."""
    print("\nrows dropped, over every run (late: behind the watermark)", file=out)
    operators = _operators(progress)
    if operators.empty:
        print("  none recorded yet", file=out)
        return
    drops = operators.groupby("flow", as_index=False).agg(
        late=("rows_dropped_by_watermark", "sum"), duplicates=("duplicates_dropped", "sum")
    )
    rows = [[r.flow, f"{int(r.late):,}", f"{int(r.duplicates):,}"] for r in drops.itertuples()]
    _print_table(["flow", "late rows", "duplicates"], rows, out, {1, 2})
