"""Delta tables on a local (or mounted) file system with delta-rs and pyarrow, without Spark.

This module holds what the embedded backend needs below the Spark data source: reading the
transaction log (snapshot files, the files each version added), writing Parquet data files with
Delta statistics, and committing them in one transaction with an app transaction id so a replayed
streaming batch is skipped (exactly-once).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import math
import os
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakehouse.errors import LakehouseError

log = logging.getLogger(__name__)

STATS_STRING_PREFIX = 32  # like delta-spark: longer strings are not given a max bound
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
MAX_COMMIT_ATTEMPTS = 20


class TableNotFound(LakehouseError, FileNotFoundError):
    """The path holds no Delta table."""


class SchemaMismatch(LakehouseError, ValueError):
    """Data written to a table does not have the table's columns and types."""


class UnsupportedChange(LakehouseError, RuntimeError):
    """A streaming reader met a version that rewrote or deleted data."""


# ---- schemas ---------------------------------------------------------------------------------


def utc_schema(schema: pa.Schema) -> pa.Schema:
    """Make every timestamp UTC-aware and every field nullable.

    Naive timestamps would create ``timestamp_ntz`` columns (a higher table protocol that older
    delta-spark readers refuse); nullable fields keep tables appendable by any writer.
    """
    return pa.schema([pa.field(f.name, _utc_type(f.type), nullable=True) for f in schema])


def _utc_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _utc_type(f.type), nullable=True) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field("element", _utc_type(t.value_type), nullable=True))
    if pa.types.is_map(t):
        return pa.map_(_utc_type(t.key_type), _utc_type(t.item_type))
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


def describe_type(t: pa.DataType) -> str:
    return str(_utc_type(t))


def schema_differences(table: pa.Schema, incoming: pa.Schema) -> list[str]:
    """Human-readable differences between a table's schema and the data written to it."""
    have = {f.name: describe_type(f.type) for f in table}
    got = {f.name: describe_type(f.type) for f in incoming}
    problems = []
    missing = [n for n in have if n not in got]
    extra = [n for n in got if n not in have]
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected column(s) {', '.join(extra)}")
    for name in have:
        if name in got and have[name] != got[name]:
            problems.append(f"column {name}: table has {have[name]}, data has {got[name]}")
    return problems


def check_schema(table_name: str, table: pa.Schema, incoming: pa.Schema) -> None:
    problems = schema_differences(table, incoming)
    if problems:
        raise SchemaMismatch(
            f"cannot write to {table_name}: the data does not match the table's schema: "
            + "; ".join(problems)
            + " (when the flow's columns changed, after an upgrade, rebuild the table with "
            "`lakehouse run --full-refresh <table>`)"
        )


def conform(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """Select and cast ``batch`` to exactly ``schema`` (order, types, nullability); absent
    columns become nulls (a file written before a column was added)."""
    arrays = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            arrays.append(pa.nulls(batch.num_rows, type=f.type))
            continue
        col = batch.column(idx)
        arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(arrays, schema=schema)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---- the transaction log ---------------------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    """One data file of a table: path relative to the root as on disk (the log's path
    URL-decoded), partition values as in the log, size, stats JSON."""

    path: str
    partition_values: tuple[tuple[str, str | None], ...] = ()
    size: int = 0
    stats: str | None = None

    def absolute(self, root: str) -> str:
        return os.path.join(root, self.path)

    def partition_dict(self) -> dict[str, str | None]:
        return dict(self.partition_values)


@dataclass
class VersionChange:
    """What one commit did to the data: files added, and whether it removed data."""

    version: int
    added: list[DataFile] = field(default_factory=list)
    removes_data: bool = False
    operation: str = ""


def log_dir(root: str | Path) -> Path:
    return Path(root) / "_delta_log"


def is_delta_table(root: str | Path) -> bool:
    d = log_dir(root)
    return d.is_dir() and any(n.endswith(".json") or ".checkpoint" in n for n in os.listdir(d))


def latest_version(root: str | Path) -> int:
    """Newest committed version, from the log's file names (cheap: no log replay)."""
    d = log_dir(root)
    if not d.is_dir():
        raise TableNotFound(f"no Delta table at {root}")
    versions = [int(n[:20]) for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit()]
    if not versions:
        raise TableNotFound(f"no Delta table at {root}")
    return max(versions)


def read_version(root: str | Path, version: int) -> VersionChange:
    """Parse the JSON commit of ``version``."""
    path = log_dir(root) / f"{version:020d}.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UnsupportedChange(
            f"commit {version} of {root} is no longer in the transaction log (log retention "
            "removed it); restart the stream from a new checkpoint"
        ) from None
    change = VersionChange(version)
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            add = action["add"]
            if add.get("dataChange", True):
                change.added.append(_data_file(add))
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                change.removes_data = True
        elif "commitInfo" in action:
            change.operation = action["commitInfo"].get("operation", "")
    return change


