"""gold.purchase_alerts: an alert when a user makes 3 or more purchases within 1 minute.

A purchase alerts when, counting it, the user made at least ``threshold`` purchases in the
minute up to it (``(time - 1 minute, time]``): in a burst of 4 purchases within a minute the
3rd and the 4th alert. The answer does not depend on arrival order: a purchase arriving late
(within ``lateness``) makes the later purchases of its minute alert if they now qualify, and
each purchase alerts at most once (its alert is recorded in the state).

A ``transformWithStateInPandas`` processor per user, in the ProcessingTime mode so that its
ListState of recent purchases (time, event id, amount, alerted) carries a TTL: a user who
stops buying is forgotten ``ttl`` after their last purchase was processed. Its input has the
events watermark, as every gold flow's: a purchase behind it is dropped (and counted), so the
alerts of the purchases before the watermark are final (ops.completeness). The list itself is
pruned to the purchases that can still matter: within ``lateness`` plus 1 minute of the
user's latest purchase.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle
from lakehouse.settings import duration_seconds

TABLE = "gold.purchase_alerts"
SPAN_MS = 60_000
THRESHOLD = 3
SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("event_id", StringType()),  # the purchase that alerted
        StructField("purchase_time", TimestampType()),
        StructField("purchases_in_minute", LongType()),  # in (purchase_time - 1 min, time]
        StructField("amount_in_minute", DoubleType()),
    ]
)
_RECENT = StructType(
    [
        StructField("time", LongType()),
        StructField("event_id", StringType()),
        StructField("amount", DoubleType()),
        StructField("alerted", BooleanType()),
    ]
)
_NS_PER_MS = 1_000_000


class PurchaseAlertProcessor(StatefulProcessor):
    """Alerts on bursts of purchases of one user (see the module docstring)."""

    def __init__(self, ttl_ms: int, lateness_ms: int, threshold: int = THRESHOLD):
        self.ttl_ms = ttl_ms
        self.lateness_ms = lateness_ms
        self.threshold = threshold

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.recent = handle.getListState("recent", _RECENT, self.ttl_ms)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows), ignore_index=True)
        kept = list(self.recent.get())
        known = {event_id for _, event_id, _, _ in kept}
        new = frame[~frame["event_id"].isin(known)].drop_duplicates("event_id")
        time = np.concatenate(
            [
                np.asarray([t for t, _, _, _ in kept], dtype=np.int64),
                new["event_time"].to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS,
            ]
        )
        event_id = np.asarray([e for _, e, _, _ in kept] + new["event_id"].tolist(), dtype=object)
        amount = np.concatenate(
            [
                np.asarray([a for _, _, a, _ in kept], dtype=np.float64),
                new["amount"].to_numpy(dtype=np.float64, na_value=0.0),
            ]
        )
        alerted = np.asarray([a for _, _, _, a in kept] + [False] * len(new), dtype=bool)
        if not len(new):
            return  # every purchase of these rows was processed before
        order = np.lexsort((event_id.astype(str), time))
        time, event_id, amount, alerted = (
            time[order],
            event_id[order],
            amount[order],
            alerted[order],
        )
        # purchases in (t - span, t] for each t, and their amounts
        first = np.searchsorted(time, time - SPAN_MS, side="right")
        last = np.searchsorted(time, time, side="right")
        counts = last - first
        cumulative = np.r_[0.0, np.cumsum(amount)]
        sums = cumulative[last] - cumulative[first]
        alert = (counts >= self.threshold) & ~alerted
        alerted |= alert
        keep = time >= time.max() - self.lateness_ms - SPAN_MS
        self.recent.put(
            list(
                zip(
                    time[keep].tolist(),
                    event_id[keep].tolist(),
                    amount[keep].tolist(),
                    alerted[keep].tolist(),
                    strict=True,
                )
            )
        )
        if alert.any():
            yield pd.DataFrame(
                {
                    "user_id": np.full(int(alert.sum()), key[0], dtype=np.int64),
                    "event_id": event_id[alert],
                    "purchase_time": pd.to_datetime(time[alert], unit="ms", utc=True),
                    "purchases_in_minute": counts[alert].astype(np.int64),
                    "amount_in_minute": sums[alert],
                }
            )

    def close(self) -> None:
        pass


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
