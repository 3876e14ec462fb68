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


# Table properties that delta-spark's CREATE TABLE copies from the session's
# ``spark.databricks.delta.properties.defaults.*`` as they are, needing no table feature.
PLAIN_PROPERTIES = frozenset(
    {
        "checkpointInterval",
        "checkpointRetentionDuration",
        "deletedFileRetentionDuration",
        "logRetentionDuration",
    }
)
# Delta's types that need no table feature (a ``decimal(p,s)`` among them)
_PLAIN_TYPES = frozenset(
    {"string", "long", "integer", "short", "byte", "float", "double", "boolean", "binary"}
    | {"date", "timestamp"}
)


# the file size bins of delta-spark's checksum file (its ``FileSizeHistogram``'s default)
# fmt: off
_SIZE_BINS = (
    0, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304,
    8388608, 12582912, 16777216, 20971520, 25165824, 29360128, 33554432, 37748736, 41943040,
    50331648, 58720256, 67108864, 75497472, 83886080, 92274688, 100663296, 109051904,
    117440512, 125829120, 130023424, 134217728, 138412032, 142606336, 146800640, 150994944,
    167772160, 184549376, 201326592, 218103808, 234881024, 251658240, 268435456, 285212672,
    301989888, 318767104, 335544320, 352321536, 369098752, 385875968, 402653184, 419430400,
    436207616, 452984832, 469762048, 486539264, 503316480, 520093696, 536870912, 553648128,
    570425344, 587202560, 603979776, 671088640, 738197504, 805306368, 872415232, 939524096,
    1006632960, 1073741824, 1140850688, 1207959552, 1275068416, 1342177280, 1409286144,
    1476395008, 1610612736, 1744830464, 1879048192, 2013265920, 2147483648, 2415919104,
    2684354560, 2952790016, 3221225472, 3489660928, 3758096384, 4026531840, 4294967296,
    8589934592, 17179869184, 34359738368, 68719476736, 137438953472, 274877906944,
)
# fmt: on


# characters delta-spark refuses in a column name (without column mapping)
_BAD_NAME = frozenset(" ,;{}()\n\t=")


def plain_table(schema: dict[str, Any], partition_by: Sequence[str] = ()) -> bool:
    """Whether delta-spark's CREATE TABLE would commit this schema (its JSON, as
    ``StructType.jsonValue()`` gives it) and these partition columns as they are, needing no
    table feature and refusing nothing: at least one column; names unique whatever their case
    at each level, without the characters Delta refuses; no column metadata (defaults,
    identity, generated columns, collations); no timestamp without time zone, no variant; no
    NOT NULL inside an array or a map; partition columns that are distinct top-level columns
    of a simple type. Anything else is left to delta-spark, which creates or refuses it."""
    fields = schema.get("fields") or []
    simple = {f["name"]: isinstance(f["type"], str) and f["type"] != "binary" for f in fields}
    if not fields or len(set(partition_by)) != len(partition_by):
        return False
    return all(simple.get(c) for c in partition_by) and _plain_type(schema, inside=False)


def _plain_type(kind: Any, inside: bool) -> bool:
    """``inside``: within an array or a map, where delta-spark refuses NOT NULL."""
    if isinstance(kind, str):
        return kind in _PLAIN_TYPES or kind.startswith("decimal(")
    name = kind.get("type")
    if name == "struct":
        fields = kind["fields"]
        if len({f["name"].lower() for f in fields}) != len(fields):
            return False
        return all(
            not field.get("metadata")
            and not _BAD_NAME & set(field["name"])
            and (field.get("nullable", True) or not inside)
            and _plain_type(field["type"], inside)
            for field in fields
        )
    if name == "array":
        return kind.get("containsNull", True) and _plain_type(kind["elementType"], True)
    if name == "map":
        return (
            kind.get("valueContainsNull", True)
            and _plain_type(kind["keyType"], True)
            and _plain_type(kind["valueType"], True)
        )
    return False


