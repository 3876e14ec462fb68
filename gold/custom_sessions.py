"""gold.sessions_custom: the sessions of gold.sessions from a custom stateful processor, with
what ``session_window`` cannot give, chained in the same query into gold.session_stats_hourly.

A session is the same as in :mod:`gold.sessions`: a maximal run of one user's events at most
15 minutes apart; it ends at its last event plus 15 minutes and closes (comes out, once) when
the watermark reaches its end. Beyond gold.sessions a session row carries its landing and exit
pages, the first ``max_pages`` pages in order and its counts per event type.

State per user (no TTL: Spark 4.2 refuses TTL in the EventTime time mode,
STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL; every open session has an event-time
timer at its end instead, and the timer clears what it closes, so no key outlives the
watermark; gold.purchase_alerts shows TTL in the ProcessingTime mode):

- ``session`` (ValueState): the open sessions' summaries, oldest first: start, last event,
  events, purchases, revenue, landing and exit page, and the one event-time timer registered.
  Usually one session is open; several are when one micro-batch holds several sessions of a
  user, which stay open until the watermark passes each end: an event arriving later within
  the lateness may still join two of them.
- ``pages`` (ListState): (time, page) of the first ``max_pages`` pages of each open session.
- ``counts`` (MapState): event type -> counts aligned with the open sessions.

The processor is written for few calls into the state store (each is a round trip from the
Python worker to the JVM): per user and micro-batch, one read and one write of each variable,
and one timer, registered for the earliest open end only when that end changes (never
deleted and re-registered per row). Sessions are merged with numpy over all of a user's rows
at once.

Hourly statistics are chained after the processor through its event-time column
``session_end``: a row emitted when the watermark passes a session's end is never behind the
downstream watermark, while its start may be hours behind it (Spark then fails the query with
EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED), so the hour of a session is the hour it ended.
One query writes both tables: the hourly aggregation keeps the hour's sessions and the writer
sends them to gold.sessions_custom, so a session comes out when its hour closes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.settings import duration_seconds

TABLE = "gold.sessions_custom"
STATS_TABLE = "gold.session_stats_hourly"
EVENT_TYPES = ("page_view", "search", "add_to_cart", "purchase")
GAP = "15 minutes"
MAX_PAGES = 50

SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("session_start", TimestampType()),
        StructField("session_end", TimestampType()),
        StructField("events", LongType()),
        StructField("purchases", LongType()),
        StructField("revenue", DoubleType()),
        StructField("landing_page", StringType()),
        StructField("exit_page", StringType()),
        StructField("pages", ArrayType(StringType())),
        StructField("event_counts", MapType(StringType(), LongType())),
    ]
)
STATS_SCHEMA = StructType(
    [
        StructField("hour_start", TimestampType()),
        StructField("hour_end", TimestampType()),
        StructField("sessions", LongType()),
        StructField("mean_duration_s", DoubleType()),
        StructField("mean_events", DoubleType()),
        StructField("purchasing_sessions", LongType()),
    ]
)
# an existing table of open sessions a first run can start from (handleInitialState)
SEED_SCHEMA = StructType(
    [
        StructField("user_id", LongType()),
        StructField("session_start", TimestampType()),
        StructField("last_event_time", TimestampType()),
        StructField("events", LongType()),
        StructField("purchases", LongType()),
        StructField("revenue", DoubleType()),
        StructField("landing_page", StringType()),
        StructField("exit_page", StringType()),
        StructField("pages", ArrayType(StringType())),
        StructField("event_counts", MapType(StringType(), LongType())),
    ]
)

_SESSION_STATE = StructType(
    [
        StructField("start", ArrayType(LongType())),
        StructField("last", ArrayType(LongType())),
        StructField("events", ArrayType(LongType())),
        StructField("purchases", ArrayType(LongType())),
        StructField("revenue", ArrayType(DoubleType())),
        StructField("landing", ArrayType(StringType())),
        StructField("exit", ArrayType(StringType())),
        StructField("timer", LongType()),
    ]
)
_PAGE_STATE = StructType([StructField("time", LongType()), StructField("page", StringType())])
_TYPE_KEY = StructType([StructField("event_type", StringType())])
_COUNTS = StructType([StructField("counts", ArrayType(LongType()))])
_MS = 1000
_NS_PER_MS = 1_000_000


class _Open:
    """A user's open sessions as numpy columns, oldest first (the processor's working form;
    the state variables hold the same as arrays)."""

    __slots__ = ("start", "last", "events", "purchases", "revenue", "landing", "exit", "counts")

    def __init__(self, start, last, events, purchases, revenue, landing, exit, counts):
        self.start = np.asarray(start, dtype=np.int64)
        self.last = np.asarray(last, dtype=np.int64)
        self.events = np.asarray(events, dtype=np.int64)
        self.purchases = np.asarray(purchases, dtype=np.int64)
        self.revenue = np.asarray(revenue, dtype=np.float64)
        self.landing = np.asarray(landing, dtype=object)
        self.exit = np.asarray(exit, dtype=object)
        self.counts = np.asarray(counts, dtype=np.int64).reshape(len(EVENT_TYPES), -1)

    def __len__(self) -> int:
        return len(self.start)

    def take(self, index) -> _Open:
        return _Open(
            self.start[index],
            self.last[index],
            self.events[index],
            self.purchases[index],
            self.revenue[index],
            self.landing[index],
            self.exit[index],
            self.counts[:, index],
        )

    @classmethod
    def concat(cls, a: _Open, b: _Open) -> _Open:
        return cls(
            *(np.concatenate([getattr(a, f), getattr(b, f)]) for f in cls.__slots__[:-1]),
            np.concatenate([a.counts, b.counts], axis=1),
        )


def _empty() -> _Open:
    return _Open([], [], [], [], [], [], [], np.zeros((len(EVENT_TYPES), 0)))


def _singletons(rows: pd.DataFrame) -> tuple[_Open, np.ndarray, np.ndarray]:
    """Each input event as a one-event session, ordered by (time, page); with its (time, page)."""
    time = rows["event_time"].to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS
    page = rows["page"].to_numpy(dtype=object)
    kind = rows["event_type"].to_numpy(dtype=object)
    order = np.lexsort((page.astype(str), time))
    time, page, kind = time[order], page[order], kind[order]
    amount = rows["amount"].to_numpy(dtype=np.float64, na_value=np.nan)[order]
    purchase = kind == "purchase"
    counts = np.stack([(kind == t).astype(np.int64) for t in EVENT_TYPES])
    single = _Open(
        time,
        time,
        np.ones(len(time), dtype=np.int64),
        purchase.astype(np.int64),
        np.where(purchase & ~np.isnan(amount), amount, 0.0),
        page,
        page,
        counts,
    )
    return single, time, page


def merge(sessions: _Open, gap_ms: int) -> _Open:
    """Merge sessions whose gap is at most ``gap_ms`` (the input in any order)."""
    if len(sessions) <= 1:
        return sessions
    order = np.argsort(sessions.start, kind="stable")
    s = sessions.take(order)
    reach = np.maximum.accumulate(s.last)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s.start[1:] - reach[:-1] > gap_ms
    heads = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    # the exit page is the one of the latest last event; ties: the later in the sorted order
    tail = np.lexsort((np.arange(len(s)), s.last, group))
    tails = tail[np.r_[heads[1:], len(s)] - 1]
    return _Open(
        s.start[heads],
        np.maximum.reduceat(s.last, heads),
        np.add.reduceat(s.events, heads),
        np.add.reduceat(s.purchases, heads),
        np.add.reduceat(s.revenue, heads),
        s.landing[heads],
        s.exit[tails],
        np.add.reduceat(s.counts, heads, axis=1),
    )


def _first_pages(
    sessions: _Open, times: np.ndarray, pages: np.ndarray, max_pages: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``max_pages`` (time, page) of each session, in order (stable: pages already
    kept come before a new page of the same time)."""
    order = np.argsort(times, kind="stable")
    times, pages = times[order], pages[order]
    group = np.searchsorted(sessions.start, times, side="right") - 1
    starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    rank = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts, len(group)]))
    keep = rank < max_pages
    return times[keep], pages[keep]


