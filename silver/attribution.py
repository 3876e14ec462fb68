"""silver.ad_attribution: impressions LEFT OUTER JOIN clicks within an hour, in one query.

Each side is checked by its quality rules (rows breaking a drop rule go to silver.quarantine
before any watermark sees them), watermarked (impressions 2 hours, clicks 3 hours by default)
and deduplicated within its watermark; then every impression is joined to the clicks on it
whose time is between the impression's time and one hour later. An impression nobody clicked
in time comes out once, with null click columns, when the watermark has passed the hour.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse.quality import Rule, dropped, flag, load_rules
from silver.quarantine import ROUTE, to_quarantine

TABLE = "silver.ad_attribution"
RULES = Path(__file__).with_name("rules")
COLUMNS = (
    "impression_id",
    "ad_id",
    "campaign_id",
    "user_id",
    "impression_time",
    "click_id",
    "click_time",
)
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
    """The routed stream: silver.ad_attribution rows and silver.quarantine rows (``_route``)."""
    imp_rules, clk_rules = impression_rules(), click_rules()
    imp = flag(
        impressions.select(
            "impression_id", "ad_id", "campaign_id", "user_id", "impression_time", "_source_file"
        ),
        imp_rules,
    )
    clk = flag(
        clicks.select(
            "click_id", "impression_id", "ad_id", "user_id", "click_time", "_source_file"
        ),
        clk_rules,
    )
    imp_bad, clk_bad = dropped(imp_rules), dropped(clk_rules)
    i = (
        imp.where(~imp_bad)
        .withWatermark("impression_time", impressions_watermark)
        .dropDuplicatesWithinWatermark(["impression_id"])
        .alias("i")
    )
    c = (
        clk.where(~clk_bad)
        .withWatermark("click_time", clicks_watermark)
        .dropDuplicatesWithinWatermark(["click_id"])
        .alias("c")
    )
    joined = i.join(
        c,
        F.expr(
            "c.impression_id = i.impression_id AND c.click_time >= i.impression_time"
            f" AND c.click_time <= i.impression_time + interval {CLICK_WINDOW}"
        ),
        "leftOuter",
    ).select(
        *[
            F.col(f"i.{n}")
            for n in ("impression_id", "ad_id", "campaign_id", "user_id", "impression_time")
        ],
        F.col("c.click_id"),
        F.col("c.click_time"),
        F.col("i._source_file"),
        F.lit(TABLE).alias(ROUTE),
    )
    quarantined = to_quarantine(imp.where(imp_bad), TABLE).unionByName(
        to_quarantine(clk.where(clk_bad), TABLE), allowMissingColumns=True
    )
    return joined.unionByName(quarantined, allowMissingColumns=True)


def attribution_rows(routed: DataFrame) -> DataFrame:
    return routed.where(F.col(ROUTE) == TABLE).select(*COLUMNS)
