"""silver.quarantine: rows of any silver flow that broke a ``drop`` quality rule."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType, TimestampType

from lakehouse.quality import FAILED

TABLE = "silver.quarantine"
ROUTE = "_route"  # the table a row of a routed silver stream belongs to
SCHEMA = StructType(
    [
        StructField("table", StringType()),
        StructField("rules", ArrayType(StringType())),
        StructField("record", StringType()),
        StructField("_source_file", StringType()),
        StructField("_quarantined_at", TimestampType()),
    ]
)


def to_quarantine(rows: DataFrame, table: str) -> DataFrame:
    """Flagged rows as quarantine rows: the table they were meant for, the rules they broke,
    the row itself as JSON; plus the quarantine columns under their own names (to route)."""
    data = [c for c in rows.columns if c not in (FAILED, "_source_file")]
    return rows.select(
        *[F.col(c) for c in rows.columns if c != FAILED],
        F.lit(table).alias("_q_table"),
        F.col(FAILED).alias("_q_rules"),
        F.to_json(F.struct(*data)).alias("_q_record"),
        F.lit(TABLE).alias(ROUTE),
    )


def quarantine_rows(routed: DataFrame) -> DataFrame:
    return routed.where(F.col(ROUTE) == TABLE).select(
        F.col("_q_table").alias("table"),
        F.col("_q_rules").alias("rules"),
        F.col("_q_record").alias("record"),
        "_source_file",
        F.current_timestamp().alias("_quarantined_at"),
    )
