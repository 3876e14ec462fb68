"""gold.ad_performance_hourly: per ad and hour of impression, impressions, clicks and the
click-through rate, from silver.ad_attribution.

silver.ad_attribution has a row per (impression, click) and one row for an impression without
a click, so counting rows would count an impression once per click. One query chains two
aggregations: per impression and hour (its clicks), then per ad and hour (impressions,
clicks). Append mode: an hour comes out once the watermark on ``impression_time`` passes its
end. The watermark (``watermarks.attribution``) must cover how late an unmatched impression
reaches silver: after the join's watermark passes its time plus the 1-hour click window.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StructField, StructType, TimestampType

from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle

TABLE = "gold.ad_performance_hourly"
SCHEMA = StructType(
    [
        StructField("ad_id", LongType()),
        StructField("hour_start", TimestampType()),
        StructField("hour_end", TimestampType()),
        StructField("impressions", LongType()),
        StructField("clicks", LongType()),
        StructField("click_through_rate", DoubleType()),
    ]
)


def ad_performance(attribution: DataFrame, *, watermark: str) -> DataFrame:
    """Per ad and hour, from a stream of silver.ad_attribution rows."""
    per_impression = (
        attribution.withWatermark("impression_time", watermark)
        .groupBy("ad_id", "impression_id", F.window("impression_time", "1 hour"))
        .agg(F.count("click_id").alias("clicks"))
    )
    return (
        per_impression.groupBy("ad_id", F.window(F.col("window"), "1 hour").alias("hour"))
        .agg(F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks"))
        .select(
            "ad_id",
            F.col("hour.start").alias("hour_start"),
            F.col("hour.end").alias("hour_end"),
            "impressions",
            "clicks",
            (F.col("clicks") / F.col("impressions")).alias("click_through_rate"),
        )
    )


FLOW = Flow(
    name="gold.ad_performance_hourly",
    description="per ad and hour: impressions (once each), clicks, click-through rate",
    inputs=(TableInput("silver.ad_attribution"),),
    transform=ad_performance,
    params=lambda settings: {"watermark": settings.watermarks.attribution},
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            complete_by="hour_end",
            zorder_by=("ad_id",),
            reference=Reference(oracle.ad_performance_hourly_table, ("ad_id", "hour_start")),
        ),
    ),
)
