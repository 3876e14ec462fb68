"""Writes by delta-rs, through its public API only: ``DeltaTable.create``, ``write_deltalake``
and ``DeltaTable.merge``, each commit recording the micro-batch as an app transaction
(``CommitProperties(app_transactions=...)``) and skipped when the table records it already
(``DeltaTable.transaction_version``).

A Spark DataFrame reaches delta-rs as Arrow, collected on the driver: whole when it is small,
else as a stream of chunks (:data:`CHUNK_BYTES` each, by Spark's estimate), so the driver holds
one chunk at a time, however large the micro-batch. delta-rs commits with put-if-absent (a link
on a local disk, a conditional PUT on an object store) and retries a commit another writer won,
so commits to one table from several flows need no lock of ours.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.faults import failpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

ENGINE = "delta-rs"
# The most of a DataFrame (Spark's estimate of its rows in memory) collected on the driver at
# once: a larger one is collected in chunks of about this size
CHUNK_BYTES = 64 * 1024 * 1024
# delta-rs's target file size for a micro-batch that must be one file (the rows of a table that
# streams read, see lakehouse.storage.timeorder): larger than any micro-batch
ONE_FILE = 1 << 50
DUPLICATE_KEYS = "occur more than once in batch"


def create(
    root: Path,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
) -> bool:
    """Create the Delta table at ``root`` empty (version 0), unless one is there; True when
    created. Every column nullable, times in UTC (:func:`deltafiles.utc_schema`)."""
    from deltalake import DeltaTable

    if dfiles.is_delta_table(root):
        return False
    DeltaTable.create(
        str(root),
        dfiles.utc_schema(schema),
        mode="ignore",
        partition_by=list(partition_by) or None,
        configuration=dict(properties or {}) or None,
    )
    return True


def create_with(
    root: Path,
    df: DataFrame,
    txn: tuple[str, int] | None,
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
) -> None:
    """Create the Delta table at ``root`` with ``df``'s rows, in one commit that records
    ``txn``."""
    from deltalake import write_deltalake

    write_deltalake(
        str(root),
        _stream(df, dfiles.utc_schema(spark_arrow_schema(df.schema))),
        mode="append",
        partition_by=list(partition_by) or None,
        configuration=dict(properties or {}) or None,
        commit_properties=_properties(txn),
    )


def recorded(table, app_id: str, version: int) -> bool:
    """Whether the delta-rs ``table`` records app transaction (``app_id``, ``version``) or a
    later version of that app: the micro-batch was written already."""
    if dfiles.records(table, app_id, version):
        log.info("batch %s of %s already in %s: skipped", version, app_id, table.table_uri)
        return True
    return False


def append(
    root: Path,
    df: DataFrame,
    name: str,
    txn: tuple[str, int] | None,
    *,
    one_file: bool = False,
) -> bool:
    """Append ``df`` to the table at ``root`` in one commit that records ``txn`` (app id,
    version), unless the table records it already (then False, and ``df`` is not computed).
    ``one_file``: the rows go in one file, however many (a table that streams read)."""
    table = dfiles.open_table(root)
    if txn is not None and recorded(table, *txn):
        return False
    data = arrow_of(df, table, name)
    failpoint(f"before-commit:{name}")
    _write(table, data, "append", txn, one_file)
    return True


def overwrite(
    root: Path,
    df: DataFrame,
    name: str,
    txn: tuple[str, int] | None,
    *,
    schema: bool = False,
    partition_by: Sequence[str] = (),
) -> bool:
    """Replace the rows of the table at ``root`` with ``df`` in one commit that records
    ``txn``, unless the table records it already (then False). ``schema``: the table takes
    ``df``'s schema and ``partition_by`` too (a full refresh's switch)."""
    from deltalake import write_deltalake

    table = dfiles.open_table(root)
    if txn is not None and recorded(table, *txn):
        return False
    if schema:
        data = _stream(df, dfiles.utc_schema(spark_arrow_schema(df.schema)))
    else:
        data = arrow_of(df, table, name)
    failpoint(f"before-commit:{name}")
    write_deltalake(
        table,
        data,
        mode="overwrite",
        schema_mode="overwrite" if schema else None,
        partition_by=(list(partition_by) if schema else table.metadata().partition_columns) or None,
        commit_properties=_properties(txn),
    )
    return True


def append_arrow(root: Path, rows: pa.Table, name: str, txn: tuple[str, int]) -> bool:
    """Append Arrow ``rows`` (a micro-batch's side rows) in a commit that records ``txn``,
    unless the table records it already (then False). No Spark job."""
    table = dfiles.open_table(root)
    if recorded(table, *txn):
        return False
    schema = dfiles.utc_schema(dfiles.table_arrow_schema(table))
    dfiles.check_schema(f"table {name}", schema, dfiles.utc_schema(rows.schema))
    _write(table, dfiles.conform(rows, schema), "append", txn, one_file=False)
    return True


def merge(
    root: Path,
    df: DataFrame,
    name: str,
    keys: Sequence[str],
    updates: dict[str, str] | None,
    txn: tuple[str, int],
) -> bool:
    """MERGE ``df`` (one row per key) into the table at ``root`` by ``keys`` in one commit
    that records ``txn``, unless the table records it already (then False): a matched row
    takes the batch's row (or, with ``updates``, each of those columns the value of its SQL
    expression over ``t``, the table's row, and ``s``, the batch's), a new key is inserted.
    Into a table with no rows yet the batch is appended. A key twice in the batch is refused
    in one line naming it."""
    table = dfiles.open_table(root)
    if recorded(table, *txn):
        return False
    data = arrow_of(df, table, name)
    _check_unique(data, df, name, keys, txn[1])
    failpoint(f"before-commit:{name}")
    if not table.file_uris():
        _write(table, data, "append", txn, one_file=False)
        return True
    # each comparison in parentheses: DataFusion parses `a IS NOT DISTINCT FROM b AND c` as
    # `a IS NOT DISTINCT FROM (b AND c)`
    predicate = " AND ".join(f"(t.`{k}` IS NOT DISTINCT FROM s.`{k}`)" for k in keys)
    merger = table.merge(
        source=data,
        predicate=predicate,
        source_alias="s",
        target_alias="t",
        commit_properties=_properties(txn),
    )
    if updates:
        merger = merger.when_matched_update(updates=dict(updates))
    else:
        merger = merger.when_matched_update_all()
    merger.when_not_matched_insert_all().execute()
    return True


def _write(table, data, mode: str, txn: tuple[str, int] | None, one_file: bool) -> None:
    from deltalake import write_deltalake

    write_deltalake(
        table,
        data,
        mode=mode,
        partition_by=table.metadata().partition_columns or None,
        target_file_size=ONE_FILE if one_file else None,
        commit_properties=_properties(txn),
    )


def _properties(txn: tuple[str, int] | None):
    return dfiles.app_commit(*txn) if txn is not None else None


def arrow_of(df: DataFrame, table, name: str) -> pa.Table | pa.RecordBatchReader:
    """``df``'s rows as Arrow in the columns and types of delta-rs ``table`` (refused in one
    line naming the columns when they do not fit): a table when Spark sizes ``df`` at most
    :data:`CHUNK_BYTES`, else a stream of chunks of about that size."""
    schema = dfiles.utc_schema(dfiles.table_arrow_schema(table))
    incoming = dfiles.utc_schema(spark_arrow_schema(df.schema))
    dfiles.check_schema(f"table {name}", schema, incoming)
    return _stream(df, schema)


def _stream(df: DataFrame, schema: pa.Schema) -> pa.Table | pa.RecordBatchReader:
    # (no more chunks than partitions: a frame Spark cannot size is estimated as unbounded)
    chunks = min(math.ceil(estimated_bytes(df) / CHUNK_BYTES), df._jdf.rdd().getNumPartitions())
    if chunks <= 1:
        return dfiles.conform(df.toArrow(), schema)
    return pa.RecordBatchReader.from_batches(schema, _chunks(df, chunks, schema))


def _chunks(df: DataFrame, chunks: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``df``'s rows a chunk at a time: the rows of its partitions whose index modulo
    ``chunks`` is 0, then 1, ... (a job each, over the cached micro-batch)."""
    from pyspark.sql import functions as F

    for chunk in range(chunks):
        part = df.where(F.spark_partition_id() % F.lit(chunks) == F.lit(chunk)).toArrow()
        yield from dfiles.conform(part, schema).to_batches()


