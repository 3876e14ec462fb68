"""gold.user_activity_spans: per user and event type, the first and last activity of a span
of activity, emitted once the user has been idle for 30 minutes (event time).

A span is a maximal run of one user's events (of any type) in which consecutive events are
at most 30 minutes apart; it is emitted, one row per event type in it, once the watermark has
passed its last event plus 30 minutes. The spans depend on the events only, not on how they
were cut into micro-batches: a batch holding a gap of more than 30 minutes holds two spans.

Written with the legacy ``applyInPandasWithState`` and ``GroupStateTimeout.EventTimeTimeout``,
kept as a worked example for users migrating from it. The state is keyed by a bucket of users
(``gold.span_buckets``), as gold.sessions_custom's: the function is called per bucket with the
rows of a micro-batch of many users at once, which it handles with pandas, instead of once
per user (per user, the calls took four fifths of gold's time). A bucket's state holds its
users' open spans; its timeout is kept at the earliest open span's last event plus the idle
time, and the call it fires (or any call with rows) closes every span the watermark has
passed. An event of a closed span cannot arrive any more: the watermark is past it, so Spark
drops it as late.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from gold.sessions_custom import bucket
from lakehouse.flows import Flow, Output, Reference, TableInput
from lakehouse.proof import oracle
from lakehouse.settings import duration_seconds

TABLE = "gold.user_activity_spans"
IDLE = "30 minutes"
BUCKETS = 64
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
# a bucket's open spans, one row per (span, event type) of SPAN_COLUMNS, as Arrow IPC bytes:
# one opaque field is one value to (un)pickle, where a list field is walked element by element
STATE = StructType([StructField("spans", BinaryType())])
# per open span and event type: the user, the span's first and last event (ms), and the
# type's first and last event and count in it
SPAN_COLUMNS = ("user", "span_first", "span_last", "event_type", "first", "last", "events")
_NS_PER_MS = 1_000_000


def _per_type(rows: pd.DataFrame, span: np.ndarray) -> pd.DataFrame:
    """Rows (user, event_type, first, last, events) grouped by ``span`` (a span number per
    row) and event type, with each span's first and last event."""
    grouped = rows.assign(span=span).groupby(["span", "event_type"], sort=False)
    out = grouped.agg(
        user=("user", "first"),
        first=("first", "min"),
        last=("last", "max"),
        events=("events", "sum"),
    ).reset_index()
    per_span = out.groupby("span")
    out["span_first"] = per_span["first"].transform("min")
    out["span_last"] = per_span["last"].transform("max")
    return out[list(SPAN_COLUMNS)]


def merge(spans: pd.DataFrame, idle_ms: int) -> pd.DataFrame:
    """Open spans (SPAN_COLUMNS) with each user's spans at most ``idle_ms`` apart merged."""
    if spans.empty:
        return spans
    order = spans.sort_values(["user", "span_first"], kind="stable", ignore_index=True)
    # the latest last event so far of the user's earlier spans
    reach = order.groupby("user")["span_last"].cummax().groupby(order["user"]).shift()
    new = reach.isna() | (order["span_first"] - reach > idle_ms)
    return _per_type(order, np.cumsum(new.to_numpy()))


def new_spans(frame: pd.DataFrame, idle_ms: int) -> pd.DataFrame:
    """A call's rows (user_id, event_type, event_time) as spans (SPAN_COLUMNS)."""
    ms = frame["event_time"].to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS
    rows = pd.DataFrame(
        {
            "user": frame["user_id"].to_numpy(dtype=np.int64),
            "event_type": frame["event_type"].to_numpy(dtype=object),
            "first": ms,
            "last": ms,
            "events": np.ones(len(ms), dtype=np.int64),
        }
    ).sort_values(["user", "first"], kind="stable", ignore_index=True)
    user, time = rows["user"].to_numpy(), rows["first"].to_numpy()
    new = np.r_[True, (user[1:] != user[:-1]) | (np.diff(time) > idle_ms)]
    return _per_type(rows, np.cumsum(new))


def _pack(spans: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(spans, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _unpack(blob: bytes) -> pd.DataFrame:
    return pa.ipc.open_stream(blob).read_all().to_pandas()


def _rows(closed: pd.DataFrame, idle_ms: int) -> pd.DataFrame:
    """One output row per closed span and event type."""

    def at(ms) -> pd.Series:
        return pd.to_datetime(np.asarray(ms, dtype=np.int64), unit="ms", utc=True)

    return pd.DataFrame(
        {
            "user_id": closed["user"].to_numpy(dtype=np.int64),
            "event_type": closed["event_type"].to_numpy(dtype=object),
            "first_activity": at(closed["first"]),
            "last_activity": at(closed["last"]),
            "events": closed["events"].to_numpy(dtype=np.int64),
            "span_end": at(closed["span_last"] + idle_ms),
        }
    )


def span_function(idle_ms: int):
    """The function for ``applyInPandasWithState``, per bucket of users: merge the rows into
    the open spans, emit those the watermark has passed, keep the timeout at the earliest
    open one."""

    def spans(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        opened = _unpack(state.get[0]) if state.exists else None
        if not state.hasTimedOut:
            found = [new_spans(frame, idle_ms) for frame in frames if len(frame)]
            parts = [s for s in (opened, *found) if s is not None]
            if not parts:
                return
            opened = merge(pd.concat(parts, ignore_index=True), idle_ms)
        # a timeout fires once the watermark is past it: the same test closes a span here
        watermark = state.getCurrentWatermarkMs()
        done = (opened["span_last"] + idle_ms < watermark).to_numpy()
        closed, opened = opened[done], opened[~done]
        if len(opened):
            state.update((_pack(opened),))
            state.setTimeoutTimestamp(int(opened["span_last"].min()) + idle_ms)
        else:
            state.remove()
        if len(closed):
            yield _rows(closed, idle_ms)

    return spans


def activity_spans(
    events: DataFrame, *, watermark: str, idle: str = IDLE, buckets: int = BUCKETS
) -> DataFrame:
    """Spans from a stream of silver.events rows."""
    return (
        events.withWatermark("event_time", watermark)
        .select(bucket(buckets), "user_id", "event_type", "event_time")
        .groupBy("bucket")
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
    params=lambda settings: {
        "watermark": settings.watermarks.events,
        "buckets": settings.gold.span_buckets,
    },
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
