"""Streaming writes to the lake's tables, exactly once: each micro-batch computed once
(persisted), then written to its tables in commits that record the query's app id and the
batch id as a Delta app transaction, so a replayed micro-batch is skipped table by table.

Appends and upserts go through ``foreachBatch`` (:func:`start_stream`, :func:`start_routed`),
complete mode through delta-spark's own sink. The tables' writes are the store's
(:class:`lakehouse.storage.store.TableStore`), by each table's engine.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from lakehouse import checkpoints
from lakehouse.settings import split_table_name
from lakehouse.storage.faults import failpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from lakehouse.flows import SideOutputs
    from lakehouse.storage.store import TableStore

OUTPUT_MODES = ("append", "complete", "update")
# columns start_routed adds to a micro-batch: its id, and the watermark its stateful
# operators drop late rows against
BATCH_ID = "_batch_id"
LATE_BEFORE = "_late_before"


class Route(NamedTuple):
    """A table a routed stream appends to: ``rows(batch)`` are its rows of a micro-batch,
    written in one file per micro-batch when ``event_time`` is given (a table streams read,
    see lakehouse.storage.timeorder), or MERGEd by ``upsert`` (a
    :class:`lakehouse.flows.Upsert`), by ``engine``."""

    table: str
    rows: Callable[[DataFrame], DataFrame]
    partition_by: Sequence[str] = ()
    event_time: str | None = None
    upsert: Any = None
    engine: str = "delta-rs"


def with_batch_columns(batch: DataFrame, batch_id: int, late_ms: int) -> DataFrame:
    """A routed micro-batch with its place, for routes that need it (the late rows of
    silver.late_events): :data:`BATCH_ID` and :data:`LATE_BEFORE`, the watermark its stateful
    operators drop late rows against (a row at or behind it is late)."""
    from pyspark.sql import functions as F

    return batch.withColumns(
        {
            BATCH_ID: F.lit(batch_id).cast("long"),
            LATE_BEFORE: F.timestamp_millis(F.lit(late_ms).cast("long")),
        }
    )


def route_rows(rows: Callable[[DataFrame], DataFrame], batch: DataFrame) -> DataFrame:
    """A route's rows of a batch with its place (a route of every column drops it again)."""
    return rows(batch).drop(BATCH_ID, LATE_BEFORE)


def start_stream(
    store: TableStore,
    df: DataFrame,
    name: str,
    checkpoint: str | Path,
    *,
    output_mode: str = "append",
    keys: Sequence[str] = (),
    trigger: dict[str, Any] | None = None,
    query_name: str | None = None,
    options: dict[str, str] | None = None,
    engine: str = "delta-rs",
) -> StreamingQuery:
    """Start a streaming query writing ``df`` to table ``name``, exactly once.

    ``options`` go to the sink (e.g. ``partitionBy`` for a table the stream creates). Complete
    mode is delta-spark's own sink (it records the query id and batch id): its table is
    delta-spark's."""
    if output_mode not in OUTPUT_MODES:
        raise ValueError(f"output mode must be one of {', '.join(OUTPUT_MODES)}")
    split_table_name(name)
    writer = _stream_writer(df, output_mode, checkpoint, trigger, query_name)
    for key, value in (options or {}).items():
        writer = writer.option(key, value)
    if output_mode == "update":
        if not keys:
            raise ValueError(
                f"update mode on {name} needs key columns: the rows of each micro-batch are "
                "upserted (MERGE) by key"
            )
        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise ValueError(f"key column(s) {', '.join(missing)} of {name} not in the stream")

        def upsert(batch: DataFrame, batch_id: int, counts, app_id: str, _clock) -> None:
            store.upsert(batch, name, keys, app_id, batch_id, rows=counts[0], engine=engine)

        return _each_batch(writer, checkpoint, query_name, upsert)
    partition_by = [c for c in (options or {}).get("partitionBy", "").split(",") if c]
    if output_mode == "complete":
        store.create(name, df.schema, partition_by, engine="delta-spark")
        return writer.format("delta").start(str(store.path(name)))
    # created first: two queries whose first commits would both create it (two flows into
    # one table) would race
    store.create(name, df.schema, partition_by, engine=engine)

    def append(batch: DataFrame, batch_id: int, counts, app_id: str, _clock) -> None:
        store.write(batch, name, txn=(app_id, batch_id), rows=counts[0], engine=engine)

    return _each_batch(writer, checkpoint, query_name, append)


