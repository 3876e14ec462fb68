"""The ``deltalake`` Spark data source: Delta tables through delta-rs, with no JVM jars.

Usable directly once registered (``lakehouse.session.build_session`` does it)::

    spark.read.format("deltalake").load(path)
    spark.readStream.format("deltalake").option("maxFilesPerTrigger", 10).load(path)
    df.write.format("deltalake").mode("append").save(path)
    df.writeStream.format("deltalake").option("checkpointLocation", cp).start(path)
    CREATE TEMPORARY VIEW v USING deltalake OPTIONS (path '...')

Options:
    path                 table location (required)
    tableName            ``layer.table``, used in error messages
    maxFilesPerTrigger   streaming read: at most this many data files per micro-batch
    startingVersion      streaming read: start with the changes of this version instead of the
                         latest snapshot
    skipChangeCommits    streaming read: ``true`` skips versions that deleted or rewrote data
                         (by default such a version stops the stream with an error)
    partitionBy          write to a new table: comma-separated partition columns
    overwriteSchema      batch overwrite: ``true`` replaces the table's schema
    txnAppId, txnVersion batch write: skip the write when the table already records this app
                         transaction version (idempotent writes, as in delta-spark)
    checkpointLocation   streaming write: its query id tags each commit (exactly-once)
    failpoint            fault injection for tests: ``before-commit`` writes the data files,
                         then fails instead of committing them and leaves them behind, as a
                         crash between the two would

    pruneFiles           batch read: ``true`` lets filters skip files (needs
                         spark.sql.python.filterPushdown.enabled; see below)

Column pruning: Spark does not push projections into Python data sources, so a reader asked for
fewer columns (``spark.read.format("deltalake").schema("a long, b string")``) reads only those
columns from the Parquet files.

File pruning is opt-in: with ``pruneFiles=true`` and Spark's Python filter pushdown on, filters on
partition columns prune files and comparisons on other columns skip files through their min/max
statistics (Spark still applies them to the rows). Spark 4.2.0 keeps the read plan of a pushdown
on the DataFrame's shared source object, so a later action on the same DataFrame without a filter
reads only the files the earlier filter kept; use pruning only on DataFrames read for one query.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.deltafiles import (
    AddedFile,
    DataFile,
    TableNotFound,
    UnsupportedChange,
)

TARGET_PARTITION_BYTES = 64 * 1024 * 1024


def _flag(options, key: str) -> bool:
    return str(options.get(key, "false")).strip().lower() in ("true", "1", "yes")


def _int_option(options, key: str) -> int | None:
    value = options.get(key)
    if value is None or str(value).strip() == "":
        return None
    try:
        number = int(str(value))
    except ValueError:
        raise ValueError(f"option {key} must be an integer; got {value!r}") from None
    if number < 0:
        raise ValueError(f"option {key} must be >= 0; got {number}")
    return number


class DeltaLakeDataSource(DataSource):
    """Delta tables read and written with delta-rs (see the module docstring for options)."""

    @classmethod
    def name(cls) -> str:
        return "deltalake"

    @property
    def root(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError("the deltalake data source needs a path: .load(path) or .save(path)")
        return os.path.abspath(str(path).removeprefix("file:"))

    @property
    def label(self) -> str:
        name = self.options.get("tableName")
        return f"table {name} at {self.root}" if name else f"Delta table at {self.root}"

    def _open(self, version: int | None = None):
        try:
            table = dfiles.open_table(self.root, version)
        except TableNotFound:
            raise TableNotFound(
                f"{self.label} does not exist (no _delta_log); write to it first or check the path"
            ) from None
        dfiles.check_readable(table, self.label)
        return table

    def schema(self) -> StructType:
        return from_arrow_schema(
            dfiles.table_arrow_schema(self._open()), prefer_timestamp_ntz=False
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        table = self._open()
        if _flag(self.options, "pruneFiles"):
            return PruningDeltaBatchReader(self.root, table, schema)
        return DeltaBatchReader(self.root, table, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        table = self._open()
        return DeltaStreamReader(self.root, self.label, table, schema, self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return DeltaBatchWriter(self.root, self.label, schema, overwrite, self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return DeltaStreamWriter(self.root, self.label, schema, overwrite, self.options)


# ---- reading ---------------------------------------------------------------------------------


def group_files(files: Sequence[DataFile], min_partitions: int = 2) -> list[InputPartition]:
    """Bin-pack files into input partitions of about TARGET_PARTITION_BYTES, at least
    ``min_partitions`` of them when there are enough files."""
    if not files:
        return []
    total = sum(f.size for f in files)
    count = min(len(files), max(min_partitions, math.ceil(total / TARGET_PARTITION_BYTES)))
    bins: list[list[DataFile]] = [[] for _ in range(count)]
    sizes = [0] * count
    for f in sorted(files, key=lambda f: -f.size):
        i = sizes.index(min(sizes))
        bins[i].append(f)
        sizes[i] += f.size
    # keep each partition's files in log order so rows come back in commit order
    order = {f.path: i for i, f in enumerate(files)}
    # (plain InputPartitions: Spark may hand back a base-class copy, so the files live in .value)
    return [InputPartition(tuple(sorted(b, key=lambda f: order[f.path]))) for b in bins if b]


class _TableReading:
    """What readers need about a table: the output Arrow schema and partition column types."""

    def __init__(self, root: str, table, schema: StructType):
        self.root = root
        table_schema = dfiles.table_arrow_schema(table)
        self.partition_columns = list(table.metadata().partition_columns)
        self.partition_types = {n: table_schema.field(n).type for n in self.partition_columns}
        # exactly what Spark checks the returned batches against
        self.output_schema = to_arrow_schema(schema, timezone="UTC")
        unknown = [n for n in self.output_schema.names if n not in table_schema.names]
        if unknown:
            raise ValueError(
                f"columns {', '.join(unknown)} are not in the Delta table at {root}; "
                f"it has {', '.join(table_schema.names)}"
            )
        self.partition_types = {
            n: self.output_schema.field(n).type if n in self.output_schema.names else t
            for n, t in self.partition_types.items()
        }

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:  # Spark's stand-in when no file is left to read
            return
        yield from dfiles.iter_file_batches(
            self.root, partition.value, self.output_schema, self.partition_types
        )


class DeltaBatchReader(DataSourceReader):
    def __init__(self, root: str, table, schema: StructType):
        self.reading = _TableReading(root, table, schema)
        self.files = dfiles.snapshot_files(table)
        self.pushed: list[Filter] = []

    def partitions(self) -> Sequence[InputPartition]:
        files = [f for f in self.files if _keep_file(f, self.pushed, self.reading.partition_types)]
        return group_files(files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)


class PruningDeltaBatchReader(DeltaBatchReader):
    """A batch reader that skips files by the query's filters (option ``pruneFiles``)."""

    def pushFilters(self, filters: list[Filter]):
        """Filters prune files (by partition values, else by statistics); all of them go back
        to Spark, which still filters the rows, so a doubtful prune can only keep a file."""
        for f in filters:
            if _filter_column(f) is not None and _prunable(f):
                self.pushed.append(f)
            yield f