def _check_unique(data, df: DataFrame, name: str, keys: Sequence[str], batch_id: int) -> None:
    """Refuse a batch in which a key occurs more than once, naming one such key."""
    import pyarrow.compute as pc

    if isinstance(data, pa.Table):
        copies = data.group_by(list(keys)).aggregate([([], "count_all")])
        copies = copies.filter(pc.greater(copies.column("count_all"), 1))
        first = copies.select(list(keys)).slice(0, 1).to_pylist()
    else:  # a stream of chunks: counted by Spark, over the cached batch
        first = [
            row.asDict()
            for row in df.groupBy(*keys).count().where("count > 1").drop("count").limit(1).collect()
        ]
    if first:
        before, after = duplicate_keys_message(name, keys, batch_id)
        raise ValueError(before + json.dumps(first[0], default=str) + after)


def duplicate_keys_message(name: str, keys: Sequence[str], batch_id: int) -> tuple[str, str]:
    """The error of a batch whose keys repeat, before and after the example key (as JSON)."""
    return (
        f"cannot upsert into {name}: key(s) of ({', '.join(keys)}) {DUPLICATE_KEYS} "
        f"{batch_id}, e.g. ",
        "; update mode needs one row per key",
    )


def estimated_bytes(df: DataFrame) -> int:
    """Spark's size estimate of ``df``, no job run: for rows picked out of a cached
    micro-batch, the cached batch's size in memory (an upper bound)."""
    # (a Scala BigInt: py4j gives a Python int, or an object whose str() is its digits)
    return int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))


def spark_arrow_schema(schema) -> pa.Schema:
    """A Spark schema in Arrow's terms (times in UTC, no large types)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