def start_routed(
    store: TableStore,
    df: DataFrame,
    routes: Sequence[Route | tuple],
    checkpoint: str | Path,
    *,
    trigger: dict[str, Any] | None = None,
    query_name: str | None = None,
    before_write: Callable[[DataFrame, int, int], SideOutputs | None] | None = None,
    prepare: Callable[[DataFrame, int], DataFrame] | None = None,
) -> StreamingQuery:
    """Start a streaming query appending each micro-batch to several tables: table ``name``
    gets ``rows(batch)`` (partitioned by the route's columns, one file per micro-batch when
    it has an event-time column). The batch holds two more columns for them: :data:`BATCH_ID`,
    and :data:`LATE_BEFORE`, the watermark its stateful operators drop late rows against (a
    row at or before it is late). Each table records the batch in its own app transaction, so
    after a crash between two tables the replayed batch only writes the tables that missed it.
    ``before_write(batch, batch_id, rows)`` runs first (it may raise to stop the query) and may
    return more rows to append to other tables ({table: rows, or a future of them}),
    written the same way after the routes. ``prepare(batch, batch_id)``, when given, is
    the batch the routes and ``before_write`` see (rows taken out or added)."""
    routes = [Route(*route) for route in routes]
    for route in routes:
        split_table_name(route.table)

    def framed(batch: DataFrame, batch_id: int) -> tuple[DataFrame, list[DataFrame]]:
        late_ms = checkpoints.late_watermark_ms(Path(checkpoint), batch_id)
        if prepare is not None:
            batch = prepare(batch, batch_id)
        batch = with_batch_columns(batch, batch_id, late_ms)
        return batch, [route_rows(route.rows, batch) for route in routes]

    def count(batch: DataFrame, batch_id: int):
        # the batch and each route in the job that computes the batch: an empty route is
        # not written
        batch, outs = framed(batch, batch_id)
        return _counts([batch, *outs]), (batch, outs)

    def write_batch(made, batch_id: int, counts, app_id: str, clock):
        batch, outs = made
        side = {}
        try:
            # (the batch's rows, counted already: a bound for the parts it validates)
            side = (before_write(batch, batch_id, counts[0]) if before_write else None) or {}
            clock.lap("before_write")
            for route, out, rows in zip(routes, outs, counts[1:], strict=True):
                if rows:  # (an empty route: no write job, no Delta transaction)
                    _write_route(store, route, out, rows, app_id, batch_id)
            clock.lap("write")
            _write_side(store, side, app_id, batch_id, clock)
        finally:
            # background work on the batch ends before its cached data goes
            wait([f for f in side.values() if isinstance(f, Future)])

    writer = _stream_writer(df, "append", checkpoint, trigger, query_name)
    return _each_batch(writer, checkpoint, query_name, write_batch, count)


def _write_route(
    store: TableStore, route: Route, out: DataFrame, rows: int, app_id: str, batch_id: int
) -> None:
    """The ``rows`` rows ``out`` of a routed micro-batch into ``route``'s table, once per
    ``(app_id, batch_id)``: merged, or appended."""
    txn = (app_id, batch_id)
    if route.upsert is not None:
        keys, updates = route.upsert.keys, route.upsert.updates
        store.upsert(out, route.table, keys, *txn, updates, rows=rows, engine=route.engine)
    else:
        store.write(
            out,
            route.table,
            partition_by=route.partition_by,
            txn=txn,
            event_time=route.event_time,
            rows=rows,
            engine=route.engine,
        )
    failpoint(f"after-write:{route.table}")


def _write_side(
    store: TableStore, side: SideOutputs, app_id: str, batch_id: int, clock: _Clock
) -> None:
    """A routed micro-batch's side outputs ({table: rows, an Arrow table, or a future of
    either}), each once per ``(app_id, batch_id)``, by delta-rs (the ops tables)."""
    for name, rows_df in side.items():
        if isinstance(rows_df, Future):
            rows_df = rows_df.result()
            clock.lap("wait_side")
        if isinstance(rows_df, pa.Table):
            store.append_arrow_once(rows_df, name, app_id, batch_id)
        elif rows_df is not None:
            store.write(rows_df, name, txn=(app_id, batch_id))
    clock.lap("write_side")


