"""silver.quarantine: rows of any silver flow that broke a ``drop`` quality rule."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType, TimestampType

from lakehouse.quality import FAILED

TABLE = "silver.quarantine"
ROUTE = "_route"  # the table a row of a routed silver stream belongs to
CHECKED = "_checked"  # route of rows kept in a micro-batch to be validated, written nowhere
SIDE = "_side"  # which input of a flow a quarantined or checked row came from
WATERMARK = "_watermark_time"  # the event time the watermark follows: null on a bad row
SCHEMA = StructType(
    [
        StructField("table", StringType()),
        StructField("rules", ArrayType(StringType())),
        StructField("record", StringType()),
        StructField("_source_file", StringType()),
        StructField("_quarantined_at", TimestampType()),
    ]
)


def to_quarantine(rows: DataFrame, table: str, bad: Column | None = None) -> DataFrame:
    """Flagged rows as quarantine rows: the table they were meant for, the rules they broke,
    the row itself as JSON; plus the quarantine columns under their own names (to route).

    With ``bad``, every row is kept: those for which it holds as quarantine rows, the others
    routed :data:`CHECKED`, so that the micro-batch holds every input row for validation."""
    data = [c for c in rows.columns if not c.startswith("_")]
    record = F.to_json(F.struct(*data))
    route = F.lit(TABLE)
    if bad is not None:
        record = F.when(bad, record)
        route = F.when(bad, route).otherwise(F.lit(CHECKED))
    return rows.select(
        *[F.col(c) for c in rows.columns if c != FAILED],
        F.lit(table).alias("_q_table"),
        F.col(FAILED).alias("_q_rules"),
        record.alias("_q_record"),
        route.alias(ROUTE),
    )


def quarantine_rows(routed: DataFrame) -> DataFrame:
    return routed.where(F.col(ROUTE) == TABLE).select(
        F.col("_q_table").alias("table"),
        F.col("_q_rules").alias("rules"),
        F.col("_q_record").alias("record"),
        "_source_file",
        F.current_timestamp().alias("_quarantined_at"),
    )


def watermarked(rows: DataFrame, bad: Column, time: str, delay: str) -> DataFrame:
    """``rows`` with the watermark on :data:`WATERMARK`: ``time``, but null for a row that
    breaks a drop rule, so that a quarantined row never moves it (a null time is not
    seen). The stateful operators after it take that column for their event time."""
    return rows.withColumn(WATERMARK, F.when(~bad, F.col(time))).withWatermark(WATERMARK, delay)


def unpushed(condition: Column) -> Column:
    """``condition`` as a filter the optimizer leaves where it is: not pushed below the
    shuffle that the branches of a routed stream share, which it would then no longer be.
    (A nondeterministic expression is never pushed down; this one always equals
    ``condition``. A conditional would not do: a CASE WHEN in a filter becomes a conjunction
    whose deterministic part is pushed; nor would rand(): Spark folds ``rand() >= 0`` to
    true.)"""
    return condition == (F.spark_partition_id() >= 0)


def branches(first: DataFrame, *others: DataFrame) -> DataFrame:
    """The union by name of a routed stream's branches, each column of each renamed anew:
    the optimizer then drops the aliases inside every branch alike, so the branches' shared
    part stays the same plan in each, and Spark computes it once (its exchange reused)."""

    def fresh(branch: DataFrame) -> DataFrame:
        return branch.select(*[F.col(c).alias(c) for c in branch.columns])

    out = fresh(first)
    for branch in others:
        out = out.unionByName(fresh(branch), allowMissingColumns=True)
    return out