def _filter_column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if attr and len(attr) == 1 else None


def _prunable(f: Filter) -> bool:
    return isinstance(
        f,
        EqualTo
        | EqualNullSafe
        | GreaterThan
        | GreaterThanOrEqual
        | LessThan
        | LessThanOrEqual
        | In
        | IsNull
        | IsNotNull,
    )


def _keep_file(f: DataFile, filters: list[Filter], partition_types: dict) -> bool:
    """False when a pushed filter proves the file holds no matching row."""
    values = f.partition_dict()
    stats = None
    for flt in filters:
        column = _filter_column(flt)
        if column in partition_types:
            value = dfiles.parse_partition_value(values.get(column), partition_types[column])
            if not _matches(flt, value):
                return False
        else:
            if stats is None:
                stats = _parse_stats(f.stats)
            if stats and not _may_match(flt, column, stats):
                return False
    return True


def _matches(flt: Filter, value) -> bool:
    try:
        if isinstance(flt, IsNull):
            return value is None
        if isinstance(flt, IsNotNull):
            return value is not None
        if isinstance(flt, EqualNullSafe):
            return value == flt.value
        if value is None:
            return False
        if isinstance(flt, EqualTo):
            return value == flt.value
        if isinstance(flt, In):
            return value in flt.value
        if isinstance(flt, GreaterThan):
            return value > flt.value
        if isinstance(flt, GreaterThanOrEqual):
            return value >= flt.value
        if isinstance(flt, LessThan):
            return value < flt.value
        if isinstance(flt, LessThanOrEqual):
            return value <= flt.value
    except TypeError:
        return True  # incomparable types: never prune on a doubt
    return True


