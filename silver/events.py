"""silver.events: bronze events typed and cleaned, checked by the quality rules, watermarked
and deduplicated by ``event_id`` within the watermark.

One streaming query: rows breaking a ``drop`` rule leave before the watermark sees them (to
silver.quarantine); the rest go through ``withWatermark`` and ``dropDuplicatesWithinWatermark``
to silver.events, and those it drops as late to silver.late_events. The branches come out of
the same query as one stream marked by ``_route``.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from bronze.sources import SCHEMAS
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
from silver.quarantine import ROUTE, branches, to_quarantine, unpushed, watermarked

# package data, read through importlib so that it also loads from a zip (spark-submit --py-files)
RULES_FILE = resources.files("silver") / "rules" / "events.toml"
TABLE = "silver.events"
# the bronze fields of the contract, cleaned, plus the landing file they came from
SCHEMA = StructType([*SCHEMAS["events"].fields, StructField("_source_file", StringType())])
COLUMNS = tuple(SCHEMA.fieldNames())


def rules() -> tuple[Rule, ...]:
    return load_rules(RULES_FILE)


def clean_events(bronze: DataFrame) -> DataFrame:
    """Typed, trimmed and normalised columns of the contract (codes in one case)."""
    return bronze.select(
        F.trim("event_id").alias("event_id"),
        "user_id",
        F.lower(F.trim("event_type")).alias("event_type"),
        F.trim("page").alias("page"),
        "amount",
        "event_time",
        F.lower(F.trim("device")).alias("device"),
        F.upper(F.trim("country")).alias("country"),
        "_source_file",
    )


def silver_events(
    bronze: DataFrame, *, watermark: str, quality: Sequence[Rule] | None = None
) -> DataFrame:
    """The routed stream: silver.events rows and silver.quarantine rows (``_route``)."""
    quality = rules() if quality is None else quality
    flagged = flag(clean_events(bronze), quality)
    bad = dropped(quality)
    # one pass over the input: the watermark follows the rows that pass the rules only (a
    # quarantined row's time may be null or absurd), then every row is hashed by the
    # deduplication key, and both branches read that one shuffle (Spark reuses the
    # exchange), so each bronze row is read, and counted as input, once
    rows = watermarked(flagged, bad, "event_time", watermark).repartition("event_id")
    kept = rows.where(unpushed(~bad)).dropDuplicatesWithinWatermark(["event_id"])
    # every input row once more, outside the deduplication: the bad ones to quarantine, the
    # others kept in the micro-batch to be validated and, when late, written to
    # silver.late_events
    return branches(kept.withColumn(ROUTE, F.lit(TABLE)), to_quarantine(rows, TABLE, bad))


def events_rows(routed: DataFrame) -> DataFrame:
    return routed.where(F.col(ROUTE) == TABLE).select(*COLUMNS)


def _check(batch: DataFrame, batch_id: int, batch_rows: int):
    """The fail rules on the kept rows, the results on every input row (kept, quarantined,
    duplicate or late)."""
    rows = batch.where(F.col(ROUTE) != TABLE).select(*COLUMNS)
    kept = batch.where(F.col(ROUTE) == TABLE)
    return check_batch([(kept, rows, rules())], TABLE, batch_id, batch_rows)


def late_rows(routed: DataFrame) -> DataFrame:
    return late.late_rows(routed, TABLE, {None: ("bronze.events", "event_time", COLUMNS[:-1])})


FLOW = Flow(
    name="silver.events",
    description="bronze.events checked, watermarked and deduplicated by event_id",
    inputs=(TableInput("bronze.events"),),
    transform=silver_events,
    params=lambda settings: {"watermark": settings.watermarks.events},
    outputs=(
        Output(TABLE, events_rows, SCHEMA, event_time="event_time"),
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

__all__ = ["FAILED", "FLOW", "clean_events", "events_rows", "rules", "silver_events"]