def create_empty(
    root: str | Path,
    schema: dict[str, Any],
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
) -> bool | None:
    """Commit version 0 of an empty Delta table at ``root``: the actions delta-spark's CREATE
    TABLE commits for a :func:`plain_table` with :data:`PLAIN_PROPERTIES` (protocol
    1, 2; the schema in Spark's own JSON), written without a Spark job, in a millisecond (a
    Spark creation took 0.25 to 0.45 s in a warm session). The commit file appears whole or not
    at all, and never over another's (a link, which fails where the name exists: Delta's own
    rule for a local log). False when version 0 exists already; None when the file system
    cannot link (nothing written: delta-spark, whose log store renames, creates the table)."""
    import json
    import time
    import uuid

    properties = dict(properties or {})
    now = int(time.time() * 1000)
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "CREATE TABLE",
                "operationParameters": {
                    "partitionBy": json.dumps(list(partition_by), separators=(",", ":")),
                    "clusterBy": "[]",
                    "description": None,
                    "isManaged": "false",
                    "properties": json.dumps(properties, separators=(",", ":")),
                },
                "isolationLevel": "Serializable",
                "isBlindAppend": True,
                "operationMetrics": {},
                "engineInfo": "lakehouse",
                "txnId": str(uuid.uuid4()),
            }
        },
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema, separators=(",", ":")),
                "partitionColumns": list(partition_by),
                "configuration": properties,
                "createdTime": now,
            }
        },
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
    ]
    d = log_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"{0:020d}.json"
    partial = d / f".{final.name}.{uuid.uuid4().hex}.tmp"
    partial.write_text("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))
    try:
        os.link(partial, final)
    except FileExistsError:
        return False
    except OSError:
        return None
    finally:
        partial.unlink()
    # the version's checksum, as delta-spark writes it after its commit: without it the
    # table's first append rebuilt the table's state to write its own (0.8 s against 0.18 s)
    checksum = {
        "txnId": actions[0]["commitInfo"]["txnId"],
        "tableSizeBytes": 0,
        "numFiles": 0,
        "numMetadata": 1,
        "numProtocol": 1,
        "setTransactions": [],
        "domainMetadata": [],
        "metadata": actions[1]["metaData"],
        "protocol": actions[2]["protocol"],
        "fileSizeHistogram": {
            "sortedBinBoundaries": list(_SIZE_BINS),
            "fileCounts": [0] * len(_SIZE_BINS),
            "totalBytes": [0] * len(_SIZE_BINS),
        },
        "allFiles": [],
    }
    # committed already: a checksum not written costs the first append time, no more
    _write_new(d / f"{0:020d}.crc", json.dumps(checksum, separators=(",", ":")))
    return True


# the most app transactions delta-spark keeps in a checksum (its
# ``setTransactionsInCrc.maxAllowed``); a table with more keeps none there
_MAX_TRANSACTIONS_IN_CHECKSUM = 100


def write_checksum(root: str | Path, version: int) -> bool:
    """Write the checksum file (``N.crc``) of ``version``, derived from the previous version's
    and the commit's own actions, as delta-spark derives its own after each commit (its
    ``Checksum.computeNewChecksum``). delta-rs writes none, and without one every delta-spark
    reader that reaches the version (a streaming source's next micro-batch, a write's
    snapshot) runs a Spark job over the log for the table's protocol and metadata: 0.65 to
    1.7 s each on an idle 2-core machine, behind every other query on a busy one.

    True when written. False, with nothing written, when it cannot be derived exactly: no
    checksum for the previous version, or one not as delta-spark writes it; a commit that
    holds actions a checksum counts otherwise (deletion vectors, domain metadata, in-commit
    timestamps, a removal without its size); or one there already (never replaced). The file
    counts and sizes, the protocol and metadata, the table's app transactions (when the
    previous checksum lists them all and neither version sets a retention for them) and its
    file size histogram (when the previous one has it) are delta-spark's own; the optional fields this cannot keep exactly are left out, as delta-spark leaves
    them out when it cannot compute them."""
    import json

    d = log_dir(root)
    try:
        before = json.loads((d / f"{version - 1:020d}.crc").read_text())
        with open(d / f"{version:020d}.json", encoding="utf-8") as handle:
            actions = [json.loads(line) for line in handle if line.strip()]
        checksum = _next_checksum(before, actions)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False  # none, or not as delta-spark writes it: the commit is made, readers cope
    if checksum is None:
        return False
    return _write_new(d / f"{version:020d}.crc", json.dumps(checksum, separators=(",", ":")))


def _next_checksum(before: dict[str, Any], actions: list[dict[str, Any]]) -> dict | None:
    """The checksum after a commit of ``actions`` on a version whose checksum is ``before``;
    None when it cannot be exact (see :func:`write_checksum`)."""
    import bisect
    import uuid

    if not before.get("metadata") or not before.get("protocol"):
        return None
    size_key = "fileSizeHistogram" if before.get("fileSizeHistogram") else "histogramOpt"
    histogram = before.get(size_key)
    bins = histogram and histogram["sortedBinBoundaries"]
    size, files = before["tableSizeBytes"], before["numFiles"]
    metadata, protocol = before["metadata"], before["protocol"]
    transactions: dict[str, dict[str, Any]] | None = None
    if isinstance(before.get("setTransactions"), list):
        transactions = {t["appId"]: t for t in before["setTransactions"]}
    txn_id = None
    for action in actions:
        ((kind, body),) = action.items()
        if kind in ("add", "remove"):
            if body.get("deletionVector"):
                return None
            if kind == "remove" and not (body.get("extendedFileMetadata") and "size" in body):
                return None
            sign = 1 if kind == "add" else -1
            size += sign * body["size"]
            files += sign
            index = bisect.bisect_right(bins, body["size"]) - 1 if bins else -1
            if index >= 0:
                histogram["fileCounts"][index] += sign
                histogram["totalBytes"][index] += sign * body["size"]
        elif kind == "metaData":
            metadata = body
        elif kind == "protocol":
            protocol = body
        elif kind == "txn":
            if transactions is not None:
                transactions[body["appId"]] = body
        elif kind == "commitInfo":
            if body.get("inCommitTimestamp") is not None:
                return None
            txn_id = body.get("txnId")
        elif kind == "domainMetadata":
            return None
    # a retention before or after the commit: the previous checksum may lack expired ones
    retention = any(
        (m.get("configuration") or {}).get("delta.setTransactionRetentionDuration")
        for m in (before["metadata"], metadata)
    )
    if retention or (transactions and len(transactions) > _MAX_TRANSACTIONS_IN_CHECKSUM):
        transactions = None
    checksum: dict[str, Any] = {
        "txnId": txn_id or str(uuid.uuid4()),
        "tableSizeBytes": size,
        "numFiles": files,
        "numMetadata": 1,
        "numProtocol": 1,
        "metadata": metadata,
        "protocol": protocol,
    }
    for key in ("numDeletedRecordsOpt", "numDeletionVectorsOpt", "domainMetadata"):
        if before.get(key) is not None:
            checksum[key] = before[key]
    if transactions is not None:
        checksum["setTransactions"] = list(transactions.values())
    if histogram:
        checksum[size_key] = histogram
    if files == 0:
        checksum["allFiles"] = []
    return checksum


def _write_new(path: Path, text: str) -> bool:
    """Write ``path`` whole, unless it exists (a link fails where the name exists); True when
    written."""
    import uuid

    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        partial.write_text(text)
        os.link(partial, path)
    except OSError:
        return False
    finally:
        partial.unlink(missing_ok=True)
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


def append_once(root: str | Path, rows: pa.Table, app_id: str, version: int) -> bool:
    """Append ``rows`` to the Delta table at ``root`` in a commit that records app transaction
    (``app_id``, ``version``), unless the table records that version or a later one already
    (then False): a replayed micro-batch's side rows, without a Spark job."""
    from deltalake import write_deltalake

    table = open_table(root)
    if records(table, app_id, version):
        return False
    write_deltalake(table, rows, mode="append", commit_properties=app_commit(app_id, version))
    write_checksum(root, table.version())
    return True


def records(table, app_id: str, version: int) -> bool:
    """Whether the delta-rs ``table`` records app transaction (``app_id``, ``version``) or a
    later version of that app: a micro-batch written already."""
    recorded = table.transaction_version(app_id)
    return recorded is not None and recorded >= version


def app_commit(app_id: str, version: int):
    """delta-rs commit properties recording app transaction (``app_id``, ``version``)."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app_id, version)])