def _data_file(add: dict[str, Any]) -> DataFile:
    pv = add.get("partitionValues") or {}
    return DataFile(
        path=urllib.parse.unquote(add["path"]),
        partition_values=tuple(sorted(pv.items())),
        size=int(add.get("size", 0)),
        stats=add.get("stats"),
    )


def open_table(root: str | Path, version: int | None = None):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(root), version=version)
    except TableNotFoundError:
        raise TableNotFound(f"no Delta table at {root}") from None


def read_arrow(
    root: str | Path, columns: Sequence[str] | None = None, files_where: str | None = None
) -> pa.Table:
    """A (small) table's rows through pyarrow's own file system. delta-rs's default one (a Python
    handler over its Rust object store) leaves scanner threads that can abort the interpreter
    at exit ("terminate called without an active exception", delta-rs#2184): seen 14 times in
    20 here with a file pruning predicate. ``files_where``: a SQL predicate on the files' min/max
    statistics; files that cannot match are not read, the rows of the others all are."""
    import pyarrow.fs as pafs

    dataset = open_table(root).to_pyarrow_dataset(
        filesystem=pafs.SubTreeFileSystem(str(Path(root).absolute()), pafs.LocalFileSystem()),
        file_pruning_predicate=files_where,
    )
    return dataset.to_table(columns=list(columns) if columns is not None else None)


def snapshot_files(table) -> list[DataFile]:
    """Data files of a snapshot in the order they were written (modification time, then path,
    as delta-spark orders a stream's initial snapshot): a stream started on an existing table
    reads its rows in about the order they arrived, which event-time watermarks depend on."""
    adds = pa.table(table.get_add_actions(flatten=False))
    columns = adds.column_names
    rows = adds.to_pylist()
    files: list[DataFile] = []
    order: list[int] = []
    for row in rows:
        pv = row.get("partition") or {} if "partition" in columns else {}
        stats = None
        if row.get("num_records") is not None:
            stats = json.dumps(
                {
                    "numRecords": row["num_records"],
                    "minValues": _json_stats(row.get("min"), "min"),
                    "maxValues": _json_stats(row.get("max"), "max"),
                    "nullCount": row.get("null_count") or {},
                },
                separators=(",", ":"),
            )
        written = row.get("modification_time")
        order.append(
            int(written.timestamp() * 1000) if hasattr(written, "timestamp") else int(written or 0)
        )
        files.append(
            DataFile(
                path=urllib.parse.unquote(row["path"]),
                partition_values=tuple(
                    sorted((k, partition_value_string(v)) for k, v in pv.items())
                ),
                size=int(row.get("size_bytes") or 0),
                stats=stats,
            )
        )
    ranked = sorted(zip(order, files, strict=True), key=lambda p: (p[0], p[1].path))
    return [f for _, f in ranked]


def _json_stats(values: dict | None, kind: str) -> dict:
    out = {}
    for key, value in (values or {}).items():
        if isinstance(value, dict):
            out[key] = _json_stats(value, kind)
        elif value is not None:
            converted = _stat_value(value, kind)
            if converted is not None:
                out[key] = converted
    return out


def check_readable(table, label: str) -> None:
    """Column mapping and deletion vectors change what the Parquet files mean; refuse them
    rather than return wrong rows."""
    config = table.metadata().configuration or {}
    mapping = config.get("delta.columnMapping.mode", "none")
    features = set(table.protocol().reader_features or [])
    if mapping != "none" or features & {"columnMapping", "deletionVectors"}:
        raise UnsupportedChange(
            f"the {label} uses column mapping or deletion vectors, which the embedded backend "
            "does not read; use the native backend (delta-spark) for it"
        )


def table_arrow_schema(table) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


# ---- writing data files ----------------------------------------------------------------------