def _each_batch(
    writer,
    checkpoint: str | Path,
    query_name: str | None,
    write: Callable[[Any, int, list[int], str, _Clock], None],
    count: Callable[[DataFrame, int], tuple[list[int], Any]] | None = None,
) -> StreamingQuery:
    """Start ``writer``'s query with each micro-batch computed once, in full (persisted:
    the tables' rows come from that one computation, and its stateful operators run, and
    commit their state, in it), then handed to ``write(batch, batch_id, counts, app_id,
    clock)`` when it has rows. ``count(batch, batch_id)`` gives ``counts`` (the batch's
    rows first, then what else the writer counts in the same job) and what ``write`` gets
    in place of the batch; without it, ``counts`` is the batch's rows alone. A batch of no
    rows writes nothing: no Delta transaction, no write job (a no-data batch that only
    moved the watermark, a replayed batch's state). Spark 4.2 fails a foreachBatch whose
    state stores did not all commit, hence the count even of a batch every table already
    records."""
    app_ids: list[str] = []  # read once the query has written its id
    steps = _Batches(query_name or _query_name(checkpoint))

    def each(batch: DataFrame, batch_id: int) -> None:
        try:
            if not app_ids:
                app_ids.append(checkpoints.app_id(Path(checkpoint)))
            clock = _Clock()
            batch = _cacheable(batch).persist()
            try:
                counts, made = count(batch, batch_id) if count else ([batch.count()], batch)
                clock.lap("compute")
                if counts[0]:
                    write(made, batch_id, counts, app_ids[0], clock)
                    clock.lap("write")
                steps.done(batch_id, clock.laps)
            finally:
                batch.unpersist()
        except Exception as exc:
            cut = interruption(exc)
            if cut is None:
                raise
            raise BatchInterrupted(cut) from None

    return writer.foreachBatch(each).start()


def _counts(frames: Sequence[DataFrame]) -> list[int]:
    """The row counts of ``frames`` (derived from one persisted micro-batch), in one job (the
    one that computes the batch when it is not cached yet)."""
    from functools import reduce

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    tagged = [frame.select(F.lit(i).alias("_i")) for i, frame in enumerate(frames)]
    found = dict(reduce(DataFrame.unionAll, tagged).groupBy("_i").count().collect())
    return [found.get(i, 0) for i in range(len(frames))]


def _cacheable(batch: DataFrame) -> DataFrame:
    """A micro-batch as it can be persisted: the same rows in the same partitions, without
    the partitioning its stateful operator gave it. Spark 4.2 fails to cache a streaming
    aggregation's batch in update mode (``key not found`` while it maps the cached plan's
    partitioning onto its output)."""
    return batch.coalesce(max(1, batch._jdf.rdd().getNumPartitions()))


def _stream_writer(
    df: DataFrame,
    output_mode: str,
    checkpoint: str | Path,
    trigger: dict[str, Any] | None,
    query_name: str | None,
):
    writer = (
        df.writeStream.outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        # one query per checkpoint (flow); several flows may feed one table
        .queryName(query_name or _query_name(checkpoint))
    )
    return writer.trigger(**trigger) if trigger else writer


def _query_name(checkpoint: str | Path) -> str:
    return ".".join(Path(checkpoint).parts[-2:])


# Per query name, the seconds each step of its last micro-batches took inside foreachBatch
# (compute: the batch itself; before_write: the flow's own step, e.g. quality rules; write:
# the tables' writes and commits; wait_side, write_side: the side outputs, e.g. the
# great-expectations results). bench/latency.py reads it; nothing else depends on it.
BATCH_STEPS: defaultdict[str, deque[dict[str, float]]] = defaultdict(lambda: deque(maxlen=2000))
# Per query name, set each time its foreachBatch function returns: the moment a query that
# never ends by itself can be stopped outside Python (lakehouse.runner.stopping)
BATCH_ENDED: defaultdict[str, threading.Event] = defaultdict(threading.Event)


class _Batches:
    """Where a query's foreachBatch function reports each micro-batch it is done with."""

    def __init__(self, query: str):
        self.query = query

    def done(self, batch_id: int, laps: dict[str, float]) -> None:
        BATCH_STEPS[self.query].append({"batch_id": batch_id, **laps})
        BATCH_ENDED[self.query].set()


class _Clock:
    """Seconds between laps, added up per lap name."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._last
        self._last = now


# what Spark takes for a stop when a foreachBatch function raises it (StreamExecution's
# IO_EXCEPTION_NAMES)
INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


class BatchInterrupted(RuntimeError):
    """A micro-batch's foreachBatch function cut by a stop, in the short form Spark recognizes.
    Spark matches the Python error of the function against a pattern that recurses once per
    character (StreamExecution.PROXY_ERROR): on the whole traceback of a Java interruption,
    its stack trace included, the stream thread overflows its stack and the JVM prints the
    trace whatever the log level."""


def interruption(exc: BaseException) -> str | None:
    """The message of a :class:`BatchInterrupted` for an error a stop caused (a Java
    interruption, or the stopped query's jobs cancelled), None for any other error."""
    text = str(exc)
    cut = next((name for name in INTERRUPTIONS if name in text), None)
    if cut is None and "cancelled" in text and "job group" in text:
        cut = INTERRUPTIONS[0]
    if cut is None:
        return None
    call = (
        text.split("\n", 1)[0].strip().rstrip(".").removeprefix("An error occurred while calling")
    )
    return f"py4j.protocol.Py4JJavaError: An error occurred while calling{call[:200]}: {cut}"
