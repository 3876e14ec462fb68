"""gold.user_activity_spans: per user and event type, the first and last activity of a span
of activity, emitted once the user has been idle for 30 minutes (event time).

A span is a maximal run of one user's events (of any type) in which consecutive events are
at most 30 minutes apart; it is emitted, one row per event type in it, once the watermark has
passed its last event plus 30 minutes. The spans depend on the events only, not on how they
were cut into micro-batches: a batch holding a gap of more than 30 minutes holds two spans.

Written with the legacy ``applyInPandasWithState`` and ``GroupStateTimeout.EventTimeTimeout``,
kept as a worked example for users migrating from it: the function is called per user with
the rows of a micro-batch, or with no rows and ``state.hasTimedOut`` once the watermark has
passed the timeout, which is kept at the earliest open span's last event plus the idle time.
Each call merges what it got into the open spans first, then emits those the watermark has
passed (a call with rows may close an older span: Spark calls a key that has rows instead of
timing it out). An event of a closed span cannot arrive any more: the watermark is past it,
so Spark drops it as late.
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

from lakehouse import oracle
from lakehouse.flows import Flow, Output, Reference, TableInput
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
        # when the span closed: its last event (of any type) plus the idle time
        StructField("span_end", TimestampType()),
    ]
)
# the open spans of a user as JSON: [[first ms, last ms, {event type: [first, last, events]}],
# ...] by first event. PySpark 4.2 cannot read back an array field of an
# applyInPandasWithState state (KeyError 'elementType' while parsing the state schema), so the
# spans are one string
STATE = StructType([StructField("spans", StringType())])
_NS_PER_MS = 1_000_000


def _runs(frame: pd.DataFrame, idle_ms: int) -> list:
    """The rows of one call as spans (runs at most ``idle_ms`` apart), in the state's form."""
    time = frame["event_time"].to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS
    order = np.argsort(time, kind="stable")
    time, kind = time[order], frame["event_type"].to_numpy(dtype=object)[order]
    run = np.cumsum(np.r_[False, np.diff(time) > idle_ms])
    per_type = pd.DataFrame({"run": run, "type": kind, "time": time}).groupby(["run", "type"])
    spans: dict[int, list] = {}
    for (r, event_type), (first, last, count) in (
        per_type["time"].agg(["min", "max", "count"]).iterrows()
    ):
        span = spans.setdefault(int(r), [int(first), int(last), {}])
        span[0], span[1] = min(span[0], int(first)), max(span[1], int(last))
        span[2][event_type] = [int(first), int(last), int(count)]
    return list(spans.values())


def _merge(spans: list, idle_ms: int) -> list:
    """Merge spans whose gap is at most ``idle_ms``; the result by first event."""
    merged: list = []
    for first, last, types in sorted(spans, key=lambda s: s[0]):
        if not merged or first - merged[-1][1] > idle_ms:
            merged.append([first, last, dict(types)])
            continue
        into = merged[-1]
        into[1] = max(into[1], last)
        for event_type, (f, la, n) in types.items():
            old = into[2].get(event_type)
            into[2][event_type] = (
                [f, la, n] if old is None else [min(old[0], f), max(old[1], la), old[2] + n]
            )
    return merged


def _rows(user_id: int, spans: list, idle_ms: int) -> pd.DataFrame:
    """One row per span and event type."""
    rows = [
        (event_type, first, last, count, span_last + idle_ms)
        for _, span_last, types in spans
        for event_type, (first, last, count) in sorted(types.items())
    ]
    types, firsts, lasts, counts, ends = (list(c) for c in zip(*rows, strict=True))
    return pd.DataFrame(
        {
            "user_id": np.full(len(rows), user_id, dtype=np.int64),
            "event_type": types,
            "first_activity": pd.to_datetime(np.asarray(firsts), unit="ms", utc=True),
            "last_activity": pd.to_datetime(np.asarray(lasts), unit="ms", utc=True),
            "events": np.asarray(counts, dtype=np.int64),
            "span_end": pd.to_datetime(np.asarray(ends), unit="ms", utc=True),
        }
    )


def span_function(idle_ms: int):
    """The function for ``applyInPandasWithState``: merge a user's rows into the open spans,
    emit those the watermark has passed, keep the timeout at the earliest open one."""

    def spans(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        opened = json.loads(state.get[0]) if state.exists else []
        if not state.hasTimedOut:
            frame = pd.concat(list(frames), ignore_index=True)
            opened = _merge(opened + _runs(frame, idle_ms), idle_ms)
        # a timeout fires once the watermark is past it: the same test closes a span here
        watermark = state.getCurrentWatermarkMs()
        closed = [s for s in opened if s[1] + idle_ms < watermark]
        opened = [s for s in opened if s[1] + idle_ms >= watermark]
        if opened:
            state.update((json.dumps(opened),))
            state.setTimeoutTimestamp(min(s[1] for s in opened) + idle_ms)
        else:
            state.remove()
        if closed:
            yield _rows(user_id, closed, idle_ms)

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


FLOW = Flow(
    name="gold.user_activity_spans",
    description="per user and event type, first and last activity once idle 30 minutes "
    "(applyInPandasWithState, event-time timeout)",
    inputs=(TableInput("silver.events"),),
    transform=activity_spans,
    params=lambda settings: {"watermark": settings.watermarks.events},
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            zorder_by=("user_id",),
            complete_by="span_end",
            reference=Reference(
                oracle.user_activity_spans_table, ("user_id", "first_activity", "event_type")
            ),
        ),
    ),
)
