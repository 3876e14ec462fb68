"""gold.revenue_by_country_hourly: per country and hour, the events, purchases and revenue.

Tumbling hours of event time under the events watermark, in append mode: an hour's row is
written once, in the micro-batch in which the watermark passes its end, and is final. Events
without a country count under ``unknown``. Revenue is the sum of the purchases' amounts (a
purchase without an amount adds 0).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle

TABLE = "gold.revenue_by_country_hourly"
UNKNOWN = "unknown"  # the country of events that name none
SCHEMA = StructType(
    [
        StructField("country", StringType()),
        StructField("hour_start", TimestampType()),
        StructField("hour_end", TimestampType()),
        StructField("events", LongType()),
        StructField("purchases", LongType()),
        StructField("revenue", DoubleType()),
    ]
)


def revenue_by_country(events: DataFrame, *, watermark: str) -> DataFrame:
    purchase = F.col("event_type") == "purchase"
    return (
        events.withWatermark("event_time", watermark)
        .groupBy(
            F.coalesce(F.col("country"), F.lit(UNKNOWN)).alias("country"),
            F.window("event_time", "1 hour").alias("hour"),
        )
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.count(F.when(purchase, 1)).alias("purchases"),
            F.coalesce(F.sum(F.when(purchase, F.col("amount"))), F.lit(0.0)).alias("revenue"),
        )
        .select(
            "country",
            F.col("hour.start").alias("hour_start"),
            F.col("hour.end").alias("hour_end"),
            "events",
            "purchases",
            "revenue",
        )
    )


FLOW = Flow(
    name="gold.revenue_by_country_hourly",
    description="per country and hour: events, purchases, revenue",
    inputs=(TableInput("silver.events"),),
    transform=revenue_by_country,
    params=lambda settings: {"watermark": settings.watermarks.events},
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            complete_by="hour_end",
            zorder_by=("country",),
            reference=Reference(oracle.revenue_by_country_hourly_table, ("country", "hour_start")),
        ),
    ),
)
