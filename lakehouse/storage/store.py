"""Table storage: Delta tables through delta-spark, addressed as ``layer.table``.

Tables live under ``tables/<layer>/<table>``; streaming writes are exactly-once: every commit of
a micro-batch records the query's app id and the batch id as a Delta app transaction, so a
replayed micro-batch is skipped. Appends go through ``foreachBatch``, one commit per table:
a small micro-batch's rows collected as Arrow and appended by delta-rs, a larger one in a
delta-spark transaction; complete mode through Delta's own sink, update mode through a MERGE on
the declared key columns (by delta-rs for a small batch).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from lakehouse import checkpoints
from lakehouse.errors import LakehouseError
from lakehouse.locks import creating
from lakehouse.settings import Settings, TriggerSettings, split_table_name
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage import timeorder
from lakehouse.storage.deltafiles import TableNotFound

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from lakehouse.flows import SideOutputs

log = logging.getLogger(__name__)
OUTPUT_MODES = ("append", "complete", "update")
# columns write_stream_routed adds to a micro-batch: its id, and the watermark its stateful
# operators drop late rows against
BATCH_ID = "_batch_id"
LATE_BEFORE = "_late_before"


class Route(NamedTuple):
    """A table a routed stream appends to: ``rows(batch)`` are its rows of a micro-batch,
    written in files in ``event_time`` order when given (see lakehouse.storage.timeorder), or
    MERGEd by ``upsert`` (a :class:`lakehouse.flows.Upsert`)."""

    table: str
    rows: Callable[[DataFrame], DataFrame]
    partition_by: Sequence[str] = ()
    event_time: str | None = None
    upsert: Any = None


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


class DeltaUnavailable(LakehouseError, RuntimeError):
    """delta-spark is not on the Spark classpath."""


def trigger_kwargs(trigger: TriggerSettings, layer: str = "") -> dict[str, Any]:
    """``DataStreamWriter.trigger`` arguments for the configured trigger (of ``layer``'s
    flows)."""
    if trigger.mode == "available-now":
        return {"availableNow": True}
    return {"processingTime": trigger.interval_of(layer)}


class TableStore:
    """Read, read as a stream, write, and write a stream, for tables named ``layer.table``,
    through delta-spark (its jars from ``make setup``, see lakehouse.jars), a micro-batch's
    small appends and upserts through delta-rs (:meth:`_by_delta_rs`). Where the session's
    catalog outlives the process (a metastore: ``spark.sql.catalogImplementation=hive``) every
    table it creates is registered there as ``layer.table`` (a Delta table at its location), so
    SQL, ``DESCRIBE HISTORY`` and time travel see it by name; in Spark's in-memory catalog an
    entry would die with the job that wrote it (three catalog statements a table, every run), so
    a table is registered only when :meth:`register` is called (``lakehouse sql`` does)."""

    def __init__(self, spark: SparkSession, settings: Settings):
        self.spark = spark
        self.settings = settings
        if not delta_available(spark):
            raise DeltaUnavailable(
                "delta-spark is not on the Spark classpath: under spark-submit pass the jars "
                "(--jars with the files of jars/lib, see `lakehouse cluster package`); "
                "elsewhere run make setup, or set native.jars_packages"
            )
        self._registered: set[str] = set()
        self._catalog_persists = (
            spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "hive"
        )

    # -- locations --
    def path(self, name: str) -> Path:
        return self.settings.table_path(name).absolute()

    def exists(self, name: str) -> bool:
        return dfiles.is_delta_table(self.path(name))

    def require(self, name: str) -> Path:
        path = self.path(name)
        if not dfiles.is_delta_table(path):
            layer, _ = split_table_name(name)
            raise TableNotFound(
                f"table {name} does not exist at {path}; run the {layer} layer that writes it "
                "first, or check --root"
            )
        return path

    def register(self, name: str, force: bool = False) -> bool:
        """Register table ``name`` in the session catalog as a Delta table at its location
        (once per store), unless the catalog has it there already: a persistent catalog (the
        JDBC server's, lakehouse.tools.catalog) keeps it across processes. A name registered at
        another location (another lake root) is replaced; ``force`` replaces it anyway.
        Whether the catalog's entry was written now."""
        if name in self._registered and not force:
            return False
        layer, table = split_table_name(name)
        path = self.path(name)
        if not self.spark.catalog.databaseExists(layer):  # (IF NOT EXISTS warns when it is)
            self.spark.sql(f"CREATE DATABASE IF NOT EXISTS `{layer}`")
        written = force or registered_location(self.spark, layer, table) != Path(
            os.path.normpath(path)
        )
        if written:
            location = str(path).replace("\\", "\\\\").replace("'", "\\'")
            self.spark.sql(f"DROP TABLE IF EXISTS `{layer}`.`{table}`")  # external: data stays
            self.spark.sql(f"CREATE TABLE `{layer}`.`{table}` USING delta LOCATION '{location}'")
        self._registered.add(name)
        return written

    def register_again(self, name: str) -> None:
        """Register ``name`` anew (its table was rewritten: what the catalog and the session
        kept of it goes), where it is registered."""
        if self._catalog_persists or name in self._registered:
            self.register(name, force=True)

    def _register_created(self, name: str) -> None:
        if self._catalog_persists:
            self.register(name)

    # -- reading --
    def read(self, name: str, columns: Sequence[str] | None = None) -> DataFrame:
        df = self.spark.read.format("delta").load(str(self.require(name)))
        return df.select(*columns) if columns else df

    def read_stream(
        self,
        name: str,
        max_files_per_trigger: int | None = None,
        starting_version: int | None = None,
    ) -> DataFrame:
        """Table ``name`` as a stream: from ``starting_version`` on, commit by commit, or else
        (Delta's default) its snapshot first, then the commits after it. Either only for a
        checkpoint's first start: a restart goes on from the checkpoint's offsets. A commit
        that removes rows (a full refresh's overwrite of the table) is skipped: the stream
        keeps what it read and goes on with the appends after it (a full refresh of the
        reader's own tables, ``--with-downstream``, follows the rebuilt rows)."""
        path = self.require(name)
        reader = self.spark.readStream.format("delta").option("skipChangeCommits", "true")
        if starting_version is not None:
            reader = reader.option("startingVersion", str(starting_version))
        limit = max_files_per_trigger or self.settings.trigger.max_files_per_trigger
        if limit:
            reader = reader.option("maxFilesPerTrigger", int(limit))
        return reader.load(str(path))

    def read_path(self, path: str | Path, name: str = "staging") -> DataFrame:
        """The Delta table at ``path`` (not a table of the lake: a full refresh's staging)."""
        return self.spark.read.format("delta").load(str(path))

    def replace(
        self,
        df: DataFrame,
        name: str,
        partition_by: Sequence[str] = (),
        txn: tuple[str, int] | None = None,
    ) -> None:
        """Overwrite table ``name`` with ``df`` in one commit, its schema too (a full
        refresh's switch); skipped, as a write, when the table records ``txn`` already."""
        failpoint(f"before-switch:{name}")
        self.write(df, name, mode="overwrite", partition_by=partition_by, txn=txn, schema=True)

    # -- writing --
    def write(
        self,
        df: DataFrame,
        name: str,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        txn: tuple[str, int] | None = None,
        order_by: str | None = None,
        schema: bool = False,
    ) -> None:
        """Batch write. ``txn`` = (app id, version) makes the write idempotent: it is skipped
        when the table already records that version for that app (a replayed micro-batch).
        ``order_by`` (an event-time column) lists the new files in its order in the commit,
        with modification times in that order too (a micro-batch's append). ``schema``: an
        overwrite replaces the table's schema too. A schema that does not fit the table is
        refused in one line naming the columns."""
        _check_write_mode(mode)
        if mode == "append" and txn and not self.exists(name):
            # created first, alone: flows of one job appending at once to a table that does
            # not exist yet (ops.quality_results) would both create it and one would fail
            self.create(name, df.schema, partition_by)
        if mode == "append" and self.exists(name):
            if txn:
                self._append_once(df, name, *txn, order_by=order_by)
                return
            self._check_schema(df, name, self._transaction(name))
        failpoint(f"before-commit:{name}")  # delta-spark writes and commits in one call
        self._save(df, name, mode, partition_by, txn, schema)

    def _save(
        self,
        df: DataFrame,
        name: str,
        mode: str,
        partition_by: Sequence[str],
        txn: tuple[str, int] | None,
        schema: bool,
    ) -> None:
        """delta-spark's own writer, in one call (it writes and commits)."""
        writer = df.write.format("delta").mode(mode)
        if schema:
            writer = writer.option("overwriteSchema", "true")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if txn:
            writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
        with _commit_lock(self.path(name)):
            writer.save(str(self.path(name)))

    def write_stream(
        self,
        df: DataFrame,
        name: str,
        checkpoint: str | Path,
        *,
        output_mode: str = "append",
        keys: Sequence[str] = (),
        trigger: dict[str, Any] | None = None,
        query_name: str | None = None,
        options: dict[str, str] | None = None,
    ) -> StreamingQuery:
        """Start a streaming query writing ``df`` to table ``name``, exactly once.

        ``options`` go to the sink (e.g. ``partitionBy`` for a table the stream creates)."""
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
                self.upsert(batch, name, keys, app_id, batch_id, rows=counts[0])

            return self._each_batch(writer, checkpoint, query_name, upsert)
        # created first: two queries whose first commits would both create it (two flows into
        # one table) fail with a protocol conflict in delta-spark
        self.create(
            name, df.schema, [c for c in (options or {}).get("partitionBy", "").split(",") if c]
        )
        if output_mode != "append":
            # delta-spark's own sink, exactly-once (it records the query id and batch id): an
            # overwrite lists the table's files, the state its id lookup reconstructs anyway
            return writer.format("delta").start(str(self.path(name)))

        # appends as delta-spark's sink makes them (the app id is the query id, the version
        # the batch id), at the price of an append, not of a state reconstruction
        def append(batch: DataFrame, batch_id: int, counts, app_id: str, _clock) -> None:
            if not self._append_arrow(batch, name, app_id, batch_id, counts[0]):
                self._append_once(self._sized(batch, counts[0]), name, app_id, batch_id)

        return self._each_batch(writer, checkpoint, query_name, append)

    def _each_batch(
        self,
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

    def _sized(self, rows_df: DataFrame, rows: int) -> DataFrame:
        """``rows_df`` (about ``rows`` rows) in one partition, one file, when they fit in one
        file (``write.rows_per_file``): a micro-batch of a few rows is not spread over a file
        per shuffle partition."""
        return rows_df.coalesce(1) if rows <= self.settings.write.rows_per_file else rows_df

    def write_stream_routed(
        self,
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
        gets ``rows(batch)`` (partitioned by the route's columns, in files in the order of its
        event-time column). The batch holds two more columns for them: :data:`BATCH_ID`, and
        :data:`LATE_BEFORE`, the watermark its stateful operators drop late rows against (a
        row at or before it is late). Each table records the batch in its own app transaction, so after
        a crash between two tables the replayed batch only writes the tables that missed it.
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
            # not written, a small one is one file
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
                        self._write_route(route, out, rows, app_id, batch_id)
                clock.lap("write")
                self._write_side(side, app_id, batch_id, clock)
            finally:
                # background work on the batch ends before its cached data goes
                wait([f for f in side.values() if isinstance(f, Future)])

        writer = _stream_writer(df, "append", checkpoint, trigger, query_name)
        return self._each_batch(writer, checkpoint, query_name, write_batch, count)

    def _write_route(
        self, route: Route, out: DataFrame, rows: int, app_id: str, batch_id: int
    ) -> None:
        """The ``rows`` rows ``out`` of a routed micro-batch into ``route``'s table, once per
        ``(app_id, batch_id)``: merged, or appended in files in event-time order."""
        name, _, partition_by, event_time, merge = route
        if merge is not None:
            self.upsert(out, name, merge.keys, app_id, batch_id, merge.updates, rows)
        elif not self._append_arrow(out, name, app_id, batch_id, rows, partition_by):
            if event_time:
                out = timeorder.clustered(out, event_time, rows, self.settings.write.rows_per_file)
            else:
                out = self._sized(out, rows)
            self.write(
                out, name, partition_by=partition_by, txn=(app_id, batch_id), order_by=event_time
            )
        failpoint(f"after-write:{name}")

    def _write_side(self, side: SideOutputs, app_id: str, batch_id: int, clock: _Clock) -> None:
        """A routed micro-batch's side outputs ({table: rows, an Arrow table, or a future of
        either}), each once per ``(app_id, batch_id)``."""
        for name, rows_df in side.items():
            if isinstance(rows_df, Future):
                rows_df = rows_df.result()
                clock.lap("wait_side")
            if isinstance(rows_df, pa.Table):
                self.append_arrow_once(rows_df, name, app_id, batch_id)
            elif rows_df is not None:
                self.write(rows_df.coalesce(1), name, txn=(app_id, batch_id))
        clock.lap("write_side")

    def _append_once(
        self, df: DataFrame, name: str, app_id: str, version: int, order_by: str | None = None
    ) -> bool:
        """Append ``df`` to existing table ``name`` in a commit that records (``app_id``,
        ``version``), unless the table records that version or a later one already (then
        False, and ``df`` is not evaluated).

        What ``txnAppId``/``txnVersion`` do, without their price: delta-spark looks the app's
        version up in the snapshot's reconstructed state, three Spark jobs over the log per
        write (most of a small append's time). The version is read here from the snapshot's
        checksum file (``.crc``), which delta-spark keeps with every commit, and from the
        reconstructed state only when the checksum lacks it. The app id is registered as read,
        so a concurrent commit by the same app still conflicts. A batch that writes no rows
        commits nothing: its replay writes no rows either, or writes rows no earlier attempt
        did. ``order_by``: see :meth:`TableStore.write`."""
        jvm = self.spark._jvm
        delta = jvm.org.apache.spark.sql.delta
        jtxn = self._transaction(name)
        self._check_schema(df, name, jtxn)
        if _recorded_version(jtxn, app_id) >= version:
            log.info("batch %s of %s already in %s: skipped", version, app_id, name)
            return False
        jtxn.readTxn().addOne(app_id)
        files = jtxn.writeFiles(df._jdf)
        failpoint(f"before-commit:{name}")
        if files.isEmpty():
            return True
        if order_by:
            files = _in_time_order(jvm, files, order_by)
        stamp = jvm.scala.Some(jvm.java.lang.Long.valueOf(int(time.time() * 1000)))
        record = delta.actions.SetTransaction(app_id, version, stamp)
        none = jvm.scala.Option.empty()
        write_op = getattr(delta, "DeltaOperations$Write")(
            jvm.org.apache.spark.sql.SaveMode.Append, *[none] * 8
        )
        with _commit_lock(self.path(name)):
            jtxn.commit(files.appended(record), write_op)
        return True

    def _append_arrow(
        self,
        df: DataFrame,
        name: str,
        app_id: str,
        version: int,
        rows: int,
        partition_by: Sequence[str] = (),
    ) -> bool:
        """Append the ``rows`` rows of ``df`` to table ``name`` by delta-rs, as one file, in a
        commit that records (``app_id``, ``version``), when they are few (at most
        ``write.arrow_append_rows`` and ``write.rows_per_file``): collected as Arrow on the
        driver, a small append costs a tenth of delta-spark's write job and commit. False,
        with nothing done, where delta-spark appends (see :meth:`_by_delta_rs`; a
        partitioned table; a batch Spark sizes at more than :data:`ARROW_MAX_BYTES`, which
        for rows of a cached micro-batch is the cached batch's size, and for a frame Spark
        cannot size, such as one not cached, is unbounded)."""
        from deltalake import write_deltalake

        write = self.settings.write
        if partition_by or rows > min(write.arrow_append_rows, write.rows_per_file):
            return False
        if _estimated_bytes(df) > ARROW_MAX_BYTES:
            # a few rows can be large (bronze.quarantine keeps long lines whole): they are not
            # copied to the driver's Python
            return False

        def append(table, data: pa.Table, properties) -> None:
            write_deltalake(table, data, mode="append", commit_properties=properties)

        return self._by_delta_rs(df, name, app_id, version, append, empty_too=True)

    def _upsert_arrow(
        self,
        df: DataFrame,
        name: str,
        keys: Sequence[str],
        app_id: str,
        batch_id: int,
        updates: dict[str, str] | None,
        rows: int,
    ) -> bool:
        """:meth:`upsert` of the ``rows`` rows of ``df`` by delta-rs: the batch merged in one
        commit that records (``app_id``, ``batch_id``), or appended into a table with no rows
        yet, where it has nothing to match; False, with nothing done, where delta-spark does
        it (see :meth:`_by_delta_rs`; more rows than one file holds into a table with no
        rows, which delta-spark writes in files of ``write.rows_per_file``)."""
        import pyarrow.compute as pc
        from deltalake import write_deltalake

        def merge(table, data: pa.Table, properties) -> None:
            copies = data.group_by(list(keys)).aggregate([([], "count_all")])
            copies = copies.filter(pc.greater(copies.column("count_all"), 1))
            if copies.num_rows:
                first = copies.select(list(keys)).slice(0, 1).to_pylist()[0]
                before, after = _duplicate_keys_message(name, keys, batch_id)
                raise ValueError(before + json.dumps(first, default=str) + after)
            if not table.file_uris():
                write_deltalake(table, data, mode="append", commit_properties=properties)
                return
            # each comparison in parentheses: DataFusion parses `a IS NOT DISTINCT FROM b AND
            # c` as `a IS NOT DISTINCT FROM (b AND c)`
            predicate = " AND ".join(f"(t.`{k}` IS NOT DISTINCT FROM s.`{k}`)" for k in keys)
            merger = table.merge(
                source=data,
                predicate=predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            if updates:
                merger = merger.when_matched_update(updates=dict(updates))
            else:
                merger = merger.when_matched_update_all()
            merger.when_not_matched_insert_all().execute()

        one_file = rows <= self.settings.write.rows_per_file
        return self._by_delta_rs(df, name, app_id, batch_id, merge, empty_too=one_file)

    def _by_delta_rs(
        self,
        df: DataFrame,
        name: str,
        app_id: str,
        version: int,
        commit: Callable[[Any, pa.Table, Any], None],
        empty_too: bool,
    ) -> bool:
        """``commit(table, data, properties)``: ``df`` collected as Arrow in the columns of
        table ``name`` (a delta-rs table), written in one commit with ``properties``, which
        record (``app_id``, ``version``); skipped when the table records that version or a
        later one already. True when done or skipped; False, with nothing done, where
        delta-spark does it: no table yet, a table with no rows unless ``empty_too``, a
        partitioned table, a batch whose columns are not the table's
        (delta-spark's path says how in one line), a table feature delta-rs does not write
        (in-commit timestamps, row tracking, type widening: refused before any commit)."""
        from deltalake.exceptions import (
            CommitFailedError,
            DeltaProtocolError,
            SchemaMismatchError,
        )

        if not self.exists(name):
            return False
        try:
            table = dfiles.open_table(self.path(name))
            if dfiles.records(table, app_id, version):
                log.info("batch %s of %s already in %s: skipped", version, app_id, name)
                return True
            schema = dfiles.utc_schema(dfiles.table_arrow_schema(table))
            incoming = dfiles.utc_schema(_arrow_schema(df.schema))
            if table.metadata().partition_columns or dfiles.schema_differences(schema, incoming):
                return False
            if not empty_too and not table.file_uris():
                return False
            data = dfiles.conform(df.toArrow(), schema)
            properties = dfiles.app_commit(app_id, version)
            failpoint(f"before-commit:{name}")
            with _commit_lock(self.path(name)):
                table.update_incremental()  # what this process committed since it opened it
                commit(table, data, properties)
                dfiles.write_checksum(self.path(name), table.version())
        except (DeltaProtocolError, CommitFailedError, SchemaMismatchError) as exc:
            # (a schema delta-rs sees otherwise than delta-spark: delta-spark's path writes
            # or refuses it in one line); any other failure is the write's own
            if isinstance(exc, CommitFailedError) and UNSUPPORTED_BY_DELTA_RS not in str(exc):
                raise
            log.info("write to %s by delta-spark: %s", name, str(exc).splitlines()[0])
            return False
        return True

    def _transaction(self, name: str):
        """A delta-spark transaction on table ``name`` (its snapshot, its schema, its app
        versions); one not committed is dropped without a trace."""
        delta = self.spark._jvm.org.apache.spark.sql.delta
        return delta.DeltaLog.forTable(
            self.spark._jsparkSession, str(self.path(name))
        ).startTransaction()

    def _check_schema(self, df: DataFrame, name: str, jtxn) -> None:
        """Refuse ``df`` in one line naming the columns when it does not fit table ``name``,
        whose schema is that of delta-spark transaction ``jtxn``."""
        from pyspark.sql.types import StructType

        table = _arrow_schema(StructType.fromJson(json.loads(jtxn.metadata().schemaString())))
        incoming = _arrow_schema(df.schema)
        dfiles.check_schema(f"table {name}", dfiles.utc_schema(table), dfiles.utc_schema(incoming))

    def append_arrow_once(self, rows: pa.Table, name: str, app_id: str, version: int) -> bool:
        """Append a few Arrow rows to table ``name`` (created when missing) with delta-rs, in a
        commit that records (``app_id``, ``version``), unless the table records it already
        (then False). No Spark job: about a tenth of delta-spark's append for a few rows."""
        from pyspark.sql.pandas.types import from_arrow_schema

        if not self.exists(name):
            self.create(name, from_arrow_schema(rows.schema))
        with _commit_lock(self.path(name)):
            return dfiles.append_once(self.path(name), rows, app_id, version)

    def create(self, name: str, schema: StructType, partition_by: Sequence[str] = ()) -> bool:
        """Create table ``name`` empty, unless it exists; True when created. Creations take
        turns, in a process and across processes (:func:`lakehouse.locks.creating`): two at
        once would both write version 0, and one fail, or one would take the other's log
        folder, still without a version, for a killed creation's and remove it."""
        from delta.tables import DeltaTable

        with _CREATING, creating(self.path(name)):
            if self.exists(name):
                self._register_created(name)
                return False
            if dfiles.remove_uncommitted_log(self.path(name)):
                log.info("table %s: removed the log of a creation killed before its commit", name)
            properties = self._creation_properties()
            fields = schema.jsonValue()
            created = None
            if properties is not None and dfiles.plain_table(fields, partition_by):
                created = dfiles.create_empty(self.path(name), fields, partition_by, properties)
            if created is None:
                builder = DeltaTable.createIfNotExists(self.spark).location(str(self.path(name)))
                builder = builder.addColumns(schema)
                if partition_by:
                    builder = builder.partitionedBy(*partition_by)
                builder.execute()
                created = True
            self._register_created(name)
        return created

    def _creation_properties(self) -> dict[str, str] | None:
        """The table properties delta-spark would give a table created in this session (from
        its ``spark.databricks.delta.properties.defaults.*``), when they are all
        :data:`~lakehouse.storage.deltafiles.PLAIN_PROPERTIES` and no conf sets a protocol or
        table feature; else None (delta-spark creates the table). Read once per store: a
        conf set on the session later is seen by the next run's store."""
        if not hasattr(self, "_properties"):
            defaults = "spark.databricks.delta.properties.defaults."
            properties: dict[str, str] | None = {}
            for key, value in self.spark.conf.getAll.items():
                if key.startswith(defaults) and key[len(defaults) :] in dfiles.PLAIN_PROPERTIES:
                    properties[f"delta.{key[len(defaults) :]}"] = value
                elif key.startswith((defaults, "spark.databricks.delta.protocol.")) or (
                    key.startswith("spark.databricks.delta.") and "feature" in key.lower()
                ):
                    properties = None
                    break
            self._properties = properties
        return self._properties

    def upsert(
        self,
        df: DataFrame,
        name: str,
        keys: Sequence[str],
        app_id: str,
        batch_id: int,
        updates: dict[str, str] | None = None,
        rows: int | None = None,
    ) -> None:
        """MERGE one micro-batch into ``name`` by ``keys``, once per ``(app_id, batch_id)``: a
        matched row takes the batch's row (or, with ``updates``, each of those columns the
        value of its SQL expression over ``t``, the table's row, and ``s``, the batch's).
        ``rows``: the batch's row count, when the caller knows it. A batch of no rows writes
        nothing; into a table with no rows yet the batch is appended (a MERGE would look for
        matches it cannot find). A batch of at most ``write.arrow_upsert_rows`` rows is
        merged, or appended, by delta-rs (:meth:`_upsert_arrow`); a larger one by
        delta-spark's MERGE, which takes its app transaction from the confs of the batch's own
        session: each streaming query runs in a session of its own, so no other flow sees
        them."""
        from delta.tables import DeltaTable

        rows = df.count() if rows is None else rows
        if not rows:
            return
        small = rows <= self.settings.write.arrow_upsert_rows
        if small and self._upsert_arrow(df, name, keys, app_id, batch_id, updates, rows):
            return
        jtxn = self._transaction(name) if self.exists(name) else None
        if jtxn is not None and _recorded_version(jtxn, app_id) >= batch_id:
            log.info("upsert batch %s of %s already in %s: skipped", batch_id, app_id, name)
            return
        df = _unique_keys(df, name, keys, batch_id)
        try:
            if jtxn is None or jtxn.snapshot().numOfFiles() == 0:
                self.write(self._sized(df, rows), name, txn=(app_id, batch_id))
                return
            self._check_schema(df, name, jtxn)
            conf = df.sparkSession.conf
            merge_confs = {
                "spark.databricks.delta.write.txnAppId": app_id,
                "spark.databricks.delta.write.txnVersion": str(batch_id),
            }
            for key, value in merge_confs.items():
                conf.set(key, value)
            try:
                condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
                table = DeltaTable.forPath(df.sparkSession, str(self.path(name)))
                merge = table.alias("t").merge(df.alias("s"), condition)
                if updates:
                    merge = merge.whenMatchedUpdate(set=dict(updates))
                else:
                    merge = merge.whenMatchedUpdateAll()
                with _commit_lock(self.path(name)):
                    merge.whenNotMatchedInsertAll().execute()
            finally:
                # left set, they would skip the session's later plain writes too
                for key in merge_confs:
                    conf.unset(key)
        except Exception as exc:  # Spark's error, or py4j's around it
            if DUPLICATE_KEYS in str(exc):
                message = str(exc)[str(exc).index(f"cannot upsert into {name}") :]
                raise ValueError(message.splitlines()[0].rstrip(". ")) from None
            raise


DUPLICATE_KEYS = "occur more than once in batch"
# how delta-rs refuses a commit to a table with a feature it does not write
UNSUPPORTED_BY_DELTA_RS = "Unsupported table features required"
_CREATING = threading.RLock()  # one table creation at a time in this process (TableStore.create)
# One commit at a time per table in this process, whichever engine makes it. delta-rs claims a
# log version with an atomic link; delta-spark's log store on a local disk checks that the
# version is free, then renames over it, which is atomic only among delta-spark's own commits
# of one JVM: a delta-rs commit in between would be overwritten.
_COMMITS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_COMMITS_GUARD = threading.Lock()


def _commit_lock(path: Path) -> threading.Lock:
    with _COMMITS_GUARD:
        return _COMMITS[str(path)]


# The largest micro-batch (Spark's estimate of its rows in memory) written by delta-rs from
# Arrow on the driver: a larger one is written by delta-spark, from the executors
ARROW_MAX_BYTES = 64 * 1024 * 1024


def _estimated_bytes(df: DataFrame) -> int:
    """Spark's size estimate of ``df``, no job run: for rows picked out of a cached
    micro-batch, the cached batch's size in memory (an upper bound)."""
    # (a Scala BigInt: py4j gives a Python int, or an object whose str() is its digits)
    return int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))


def _cacheable(batch: DataFrame) -> DataFrame:
    """A micro-batch as it can be persisted: the same rows in the same partitions, without
    the partitioning its stateful operator gave it. Spark 4.2 fails to cache a streaming
    aggregation's batch in update mode (``key not found`` while it maps the cached plan's
    partitioning onto its output)."""
    return batch.coalesce(max(1, batch._jdf.rdd().getNumPartitions()))


def _arrow_schema(schema) -> pa.Schema:
    """A Spark schema in Arrow's terms (times in UTC, no large types)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def _counts(frames: Sequence[DataFrame]) -> list[int]:
    """The row counts of ``frames`` (derived from one persisted micro-batch), in one job (the
    one that computes the batch when it is not cached yet)."""
    from functools import reduce

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    tagged = [frame.select(F.lit(i).alias("_i")) for i, frame in enumerate(frames)]
    found = dict(reduce(DataFrame.unionAll, tagged).groupBy("_i").count().collect())
    return [found.get(i, 0) for i in range(len(frames))]


def _in_time_order(jvm, files, column: str):
    """delta-spark's written files (a Scala Seq of AddFile) in the order of their first value
    of ``column``, with modification times in that order (lakehouse.storage.timeorder)."""
    adds = [files.apply(i) for i in range(files.size())]
    adds = timeorder.in_time_order(adds, column, lambda a: a.stats())
    times = timeorder.commit_times([a.modificationTime() for a in adds])
    ordered = jvm.java.util.ArrayList()
    for a, ms in zip(adds, times, strict=True):
        ordered.add(
            a.copy(
                a.path(),
                a.partitionValues(),
                a.size(),
                ms,
                a.dataChange(),
                a.stats(),
                a.tags(),
                a.deletionVector(),
                a.baseRowId(),
                a.defaultRowCommitVersion(),
                a.clusteringProvider(),
                a.backReference(),
                a.amtPassthrough(),
            )
        )
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(ordered).toSeq()


def _recorded_version(jtxn, app_id: str) -> int:
    """The last version app ``app_id`` recorded in the snapshot of delta-spark transaction
    ``jtxn`` (-1: none): from the snapshot's checksum when it lists the table's app
    transactions, else from its reconstructed state."""
    checksum = jtxn.snapshot().checksumOpt()
    if checksum.isDefined() and checksum.get().setTransactions().isDefined():
        found = -1
        records = checksum.get().setTransactions().get().iterator()
        while records.hasNext():
            record = records.next()
            if record.appId() == app_id:
                found = max(found, record.version())
        return found
    return jtxn.txnVersion(app_id)


def _duplicate_keys_message(name: str, keys: Sequence[str], batch_id: int) -> tuple[str, str]:
    """The error of a batch whose keys repeat, before and after the example key (as JSON)."""
    return (
        f"cannot upsert into {name}: key(s) of ({', '.join(keys)}) {DUPLICATE_KEYS} "
        f"{batch_id}, e.g. ",
        "; update mode needs one row per key",
    )


def _unique_keys(df: DataFrame, name: str, keys: Sequence[str], batch_id: int) -> DataFrame:
    """``df`` that fails the job writing it when a key occurs more than once (update mode needs
    one row per key). Checked inside the write's own job: a second action on a micro-batch of
    a streaming aggregation would run it again (and Spark 4.2 fails to cache one that is
    grouped again: 'key not found')."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    copies = F.count(F.lit(1)).over(Window.partitionBy(*keys))
    before, after = _duplicate_keys_message(name, keys, batch_id)
    message = F.concat(F.lit(before), F.to_json(F.struct(*keys)), F.lit(after))
    return (
        df.withColumn("_copies", copies)
        .where(F.assert_true(F.col("_copies") == 1, message).isNull())
        .drop("_copies")
    )


def _check_write_mode(mode: str) -> None:
    if mode not in ("append", "overwrite"):
        raise ValueError(f"write mode must be append or overwrite; got {mode!r}")


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


FAILPOINT_ENV = "LAKEHOUSE_FAILPOINT"


class Failpoint(RuntimeError):
    """A crash injected on purpose by a test (``LAKEHOUSE_FAILPOINT``)."""


def failpoint(name: str) -> None:
    """Crash here when ``$LAKEHOUSE_FAILPOINT`` names this point (tests of exactly-once)."""
    if os.environ.get(FAILPOINT_ENV) == name:
        raise Failpoint(f"failpoint {name} reached")


def delta_available(spark: SparkSession) -> bool:
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName(
            "io.delta.tables.DeltaTable", True, False
        )
        return True
    except Exception:
        return False


def catalog_entry(spark: SparkSession, layer: str, name: str):
    """The catalog's entry (a JVM CatalogTable) of ``layer.name``, a table or a view; None when
    there is none. One lookup in the session's catalog, however large the table."""
    catalog = spark._jsparkSession.sessionState().catalog().externalCatalog()
    if not catalog.databaseExists(layer) or not catalog.tableExists(layer, name):
        return None
    return catalog.getTable(layer, name)


def registered_location(spark: SparkSession, layer: str, name: str) -> Path | None:
    """Where the catalog says table ``layer.name`` is (None: not registered, or no location)."""
    entry = catalog_entry(spark, layer, name)
    if entry is None or not entry.storage().locationUri().isDefined():
        return None
    return Path(os.path.normpath(entry.storage().locationUri().get().getPath()))


def table_store(spark: SparkSession, settings: Settings) -> TableStore:
    """The lake's tables on this session."""
    return TableStore(spark, settings)
