"""silver.ad_attribution: impressions LEFT OUTER JOIN clicks within an hour, in one query.

Each side is checked by its quality rules (rows breaking a drop rule go to silver.quarantine
before any watermark sees them), watermarked (impressions 2 hours, clicks 3 hours by default)
and deduplicated within its watermark; then every impression is joined to the clicks on it
whose time is between the impression's time and one hour later. An impression nobody clicked
in time comes out once, with null click columns, when the watermark has passed the hour.
"""

from __future__ import annotations

from importlib import resources

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from lakehouse.flows import Flow, Output, TableInput
from lakehouse.quality import (
    FAILED,
    Rule,
    check_batch,
    dropped,
    flag,
    load_rules,
)
from silver import late, quarantine
from silver.quarantine import (
    CHECKED,
    ROUTE,
    SIDE,
    WATERMARK,
    branches,
    to_quarantine,
    unpushed,
    watermarked,
)

TABLE = "silver.ad_attribution"
RULES = resources.files("silver") / "rules"  # package data: also loads from a zip
SCHEMA = StructType(
    [
        StructField("impression_id", StringType()),
        StructField("ad_id", LongType()),
        StructField("campaign_id", LongType()),
        StructField("user_id", LongType()),
        StructField("impression_time", TimestampType()),
        StructField("click_id", StringType()),
        StructField("click_time", TimestampType()),
    ]
)
COLUMNS = tuple(SCHEMA.fieldNames())
IMPRESSION_COLUMNS = ("impression_id", "ad_id", "campaign_id", "user_id", "impression_time")
CLICK_COLUMNS = ("click_id", "impression_id", "ad_id", "user_id", "click_time")
CLICK_WINDOW = "1 hour"


def impression_rules() -> tuple[Rule, ...]:
    return load_rules(RULES / "impressions.toml")


def click_rules() -> tuple[Rule, ...]:
    return load_rules(RULES / "clicks.toml")


def attribution(
    impressions: DataFrame,
    clicks: DataFrame,
    *,
    impressions_watermark: str,
    clicks_watermark: str,
) -> DataFrame:
    """The routed stream (``_route``): silver.ad_attribution rows, then every input row of
    both sides (``_side``) as a silver.quarantine row or a row only to validate."""
    imp_rules, clk_rules = impression_rules(), click_rules()
    imp = flag(impressions.select(*IMPRESSION_COLUMNS, "_source_file"), imp_rules)
    clk = flag(clicks.select(*CLICK_COLUMNS, "_source_file"), clk_rules)
    imp_bad, clk_bad = dropped(imp_rules), dropped(clk_rules)
    # one pass over each side's input: its watermark follows the rows that pass its rules
    # only, then every row is hashed by the side's deduplication key, and both branches read
    # that one shuffle (Spark reuses the exchange), so each bronze row is read, and counted
    # as input, once. The join's time condition is on the watermark columns (equal to the
    # event times on the rows it sees), which tell Spark when it may let go of its state.
    imp_rows = watermarked(imp, imp_bad, "impression_time", impressions_watermark)
    imp_rows = imp_rows.repartition("impression_id")
    clk_rows = watermarked(clk, clk_bad, "click_time", clicks_watermark).repartition("click_id")
    i = imp_rows.where(unpushed(~imp_bad)).dropDuplicatesWithinWatermark(["impression_id"])
    c = clk_rows.where(unpushed(~clk_bad)).dropDuplicatesWithinWatermark(["click_id"])
    joined = (
        i.alias("i")
        .join(
            c.alias("c"),
            F.expr(
                f"c.impression_id = i.impression_id AND c.{WATERMARK} >= i.{WATERMARK}"
                f" AND c.{WATERMARK} <= i.{WATERMARK} + interval {CLICK_WINDOW}"
            ),
            "leftOuter",
        )
        .select(
            *[F.col(f"i.{n}") for n in IMPRESSION_COLUMNS],
            F.col("c.click_id"),
            F.col("c.click_time"),
            F.col("i._source_file"),
            F.lit(TABLE).alias(ROUTE),
            # written nowhere: every column of the clicks the join saw, so that Spark reads
            # them all on this side too and the clicks' shuffle stays the one both branches
            # share (pruned to the columns used, it would be another, and read again)
            F.struct(*[F.col(f"c.{n}") for n in (*CLICK_COLUMNS, "_source_file")]).alias(
                "_clicks_read"
            ),
        )
    )
    # every input row once more, outside the join: the bad ones to quarantine, the others kept
    # in the micro-batch for great-expectations to see the whole input of both sides
    return branches(
        joined,
        to_quarantine(imp_rows.withColumn(SIDE, F.lit("impressions")), TABLE, imp_bad),
        to_quarantine(clk_rows.withColumn(SIDE, F.lit("clicks")), TABLE, clk_bad),
    )


SIDES = {  # input name: (its columns, its rules)
    "impressions": (IMPRESSION_COLUMNS, impression_rules),
    "clicks": (CLICK_COLUMNS, click_rules),
}


def side_rows(routed: DataFrame, side: str) -> DataFrame:
    """The input rows of one side in a routed micro-batch (kept or quarantined), with the
    rules each broke."""
    columns, _rules = SIDES[side]
    return routed.where(F.col(SIDE) == side).select(
        *columns, F.col("_q_rules").alias(FAILED), ROUTE
    )


def attribution_rows(routed: DataFrame) -> DataFrame:
    return routed.where(F.col(ROUTE) == TABLE).select(*COLUMNS)


def late_rows(routed: DataFrame) -> DataFrame:
    """The rows either side's deduplication dropped as late (the sides share the query's
    watermark: the lower of the two)."""
    return late.late_rows(
        routed,
        TABLE,
        {
            "impressions": ("bronze.impressions", "impression_time", IMPRESSION_COLUMNS),
            "clicks": ("bronze.clicks", "click_time", CLICK_COLUMNS),
        },
    )


def _check(batch: DataFrame, batch_id: int, batch_rows: int):
    """The fail rules on each side's kept rows, the results on each side's input rows in the
    batch, kept or quarantined."""
    parts = []
    for side, (_columns, rules) in SIDES.items():
        rows = side_rows(batch, side)
        parts.append((rows.where(F.col(ROUTE) == CHECKED), rows.drop(FAILED, ROUTE), rules()))
    return check_batch(parts, TABLE, batch_id, batch_rows)


FLOW = Flow(
    name="silver.ad_attribution",
    description="impressions left outer join clicks within an hour, both deduplicated",
    inputs=(TableInput("bronze.impressions"), TableInput("bronze.clicks")),
    transform=attribution,
    params=lambda settings: {
        "impressions_watermark": settings.watermarks.impressions,
        "clicks_watermark": settings.watermarks.clicks,
    },
    outputs=(
        Output(TABLE, attribution_rows, SCHEMA, event_time="impression_time"),
        Output(
            quarantine.TABLE,
            quarantine.quarantine_rows,
            quarantine.SCHEMA,
            shared_by=("table", TABLE),
        ),
        Output(late.TABLE, late_rows, late.SCHEMA, shared_by=("flow", TABLE)),
    ),
    before_write=_check,
)
