"""The ``transformWithStateInPandas`` processors as Spark's driver sees them.

At every start of a query (each run of the gold layer), Spark starts a Python process on the
driver only to call the processor's ``init`` and learn its state variables. That process
unpickles the processor, which imports the module of its class: the flows' modules import
numpy, pandas, pyarrow and the project's reference code, 2.3 s of the 3 s it took that process
to import what it needed (bench/RESULTS.md), at every start of gold.sessions_custom and
gold.purchase_alerts. The classes here import only what ``init`` needs, pyspark's types, which
that process has loaded already. Their handlers run in the executors' Python workers, which
import pandas anyway: gold.purchase_alerts' imports numpy and pandas then, and
gold.sessions_custom's becomes the class of its flow's module (every handler, numpy and
pyarrow) at its first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------------------------
# gold.sessions_custom (see that module for the design)

MAX_PAGES = 50

# The state holds its columns as Arrow IPC bytes: PySpark pickles a state value field by
# field and walks every element of a list, which cost more than the rest of the processor;
# one binary field per value is one opaque blob to pickle.
SESSION_STATE = StructType(
    [
        # the open sessions' summaries: one Arrow record batch of gold.sessions_custom's
        # _FIELDS columns (null while none is open)
        StructField("sessions", BinaryType()),
        StructField("timer", LongType()),  # the one event-time timer registered
        # the watermark of the bucket's last call: the next call drops rows at or behind it
        StructField("watermark", LongType()),
    ]
)
# one element per bucket and micro-batch: the visits worth listing, (user, time, page)
PAGE_RUN = StructType([StructField("visits", BinaryType())])
TYPE_KEY = StructType([StructField("event_type", StringType())])
# per event type, int64 counts aligned with the open sessions
COUNTS = StructType([StructField("counts", BinaryType())])


class SessionProcessor(StatefulProcessor):
    """gold.sessions_custom's processor up to its state variables. Its first handler call
    makes it :class:`gold.sessions_custom.SessionProcessor`, a subclass with every handler,
    whose module imports numpy, pandas and pyarrow."""

    def __init__(self, gap_ms: int, max_pages: int = MAX_PAGES):
        self.gap_ms = gap_ms
        self.max_pages = max_pages

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_STATE)
        self.pages = handle.getListState("pages", PAGE_RUN)
        self.counts = handle.getMapState("counts", TYPE_KEY, COUNTS)

    def _handlers(self) -> SessionProcessor:
        from gold.sessions_custom import SessionProcessor as WithHandlers

        self.__class__ = WithHandlers
        return self

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        return self._handlers().handleInputRows(key, rows, timerValues)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        return self._handlers().handleExpiredTimer(key, timerValues, expiredTimerInfo)

    def handleInitialState(self, key, initialState, timerValues) -> None:
        return self._handlers().handleInitialState(key, initialState, timerValues)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# gold.purchase_alerts (see that module for the design)

SPAN_MS = 60_000
THRESHOLD = 3
RECENT = StructType(
    [
        StructField("time", LongType()),
        StructField("event_id", StringType()),
        StructField("amount", DoubleType()),
        StructField("alerted", BooleanType()),
    ]
)
_NS_PER_MS = 1_000_000


class PurchaseAlertProcessor(StatefulProcessor):
    """Alerts on bursts of purchases of one user (see gold.purchase_alerts)."""

    def __init__(self, ttl_ms: int, lateness_ms: int, threshold: int = THRESHOLD):
        self.ttl_ms = ttl_ms
        self.lateness_ms = lateness_ms
        self.threshold = threshold

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.recent = handle.getListState("recent", RECENT, self.ttl_ms)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        import numpy as np
        import pandas as pd

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
