"""silver.late_events: the rows of any silver flow that its watermark dropped.

A silver flow's routed micro-batch holds every input row once more, outside its stateful
operators (routed ``_checked``, or to silver.quarantine). The rows of it that passed the
quality rules and whose event time is at or behind the watermark the batch drops late rows
against (``_late_before``, the watermark of the micro-batch before: Spark's rule) are the rows
its deduplication dropped as late: they are written here, with the flow, the batch and that
watermark, in the batch's own exactly-once commit. So each row the watermark drops is kept,
once, and the books of a silver table balance row by row (``lakehouse verify``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from lakehouse.storage.streams import BATCH_ID, LATE_BEFORE
from silver.quarantine import CHECKED, ROUTE, SIDE

TABLE = "silver.late_events"
SCHEMA = StructType(
    [
        StructField("flow", StringType()),  # the silver flow (and table) it was meant for
        StructField("input", StringType()),  # the bronze table it came from
        StructField("record", StringType()),  # the row's contract fields as JSON
        StructField("event_time", TimestampType()),  # its event time
        StructField("batch_id", LongType()),  # the flow's micro-batch that dropped it
        StructField("watermark", TimestampType()),  # it was at or behind this watermark
        StructField("_source_file", StringType()),
        StructField("_dropped_at", TimestampType()),
    ]
)


def late_rows(
    routed: DataFrame, flow: str, inputs: dict[str | None, tuple[str, str, tuple[str, ...]]]
) -> DataFrame:
    """The late rows of a routed micro-batch of ``flow``: per side (``_side``; None for a
    flow of one input), its (bronze table, event-time column, contract columns)."""
    parts = []
    for side, (source, time, columns) in inputs.items():
        rows = routed.where(F.col(ROUTE) == CHECKED)
        if side is not None:
            rows = rows.where(F.col(SIDE) == side)
        parts.append(
            rows.where(F.col(time) <= F.col(LATE_BEFORE)).select(
                F.lit(flow).alias("flow"),
                F.lit(source).alias("input"),
                F.to_json(F.struct(*columns)).alias("record"),
                F.col(time).alias("event_time"),
                F.col(BATCH_ID).alias("batch_id"),
                F.col(LATE_BEFORE).alias("watermark"),
                "_source_file",
                F.current_timestamp().alias("_dropped_at"),
            )
        )
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out
