"""Delta tables read without Spark, with delta-rs and pyarrow: what status, verify, the report
and the benchmarks read, and the runner's own ops tables, which it appends to from the driver
without a Spark job (so recording never competes with the flows).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakehouse.errors import LakehouseError


class TableNotFound(LakehouseError, FileNotFoundError):
    """The path holds no Delta table."""


class MissingDataFile(LakehouseError, FileNotFoundError):
    """A data file the table's log lists is not on disk (deleted or lost by hand)."""


class SchemaMismatch(LakehouseError, ValueError):
    """Data written to a table does not have the table's columns and types."""


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


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` with exactly ``schema``'s columns, in its order and types (cast where they
    differ only in how Arrow spells them: large strings, timestamp zones, nullability)."""
    arrays = []
    for f in schema:
        column = data.column(f.name)
        arrays.append(column if column.type.equals(f.type) else column.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def log_dir(root: str | Path) -> Path:
    return Path(root) / "_delta_log"


def is_delta_table(root: str | Path) -> bool:
    d = log_dir(root)
    return d.is_dir() and any(n.endswith(".json") or ".checkpoint" in n for n in os.listdir(d))


def remove_uncommitted_log(root: str | Path) -> bool:
    """Remove the log folder of a table whose creation was killed before its first commit (a
    ``_delta_log`` holding no version): delta-spark would refuse to create the table there
    forever (``DELTA_TABLE_NOT_FOUND``). Nothing committed is in it. True when removed."""
    d = log_dir(root)
    if not d.is_dir() or is_delta_table(root):
        return False
    shutil.rmtree(d)
    return True


def latest_version(root: str | Path) -> int:
    """Newest committed version, from the log's file names (cheap: no log replay)."""
    d = log_dir(root)
    if not d.is_dir():
        raise TableNotFound(f"no Delta table at {root}")
    versions = [int(n[:20]) for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit()]
    if not versions:
        raise TableNotFound(f"no Delta table at {root}")
    return max(versions)


def appends_only(root: str | Path) -> bool:
    """Whether the table's log still holds every commit since version 0 and each only added
    data: no file removed (an overwrite, a compaction, a delete), no schema or protocol change
    after the first. Its commits, read in order, are then its rows, in the order they came."""
    d = log_dir(root)
    names = sorted(n for n in os.listdir(d) if len(n) == 25 and n.endswith(".json"))
    if not names or any(n != f"{v:020d}.json" for v, n in enumerate(names)):
        return False
    first = {"add", "commitInfo", "txn", "metaData", "protocol", "domainMetadata"}
    later = {"add", "commitInfo", "txn"}
    for version, name in enumerate(names):
        allowed = later if version else first
        with open(d / name, encoding="utf-8") as handle:
            for line in handle:
                # an action is a one-key object: {"add":{...}}
                if line.strip() and line[2 : line.find('"', 2)] not in allowed:
                    return False
    return True


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
    try:
        return dataset.to_table(columns=list(columns) if columns is not None else None)
    except FileNotFoundError as exc:
        gone = (Path(root) / f for f in dataset.files if not (Path(root) / f).exists())
        missing = next(gone, str(exc))
        raise MissingDataFile(
            f"the Delta table at {root} lists a data file that is not there: {missing}; "
            "restore the file (or the table) from a backup, or rebuild the table with "
            "lakehouse run --full-refresh"
        ) from None


def table_arrow_schema(table) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def append_rows(root: str | Path, schema: pa.Schema, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to the Delta table at ``root``, created with ``schema`` when missing
    (delta-rs retries the commit when another writer committed first)."""
    from deltalake import write_deltalake

    write_deltalake(str(root), pa.Table.from_pylist(rows, schema=schema), mode="append")


def records(table, app_id: str, version: int) -> bool:
    """Whether the delta-rs ``table`` records app transaction (``app_id``, ``version``) or a
    later version of that app: a micro-batch written already."""
    recorded = table.transaction_version(app_id)
    return recorded is not None and recorded >= version


def app_commit(app_id: str, version: int):
    """delta-rs commit properties recording app transaction (``app_id``, ``version``)."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app_id, version)])
