"""gold.sessions_custom: the sessions of gold.sessions from a custom stateful processor, with
what ``session_window`` cannot give, and their hourly statistics in gold.session_stats_hourly,
from one query.

A session is the same as in :mod:`gold.sessions`: a maximal run of one user's events at most
15 minutes apart; it ends at its last event plus 15 minutes and closes (comes out, once) when
the watermark reaches its end. Beyond gold.sessions a session row carries its landing and exit
pages, the first ``max_pages`` pages in order and its counts per event type.

State is keyed by a bucket of users (``pmod(xxhash64(user_id), buckets)``), so one call of the
processor handles many users at once with numpy and pays each state call (a round trip to the
JVM) per bucket. Events reach it packed, one Arrow IPC blob per bucket and input partition
(:func:`pack_events`, a stateless ``mapInArrow``); packed rows carry no event-time column, so
the processor drops late rows itself, by Spark's rule (a row at or behind the watermark of the
micro-batch before is late), with the watermark each bucket saw at its last call. State per
bucket:

- ``session`` (ValueState): the open sessions' summaries by user and start, the one event-time
  timer registered, the watermark of the bucket's last call. A user may have several open
  sessions: a later event within the lateness may still join two of them.
- ``pages`` (ListState): the first ``max_pages`` visits of each open session, one element per
  micro-batch, read only when sessions close.
- ``counts`` (MapState): event type -> counts aligned with the open sessions.
- one event-time timer, at the earliest open end, registered only when that end changes.

No TTL: Spark 4.2 refuses TTL in the EventTime time mode; the timer clears every session it
closes, so none outlives the watermark (gold.purchase_alerts shows TTL, in ProcessingTime).

Each session is written to gold.sessions_custom in the micro-batch whose watermark closes it,
as gold.sessions writes its own, and the same micro-batch merges it into
gold.session_stats_hourly (per hour of session end: counts added, means weighted), whose row
is final once the watermark passes the hour's end (``ops.completeness``). Why this design and
not a chained window aggregation: bench/session_designs.py and bench/RESULTS.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from gold import processors
from gold.processors import MAX_PAGES
from gold.sessions import SCHEMA as SESSIONS_SCHEMA
from lakehouse.contract import EVENT_TYPES
from lakehouse.flows import Flow, Output, Reference, TableInput, Upsert
from lakehouse.proof import oracle
from lakehouse.settings import duration_seconds

TABLE = "gold.sessions_custom"
STATS_TABLE = "gold.session_stats_hourly"
_PURCHASE = EVENT_TYPES.index("purchase")
GAP = "15 minutes"
BUCKETS = 64
# the processor class a query pickles: gold.processors' (Spark's driver unpickles it at every
# query start, without this module's imports); bench/sessions.py puts a profiled one here
PROCESSOR = processors.SessionProcessor

# what a session holds beyond gold.sessions' columns, in the table and in the seed
_PAGES = [
    StructField("landing_page", StringType()),
    StructField("exit_page", StringType()),
    StructField("pages", ArrayType(StringType())),
    StructField("event_counts", MapType(StringType(), LongType())),
]
# gold.sessions' columns (the same sessions), then the pages
SCHEMA = StructType([*SESSIONS_SCHEMA.fields, *_PAGES])
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
        *_PAGES,
    ]
)

_MS = 1000
_US_PER_MS = 1000
_NS_PER_MS = 1_000_000
# what the processor reads of silver.events, packed per bucket (see pack_events)
INPUT_COLUMNS = ("user_id", "event_time", "event_type", "page", "amount")
PACKED_SCHEMA = StructType([StructField("bucket", LongType()), StructField("events", BinaryType())])
_NEVER = np.iinfo(np.int64).min

# how each summary column of merged sessions is combined
_FIELDS = {
    "user": (np.int64, "first"),
    "start": (np.int64, "first"),
    "last": (np.int64, np.maximum),
    "events": (np.int64, np.add),
    "purchases": (np.int64, np.add),
    "revenue": (np.float64, np.add),
    "landing": (object, "first"),
    "exit": (object, "latest"),
    "listed": (np.int64, np.add),
    "listed_until": (np.int64, np.maximum),
}


class _Open:
    """Open sessions as numpy columns, sorted by (user, start), with ``counts`` (event types x
    sessions): the processor's working form of its state variables."""

    def __init__(self, counts, **columns):
        for name, (dtype, _) in _FIELDS.items():
            setattr(self, name, np.asarray(columns[name], dtype=dtype))
        self.counts = np.asarray(counts, dtype=np.int64).reshape(len(EVENT_TYPES), -1)

    def __len__(self) -> int:
        return len(self.start)

    def take(self, index) -> _Open:
        return _Open(self.counts[:, index], **{f: getattr(self, f)[index] for f in _FIELDS})

    @staticmethod
    def concat(a: _Open, b: _Open) -> _Open:
        return _Open(
            np.concatenate([a.counts, b.counts], axis=1),
            **{f: np.concatenate([getattr(a, f), getattr(b, f)]) for f in _FIELDS},
        )


