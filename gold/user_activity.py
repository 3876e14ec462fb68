"""gold.user_activity_5m and gold.user_activity_hourly: per-user activity in time windows.

gold.user_activity_5m: per user and 5-minute tumbling window, events, purchases and revenue,
in update mode: every micro-batch emits the windows it changed and the writer upserts them
(MERGE by user and window start), so the table always holds each window's latest value, from
the first event on, instead of waiting for the watermark to close the window.

gold.user_activity_hourly: two chained window aggregations in one streaming query.

Per user, events are counted in 5-minute tumbling windows; those windows are then grouped into
1-hour windows (``window(col("window"), "1 hour")``: a window column is placed by its end) with
the hour's total events, the number of active 5-minute windows, and the mean and max of their
counts. Append mode: an hour comes out once the watermark has passed its end, which happens
after each of its 5-minute windows has come out of the first aggregation.
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

from gold.sessions import activity_totals
from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle

FIVE_MINUTE_TABLE = "gold.user_activity_5m"
FIVE_MINUTE_KEYS = ("user_id", "window_start")
FIVE_MINUTE_SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("events", LongType()),
        StructField("purchases", LongType()),
        StructField("revenue", DoubleType()),
    ]
)
HOURLY_TABLE = "gold.user_activity_hourly"
HOURLY_SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("hour_start", TimestampType()),
        StructField("hour_end", TimestampType()),
        StructField("events", LongType()),
        StructField("active_5m_windows", LongType()),
        StructField("mean_events_per_5m", DoubleType()),
        StructField("max_events_per_5m", LongType()),
    ]
)


def five_minute_activity(events: DataFrame, *, watermark: str) -> DataFrame:
    """Per user and 5-minute window, updated as events arrive (update output mode)."""
    return (
        events.withWatermark("event_time", watermark)
        .groupBy("user_id", F.window("event_time", "5 minutes"))
        .agg(*activity_totals())
        .select(
            "user_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "events",
            "purchases",
            "revenue",
        )
    )


def hourly_activity(events: DataFrame, *, watermark: str) -> DataFrame:
    """Per user and hour, from per user 5-minute counts, in one query."""
    five = (
        events.withWatermark("event_time", watermark)
        .groupBy("user_id", F.window("event_time", "5 minutes"))
        .agg(F.count(F.lit(1)).alias("events"))
    )
    return (
        five.groupBy("user_id", F.window(F.col("window"), "1 hour").alias("hour"))
        .agg(
            F.sum("events").alias("events"),
            F.count(F.lit(1)).alias("active_5m_windows"),
            F.avg("events").alias("mean_events_per_5m"),
            F.max("events").alias("max_events_per_5m"),
        )
        .select(
            "user_id",
            F.col("hour.start").alias("hour_start"),
            F.col("hour.end").alias("hour_end"),
            "events",
            "active_5m_windows",
            "mean_events_per_5m",
            "max_events_per_5m",
        )
    )


FLOWS = (
    Flow(
        name="gold.user_activity_5m",
        description="per user 5-minute windows, update mode, upserted by (user, window)",
        inputs=(TableInput("silver.events"),),
        transform=five_minute_activity,
        params=lambda settings: {"watermark": settings.watermarks.events},
        output_mode="update",
        keys=FIVE_MINUTE_KEYS,
        outputs=(
            Output(
                FIVE_MINUTE_TABLE,
                schema=FIVE_MINUTE_SCHEMA,
                complete_by="window_end",
                zorder_by=("user_id",),
                reference=Reference(oracle.user_activity_5m_table, FIVE_MINUTE_KEYS),
            ),
        ),
    ),
    Flow(
        name="gold.user_activity_hourly",
        description="per user 5-minute counts chained into hourly windows, one query",
        inputs=(TableInput("silver.events"),),
        transform=hourly_activity,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(
                HOURLY_TABLE,
                schema=HOURLY_SCHEMA,
                complete_by="hour_end",
                zorder_by=("user_id",),
                reference=Reference(oracle.user_activity_hourly_table, ("user_id", "hour_start")),
            ),
        ),
    ),
)