def _stat_value(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        # Delta stats keep milliseconds: round the lower bound down and the upper bound up.
        micros = value.microsecond % 1000
        try:
            if micros and kind == "max":
                value = value + dt.timedelta(microseconds=1000 - micros)
            else:
                value = value - dt.timedelta(microseconds=micros)
        except OverflowError:
            return None  # past year 9999: no bound (a missing bound only costs skipping)
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:"
            f"{value.minute:02d}:{value.second:02d}.{value.microsecond // 1000:03d}Z"
        )
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str) and len(value) > STATS_STRING_PREFIX:
        # a prefix is a valid lower bound; an upper bound would need more care, so there is none
        return value[:STATS_STRING_PREFIX] if kind == "min" else None
    return value


def _stats_for(column: pa.ChunkedArray | pa.Array, name: str, mins: dict, maxs: dict, nulls: dict):
    t = column.type
    if pa.types.is_struct(t):
        sub_min: dict = {}
        sub_max: dict = {}
        sub_null: dict = {}
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for i, f in enumerate(t):
            child = pa.chunked_array([c.field(i) for c in chunks], type=f.type)
            _stats_for(child, f.name, sub_min, sub_max, sub_null)
        if sub_min:
            mins[name] = sub_min
        if sub_max:
            maxs[name] = sub_max
        nulls[name] = sub_null
        return
    nulls[name] = column.null_count
    # no bounds for decimals: as JSON floats they could round past the true value
    if not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    ):
        return
    if column.null_count == len(column):
        return
    if pa.types.is_floating(t) and pc.any(pc.is_nan(column)).as_py():
        return  # min_max ignores NaN, which Spark orders above every number
    mm = pc.min_max(column)
    lo = _stat_value(mm["min"].as_py(), "min")
    hi = _stat_value(mm["max"].as_py(), "max")
    if lo is not None:
        mins[name] = lo
    if hi is not None:
        maxs[name] = hi


def file_stats(table: pa.Table) -> str:
    """Delta per-file statistics (numRecords, minValues, maxValues, nullCount) as JSON."""
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    for name in table.column_names:
        _stats_for(table.column(name), name, mins, maxs, nulls)
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def partition_value_string(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.UTC) if value.tzinfo else value
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


_HIVE_UNSAFE = set("\"#%'*/:=?\\\x7f{[]^")


def _hive_escape(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _HIVE_UNSAFE or ord(c) < 32 else c for c in value)


def _partition_dir(partition_by: Sequence[str], values: Sequence[str | None]) -> str:
    """The directory on disk, Hive-escaped like delta-spark writes it (``p=a%3Ab``)."""
    parts = []
    for name, value in zip(partition_by, values, strict=True):
        parts.append(f"{name}={HIVE_NULL if value is None else _hive_escape(value)}")
    return "/".join(parts)


@dataclass
class AddedFile:
    """A Parquet file written under the table root, ready to be committed."""

    path: str  # relative to the table root, as on disk (delta-rs URL-encodes it in the log)
    size: int
    partition_values: dict[str, str | None]
    stats: str
    modification_time: int

    def to_action(self):
        from deltalake.transaction import AddAction

        return AddAction(
            path=self.path,
            size=self.size,
            partition_values=self.partition_values,
            modification_time=self.modification_time,
            data_change=True,
            stats=self.stats,
        )


def check_partition_columns(schema: pa.Schema, partition_by: Sequence[str]) -> None:
    for name in partition_by:
        if schema.get_field_index(name) < 0:
            raise SchemaMismatch(f"partition column {name} is not a column of the data")
        if pa.types.is_floating(schema.field(name).type):
            raise ValueError(
                f"cannot partition by floating-point column {name}: NaN and -0.0 make "
                "partition values ambiguous; partition by a string, integer or date"
            )


