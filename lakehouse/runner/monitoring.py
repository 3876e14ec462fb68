"""The runner's books: ``ops.stream_progress`` and ``ops.runs``.

``ops.stream_progress`` has one row per micro-batch and stateful operator of every flow: the
runner's query listener hands each progress event to :class:`ProgressRecorder`. A micro-batch
without stateful operators gets one row with a null operator. Spark reports a batch after it
committed, so a job killed in between leaves a committed batch unrecorded; the runner finds such
batches (:func:`recorded_batches`) and recounts them before the flow's next start.
``ops.runs`` has one row per flow and run (start, end, status, micro-batches, rows, error),
written by :func:`record_runs` when a run ends, failed runs included. ``ops.completeness``
has a row per gold table each time its flow's watermark moves: the event time before which
the table's rows are final (:func:`completeness_rows`). Both are appended with
delta-rs from the driver (no Spark job, so recording never competes with the flows); a failure
to record is logged, never raised into a flow.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, NamedTuple

import pyarrow as pa

from lakehouse.settings import Settings
from lakehouse.storage import deltafiles as dfiles


class Drops(NamedTuple):
    """Rows the stateful operators of a flow dropped: behind the watermark, or duplicates."""

    late: int
    duplicates: int


log = logging.getLogger(__name__)
TABLE = "ops.stream_progress"
SCHEMA = pa.schema(
    [
        ("flow", pa.string()),
        ("query_id", pa.string()),
        ("run_id", pa.string()),
        ("batch_id", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("input_rows", pa.int64()),
        ("input_rows_per_second", pa.float64()),
        ("processed_rows_per_second", pa.float64()),
        ("batch_duration_ms", pa.int64()),
        ("durations_ms", pa.string()),  # JSON: addBatch, getBatch, queryPlanning, walCommit, ...
        ("watermark", pa.timestamp("us", tz="UTC")),
        ("operator", pa.string()),
        ("operator_index", pa.int32()),
        ("state_rows", pa.int64()),
        ("state_rows_updated", pa.int64()),
        ("state_rows_removed", pa.int64()),
        ("state_memory_bytes", pa.int64()),
        ("rows_dropped_by_watermark", pa.int64()),
        ("duplicates_dropped", pa.int64()),
    ]
)


def _time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN (no rows yet) as null


def progress_rows(progress: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one progress event (the dict of ``StreamingQueryProgress.json``)."""
    base = {
        "flow": progress.get("name"),
        "query_id": progress.get("id"),
        "run_id": progress.get("runId"),
        "batch_id": progress.get("batchId"),
        "timestamp": _time(progress.get("timestamp")),
        "input_rows": progress.get("numInputRows"),
        "input_rows_per_second": _float(progress.get("inputRowsPerSecond")),
        "processed_rows_per_second": _float(progress.get("processedRowsPerSecond")),
        "batch_duration_ms": progress.get("batchDuration"),
        "durations_ms": json.dumps(progress.get("durationMs") or {}, sort_keys=True),
        "watermark": _time((progress.get("eventTime") or {}).get("watermark")),
    }
    operators = progress.get("stateOperators") or []
    if not operators:
        return [{**base, "operator": None, "operator_index": None}]
    rows = []
    for index, op in enumerate(operators):
        rows.append(
            {
                **base,
                "operator": op.get("operatorName"),
                "operator_index": index,
                "state_rows": op.get("numRowsTotal"),
                "state_rows_updated": op.get("numRowsUpdated"),
                "state_rows_removed": op.get("numRowsRemoved"),
                "state_memory_bytes": op.get("memoryUsedBytes"),
                "rows_dropped_by_watermark": op.get("numRowsDroppedByWatermark"),
                "duplicates_dropped": (op.get("customMetrics") or {}).get(
                    "numDroppedDuplicateRows"
                ),
            }
        )
    return rows