def _parse_stats(text: str | None) -> dict | None:
    if not text:
        return None
    import json

    try:
        return json.loads(text)
    except ValueError:
        return None


def _may_match(flt: Filter, column: str | None, stats: dict) -> bool:
    """Whether a file with these min/max/null statistics may hold a row passing ``flt``.
    Only numbers and strings are compared; anything else keeps the file."""
    if column is None:
        return True
    rows = stats.get("numRecords")
    nulls = (stats.get("nullCount") or {}).get(column)
    lo = (stats.get("minValues") or {}).get(column)
    hi = (stats.get("maxValues") or {}).get(column)
    if isinstance(flt, IsNull):
        return nulls is None or nulls > 0
    if isinstance(flt, IsNotNull):
        return nulls is None or rows is None or nulls < rows
    value = getattr(flt, "value", None)
    comparable = (int, float, str)

    def ok(bound) -> bool:
        return (
            bound is not None
            and not isinstance(bound, bool)
            and isinstance(bound, comparable)
            and isinstance(value, comparable)
            and not isinstance(value, bool)
            and isinstance(bound, str) == isinstance(value, str)
        )

    if isinstance(flt, In):
        return True
    if isinstance(flt, EqualTo | EqualNullSafe):
        return not ((ok(lo) and value < lo) or (ok(hi) and value > hi))
    if isinstance(flt, GreaterThan):
        return not (ok(hi) and hi <= value)
    if isinstance(flt, GreaterThanOrEqual):
        return not (ok(hi) and hi < value)
    if isinstance(flt, LessThan):
        return not (ok(lo) and lo >= value)
    if isinstance(flt, LessThanOrEqual):
        return not (ok(lo) and lo > value)
    return True


