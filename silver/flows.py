"""The silver flows."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakehouse.flows import Flow, Output, TableInput, in_background
from lakehouse.quality import FAILED, RESULTS_TABLE, enforce_fail_rules, validate
from silver import attribution, events, quarantine


def _check_events(batch, batch_id: int):
    """The fail rules on the kept rows (before anything is written), then, in the background
    while the batch is written, great-expectations' results of the batch: every row, kept or
    quarantined (none for a no-data batch, which only moves the watermark)."""
    rules = events.rules()
    enforce_fail_rules(batch.where(F.col(quarantine.ROUTE) == events.TABLE), rules, events.TABLE)

    def results():
        data = batch.select(*events.COLUMNS)
        return None if data.isEmpty() else validate(data, rules, events.TABLE, batch_id)

    return {RESULTS_TABLE: in_background(results)}


def _check_attribution(batch, batch_id: int):
    """The fail rules on each side's kept rows, then in the background great-expectations'
    results of each side's input rows in the batch (kept or quarantined)."""
    sides = {
        side: (attribution.side_rows(batch, side), rules())
        for side, (_c, rules) in attribution.SIDES.items()
    }
    for rows, rules in sides.values():
        checked = rows.where(F.col(quarantine.ROUTE) == quarantine.CHECKED)
        enforce_fail_rules(checked, rules, attribution.TABLE)

    def results():
        found = [
            validate(rows.drop(FAILED, quarantine.ROUTE), rules, attribution.TABLE, batch_id)
            for rows, rules in sides.values()
            if not rows.isEmpty()
        ]
        return reduce(DataFrame.unionByName, found) if found else None

    return {RESULTS_TABLE: in_background(results)}


FLOWS = (
    Flow(
        name="silver.events",
        description="bronze.events checked, watermarked and deduplicated by event_id",
        inputs=(TableInput("bronze.events"),),
        transform=events.silver_events,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(events.TABLE, events.events_rows, events.SCHEMA, event_time="event_time"),
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
            Output(
                attribution.TABLE,
                attribution.attribution_rows,
                attribution.SCHEMA,
                event_time="impression_time",
            ),
            Output(quarantine.TABLE, quarantine.quarantine_rows, quarantine.SCHEMA),
        ),
        before_write=_check_attribution,
    ),
)