def recorded_batches(settings: Settings, since: dict[str, int]) -> dict[str, set[int]]:
    """The micro-batches ops.stream_progress holds of the queries in ``since`` (query id: first
    batch id of interest), as batch ids per query id. Only the files whose statistics can hold
    such rows are read: the table gets a file per micro-batch until maintenance compacts it."""
    path = settings.table_path(TABLE)
    if not since or not dfiles.is_delta_table(path):
        return {}
    predicate = " OR ".join(f"(query_id = '{q}' AND batch_id >= {b:d})" for q, b in since.items())
    rows = dfiles.read_arrow(path, ["query_id", "batch_id"], files_where=predicate).to_pydict()
    recorded: dict[str, set[int]] = {}
    for query, batch in zip(rows["query_id"], rows["batch_id"], strict=True):
        recorded.setdefault(query, set()).add(batch)
    return recorded


COMPLETENESS_TABLE = "ops.completeness"
COMPLETENESS_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("flow", pa.string()),
        # the table's rows whose `column` is before this time are final: nothing is added to
        # them or changed any more (late rows aside, which the flow drops and counts)
        ("complete_through", pa.timestamp("us", tz="UTC")),
        ("column", pa.string()),
        ("query_id", pa.string()),
        ("batch_id", pa.int64()),  # the micro-batch whose watermark it is
        ("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)


def completeness_rows(
    progress: dict[str, Any], outputs: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """The complete-through marks a micro-batch's progress gives ``outputs`` ((table,
    column) of its flow): its watermark, the event time every stateful operator of the
    flow has closed its rows up to (none before the first watermark)."""
    watermark = _time((progress.get("eventTime") or {}).get("watermark"))
    if watermark is None or watermark.timestamp() <= 0:
        return []
    now = dt.datetime.now(dt.UTC)
    return [
        {
            "table": table,
            "flow": progress.get("name"),
            "complete_through": watermark,
            "column": column,
            "query_id": progress.get("id"),
            "batch_id": progress.get("batchId"),
            "recorded_at": now,
        }
        for table, column in outputs
    ]


class ProgressRecorder:
    """Appends progress rows to ops.stream_progress under a lake root, and to ops.completeness
    the marks of the flows in ``marks`` (flow: its (table, column) pairs) when they move."""

    def __init__(self, settings: Settings, marks: dict[str, list[tuple[str, str]]] | None = None):
        self.root = str(settings.table_path(TABLE).absolute())
        self.completeness = str(settings.table_path(COMPLETENESS_TABLE).absolute())
        self.marks = marks or {}
        self.last_mark: dict[str, Any] = {}  # per flow, the mark last recorded

    def record(self, progress: dict[str, Any]) -> None:
        dfiles.append_rows(self.root, SCHEMA, progress_rows(progress))
        flow = progress.get("name")
        rows = completeness_rows(progress, self.marks.get(flow, []))
        if rows and self.last_mark.get(flow) != rows[0]["complete_through"]:
            dfiles.append_rows(self.completeness, COMPLETENESS_SCHEMA, rows)
            self.last_mark[flow] = rows[0]["complete_through"]

    def record_progress(self, progress: dict) -> None:
        """Record one progress (Spark's JSON of it, parsed); never raises."""
        try:
            self.record(progress)
        except Exception as exc:  # monitoring must never break a flow
            log.warning("could not record stream progress in %s: %s", TABLE, exc)


RUNS_TABLE = "ops.runs"
RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),  # one per run_flows call: the flows started together
        ("flow", pa.string()),
        ("query_id", pa.string()),  # null when the flow failed before its query started
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("ended_at", pa.timestamp("us", tz="UTC")),
        # succeeded | failed | stopped (interrupted) | restarted (an attempt that failed and
        # was started again: one row each, before the flow's own row of the run)
        ("status", pa.string()),
        ("batches", pa.int64()),  # micro-batches that read rows
        ("input_rows", pa.int64()),
        ("late_rows", pa.int64()),
        ("duplicates", pa.int64()),
        ("error", pa.string()),
    ]
)


def record_runs(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Append one row per flow of a run to ops.runs (see RUNS_SCHEMA)."""
    try:
        root = str(settings.table_path(RUNS_TABLE).absolute())
        dfiles.append_rows(root, RUNS_SCHEMA, rows)
    except Exception as exc:  # monitoring must never break a flow
        log.warning("could not record the run in %s: %s", RUNS_TABLE, exc)