class SessionProcessor(StatefulProcessor):
    """Sessionizes one user's events with event-time timers (see the module docstring)."""

    def __init__(self, gap_ms: int, max_pages: int = MAX_PAGES):
        self.gap_ms = gap_ms
        self.max_pages = max_pages

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", _SESSION_STATE)
        self.pages = handle.getListState("pages", _PAGE_STATE)
        self.counts = handle.getMapState("counts", _TYPE_KEY, _COUNTS)

    # -- state <-> working form: one call per variable ---------------------------------------

    def _load(self) -> tuple[_Open, np.ndarray, np.ndarray, int | None]:
        state = self.session.get()
        if state is None:
            return _empty(), np.empty(0, np.int64), np.empty(0, object), None
        start, last, events, purchases, revenue, landing, exit_, timer = state
        by_type = {k[0]: v[0] for k, v in self.counts.iterator()}
        zero = [0] * len(start)
        counts = [by_type.get(t) or zero for t in EVENT_TYPES]
        kept = list(self.pages.get())
        times = np.fromiter((t for t, _ in kept), dtype=np.int64, count=len(kept))
        pages = np.array([p for _, p in kept], dtype=object)
        opened = _Open(start, last, events, purchases, revenue, landing, exit_, counts)
        return opened, times, pages, timer

    def _save(self, opened: _Open, times, pages, timer: int | None, old: _Open) -> None:
        if not len(opened):
            self.session.clear()
            self.pages.clear()
            self.counts.clear()
            return
        due = int(opened.last.min()) + self.gap_ms
        if due != timer:
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(due)
        self.session.update(
            (
                opened.start.tolist(),
                opened.last.tolist(),
                opened.events.tolist(),
                opened.purchases.tolist(),
                opened.revenue.tolist(),
                opened.landing.tolist(),
                opened.exit.tolist(),
                due,
            )
        )
        self.pages.put(list(zip(times.tolist(), pages.tolist(), strict=True)))
        same_shape = len(old) == len(opened)
        for i, event_type in enumerate(EVENT_TYPES):
            row = opened.counts[i]
            if same_shape and np.array_equal(row, old.counts[i]):
                continue  # unchanged: no call
            if row.any():
                self.counts.updateValue((event_type,), (row.tolist(),))
            elif len(old) and old.counts[i].any():
                self.counts.removeKey((event_type,))

    # -- the processor --------------------------------------------------------------------

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows), ignore_index=True)
        old, times, pages, timer = self._load()
        single, new_times, new_pages = _singletons(frame)
        opened = merge(_Open.concat(old, single), self.gap_ms)
        times, pages = _first_pages(
            opened,
            np.concatenate([times, new_times]),
            np.concatenate([pages, new_pages]),
            self.max_pages,
        )
        self._save(opened, times, pages, timer, old)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        opened, times, pages, _ = self._load()
        if not len(opened):  # nothing open: a timer left behind (cannot happen by design)
            return
        closed = opened.last + self.gap_ms <= timerValues.getCurrentWatermarkInMs()
        if not closed.any():
            self._save(opened, times, pages, None, opened)
            return
        out = self._rows(key[0], opened.take(closed), times, pages)
        rest = opened.take(~closed)
        keep = times >= rest.start[0] if len(rest) else np.zeros(len(times), dtype=bool)
        # the fired timer is deleted by Spark after this call: the next one is registered
        self._save(rest, times[keep], pages[keep], None, opened)
        yield out

    def handleInitialState(self, key, initialState, timerValues) -> None:
        seed = initialState
        start = _ms(seed["session_start"])
        last = _ms(seed["last_event_time"])
        maps = [dict(m) if m is not None else {} for m in seed["event_counts"]]  # pairs or dict
        counts = [[int(m.get(t, 0)) for m in maps] for t in EVENT_TYPES]
        old, times, pages, timer = self._load()
        seeded = _Open(
            start,
            last,
            seed["events"],
            seed["purchases"],
            seed["revenue"],
            seed["landing_page"],
            seed["exit_page"],
            counts,
        )
        seed_times, seed_pages = [], []
        for s, listed in zip(start.tolist(), seed["pages"], strict=True):
            listed = list(listed if listed is not None else [])
            seed_times += [s] * len(listed)  # in their order: a stable sort keeps it
            seed_pages += listed
        opened = merge(_Open.concat(old, seeded), self.gap_ms)
        times, pages = _first_pages(
            opened,
            np.concatenate([times, np.asarray(seed_times, dtype=np.int64)]),
            np.concatenate([pages, np.asarray(seed_pages, dtype=object)]),
            self.max_pages,
        )
        self._save(opened, times, pages, timer, old)

    def _rows(self, user_id: int, closed: _Open, times, pages) -> pd.DataFrame:
        group = np.searchsorted(closed.start, times, side="right") - 1
        in_closed = (group >= 0) & (times <= closed.last[np.maximum(group, 0)])
        listed = [[] for _ in range(len(closed))]
        for g, page in zip(group[in_closed].tolist(), pages[in_closed].tolist(), strict=True):
            listed[g].append(page)
        counts = [
            {t: int(c) for t, c in zip(EVENT_TYPES, closed.counts[:, i].tolist(), strict=True) if c}
            for i in range(len(closed))
        ]
        return pd.DataFrame(
            {
                "user_id": np.full(len(closed), user_id, dtype=np.int64),
                "session_start": pd.to_datetime(closed.start, unit="ms", utc=True),
                "session_end": pd.to_datetime(closed.last + self.gap_ms, unit="ms", utc=True),
                "events": closed.events,
                "purchases": closed.purchases,
                "revenue": closed.revenue,
                "landing_page": closed.landing,
                "exit_page": closed.exit,
                "pages": listed,
                "event_counts": counts,
            }
        )

    def close(self) -> None:
        pass