class DataFileWriter:
    """Writes record batches to Parquet files under a table root, one open file per
    partition value combination, rolling to a new file past ``target_rows``."""

    def __init__(
        self,
        root: str,
        schema: pa.Schema,
        partition_by: Sequence[str] = (),
        task: str = "0",
        target_rows: int = 5_000_000,
    ):
        self.root = root
        self.schema = schema
        self.partition_by = list(partition_by)
        check_partition_columns(schema, self.partition_by)
        self.data_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        self.task = task
        self.target_rows = target_rows
        self._open: dict[tuple, tuple[pq.ParquetWriter, str, list[pa.RecordBatch], int]] = {}
        self.files: list[AddedFile] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = conform(batch, self.schema)
        if not self.partition_by:
            self._append((), batch)
            return
        keys = pa.Table.from_batches([batch]).select(self.partition_by)
        groups = keys.group_by(self.partition_by, use_threads=False).aggregate([])
        for row in groups.to_pylist():
            mask = None
            for name in self.partition_by:
                value = row[name]
                cond = (
                    pc.is_null(batch.column(name))
                    if value is None
                    else pc.equal(
                        batch.column(name), pa.scalar(value, type=batch.schema.field(name).type)
                    )
                )
                mask = cond if mask is None else pc.and_(mask, cond)
            part = batch.filter(mask)
            key = tuple(partition_value_string(row[n]) for n in self.partition_by)
            self._append(key, part)

    def _append(self, key: tuple, batch: pa.RecordBatch) -> None:
        data = batch.select(self.data_schema.names) if self.partition_by else batch
        if key not in self._open:
            rel_dir = _partition_dir(self.partition_by, key) if self.partition_by else ""
            name = f"part-{self.task}-{uuid.uuid4()}.c000.snappy.parquet"
            rel = f"{rel_dir}/{name}" if rel_dir else name
            absolute = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(absolute), exist_ok=True)
            writer = pq.ParquetWriter(absolute, self.data_schema, compression="snappy")
            self._open[key] = (writer, rel, [], 0)
        writer, rel, batches, rows = self._open[key]
        writer.write_batch(data)
        batches.append(data)
        rows += data.num_rows
        self._open[key] = (writer, rel, batches, rows)
        if rows >= self.target_rows:
            self._close(key)

    def _close(self, key: tuple) -> None:
        writer, rel, batches, _rows = self._open.pop(key)
        writer.close()
        absolute = os.path.join(self.root, rel)
        stat = os.stat(absolute)
        table = pa.Table.from_batches(batches, schema=self.data_schema)
        self.files.append(
            AddedFile(
                path=rel,
                size=stat.st_size,
                partition_values=dict(zip(self.partition_by, key, strict=True)),
                stats=file_stats(table),
                modification_time=int(stat.st_mtime * 1000),
            )
        )

    def close(self) -> list[AddedFile]:
        for key in list(self._open):
            self._close(key)
        return self.files

    def abort(self) -> None:
        for writer, rel, _b, _r in self._open.values():
            writer.close()
            delete_files(self.root, [rel])
        self._open.clear()
        delete_files(self.root, [f.path for f in self.files])


def delete_files(root: str, relative_paths: Iterable[str]) -> None:
    for rel in relative_paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(root, rel))


# ---- committing ------------------------------------------------------------------------------


def app_id_for_checkpoint(checkpoint: str | Path) -> str:
    """The app id of the streaming query that owns ``checkpoint``: its query id.

    Python data source stream writers get no query id, but Spark writes it to
    ``<checkpoint>/metadata`` when the query starts. It survives restarts on the same checkpoint
    and is new for a new checkpoint, even at the same path, so a stream restarted from scratch
    is not mistaken for a replay of the old one."""
    path = Path(os.path.expanduser(str(checkpoint)).removeprefix("file:")) / "metadata"
    try:
        query_id = json.loads(path.read_text().splitlines()[0])["id"]
    except (FileNotFoundError, IndexError, KeyError, ValueError):
        raise RuntimeError(
            f"cannot read the streaming query id from {path}: is {checkpoint} the checkpoint of "
            "a started query?"
        ) from None
    return f"lakehouse-{query_id}"


def already_committed(table, app_id: str | None, batch_id: int | None) -> bool:
    if table is None or app_id is None or batch_id is None:
        return False
    done = table.transaction_version(app_id)
    return done is not None and done >= batch_id


