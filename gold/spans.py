"""gold.user_activity_spans: per user and event type, the first and last activity of a span
of activity, emitted once the user has been idle for 30 minutes (event time).

Written with the legacy ``applyInPandasWithState`` and ``GroupStateTimeout.EventTimeTimeout``,
kept as a worked example for users migrating from it: the function is called per user with
the rows of a micro-batch, or with no rows and ``state.hasTimedOut`` once the watermark has
passed the timeout set at the user's last event plus the idle time. A span is then emitted and
its state removed; the user's next events start a new span. An event of a closed span cannot
arrive any more: the watermark is past it, so Spark drops it as late.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.settings import duration_seconds

TABLE = "gold.user_activity_spans"
IDLE = "30 minutes"
SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("event_type", StringType()),
        StructField("first_activity", TimestampType()),
        StructField("last_activity", TimestampType()),
        StructField("events", LongType()),
    ]
)
# the open span of a user as JSON: {event type: [first ms, last ms, events]}. PySpark 4.2
# cannot read back an array field of an applyInPandasWithState state (KeyError 'elementType'
# while parsing the state schema), so the span is one string
STATE = StructType([StructField("span", StringType())])
_NS_PER_MS = 1_000_000


def span_function(idle_ms: int):
    """The function for ``applyInPandasWithState``: update a user's span, or emit it."""

    def spans(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        if state.hasTimedOut:
            span = json.loads(state.get[0])
            state.remove()
            types = sorted(span)
            firsts, lasts, counts = ([span[t][i] for t in types] for i in range(3))
            yield pd.DataFrame(
                {
                    "user_id": np.full(len(types), user_id, dtype=np.int64),
                    "event_type": list(types),
                    "first_activity": pd.to_datetime(np.asarray(firsts), unit="ms", utc=True),
                    "last_activity": pd.to_datetime(np.asarray(lasts), unit="ms", utc=True),
                    "events": np.asarray(counts, dtype=np.int64),
                }
            )
            return
        frame = pd.concat(list(frames), ignore_index=True)
        time = frame["event_time"].to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS
        span = json.loads(state.get[0]) if state.exists else {}
        per_type = pd.DataFrame({"t": frame["event_type"].to_numpy(), "time": time}).groupby("t")
        summary = per_type["time"].agg(["min", "max", "count"])
        for event_type, (first, last, count) in summary.iterrows():
            old = span.get(event_type)
            if old is None:
                span[event_type] = [int(first), int(last), int(count)]
            else:
                span[event_type] = [
                    min(old[0], int(first)),
                    max(old[1], int(last)),
                    old[2] + int(count),
                ]
        state.update((json.dumps(span),))
        state.setTimeoutTimestamp(max(last for _, last, _ in span.values()) + idle_ms)
        return
        yield  # a generator: nothing to emit while the span is open

    return spans


def activity_spans(events: DataFrame, *, watermark: str, idle: str = IDLE) -> DataFrame:
    """Spans from a stream of silver.events rows."""
    return (
        events.withWatermark("event_time", watermark)
        .select("user_id", "event_type", "event_time")
        .groupBy("user_id")
        .applyInPandasWithState(
            span_function(duration_seconds(idle) * 1000),
            SCHEMA,
            STATE,
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
    )
