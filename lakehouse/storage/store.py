"""Table storage: Delta tables addressed as ``layer.table``, read through delta-spark and
written by each table's engine through its public API: delta-rs (:mod:`.rs_writes`, the
default) or delta-spark (:mod:`.spark_writes`), as the table's declaration says
(``Output.engine``). Tables live under ``tables/<layer>/<table>``; streaming writes
(:mod:`.streams`) are exactly-once: every commit of a micro-batch records the query's app id and
the batch id as a Delta app transaction, so a replayed micro-batch is skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.errors import LakehouseError
from lakehouse.flows import ENGINES
from lakehouse.locks import creating
from lakehouse.settings import Settings, TriggerSettings, split_table_name
from lakehouse.storage import catalog, rs_writes, spark_writes, streams, timeorder
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.deltafiles import TableNotFound
from lakehouse.storage.faults import failpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)
# Table properties a table gets from the session's
# ``spark.databricks.delta.properties.defaults.*``, whichever engine creates it
PLAIN_PROPERTIES = frozenset(
    {
        "checkpointInterval",
        "checkpointRetentionDuration",
        "deletedFileRetentionDuration",
        "logRetentionDuration",
    }
)


class DeltaUnavailable(LakehouseError, RuntimeError):
    """delta-spark is not on the Spark classpath."""


def trigger_kwargs(trigger: TriggerSettings, layer: str = "") -> dict[str, Any]:
    """``DataStreamWriter.trigger`` arguments for the configured trigger (of ``layer``'s
    flows)."""
    if trigger.mode == "available-now":
        return {"availableNow": True}
    return {"processingTime": trigger.interval_of(layer)}


def check_engine(engine: str, name: str) -> None:
    if engine not in ENGINES:
        raise ValueError(
            f"table {name}: engine must be one of {', '.join(ENGINES)}; got {engine!r}"
        )


class TableStore:
    """Read, read as a stream, write, and write a stream, for tables named ``layer.table``:
    reads through delta-spark (its jars from ``make setup``, see lakehouse.jars), writes by the
    table's engine (``engine=``, delta-rs unless the table's declaration says delta-spark).
    Where the session's catalog outlives the process (a metastore:
    ``spark.sql.catalogImplementation=hive``) every table it creates is registered there as
    ``layer.table`` (a Delta table at its location), so SQL, ``DESCRIBE HISTORY`` and time
    travel see it by name; in Spark's in-memory catalog an entry would die with the job that
    wrote it (three catalog statements a table, every run), so a table is registered only when
    :meth:`register` is called (``lakehouse sql`` does)."""

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
        self._properties: dict[str, str] | None = None

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
        written = catalog.register(self.spark, *split_table_name(name), self.path(name), force)
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
        engine: str = rs_writes.ENGINE,
    ) -> None:
        """Overwrite table ``name`` with ``df`` in one commit, its schema too (a full
        refresh's switch); skipped, as a write, when the table records ``txn`` already."""
        failpoint(f"before-switch:{name}")
        self.write(
            df,
            name,
            mode="overwrite",
            partition_by=partition_by,
            txn=txn,
            schema=True,
            engine=engine,
        )

    # -- writing --
    def write(
        self,
        df: DataFrame,
        name: str,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        txn: tuple[str, int] | None = None,
        event_time: str | None = None,
        schema: bool = False,
        rows: int | None = None,
        engine: str = rs_writes.ENGINE,
    ) -> None:
        """Batch write by ``engine`` (a missing table created by it). ``txn`` = (app
        id, version) makes the write idempotent: it is skipped when the table already records
        that version, or a later one, for that app (a replayed micro-batch). ``event_time``
        (the event-time column of a table streams read): the rows go in one file (by
        delta-spark, in files of one range of event times each, listed in that order by the
        commit; see lakehouse.storage.timeorder). ``schema``: an overwrite replaces the
        table's schema too. ``rows``: how many rows ``df`` holds, when the caller knows. A
        schema that does not fit the table is refused in one line naming the columns."""
        _check_write_mode(mode)
        check_engine(engine, name)
        if mode == "append" and txn and not self.exists(name):
            # created first, alone: flows of one job appending at once to a table that does
            # not exist yet (ops.quality_results) would both create it and one would fail
            self.create(name, df.schema, partition_by, engine=engine)
        path = self.path(name)
        if engine == spark_writes.ENGINE:
            df = self._in_files(df, rows, event_time)
            spark_writes.write(path, df, name, mode, txn, partition_by=partition_by, schema=schema)
        elif not self.exists(name):  # created by the write, in one commit
            rs_writes.create_with(path, df, txn, partition_by, self._creation_properties())
        elif mode == "overwrite":
            rs_writes.overwrite(path, df, name, txn, schema=schema, partition_by=partition_by)
        else:
            rs_writes.append(path, df, name, txn, one_file=event_time is not None)

    def _in_files(self, df: DataFrame, rows: int | None, event_time: str | None) -> DataFrame:
        """``df`` in the partitions delta-spark writes a file each of: one range of
        ``event_time`` each (:func:`timeorder.clustered`), or one partition when its ``rows``
        fit in one file (``write.rows_per_file``), not a file per shuffle partition."""
        if rows is None:
            return df
        files = self.settings.write.rows_per_file
        if event_time:
            return timeorder.clustered(df, event_time, rows, files)
        return df.coalesce(1) if rows <= files else df

    def append_arrow_once(self, rows: pa.Table, name: str, app_id: str, version: int) -> bool:
        """Append a few Arrow rows to table ``name`` (created when missing) with delta-rs, in a
        commit that records (``app_id``, ``version``), unless the table records it already
        (then False). No Spark job."""
        from pyspark.sql.pandas.types import from_arrow_schema

        if not self.exists(name):
            self.create(name, from_arrow_schema(rows.schema))
        return rs_writes.append_arrow(self.path(name), rows, name, (app_id, version))

    def create(
        self,
        name: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        engine: str = rs_writes.ENGINE,
    ) -> bool:
        """Create table ``name`` empty by ``engine``, unless it exists; True when created.
        Creations take turns, in a process and across processes
        (:func:`lakehouse.locks.creating`): two at once would both write version 0, and one
        fail, or one would take the other's log folder, still without a version, for a killed
        creation's and remove it."""
        check_engine(engine, name)
        missing = [c for c in partition_by if c not in schema.fieldNames()]
        if missing:  # (delta-rs 1.6 would commit such a table, then fail to read it)
            raise ValueError(
                f"table {name}: partition column(s) {', '.join(missing)} not in its columns"
            )
        with _CREATING, creating(self.path(name)):
            if self.exists(name):
                self._register_created(name)
                return False
            if dfiles.remove_uncommitted_log(self.path(name)):
                log.info("table %s: removed the log of a creation killed before its commit", name)
            if engine == spark_writes.ENGINE:
                spark_writes.create(self.spark, self.path(name), schema, partition_by)
            else:
                arrow = rs_writes.spark_arrow_schema(schema)
                rs_writes.create(self.path(name), arrow, partition_by, self._creation_properties())
            self._register_created(name)
        return True

    def _creation_properties(self) -> dict[str, str]:
        """The table properties delta-spark would give a table created in this session (from
        its ``spark.databricks.delta.properties.defaults.*``) that need no table feature
        (:data:`PLAIN_PROPERTIES`): delta-rs's tables get them too. Read once per store."""
        if self._properties is None:
            defaults = "spark.databricks.delta.properties.defaults."
            self._properties = {
                f"delta.{key[len(defaults) :]}": value
                for key, value in self.spark.conf.getAll.items()
                if key.startswith(defaults) and key[len(defaults) :] in PLAIN_PROPERTIES
            }
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
        engine: str = rs_writes.ENGINE,
    ) -> None:
        """MERGE one micro-batch into ``name`` by ``keys`` by ``engine``, once per ``(app_id,
        batch_id)``: a matched row takes the batch's row (or, with ``updates``, each of those
        columns the value of its SQL expression over ``t``, the table's row, and ``s``, the
        batch's). ``rows``: the batch's row count, when the caller knows it. A batch of no rows
        writes nothing; a key twice in the batch is refused in one line naming it."""
        check_engine(engine, name)
        if not (df.count() if rows is None else rows):
            return
        if not self.exists(name):
            self.create(name, df.schema, engine=engine)
        txn = (app_id, batch_id)
        if engine == spark_writes.ENGINE:
            spark_writes.merge(self.path(name), df, name, keys, updates, txn)
        else:
            rs_writes.merge(self.path(name), df, name, keys, updates, txn)

    # -- streaming --
    def write_stream(
        self, df: DataFrame, name: str, checkpoint: str | Path, **kwargs
    ) -> StreamingQuery:
        """Start a streaming query writing ``df`` to table ``name`` exactly once
        (:func:`lakehouse.storage.streams.start_stream`)."""
        return streams.start_stream(self, df, name, checkpoint, **kwargs)

    def write_stream_routed(
        self, df: DataFrame, routes: Sequence, checkpoint: str | Path, **kwargs
    ) -> StreamingQuery:
        """Start a streaming query appending each micro-batch to several tables
        (:func:`lakehouse.storage.streams.start_routed`)."""
        return streams.start_routed(self, df, routes, checkpoint, **kwargs)


_CREATING = threading.RLock()  # one table creation at a time in this process (TableStore.create)


def _check_write_mode(mode: str) -> None:
    if mode not in ("append", "overwrite"):
        raise ValueError(f"write mode must be append or overwrite; got {mode!r}")


def delta_available(spark: SparkSession) -> bool:
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName(
            "io.delta.tables.DeltaTable", True, False
        )
        return True
    except Exception:
        return False


def table_store(spark: SparkSession, settings: Settings) -> TableStore:
    """The lake's tables on this session."""
    return TableStore(spark, settings)
