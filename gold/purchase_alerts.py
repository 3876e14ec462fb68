"""gold.purchase_alerts: an alert when a user makes 3 or more purchases within 1 minute.

A purchase alerts when, counting it, the user made at least ``threshold`` purchases in the
minute up to it (``(time - 1 minute, time]``): in a burst of 4 purchases within a minute the
3rd and the 4th alert. The answer does not depend on arrival order: a purchase arriving late
(within ``lateness``) makes the later purchases of its minute alert if they now qualify, and
each purchase alerts at most once (its alert is recorded in the state).

A ``transformWithStateInPandas`` processor per user (its class is in :mod:`gold.processors`),
in the ProcessingTime mode so that its ListState of recent purchases (time, event id, amount,
alerted) carries a TTL: a user who stops buying is forgotten ``ttl`` after their last purchase
was processed. Its input has the
events watermark, as every gold flow's: a purchase behind it is dropped (and counted), so the
alerts of the purchases before the watermark are final (ops.completeness). The list itself is
pruned to the purchases that can still matter: within ``lateness`` plus 1 minute of the
user's latest purchase.
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

# the processor lives where Spark's driver can unpickle it without numpy and pandas
from gold.processors import THRESHOLD, PurchaseAlertProcessor
from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle
from lakehouse.settings import duration_seconds

TABLE = "gold.purchase_alerts"
SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("event_id", StringType()),  # the purchase that alerted
        StructField("purchase_time", TimestampType()),
        StructField("purchases_in_minute", LongType()),  # in (purchase_time - 1 min, time]
        StructField("amount_in_minute", DoubleType()),
    ]
)


def purchase_alerts(
    events: DataFrame, *, ttl: str, lateness: str, threshold: int = THRESHOLD
) -> DataFrame:
    """Alert rows from a stream of silver.events rows."""
    processor = PurchaseAlertProcessor(
        duration_seconds(ttl) * 1000, duration_seconds(lateness) * 1000, threshold
    )
    return (
        events.withWatermark("event_time", lateness)
        .where(F.col("event_type") == "purchase")
        .select("user_id", "event_id", "event_time", "amount")
        .groupBy("user_id")
        .transformWithStateInPandas(processor, SCHEMA, "append", "ProcessingTime")
    )


ALERT_IDENTITY = ("user_id", "event_id", "purchase_time")

FLOW = Flow(
    name="gold.purchase_alerts",
    description="an alert per purchase that is the 3rd (or later) within 1 minute",
    inputs=(TableInput("silver.events"),),
    transform=purchase_alerts,
    params=lambda settings: {
        "ttl": settings.gold.state_ttl,
        "lateness": settings.watermarks.events,
    },
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            zorder_by=("user_id",),
            complete_by="purchase_time",
            # an alert carries the figures of the moment it was raised, which depend on the
            # batches: the purchases that alert do not
            reference=Reference(
                oracle.purchase_alerts_table,
                ALERT_IDENTITY,
                columns=ALERT_IDENTITY,
                note="which purchases alert",
            ),
        ),
    ),
    stops_itself=False,  # ProcessingTime mode (TTL): endless no-data micro-batches
)
