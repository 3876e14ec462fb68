"""gold.sessions: one row per user session, from ``session_window`` over silver.events.

A session is a maximal run of one user's events in which consecutive events are at most
15 minutes apart (a gap of exactly 15 minutes stays in one session); it ends at its last
event time plus 15 minutes. In append mode a session comes out once, when the watermark has
passed its end: no later event can extend it then.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle

TABLE = "gold.sessions"
GAP = "15 minutes"
SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("session_start", TimestampType()),
        StructField("session_end", TimestampType()),
        StructField("events", LongType()),
        StructField("purchases", LongType()),
        StructField("revenue", DoubleType()),
    ]
)


def activity_totals() -> list:
    """The aggregate columns ``events``, ``purchases`` and ``revenue`` (0.0 without one) of a
    group of silver.events rows, shared by the gold tables that report them."""
    purchase = F.col("event_type") == "purchase"
    return [
        F.count(F.lit(1)).alias("events"),
        F.count(F.when(purchase, 1)).alias("purchases"),
        F.coalesce(F.sum(F.when(purchase, F.col("amount"))), F.lit(0.0)).alias("revenue"),
    ]


def sessions(events: DataFrame, *, watermark: str, gap: str = GAP) -> DataFrame:
    """Sessions of each user from a stream of silver.events rows."""
    return (
        events.withWatermark("event_time", watermark)
        .groupBy("user_id", F.session_window("event_time", gap).alias("session"))
        .agg(*activity_totals())
        .select(
            "user_id",
            F.col("session.start").alias("session_start"),
            F.col("session.end").alias("session_end"),
            "events",
            "purchases",
            "revenue",
        )
    )


FLOW = Flow(
    name="gold.sessions",
    description="session_window(event_time, 15 minutes) per user",
    inputs=(TableInput("silver.events"),),
    transform=sessions,
    params=lambda settings: {"watermark": settings.watermarks.events},
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            complete_by="session_end",
            zorder_by=("user_id",),
            reference=Reference(oracle.sessions_table, ("user_id", "session_start")),
        ),
    ),
)
