"""The silver flows."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bronze.sources import SCHEMAS
from lakehouse.flows import Flow, Output, TableInput
from lakehouse.quality import RESULTS_TABLE, enforce_fail_rules, validate
from silver import attribution, events, quarantine

ATTRIBUTION_SCHEMA = StructType(
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
# the bronze fields of the contract, cleaned, plus the landing file they came from
EVENTS_SCHEMA = StructType([*SCHEMAS["events"].fields, StructField("_source_file", StringType())])


def _check_events(batch, batch_id: int):
    """great-expectations results of the batch (every row, kept or quarantined), then the
    fail rules on the kept rows."""
    rules = events.rules()
    data = batch.select(*events.COLUMNS)
    if data.isEmpty():  # a no-data batch (watermark and state upkeep): nothing to report
        return None
    results = validate(data, rules, events.TABLE, batch_id)
    enforce_fail_rules(batch.where(F.col(quarantine.ROUTE) == events.TABLE), rules, events.TABLE)
    return {RESULTS_TABLE: results}


FLOWS = (
    Flow(
        name="silver.events",
        description="bronze.events checked, watermarked and deduplicated by event_id",
        inputs=(TableInput("bronze.events"),),
        transform=events.silver_events,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(events.TABLE, events.events_rows, EVENTS_SCHEMA),
            Output(quarantine.TABLE, quarantine.quarantine_rows, quarantine.SCHEMA),
        ),
        before_write=_check_events,
    ),
    Flow(
        name="silver.ad_attribution",
        description="impressions left outer join clicks within an hour, both deduplicated",
        inputs=(TableInput("bronze.impressions"), TableInput("bronze.clicks")),
        transform=attribution.attribution,
        params=lambda settings: {
            "impressions_watermark": settings.watermarks.impressions,
            "clicks_watermark": settings.watermarks.clicks,
        },
        outputs=(
            Output(attribution.TABLE, attribution.attribution_rows, ATTRIBUTION_SCHEMA),
            Output(quarantine.TABLE, quarantine.quarantine_rows, quarantine.SCHEMA),
        ),
    ),
)