def _pack(columns: dict[str, np.ndarray]) -> bytes:
    """Columns as one Arrow IPC stream."""
    batch = pa.record_batch({name: pa.array(values) for name, values in columns.items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _unpack(blob: bytes) -> dict[str, np.ndarray]:
    batch = pa.ipc.open_stream(blob).read_next_batch()
    return {
        name: column.to_numpy(zero_copy_only=False)
        for name, column in zip(batch.schema.names, batch.columns, strict=True)
    }


def state_columns(blob: bytes) -> dict[str, list]:
    """A binary state field (as the processor or the state data source reader returns it)
    as plain columns, for inspection and tests."""
    return {name: values.tolist() for name, values in _unpack(blob).items()}


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def pack_events(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """For ``mapInArrow``: the rows of one input partition (a ``bucket`` column and
    INPUT_COLUMNS) as one row per bucket, its rows an Arrow IPC blob (PACKED_SCHEMA)."""
    batches = list(batches)
    if not batches or not sum(b.num_rows for b in batches):
        return
    table = pa.Table.from_batches(batches).combine_chunks()
    buckets = table.column("bucket").to_numpy()
    order = np.argsort(buckets, kind="stable")
    buckets = buckets[order]
    rows = table.select(list(INPUT_COLUMNS)).take(pa.array(order))
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    ends = np.r_[starts[1:], len(buckets)]
    yield pa.record_batch(
        [
            pa.array(buckets[starts], pa.int64()),
            pa.array([_ipc(rows.slice(a, b - a)) for a, b in zip(starts, ends, strict=True)]),
        ],
        names=["bucket", "events"],
    )


def pack_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Events (a pandas frame with INPUT_COLUMNS) as the processor receives them from
    :func:`pack_events`: one packed row. For tests and tools that call the processor."""
    return pd.DataFrame({"events": [_ipc(pa.Table.from_pandas(frame[list(INPUT_COLUMNS)]))]})


def _unpack_events(frames: Iterator[pd.DataFrame]) -> dict[str, np.ndarray]:
    """The packed rows of a processor call as numpy columns: user, time (microseconds),
    kind (index in EVENT_TYPES, -1 for another), page, amount (NaN when null)."""
    tables = [pa.ipc.open_stream(blob).read_all() for frame in frames for blob in frame["events"]]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    time = pc.cast(table.column("event_time"), pa.timestamp("us", "UTC")).cast(pa.int64())
    kind = pc.index_in(table.column("event_type"), value_set=pa.array(EVENT_TYPES))
    return {
        "user": table.column("user_id").to_numpy().astype(np.int64),
        "time": time.to_numpy(),
        "kind": kind.fill_null(-1).to_numpy().astype(np.int64),
        "page": table.column("page").to_numpy(zero_copy_only=False).astype(object),
        "amount": pc.cast(table.column("amount"), pa.float64()).to_numpy(zero_copy_only=False),
    }


def _empty() -> _Open:
    return _Open(np.zeros((len(EVENT_TYPES), 0)), **{f: [] for f in _FIELDS})


def _singletons(rows: dict[str, np.ndarray]) -> tuple[_Open, np.ndarray, np.ndarray, np.ndarray]:
    """Each input event (columns of :func:`_unpack_events`) as a one-event session, ordered by
    (user, time, page); with its (user, time, page)."""
    user, page, kind = rows["user"], rows["page"], rows["kind"]
    time = rows["time"] // _US_PER_MS
    order = np.lexsort((page.astype(str), time, user))
    user, time, page, kind = user[order], time[order], page[order], kind[order]
    amount = rows["amount"][order]
    purchase = kind == _PURCHASE
    single = _Open(
        np.stack([(kind == code).astype(np.int64) for code in range(len(EVENT_TYPES))]),
        user=user,
        start=time,
        last=time,
        events=np.ones(len(time), dtype=np.int64),
        purchases=purchase.astype(np.int64),
        revenue=np.where(purchase & ~np.isnan(amount), amount, 0.0),
        landing=page,
        exit=page,
        listed=np.zeros(len(time), dtype=np.int64),
        listed_until=np.full(len(time), _NEVER, dtype=np.int64),
    )
    return single, user, time, page


def _user_rank(users: np.ndarray) -> np.ndarray:
    return np.unique(users, return_inverse=True)[1].astype(np.int64)


def merge(sessions: _Open, gap_ms: int) -> _Open:
    """Merge each user's sessions whose gap is at most ``gap_ms`` (the input in any order);
    the result sorted by (user, start)."""
    if len(sessions) <= 1:
        return sessions
    s = sessions.take(np.lexsort((sessions.start, sessions.user)))
    # the latest end so far within each user: offset each user above all earlier ones
    t0 = min(int(s.start.min()), int(s.last.min()))
    span = int(s.last.max()) - t0 + 1
    offset = _user_rank(s.user) * span
    reach = np.maximum.accumulate(s.last - t0 + offset) - offset
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = (s.user[1:] != s.user[:-1]) | (s.start[1:] - t0 - reach[:-1] > gap_ms)
    heads = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    # the exit page is the one of the latest last event; ties: the later in the sorted order
    latest = np.lexsort((np.arange(len(s)), s.last, group))[np.r_[heads[1:], len(s)] - 1]
    columns = {}
    for name, (_, how) in _FIELDS.items():
        values = getattr(s, name)
        if how == "first":
            columns[name] = values[heads]
        elif how == "latest":
            columns[name] = values[latest]
        else:
            columns[name] = how.reduceat(values, heads)
    return _Open(np.add.reduceat(s.counts, heads, axis=1), **columns)


def _group_of(sessions: _Open, users: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The index of the session of each (user, time), or -1 (the sessions of a user are
    disjoint; all are sorted by (user, start))."""
    if not len(sessions):
        return np.full(len(times), -1, dtype=np.int64)
    known, rank = np.unique(np.concatenate([sessions.user, users]), return_inverse=True)
    t0 = min(int(sessions.start.min()), int(times.min()) if len(times) else 0)
    span = max(int(sessions.last.max()), int(times.max()) if len(times) else 0) - t0 + 1
    keys = rank[: len(sessions)] * span + (sessions.start - t0)
    found = np.searchsorted(keys, rank[len(sessions) :] * span + (times - t0), side="right") - 1
    ok = (found >= 0) & (sessions.user[np.maximum(found, 0)] == users)
    ok &= times <= sessions.last[np.maximum(found, 0)]
    return np.where(ok, found, -1)


def _worth_listing(
    sessions: _Open, users: np.ndarray, times: np.ndarray, max_pages: int
) -> np.ndarray:
    """Which new visits (sorted by time) may be among the first ``max_pages`` pages of their
    session: while the session has listed fewer, or when older than its latest listed one
    (an out-of-order visit). The list then holds at most ``max_pages`` plus the out-of-order
    visits; the rows are cut to the first ``max_pages`` when the session closes."""
    group = _group_of(sessions, users, times)
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    firsts = np.searchsorted(sorted_group, sorted_group, side="left")
    rank = np.empty(len(times), dtype=np.int64)
    rank[order] = np.arange(len(times)) - firsts
    return (rank + sessions.listed[group] < max_pages) | (times < sessions.listed_until[group])


class SessionProcessor(processors.SessionProcessor):
    """Sessionizes the events of a bucket of users with event-time timers (see the module
    docstring). The grouping key is the bucket; the rows carry ``user_id``. Its state
    variables are declared by its base class, which is what a query pickles (so that Spark's
    driver reads them without this module's imports: :mod:`gold.processors`); a processor
    becomes this class at its first handler call."""

    # -- state <-> working form: one call per variable ---------------------------------------

    def _load(self) -> tuple[_Open, int | None, int | None]:
        """The open sessions, the timer registered and the watermark of the last call."""
        state = self.session.get()
        if state is None:
            return _empty(), None, None
        blob, timer, watermark = state
        if blob is None:
            return _empty(), None, watermark
        columns = _unpack(blob)
        by_type = {k[0]: np.frombuffer(v[0], dtype=np.int64) for k, v in self.counts.iterator()}
        zero = np.zeros(len(columns["start"]), dtype=np.int64)
        counts = [by_type.get(t, zero) for t in EVENT_TYPES]
        return _Open(counts, **columns), timer, watermark

    def _listed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The listed visits, by (user, time); runs are in arrival order and ties keep it."""
        runs = [_unpack(run[0]) for run in self.pages.get()]
        if not runs:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, object)
        users, times, pages = (
            np.concatenate([run[name] for run in runs]) for name in ("user", "time", "page")
        )
        order = np.lexsort((times, users))
        return users[order], times[order], pages[order]

    def _save(self, opened: _Open, timer: int | None, old: _Open, watermark: int) -> None:
        """Write the summaries, the counts, the timer and the watermark of this call (the
        pages are the caller's). With no session open, only the watermark stays."""
        if not len(opened):
            self.session.update((None, None, watermark))
            if len(old):
                self.counts.clear()
            return
        due = int(opened.last.min()) + self.gap_ms
        if due != timer:
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(due)
        self.session.update((_pack({f: getattr(opened, f) for f in _FIELDS}), due, watermark))
        same_shape = len(old) == len(opened)
        for i, event_type in enumerate(EVENT_TYPES):
            row = opened.counts[i]
            if same_shape and np.array_equal(row, old.counts[i]):
                continue  # unchanged: no call
            if row.any():
                self.counts.updateValue((event_type,), (row.tobytes(),))
            elif len(old) and old.counts[i].any():
                self.counts.removeKey((event_type,))

    def _add(self, old: _Open, timer, watermark, new: _Open, users, times, pages) -> None:
        """Merge ``new`` sessions (with their visits, by user and time) into ``old``; save."""
        opened = merge(_Open.concat(old, new), self.gap_ms)
        listing = _worth_listing(opened, users, times, self.max_pages)
        users, times, pages = users[listing], times[listing], pages[listing]
        if len(times):
            group = _group_of(opened, users, times)
            np.add.at(opened.listed, group, 1)
            np.maximum.at(opened.listed_until, group, times)
            self.pages.appendValue((_pack({"user": users, "time": times, "page": pages}),))
        self._save(opened, timer, old, watermark)

    # -- the processor --------------------------------------------------------------------

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        events = _unpack_events(rows)
        old, timer, seen = self._load()
        watermark = timerValues.getCurrentWatermarkInMs()
        if seen is not None:  # Spark's rule: at or behind the watermark before is late
            on_time = events["time"] > seen * _US_PER_MS
            if not on_time.all():
                events = {name: column[on_time] for name, column in events.items()}
        if len(events["time"]):
            self._add(old, timer, watermark, *_singletons(events))
        else:
            self._save(old, timer, old, watermark)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        opened, _, _ = self._load()
        watermark = timerValues.getCurrentWatermarkInMs()
        if not len(opened):  # nothing open: a timer left behind (cannot happen by design)
            return
        # the fired timer is deleted by Spark after this call: the next one is registered
        closed = opened.last + self.gap_ms <= watermark
        if not closed.any():
            self._save(opened, None, opened, watermark)
            return
        users, times, pages = self._listed()
        group = _group_of(opened, users, times)
        out = self._rows(opened, closed, group, pages)
        rest = opened.take(~closed)
        self._save(rest, None, opened, watermark)
        keep = (group >= 0) & ~closed[np.maximum(group, 0)]
        if not keep.any():
            self.pages.clear()
        else:
            visits = {"user": users[keep], "time": times[keep], "page": pages[keep]}
            self.pages.put([(_pack(visits),)])
        yield out

    def handleInitialState(self, key, initialState, timerValues) -> None:
        seed = initialState
        start = _ms(seed["session_start"])
        maps = [dict(m) if m is not None else {} for m in seed["event_counts"]]  # pairs or dict
        listed = [list(p) if p is not None else [] for p in seed["pages"]]
        seeded = _Open(
            [[int(m.get(t, 0)) for m in maps] for t in EVENT_TYPES],
            user=seed["user_id"],
            start=start,
            last=_ms(seed["last_event_time"]),
            events=seed["events"],
            purchases=seed["purchases"],
            revenue=seed["revenue"],
            landing=seed["landing_page"],
            exit=seed["exit_page"],
            listed=np.zeros(len(start), dtype=np.int64),
            listed_until=np.full(len(start), _NEVER, dtype=np.int64),
        )
        # a seed lists pages without times: they keep their order at their session's start
        sizes = [len(p) for p in listed]
        users = np.repeat(seeded.user, sizes)
        times = np.repeat(start, sizes)
        pages = np.asarray([p for run in listed for p in run], dtype=object)
        order = np.lexsort((times, users))  # stable: each seed's pages keep their order
        old, timer, _ = self._load()
        watermark = timerValues.getCurrentWatermarkInMs()
        self._add(old, timer, watermark, seeded, users[order], times[order], pages[order])

    def _rows(self, opened: _Open, closed: np.ndarray, group: np.ndarray, pages) -> pd.DataFrame:
        """The closed sessions as output rows; ``group`` maps each listed page (sorted by user
        and time) to its session."""
        mine = (group >= 0) & closed[np.maximum(group, 0)]
        # listed pages of the closed sessions, cut to the first max_pages of each
        index = np.flatnonzero(closed)
        position = np.full(len(opened), -1, dtype=np.int64)
        position[index] = np.arange(len(index))
        owner, pages = position[group[mine]], pages[mine]  # ascending: sorted by (user, time)
        firsts = np.searchsorted(owner, owner, side="left")
        keep = np.arange(len(owner)) - firsts < self.max_pages
        owner, pages = owner[keep], pages[keep]
        bounds = np.searchsorted(owner, np.arange(len(index) + 1), side="left")
        listed = [pages[bounds[i] : bounds[i + 1]].tolist() for i in range(len(index))]
        s = opened.take(closed)
        present = s.counts.T > 0
        return pd.DataFrame(
            {
                "user_id": s.user,
                "session_start": pd.to_datetime(s.start, unit="ms", utc=True),
                "session_end": pd.to_datetime(s.last + self.gap_ms, unit="ms", utc=True),
                "events": s.events,
                "purchases": s.purchases,
                "revenue": s.revenue,
                "landing_page": s.landing,
                "exit_page": s.exit,
                "pages": listed,
                "event_counts": [
                    dict(zip(np.asarray(EVENT_TYPES)[has].tolist(), row[has].tolist(), strict=True))
                    for has, row in zip(present, s.counts.T, strict=True)
                ],
            }
        )


def _ms(column: pd.Series) -> np.ndarray:
    return column.to_numpy(dtype="datetime64[ns]").astype(np.int64) // _NS_PER_MS


def bucket(buckets: int):
    """The state key of a user: one of ``buckets``, by a hash of the user id."""
    return F.pmod(F.xxhash64("user_id"), F.lit(buckets)).alias("bucket")


def custom_sessions(
    events: DataFrame,
    *,
    watermark: str,
    gap: str = GAP,
    max_pages: int = MAX_PAGES,
    buckets: int = BUCKETS,
    initial_state: DataFrame | None = None,
) -> DataFrame:
    """Sessions from the processor, each in the micro-batch whose watermark closes it."""
    processor = PROCESSOR(duration_seconds(gap) * _MS, max_pages)
    seed = None
    if initial_state is not None:
        seed = initial_state.select(bucket(buckets), *SEED_SCHEMA.fieldNames()).groupBy("bucket")
    return (
        events.withWatermark("event_time", watermark)
        .select(bucket(buckets), *INPUT_COLUMNS)
        .mapInArrow(pack_events, PACKED_SCHEMA)
        .groupBy("bucket")
        .transformWithStateInPandas(
            processor,
            SCHEMA,
            "append",
            "EventTime",
            initialState=seed,
        )
    )


def hourly_increments(sessions: DataFrame) -> DataFrame:
    """A micro-batch's closed sessions as additions to gold.session_stats_hourly: per hour of
    session end, the sessions, their mean duration and events, and those with a purchase
    (merged into the table by :data:`STATS_UPSERT`)."""
    duration = F.col("session_end").cast("double") - F.col("session_start").cast("double")
    return (
        sessions.groupBy(F.window("session_end", "1 hour").alias("hour"))
        .agg(
            F.count(F.lit(1)).alias("sessions"),
            F.avg(duration).alias("mean_duration_s"),
            F.avg("events").alias("mean_events"),
            F.count(F.when(F.col("purchases") > 0, 1)).alias("purchasing_sessions"),
        )
        .select(
            F.col("hour.start").alias("hour_start"),
            F.col("hour.end").alias("hour_end"),
            "sessions",
            "mean_duration_s",
            "mean_events",
            "purchasing_sessions",
        )
    )


def _weighted(column: str) -> str:
    return f"(t.{column} * t.sessions + s.{column} * s.sessions) / (t.sessions + s.sessions)"


# an hour's row takes a micro-batch's sessions of that hour: counts add up, means are weighted
STATS_UPSERT = Upsert(
    keys=("hour_start",),
    updates={
        "sessions": "t.sessions + s.sessions",
        "mean_duration_s": _weighted("mean_duration_s"),
        "mean_events": _weighted("mean_events"),
        "purchasing_sessions": "t.purchasing_sessions + s.purchasing_sessions",
    },
)

FLOW = Flow(
    name="gold.sessions_custom",
    description="sessions from a transformWithStateInPandas processor, each written when the "
    "watermark closes it, and their hourly statistics merged in the same micro-batch",
    inputs=(TableInput("silver.events"),),
    transform=custom_sessions,
    params=lambda settings: {
        "watermark": settings.watermarks.events,
        "max_pages": settings.gold.session_max_pages,
        "buckets": settings.gold.session_buckets,
    },
    seed_table=lambda settings: settings.gold.sessions_seed_table,
    outputs=(
        Output(
            TABLE,
            schema=SCHEMA,
            zorder_by=("user_id",),
            complete_by="session_end",
            reference=Reference(oracle.sessions_custom_table, ("user_id", "session_start")),
        ),
        Output(
            STATS_TABLE,
            rows=hourly_increments,
            schema=STATS_SCHEMA,
            complete_by="hour_end",
            upsert=STATS_UPSERT,
            reference=Reference(oracle.session_stats_hourly_table, ("hour_start",)),
        ),
    ),
)