def _ms(column: pd.Series) -> np.ndarray:
    return column.to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS


def custom_sessions(
    events: DataFrame,
    *,
    watermark: str,
    gap: str = GAP,
    max_pages: int = MAX_PAGES,
    initial_state: DataFrame | None = None,
) -> DataFrame:
    """Sessions from the processor (event time ``session_end``), as a stream."""
    processor = SessionProcessor(duration_seconds(gap) * _MS, max_pages)
    seed = initial_state.groupBy("user_id") if initial_state is not None else None
    return (
        events.withWatermark("event_time", watermark)
        .select("user_id", "event_time", "event_type", "page", "amount")
        .groupBy("user_id")
        .transformWithStateInPandas(
            processor,
            SCHEMA,
            "append",
            "EventTime",
            initialState=seed,
            eventTimeColumnName="session_end",
        )
    )


def sessions_and_hourly_stats(
    events: DataFrame,
    *,
    watermark: str,
    gap: str = GAP,
    max_pages: int = MAX_PAGES,
    initial_state: DataFrame | None = None,
) -> DataFrame:
    """One row per hour (of session end) with its statistics and its sessions: the processor
    chained into a 1-hour window aggregation in one query. :func:`session_rows` and
    :func:`stats_rows` split it into the two tables."""
    sessions = custom_sessions(
        events,
        watermark=watermark,
        gap=gap,
        max_pages=max_pages,
        initial_state=initial_state,
    )
    duration = F.col("session_end").cast("double") - F.col("session_start").cast("double")
    return sessions.groupBy(F.window("session_end", "1 hour").alias("hour")).agg(
        F.count(F.lit(1)).alias("sessions"),
        F.avg(duration).alias("mean_duration_s"),
        F.avg("events").alias("mean_events"),
        F.count(F.when(F.col("purchases") > 0, 1)).alias("purchasing_sessions"),
        F.collect_list(F.struct(*SCHEMA.fieldNames())).alias("closed"),
    )


def session_rows(hourly: DataFrame) -> DataFrame:
    return hourly.select(F.explode("closed").alias("s")).select("s.*")


def stats_rows(hourly: DataFrame) -> DataFrame:
    return hourly.select(
        F.col("hour.start").alias("hour_start"),
        F.col("hour.end").alias("hour_end"),
        "sessions",
        "mean_duration_s",
        "mean_events",
        "purchasing_sessions",
    )