def commit_files(
    root: str,
    files: Sequence[AddedFile],
    schema: pa.Schema,
    *,
    partition_by: Sequence[str] = (),
    mode: str = "append",
    app_id: str | None = None,
    batch_id: int | None = None,
    operation: str = "WRITE",
) -> bool:
    """Commit written files in one Delta transaction; return False when skipped.

    With ``app_id`` and ``batch_id`` the commit carries the app transaction ``(app_id, batch_id)``
    and is skipped when the table already records a version >= ``batch_id``: a batch replayed
    after a crash between the Delta commit and Spark's own commit log is written once. The check
    is repeated after a commit conflict, because the conflicting writer may be our own replay."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError, DeltaError

    props = None
    if app_id is not None and batch_id is not None:
        props = CommitProperties(
            app_transactions=[Transaction(app_id=app_id, version=batch_id)],
            custom_metadata={"lakehouse.operation": operation},
        )
    actions = [f.to_action() for f in files]
    for attempt in range(MAX_COMMIT_ATTEMPTS):
        table = open_table(root) if is_delta_table(root) else None
        if already_committed(table, app_id, batch_id):
            log.info("batch %s of %s already committed to %s: skipped", batch_id, app_id, root)
            delete_files(root, [f.path for f in files])
            return False
        try:
            if table is None and create_table(root, schema, partition_by, actions, props):
                return True
            if table is None:
                continue  # another writer created it first: append on the next round
            _check_target(root, table, schema, partition_by, mode)
            table.create_write_transaction(
                actions,
                mode=mode,
                schema=schema,
                partition_by=list(partition_by) or None,
                commit_properties=props,
            )
            return True
        except (CommitFailedError, DeltaError) as exc:
            if attempt == MAX_COMMIT_ATTEMPTS - 1 or not _is_conflict(exc):
                raise
            log.info("commit conflict on %s (attempt %d): %s; retrying", root, attempt + 1, exc)
            time.sleep(0.05 * (attempt + 1))
    raise RuntimeError(f"could not commit to {root} after {MAX_COMMIT_ATTEMPTS} attempts")


def _check_target(root: str, table, schema: pa.Schema, partition_by: Sequence[str], mode: str):
    """The table may have been created by another writer since the write was planned."""
    current = list(table.metadata().partition_columns)
    if current != list(partition_by):
        raise SchemaMismatch(
            f"cannot write to {root}: the table is partitioned by {current or 'nothing'}, "
            f"the write by {list(partition_by) or 'nothing'}"
        )
    if mode == "append":
        check_schema(root, utc_schema(table_arrow_schema(table)), utc_schema(schema))


@contextlib.contextmanager
def _creation_lock(root: str):
    """Serialise table creation on this file system: delta-rs can let two concurrent creators
    both write a version 0 (two table ids), so creators take a lock beside the table."""
    parent = os.path.dirname(os.path.abspath(root))
    os.makedirs(parent, exist_ok=True)
    lock_path = os.path.join(parent, f".{os.path.basename(root)}.create.lock")
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_table(
    root: str,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    actions: Sequence[Any] = (),
    commit_properties: Any = None,
) -> bool:
    """Create the table (with ``actions`` as its first files); False when it already exists."""
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    with _creation_lock(root):
        if is_delta_table(root):
            return False
        create_table_with_add_actions(
            root,
            Schema.from_arrow(utc_schema(schema)),
            list(actions),
            mode="error",
            partition_by=list(partition_by) or None,
            commit_properties=commit_properties,
        )
        return True


def _is_conflict(exc: Exception) -> bool:
    from deltalake.exceptions import CommitFailedError

    text = str(exc).lower()
    return isinstance(exc, CommitFailedError) or "conflict" in text or "already exists" in text


def iter_file_batches(
    root: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    partition_types: dict[str, pa.DataType],
    batch_size: int = 65_536,
) -> Iterator[pa.RecordBatch]:
    """Read data files as record batches of exactly ``schema``; partition columns come from
    the log's partition values, not the files."""
    data_columns = [f.name for f in schema if f.name not in partition_types]
    wanted_partitions = [n for n in partition_types if schema.get_field_index(n) >= 0]
    for data_file in files:
        pf = pq.ParquetFile(data_file.absolute(root))
        present = [c for c in data_columns if c in pf.schema_arrow.names]
        values = data_file.partition_dict()
        if present:
            batches: Iterable[pa.RecordBatch] = pf.iter_batches(
                batch_size=batch_size, columns=present
            )
        else:  # only partition columns (or columns added after this file) were asked for
            rows = pf.metadata.num_rows
            batches = (
                pa.RecordBatch.from_pydict({"__n": pa.nulls(min(batch_size, rows - start))})
                for start in range(0, rows, batch_size)
            )
        for batch in batches:
            for name in wanted_partitions:
                batch = batch.append_column(
                    name, _constant(values.get(name), partition_types[name], batch.num_rows)
                )
            yield conform(batch, schema)


def parse_partition_value(text: str | None, typ: pa.DataType) -> Any:
    """A partition value as the log stores it (a string) back to a Python value of ``typ``."""
    if text is None or text == HIVE_NULL:
        return None
    if pa.types.is_string(typ):
        return text
    if pa.types.is_timestamp(typ):
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return pa.scalar(text).cast(typ).as_py()


def _constant(text: str | None, typ: pa.DataType, rows: int) -> pa.Array:
    return pa.repeat(pa.scalar(parse_partition_value(text, typ), type=typ), rows)