@dataclass(frozen=True)
class _Position:
    """Where a stream stands: the next file to read is ``index`` of the unit ``(version,
    snapshot)``; a snapshot unit is the whole table at ``version`` (the start of a stream),
    any other unit is the files that ``version`` added."""

    version: int
    snapshot: bool
    index: int

    @classmethod
    def of(cls, offset: dict) -> _Position:
        return cls(int(offset["version"]), bool(offset["snapshot"]), int(offset["index"]))

    def offset(self) -> dict:
        return {"version": self.version, "snapshot": self.snapshot, "index": self.index}


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are table versions: the snapshot the stream started from, then the files each
    later version added. ``maxFilesPerTrigger`` bounds a micro-batch.

    Every offset also carries its stream's ``origin``, the position it started from. Spark
    keeps no start offset for the first micro-batch: replaying that batch after a crash, it
    asks :meth:`initialOffset` again, which by then may be a snapshot of a grown table. The
    batch's logged end offset names the origin it was planned from, and the read starts there.
    (Offsets written before origins were kept have none and are read as they say.)"""

    def __init__(self, root: str, label: str, table, schema: StructType, options):
        self.root = root
        self.label = label
        self.reading = _TableReading(root, table, schema)
        self.max_files = _int_option(options, "maxFilesPerTrigger") or None
        self.starting_version = _int_option(options, "startingVersion")
        self.skip_changes = _flag(options, "skipChangeCommits")
        self.target_version: int | None = None
        self._units: dict[tuple[int, bool], list[DataFile]] = {}
        self._origin: dict | None = None  # of the offsets this reader was last asked about

    # -- offsets --
    def _files(self, version: int, snapshot: bool) -> list[DataFile]:
        key = (version, snapshot)
        if key not in self._units:
            if snapshot:
                files = dfiles.snapshot_files(dfiles.open_table(self.root, version))
            else:
                change = dfiles.read_version(self.root, version)
                files = change.added
                if change.removes_data:
                    if not self.skip_changes:
                        raise UnsupportedChange(
                            f"version {version} of the {self.label} deleted or rewrote data "
                            f"({change.operation or 'unknown operation'}); a stream reading it "
                            "only accepts appends. Restart from a new checkpoint, or set the "
                            "option skipChangeCommits=true to ignore such versions"
                        )
                    files = []
            self._units[key] = files
        return self._units[key]

    def _end_version(self) -> int:
        latest = dfiles.latest_version(self.root)
        return latest if self.target_version is None else min(latest, self.target_version)

    def _normalize(self, pos: _Position, end_version: int) -> _Position:
        """Skip exhausted units so that 'no new data' always yields the same offset."""
        while pos.version <= end_version and pos.index >= len(
            self._files(pos.version, pos.snapshot)
        ):
            pos = _Position(pos.version + 1, False, 0)
        return pos

    def _offset(self, pos: _Position, origin: dict | None) -> dict:
        return pos.offset() if origin is None else {**pos.offset(), "origin": origin}

    def initialOffset(self) -> dict:
        end_version = self._end_version()
        if self.starting_version is not None:
            start = _Position(self.starting_version, False, 0)
        else:
            start = _Position(end_version, True, 0)
        start = self._normalize(start, end_version)
        return self._offset(start, start.offset())

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target_version = dfiles.latest_version(self.root)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end_version = self._end_version()
        budget = limit.max_files if isinstance(limit, ReadMaxFiles) else math.inf
        pos = self._normalize(_Position.of(start), end_version)
        taken = 0
        while taken < budget and pos.version <= end_version:
            files = self._files(pos.version, pos.snapshot)
            n = min(len(files) - pos.index, budget - taken)
            pos = _Position(pos.version, pos.snapshot, pos.index + int(n))
            taken += n
            pos = self._normalize(pos, end_version)
        self._origin = start.get("origin")
        return self._offset(pos, self._origin)

    def reportLatestOffset(self) -> dict | None:
        latest = _Position(dfiles.latest_version(self.root) + 1, False, 0)
        return self._offset(latest, self._origin)

    def files_between(self, start: dict, end: dict) -> list[DataFile]:
        a, b = _Position.of(start), _Position.of(end)
        if "origin" in end and start.get("origin") != end["origin"]:
            # the first micro-batch again, from a new initial offset: read from where it was
            # planned to (see the class's docstring)
            a = _Position.of(end["origin"])
        out: list[DataFile] = []
        pos = a
        while (pos.version, not pos.snapshot) < (b.version, not b.snapshot):
            out.extend(self._files(pos.version, pos.snapshot)[pos.index :])
            pos = _Position(pos.version + 1, False, 0)
        if (pos.version, pos.snapshot) == (b.version, b.snapshot) and pos.index < b.index:
            out.extend(self._files(pos.version, pos.snapshot)[pos.index : b.index])
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return group_files(self.files_between(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)

    def commit(self, end: dict) -> None:
        # versions before ``end`` will not be asked for again
        done = _Position.of(end).version
        for key in [k for k in self._units if k[0] < done]:
            del self._units[key]


# ---- writing ---------------------------------------------------------------------------------


@dataclass
class FilesWritten(WriterCommitMessage):
    files: list[AddedFile]


class _TableWriting:
    """Validates a write against the table on the driver, writes files on executors and
    commits them on the driver."""

    def __init__(self, root: str, label: str, schema: StructType, overwrite: bool, options):
        self.root = root
        self.label = label
        self.mode = "overwrite" if overwrite else "append"
        self.failpoint = options.get("failpoint")
        incoming = dfiles.utc_schema(to_arrow_schema(schema, timezone="UTC"))
        if dfiles.is_delta_table(root):
            table = dfiles.open_table(root)
            current = dfiles.utc_schema(dfiles.table_arrow_schema(table))
            if overwrite and _flag(options, "overwriteSchema"):
                self.schema = incoming
            else:
                dfiles.check_schema(label, current, incoming)
                self.schema = current  # the table's column order wins
            self.partition_by = list(table.metadata().partition_columns)
        else:
            self.schema = incoming
            spec = options.get("partitionBy") or ""
            self.partition_by = [c.strip() for c in spec.split(",") if c.strip()]
            unknown = [c for c in self.partition_by if c not in incoming.names]
            if unknown:
                raise ValueError(f"partitionBy column(s) {', '.join(unknown)} not in the data")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}" if ctx else "00000"
        writer = dfiles.DataFileWriter(self.root, self.schema, self.partition_by, task=task)
        try:
            for batch in iterator:
                writer.write(batch)
            return FilesWritten(writer.close())
        except BaseException:
            writer.abort()
            raise

    def commit(self, messages, app_id: str | None, batch_id: int | None) -> bool:
        files = [f for m in messages if m is not None for f in m.files]
        if self.failpoint == "before-commit":
            raise RuntimeError(f"failpoint before-commit: {len(files)} file(s) left uncommitted")
        if not files and self.mode == "append" and dfiles.is_delta_table(self.root):
            return False  # nothing to add; an empty commit would only lengthen the log
        return dfiles.commit_files(
            self.root,
            files,
            self.schema,
            partition_by=self.partition_by,
            mode=self.mode,
            app_id=app_id,
            batch_id=batch_id,
            operation="STREAMING UPDATE" if batch_id is not None and app_id else "WRITE",
        )

    def abort(self, messages) -> None:
        if self.failpoint == "before-commit":
            return  # a crashed writer cleans nothing up
        for m in messages:
            if m is not None:
                dfiles.delete_files(self.root, [f.path for f in m.files])


class DeltaBatchWriter(DataSourceArrowWriter):
    def __init__(self, root, label, schema, overwrite, options):
        self.writing = _TableWriting(root, label, schema, overwrite, options)
        self.app_id = options.get("txnAppId")
        version = _int_option(options, "txnVersion")
        if (self.app_id is None) != (version is None):
            raise ValueError("options txnAppId and txnVersion go together: set both or neither")
        self.version = version

    def write(self, iterator):
        return self.writing.write(iterator)

    def commit(self, messages) -> None:
        self.writing.commit(messages, self.app_id, self.version)

    def abort(self, messages) -> None:
        self.writing.abort(messages)


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, root, label, schema, overwrite, options):
        self.writing = _TableWriting(root, label, schema, overwrite, options)
        checkpoint = options.get("checkpointLocation")
        if not checkpoint:
            raise ValueError(
                f"a streaming write to the {label} needs a checkpointLocation (its query id "
                "tags every commit for exactly-once)"
            )
        # writers are re-created for every micro-batch, on the driver, after the query started
        self.app_id = dfiles.app_id_for_checkpoint(checkpoint)

    def write(self, iterator):
        return self.writing.write(iterator)

    def commit(self, messages, batchId: int) -> None:
        self.writing.commit(messages, self.app_id, batchId)

    def abort(self, messages, batchId: int) -> None:
        self.writing.abort(messages)
