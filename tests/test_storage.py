"""Table storage on delta-spark: reads, appends, upserts and streams, exactly-once on every
write path (a replayed micro-batch is skipped), tables the catalog knows, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.errors import StreamingQueryException
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from storage_helpers import KV, append_versions, rows

from lakehouse import checkpoints, locks
from lakehouse.storage import SchemaMismatch, TableNotFound
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage import store as store_module
from lakehouse.storage.store import FAILPOINT_ENV, BatchInterrupted, Route, interruption

PROJECT = Path(__file__).resolve().parents[1]
TXN_CONFS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")


def test_missing_table_names_table_and_path(spark, store):
    with pytest.raises(TableNotFound) as err:
        store.read("gold.nothing")
    assert "table gold.nothing does not exist at" in str(err.value)
    assert str(store.path("gold.nothing")) in str(err.value)
    with pytest.raises(TableNotFound, match="table gold.nothing does not exist at"):
        store.read_stream("gold.nothing")


def test_a_table_whose_creation_was_killed_before_its_commit_is_created(spark, store):
    """A kill while delta-spark created a table can leave its log folder without a version
    (seen in the kill matrix: the next run failed on DELTA_TABLE_NOT_FOUND, every time); the
    next creation starts over and the table takes rows."""
    log = store.path("bronze.killed") / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    (log / ".00000000000000000000.json.0b1c.tmp").write_text('{"commitInfo":')
    assert not store.exists("bronze.killed")
    kv = spark.createDataFrame([(1, "a")], KV)
    assert store.create("bronze.killed", kv.schema) is True
    store.write(kv, "bronze.killed")
    assert [tuple(r) for r in store.read("bronze.killed").collect()] == [(1, "a")]
    assert not (log / ".00000000000000000000.json.0b1c.tmp").exists()


def _creation(path: Path) -> list[dict]:
    """Version 0's actions of the table at ``path``, without what differs from one creation to
    the next (times, ids, the engine's name)."""
    import json

    actions = [json.loads(line) for line in (path / "_delta_log" / f"{0:020d}.json").open()]
    for action in actions:
        for kind, drop in (
            ("commitInfo", ("timestamp", "txnId", "engineInfo")),
            ("metaData", ("id", "createdTime")),
        ):
            if kind in action:
                for key in drop:
                    del action[kind][key]
    return sorted(actions, key=lambda a: next(iter(a)))


def test_a_table_created_without_spark_is_the_one_delta_spark_creates(spark, store, tmp_path):
    """A new table's first commit is written by the store itself, without a Spark job: the
    same actions as delta-spark's CREATE TABLE (protocol, schema, partitions, the session's
    default properties), and Spark writes and reads it. A schema that needs a table feature
    (a timestamp without time zone) is left to delta-spark."""
    from pyspark.sql.types import (
        ArrayType,
        DateType,
        DecimalType,
        DoubleType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    schema = StructType(
        [
            StructField("id", LongType(), nullable=False),
            StructField("at", TimestampType()),
            StructField("day", DateType()),
            StructField("amount", DecimalType(12, 2)),
            StructField("tags", ArrayType(StringType())),
            StructField("pages", MapType(StringType(), DoubleType())),
            StructField("user", StructType([StructField("name", StringType())])),
            StructField("country", StringType()),
        ]
    )
    assert store.create("gold.made_here", schema, ["day", "country"]) is True
    by_spark = tmp_path / "by_spark"
    made_here = store.path("gold.made_here")
    assert _creation(made_here) == _creation_by_spark(spark, by_spark, schema, ["day", "country"])
    assert _checksum(made_here) == _checksum(by_spark)  # (without it a first append is slow)
    assert _engine(made_here) == "lakehouse"  # (not a Spark job)
    # nothing else left in the log (the partial files are gone)
    assert sorted(p.name for p in (made_here / "_delta_log").iterdir()) == [
        f"{0:020d}.crc",
        f"{0:020d}.json",
    ]
    assert store.create("gold.made_here", schema, ["day", "country"]) is False

    row = spark.sql(
        "SELECT 7L AS id, TIMESTAMP'2026-11-28 10:00:00' AS at, DATE'2026-11-28' AS day,"
        " CAST(3.25 AS DECIMAL(12,2)) AS amount, array('a') AS tags, map('home', 1.5D) AS pages,"
        " named_struct('name', 'ann') AS user, 'NZ' AS country"
    )
    store.write(row, "gold.made_here")
    assert [r.asDict(recursive=True) for r in store.read("gold.made_here").collect()] == [
        r.asDict(recursive=True) for r in row.collect()
    ]

    ntz = StructType([StructField("at", TimestampNTZType())])
    assert store.create("gold.ntz", ntz) is True
    [protocol] = [a["protocol"] for a in _creation(store.path("gold.ntz")) if "protocol" in a]
    assert "timestampNtz" in protocol.get("writerFeatures", []), protocol
    assert _creation(store.path("gold.ntz")) == _creation_by_spark(spark, tmp_path / "ntz", ntz)
    assert _engine(store.path("gold.ntz")).startswith("Apache-Spark/")

    # what delta-spark refuses is refused, by delta-spark: nothing is left on disk
    with pytest.raises(Exception, match="nowhere"):
        store.create("gold.refused", ntz, ["nowhere"])
    assert not store.exists("gold.refused")


def test_a_session_default_that_needs_a_table_feature_leaves_the_creation_to_delta_spark(
    spark, settings
):
    """A session whose default table properties need a table feature (deletion vectors here)
    gets its tables from delta-spark, with that feature."""
    from pyspark.sql.types import LongType, StructField, StructType

    from lakehouse.storage import table_store

    key = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
    spark.conf.set(key, "true")
    try:
        store = table_store(spark, settings)
        assert store.create("gold.vectors", StructType([StructField("n", LongType())])) is True
    finally:
        spark.conf.unset(key)
    path = store.path("gold.vectors")
    [protocol] = [a["protocol"] for a in _creation(path) if "protocol" in a]
    assert "deletionVectors" in protocol["writerFeatures"], protocol
    assert _engine(path).startswith("Apache-Spark/")


def _checksum(path: Path) -> dict:
    """Version 0's checksum file, without its ids and times."""
    import json

    checksum = json.loads((path / "_delta_log" / f"{0:020d}.crc").read_text())
    del checksum["txnId"], checksum["metadata"]["id"], checksum["metadata"]["createdTime"]
    return checksum


def _engine(path: Path) -> str:
    import json

    with (path / "_delta_log" / f"{0:020d}.json").open() as log:
        return next(
            json.loads(line)["commitInfo"]["engineInfo"] for line in log if "commitInfo" in line
        )


def _creation_by_spark(spark, path: Path, schema, partition_by=()) -> list[dict]:
    """:func:`_creation` of the table delta-spark's CREATE TABLE makes at ``path``."""
    from delta.tables import DeltaTable as SparkDeltaTable

    builder = SparkDeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    builder.execute()
    return _creation(path)


def _wait_until_blocked_in(thread, function, seconds: float = 120) -> None:
    """Until ``thread``'s stack is inside ``function`` (blocked there), at most ``seconds``."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        frame = sys._current_frames().get(thread.ident)
        while frame is not None and frame.f_code is not function.__code__:
            frame = frame.f_back
        if frame is not None:
            return
        assert thread.is_alive(), f"{thread.name} ended before it waited in {function.__name__}"
        assert time.monotonic() < deadline, (
            f"{thread.name} not in {function.__name__} in {seconds} s"
        )
        time.sleep(0.01)


def test_a_creation_in_progress_in_another_process_is_waited_for(spark, store):
    """Another process is creating bronze.racing: it holds the table's creation lock, the log
    folder is made and has no version yet. A creation here waits for it, instead of taking
    the folder for that of a killed creation and removing it; the table is then the other
    process's, with its row."""
    import threading

    path = store.path("bronze.racing")
    script = (
        "import pathlib, sys, pyarrow as pa\n"
        "from deltalake import write_deltalake\n"
        "from lakehouse.locks import creating\n"
        f"path = pathlib.Path({str(path)!r})\n"
        "with creating(path):\n"
        "    (path / '_delta_log').mkdir(parents=True)\n"
        "    print('holding', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    rows = {'k': pa.array([7], pa.int64()), 'v': pa.array(['theirs'])}\n"
        "    write_deltalake(str(path), pa.table(rows))\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert other.stdout.readline() == "holding\n"
    created: list[bool] = []
    schema = spark.createDataFrame([], KV).schema
    here = threading.Thread(target=lambda: created.append(store.create("bronze.racing", schema)))
    here.start()
    # the creation here waits on the lock (without it, it would take the other's folder for
    # a killed creation's, remove it, and write its own version 0)
    _wait_until_blocked_in(here, locks._locked)
    assert here.is_alive() and not list((path / "_delta_log").iterdir())
    other.communicate("go\n", timeout=120)
    assert other.returncode == 0
    here.join(timeout=120)
    assert created == [False]
    assert [tuple(r) for r in store.read("bronze.racing").collect()] == [(7, "theirs")]
    assert dfiles.latest_version(path) == 0


def test_overwrite_replaces_and_schema_mismatch_names_columns(spark, store):
    store.write(spark.createDataFrame(rows(0, 3), KV), "silver.kv")
    store.write(spark.createDataFrame(rows(10, 12), KV), "silver.kv", mode="overwrite")
    assertDataFrameEqual(store.read("silver.kv"), spark.createDataFrame(rows(10, 12), KV))

    bad = spark.createDataFrame([("x", "y", 1)], "k string, w string, z long")
    with pytest.raises(SchemaMismatch) as err:
        store.write(bad, "silver.kv")
    message = str(err.value)
    assert "cannot write to table silver.kv" in message
    assert "missing column(s) v" in message
    assert "unexpected column(s) w, z" in message
    assert "column k: table has int64, data has string" in message


def test_two_streaming_queries_append_to_one_table(spark, store, settings):
    append_versions(store, "bronze.left", [rows(0, 50), rows(50, 100)])
    append_versions(store, "bronze.right", [rows(100, 150), rows(150, 200)])
    queries = [
        store.write_stream(
            store.read_stream(src, max_files_per_trigger=1),
            "silver.both",
            settings.checkpoint_path("silver", f"both_{src.split('.')[1]}"),
            trigger={"availableNow": True},
        )
        for src in ("bronze.left", "bronze.right")
    ]
    for q in queries:
        q.awaitTermination()
    assertDataFrameEqual(store.read("silver.both"), spark.createDataFrame(rows(0, 200), KV))


# an upsert of a few rows into a table with rows is delta-rs's MERGE; write.arrow_upsert_rows 0
# makes it delta-spark's: both paths, the same rows and the same exactly-once
UPSERT_PATHS = pytest.mark.parametrize("arrow_rows", [1_000_000, 0], ids=["delta-rs", "spark"])
# (the replayed batch's test on delta-spark's path in make test-all: in CI, the upsert into a
# table delta-rs cannot write takes delta-spark's MERGE, and its replay is skipped)
REPLAY_PATHS = pytest.mark.parametrize(
    "arrow_rows", [1_000_000, pytest.param(0, marks=pytest.mark.full)], ids=["delta-rs", "spark"]
)


@pytest.fixture
def upserts(spark, settings, arrow_rows):
    from lakehouse.storage import table_store

    return table_store(spark, settings.with_overrides({"write.arrow_upsert_rows": arrow_rows}))


@REPLAY_PATHS
def test_update_mode_replayed_batch_is_skipped(spark, upserts, arrow_rows):
    store = upserts
    df = spark.createDataFrame([(1, 1, "a"), (2, 1, "b")], "k long, n long, latest string")
    store.upsert(df, "gold.once", ["k"], "app", 0)
    df2 = spark.createDataFrame([(1, 5, "b")], "k long, n long, latest string")
    store.upsert(df2, "gold.once", ["k"], "app", 0)  # replay of batch 0 with other content
    assertDataFrameEqual(store.read("gold.once"), df)
    store.upsert(df2, "gold.once", ["k"], "app", 1)
    assertDataFrameEqual(
        store.read("gold.once"),
        spark.createDataFrame([(1, 5, "b"), (2, 1, "b")], "k long, n long, latest string"),
    )
    store.upsert(df, "gold.once", ["k"], "app", 1)  # replayed: skipped
    history = DeltaTable(str(store.path("gold.once"))).history()
    assert [h["operation"] for h in history][:1] == ["MERGE"]
    assert DeltaTable(str(store.path("gold.once"))).transaction_version("app") == 1
    engine = history[0].get("engineInfo") or history[0].get("clientVersion") or ""
    assert ("delta-rs" in engine) == bool(arrow_rows), history[0]


@UPSERT_PATHS
def test_upsert_by_two_key_columns_and_update_expressions(spark, upserts):
    """Each key comparison is parenthesized: unparenthesized, DataFusion read the MERGE
    predicate of two keys as ``a IS NOT DISTINCT FROM (b AND c)`` and failed. A matched row
    takes each updated column's SQL expression over ``t`` and ``s``."""
    store = upserts
    schema = "k long, w string, n long, mean double"
    first = [(1, "a", 1, 1.0), (1, "b", 2, 3.0)]
    store.upsert(spark.createDataFrame(first, schema), "gold.kw", ["k", "w"], "app", 0)
    store.upsert(
        spark.createDataFrame([(1, "b", 2, 6.0), (2, "a", 3, 1.5)], schema),
        "gold.kw",
        ["k", "w"],
        "app",
        1,
        updates={"n": "t.n + s.n", "mean": "(t.mean * t.n + s.mean * s.n) / (t.n + s.n)"},
    )
    assertDataFrameEqual(
        store.read("gold.kw"),
        spark.createDataFrame([(1, "a", 1, 1.0), (1, "b", 4, 4.5), (2, "a", 3, 1.5)], schema),
    )


@UPSERT_PATHS
def test_an_upsert_into_a_table_with_no_rows_is_an_append(spark, upserts, arrow_rows):
    """Nothing to match: the batch is appended (by delta-rs when it is few rows), once;
    keys that occur twice in it are still refused."""
    store = upserts
    kv = "k long, v string"
    store.create("gold.fresh", spark.createDataFrame([], kv).schema)
    dupes = spark.createDataFrame([(1, "a"), (1, "b")], kv)
    with pytest.raises(ValueError, match=r"key\(s\) of \(k\) occur more than once in batch 0"):
        store.upsert(dupes, "gold.fresh", ["k"], "app", 0)
    first = spark.createDataFrame([(1, "a"), (2, "b")], kv)
    store.upsert(first, "gold.fresh", ["k"], "app", 0)
    store.upsert(spark.createDataFrame([(1, "x")], kv), "gold.fresh", ["k"], "app", 0)  # replay
    assertDataFrameEqual(store.read("gold.fresh"), first)
    table = DeltaTable(str(store.path("gold.fresh")))
    assert table.transaction_version("app") == 0
    last = table.history(1)[0]
    engine = last.get("engineInfo") or last.get("clientVersion") or ""
    assert last["operation"] == "WRITE" and ("delta-rs" in engine) == bool(arrow_rows), last


def test_an_upsert_into_a_table_delta_rs_cannot_write_is_delta_sparks(spark, store):
    """A table with in-commit timestamps (a writer feature delta-rs 1.x refuses to commit
    to): a small upsert falls back to delta-spark's MERGE, exactly once."""
    kv = "k long, v string"
    store.upsert(spark.createDataFrame([(1, "a"), (2, "b")], kv), "gold.ict", ["k"], "app", 0)
    path = store.path("gold.ict")
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableInCommitTimestamps = true)"
    )
    store.upsert(spark.createDataFrame([(2, "c"), (3, "d")], kv), "gold.ict", ["k"], "app", 1)
    store.upsert(spark.createDataFrame([(2, "x")], kv), "gold.ict", ["k"], "app", 1)  # replayed
    expected = spark.createDataFrame([(1, "a"), (2, "c"), (3, "d")], kv)
    assertDataFrameEqual(store.read("gold.ict"), expected)
    table = DeltaTable(str(path))
    assert table.transaction_version("app") == 1
    last = table.history(1)[0]
    assert last["operation"] == "MERGE" and "Apache-Spark" in last.get("engineInfo", ""), last


@UPSERT_PATHS
def test_update_mode_refuses_duplicate_keys_in_a_batch(spark, upserts):
    store = upserts
    store.upsert(spark.createDataFrame([(1, 0)], "k long, n long"), "gold.dupes", ["k"], "app", 0)
    df = spark.createDataFrame([(1, 1), (1, 2)], "k long, n long")
    with pytest.raises(ValueError, match=r"key\(s\) of \(k\) occur more than once in batch 1"):
        store.upsert(df, "gold.dupes", ["k"], "app", 1)
    assertDataFrameEqual(
        store.read("gold.dupes"), spark.createDataFrame([(1, 0)], "k long, n long")
    )


def test_update_mode_needs_keys(spark, store, settings):
    append_versions(store, "bronze.nokeys", [rows(0, 1)])
    with pytest.raises(ValueError, match="update mode on gold.nokeys needs key columns"):
        store.write_stream(
            store.read_stream("bronze.nokeys").groupBy("k").count(),
            "gold.nokeys",
            settings.checkpoint_path("gold", "nokeys"),
            output_mode="update",
        )


def test_a_replayed_stateful_batch_runs_its_state_and_writes_nothing(spark, store, settings):
    """A stateful flow writing two tables (foreachBatch), its last batch replayed after both
    tables committed it: the tables skip it, and its stateful operator still runs (Spark 4.2
    fails a foreachBatch whose state stores did not all commit)."""
    from pathlib import Path

    append_versions(store, "bronze.d", [rows(0, 3) + rows(0, 2), rows(2, 5)])
    checkpoint = settings.checkpoint_path("silver", "d")
    routes = [
        ("silver.d_low", lambda b: b.where("k < 3"), ()),
        ("silver.d_high", lambda b: b.where("k >= 3"), ()),
    ]

    def run():
        query = store.write_stream_routed(
            store.read_stream("bronze.d", max_files_per_trigger=1).dropDuplicates(["k"]),
            routes,
            checkpoint,
            trigger={"availableNow": True},
        )
        query.awaitTermination()
        return query

    run()
    versions = [DeltaTable(str(store.path(n))).version() for n, _, _ in routes]
    (Path(checkpoint) / "commits" / "1").unlink()  # batch 1 committed to both tables only
    (Path(checkpoint) / "commits" / ".1.crc").unlink(missing_ok=True)
    assert [p["batchId"] for p in run().recentProgress] == [1]
    assert [DeltaTable(str(store.path(n))).version() for n, _, _ in routes] == versions
    assertDataFrameEqual(store.read("silver.d_low"), spark.createDataFrame(rows(0, 3), KV))
    assertDataFrameEqual(store.read("silver.d_high"), spark.createDataFrame(rows(3, 5), KV))


def test_a_routed_batch_is_written_in_event_time_order_and_read_back_so(spark, settings):
    """40 events over 4 hours come in one micro-batch, from 4 upstream files that each span
    the 4 hours. Written with 10 rows per file, the batch becomes 4 files of one hour each,
    listed in time order by the commit and by the snapshot; a stream that reads them one file
    at a time with a 5-minute watermark drops nothing."""
    import datetime as dt

    from lakehouse.storage import table_store
    from lakehouse.storage.timeorder import first_time

    store = table_store(spark, settings.with_overrides({"write.rows_per_file": 10}))
    start = dt.datetime(2026, 1, 5, 8, tzinfo=dt.UTC)
    events = [(n, start + dt.timedelta(minutes=6 * n)) for n in range(40)]
    # file i holds events i, i+4, i+8, ...: each spans the 4 hours
    spread = sorted(events, key=lambda e: (e[0] % 4, e[0]))
    upstream = spark.createDataFrame(
        spark.sparkContext.parallelize(spread, 4), "k long, t timestamp"
    )
    store.write(upstream, "bronze.t")
    assert len(snapshot_files(store.path("bronze.t"))) == 4

    store.create("silver.t", upstream.schema)
    store.write_stream_routed(
        store.read_stream("bronze.t"),
        [Route("silver.t", lambda batch: batch, (), "t")],
        settings.checkpoint_path("silver", "t"),
        trigger={"availableNow": True},
    ).awaitTermination()
    root = str(store.path("silver.t"))
    committed = committed_files(root, dfiles.latest_version(root))
    assert snapshot_files(root) == [path for path, _stats in committed]
    assert [first_time(stats, "t") for _path, stats in committed] == [
        start + dt.timedelta(hours=h) for h in range(4)
    ]

    hourly = (
        store.read_stream("silver.t", max_files_per_trigger=1)
        .withWatermark("t", "5 minutes")
        .groupBy(F.window("t", "1 hour"))
        .count()
        .select(F.col("window.start").alias("hour"), "count")
    )
    query = store.write_stream(
        hourly, "gold.t", settings.checkpoint_path("gold", "t"), trigger={"availableNow": True}
    )
    query.awaitTermination()
    dropped = [
        op["numRowsDroppedByWatermark"] for p in query.recentProgress for op in p["stateOperators"]
    ]
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 4
    assert sum(dropped) == 0
    assert sorted(tuple(r) for r in store.read("gold.t").collect()) == [
        (start.replace(tzinfo=None) + dt.timedelta(hours=h), 10) for h in range(3)
    ]


def committed_files(root, version: int) -> list[tuple[str, str]]:
    """(path, statistics) of the files commit ``version`` added, in the commit's order."""
    import json

    log = Path(root) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [(a["add"]["path"], a["add"]["stats"]) for a in actions if "add" in a]


def snapshot_files(root) -> list[str]:
    """A table's files in the order a stream reads its snapshot: modification time, then
    path (delta-spark's order)."""
    import pyarrow as pa

    adds = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pylist()
    return [a["path"] for a in sorted(adds, key=lambda a: (a["modification_time"], a["path"]))]


def forget_last_batch(checkpoint) -> None:
    """As if the job died after the table's commit and before Spark's own commit log."""
    commits = Path(checkpoint) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)


def version(store, name) -> int:
    return dfiles.latest_version(store.path(name))


def test_append_sink_skips_a_replayed_batch(spark, store, settings, run_stream):
    append_versions(store, "bronze.b", [rows(0, 3), rows(3, 6), rows(6, 9)])
    checkpoint = settings.checkpoint_path("silver", "b")
    assert len(run_stream("bronze.b", "silver.b", checkpoint, max_files=1)) == 3
    before = version(store, "silver.b")
    forget_last_batch(checkpoint)
    query = store.write_stream(
        store.read_stream("bronze.b", max_files_per_trigger=1),
        "silver.b",
        checkpoint,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert [p["batchId"] for p in query.recentProgress] == [2]  # Spark replayed it ...
    assert version(store, "silver.b") == before  # ... and the Delta sink skipped it
    assertDataFrameEqual(store.read("silver.b"), spark.createDataFrame(rows(0, 9), KV))

    # a new checkpoint at the same path is a new query: its batches are written, not skipped
    DeltaTable(str(store.path("silver.b"))).delete()  # reprocess: empty the sink ...
    shutil.rmtree(checkpoint)  # ... and start over from a new checkpoint at the same path
    run_stream("bronze.b", "silver.b", checkpoint, max_files=1)
    assertDataFrameEqual(store.read("silver.b"), spark.createDataFrame(rows(0, 9), KV))


def test_complete_sink_skips_a_replayed_batch(spark, store, settings):
    append_versions(store, "bronze.c", [rows(0, 3), rows(3, 4)])
    checkpoint = settings.checkpoint_path("gold", "c")

    def run():
        query = store.write_stream(
            store.read_stream("bronze.c", max_files_per_trigger=1).groupBy().count(),
            "gold.c",
            checkpoint,
            output_mode="complete",
            trigger={"availableNow": True},
        )
        query.awaitTermination()

    run()  # complete mode: each batch overwrites the table with the whole aggregate
    assert store.read("gold.c").collect() == [Row(count=4)]
    before = version(store, "gold.c")
    forget_last_batch(checkpoint)
    run()
    assert version(store, "gold.c") == before
    assert store.read("gold.c").collect() == [Row(count=4)]


# a micro-batch's few rows for a table are appended by delta-rs; write.arrow_append_rows 0
# makes it delta-spark's: both paths, the same rows and the same exactly-once
# (delta-spark's path in make test-all: in CI, the append delta-rs cannot make takes
# delta-spark's, its replay skipped)
@pytest.mark.parametrize(
    "append_rows", [100_000, pytest.param(0, marks=pytest.mark.full)], ids=["delta-rs", "spark"]
)
def test_routed_writes_replay_only_the_table_that_missed_the_batch(
    spark, settings, monkeypatch, append_rows
):
    """A foreachBatch flow writing two tables, killed between them: the restart writes the
    batch to the second table only, each table once per batch (txnAppId/txnVersion)."""
    from lakehouse.storage import table_store

    store = table_store(spark, settings.with_overrides({"write.arrow_append_rows": append_rows}))
    append_versions(store, "bronze.r", [rows(0, 4), rows(4, 8)])
    checkpoint = settings.checkpoint_path("silver", "r")
    routes = [
        ("silver.r_even", lambda b: b.where("k % 2 = 0"), ()),
        ("silver.r_odd", lambda b: b.where("k % 2 = 1"), ()),
    ]

    def run():
        query = store.write_stream_routed(
            store.read_stream("bronze.r", max_files_per_trigger=1),
            routes,
            checkpoint,
            trigger={"availableNow": True},
        )
        query.awaitTermination()

    monkeypatch.setenv(FAILPOINT_ENV, "after-write:silver.r_even")
    with pytest.raises(StreamingQueryException, match="failpoint after-write:silver.r_even"):
        run()
    assert store.read("silver.r_even").count() == 2 and not store.exists("silver.r_odd")
    monkeypatch.delenv(FAILPOINT_ENV)
    run()
    evens = [(n, f"v{n}") for n in range(0, 8, 2)]
    odds = [(n, f"v{n}") for n in range(1, 8, 2)]
    assertDataFrameEqual(store.read("silver.r_even"), spark.createDataFrame(evens, KV))
    assertDataFrameEqual(store.read("silver.r_odd"), spark.createDataFrame(odds, KV))
    app_id = checkpoints.app_id(checkpoint)
    for name in ("silver.r_even", "silver.r_odd"):  # one commit per batch, each batch once
        table = DeltaTable(str(store.path(name)))
        assert table.transaction_version(app_id) == 1, name
        writes = [h for h in table.history() if h["operation"] == "WRITE"]
        assert len(writes) == 2, name
        # the first batch creates the table (delta-spark), the second is appended
        engine = writes[0].get("engineInfo") or writes[0].get("clientVersion") or ""
        assert ("delta-rs" in engine) == bool(append_rows), writes[0]
    before = version(store, "silver.r_odd")
    forget_last_batch(checkpoint)
    run()  # the whole batch replayed: both tables skip it
    assert version(store, "silver.r_odd") == before
    assert store.read("silver.r_even").count() == 4


def test_an_append_delta_rs_cannot_make_is_delta_sparks(spark, store, monkeypatch):
    """A table with in-commit timestamps (delta-rs 1.x refuses to commit to it), a batch
    larger than ARROW_MAX_BYTES, a partitioned table: a micro-batch's rows are appended by
    delta-spark, exactly once;
    commits of both engines follow each other on one table and every row is read back.
    (Each batch is cached and computed, as a flow's micro-batch is: its size is then known.)"""

    def batch_of(data):
        frame = spark.createDataFrame(data, KV).persist()
        assert frame.count() == len(data)
        return frame

    store.write(spark.createDataFrame(rows(0, 2), KV), "silver.ict")
    path = store.path("silver.ict")
    assert store._append_arrow(batch_of(rows(2, 3)), "silver.ict", "app", 0, 1)
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableInCommitTimestamps = true)"
    )
    batch = batch_of(rows(3, 5))
    assert not store._append_arrow(batch, "silver.ict", "app", 1, 2)
    store._write_route(Route("silver.ict", lambda b: b), batch, 2, "app", 1)
    store._write_route(Route("silver.ict", lambda b: b), batch, 2, "app", 1)  # replayed
    assertDataFrameEqual(store.read("silver.ict"), spark.createDataFrame(rows(0, 5), KV))
    engines = [
        h.get("engineInfo") or h.get("clientVersion") or ""
        for h in DeltaTable(str(path)).history()
        if h["operation"] == "WRITE"
    ]
    assert ["delta-rs" in e for e in engines] == [False, True, False], engines

    # a batch of few rows but many bytes (bronze.quarantine keeps long lines whole) is not
    # copied to the driver's Python: delta-spark writes it (the size is that of the cached
    # micro-batch, as Spark measured it when it computed it)
    monkeypatch.setattr(store_module, "ARROW_MAX_BYTES", 2_000)
    store.write(spark.createDataFrame(rows(0, 1), KV), "silver.wide")
    wide = batch_of([(1, "x" * 5_000)])
    assert not store._append_arrow(wide, "silver.wide", "app", 0, 1)
    monkeypatch.setattr(store_module, "ARROW_MAX_BYTES", 20_000)
    assert store._append_arrow(wide, "silver.wide", "app", 0, 1)

    store.create("silver.parts", spark.createDataFrame([], KV).schema, ["v"])
    batch = batch_of(rows(0, 2))
    assert not store._append_arrow(batch, "silver.parts", "app", 0, 2)  # (its partitions)
    store._write_route(Route("silver.parts", lambda b: b, ("v",)), batch, 2, "app", 0)
    assertDataFrameEqual(store.read("silver.parts"), batch)
    assert DeltaTable(str(store.path("silver.parts"))).metadata().partition_columns == ["v"]


def test_app_transactions_read_from_the_checksum_or_else_from_the_log(spark, store):
    """Appends with (app id, version) skip a version the table records, whether the app's
    version comes from the snapshot's checksum file or, without one, from the log; a batch of
    no rows commits nothing; a schema that does not fit is refused naming the column."""
    store.write(spark.createDataFrame(rows(0, 2), KV), "silver.t")  # created: version 0
    store.write(spark.createDataFrame(rows(2, 4), KV), "silver.t", txn=("app", 0))
    store.write(spark.createDataFrame(rows(2, 4), KV), "silver.t", txn=("app", 0))  # replay
    store.write(spark.createDataFrame([], KV), "silver.t", txn=("app", 1))  # no rows
    assert version(store, "silver.t") == 1
    log_dir = store.path("silver.t") / "_delta_log"
    assert (log_dir / f"{1:020d}.crc").exists()
    (log_dir / f"{1:020d}.crc").unlink()  # as after a crash between the commit and its checksum
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # as in a new job
    store.write(spark.createDataFrame(rows(2, 4), KV), "silver.t", txn=("app", 0))  # replay
    store.write(spark.createDataFrame(rows(4, 5), KV), "silver.t", txn=("app", 1))
    assert version(store, "silver.t") == 2
    assert DeltaTable(str(store.path("silver.t"))).transaction_version("app") == 1
    assertDataFrameEqual(store.read("silver.t"), spark.createDataFrame(rows(0, 5), KV))
    wrong = spark.createDataFrame([(9, 9)], "k long, v long")
    with pytest.raises(dfiles.SchemaMismatch, match="cannot write to table silver.t: .*v"):
        store.write(wrong, "silver.t", txn=("app", 2))
    assert version(store, "silver.t") == 2


def test_each_delta_rs_commit_leaves_the_checksum_delta_spark_would(spark, store):
    """delta-rs writes no checksum file; each of its commits here gets the one delta-spark
    derives (``N.crc``): delta-spark, rebuilding the table's state from its log, finds it
    exact, and a reader takes the version's protocol and metadata from it, with no job."""
    kv = "k long, v string"
    name = "gold.summed"
    store.create(name, spark.createDataFrame([], kv).schema)  # version 0, with its checksum
    store.upsert(spark.createDataFrame([(1, "a"), (2, "b")], kv), name, ["k"], "app", 0)
    store.upsert(spark.createDataFrame([(2, "c"), (3, "d")], kv), name, ["k"], "app", 1)
    side = pa.table({"k": pa.array([9], pa.int64()), "v": pa.array(["s"])})
    store.append_arrow_once(side, name, "side", 7)
    table = DeltaTable(str(store.path(name)))
    assert table.version() == 3
    assert [h["operation"] for h in table.history()] == ["WRITE", "MERGE", "WRITE", "CREATE TABLE"]
    log_dir = store.path(name) / "_delta_log"
    last = json.loads((log_dir / f"{3:020d}.crc").read_text())
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    # the MERGE rewrote the first append's file: two files
    assert (last["numFiles"], last["tableSizeBytes"]) == (2, sum(sizes)) and len(sizes) == 2
    assert sorted((t["appId"], t["version"]) for t in last["setTransactions"]) == [
        ("app", 1),
        ("side", 7),
    ]
    assert sum(last["fileSizeHistogram"]["fileCounts"]) == 2
    jvm = spark._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # as in a new job
    snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, str(store.path(name))
    ).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    assert snapshot.version() == 3 and snapshot.checksumOpt().isDefined()
    # compares files, sizes, protocol, metadata, app transactions, histogram; fatal when unequal
    assert snapshot.validateChecksum(getattr(snapshot, "validateChecksum$default$1")())
    expected = [(1, "a"), (2, "c"), (3, "d"), (9, "s")]
    assertDataFrameEqual(store.read(name), spark.createDataFrame(expected, kv))


def test_no_checksum_is_written_where_it_cannot_be_exact(tmp_path):
    """No checksum without the previous version's, nor after one not as delta-spark writes
    it, nor for a commit removing a file whose size it does not give; never one written over
    another; no app transactions where the table lets them expire (the previous checksum's
    list may lack some its log still holds)."""
    from deltalake import write_deltalake

    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"k": pa.array([1], pa.int64())}))  # no checksum
    write_deltalake(str(root), pa.table({"k": pa.array([2], pa.int64())}), mode="append")
    log_dir = root / "_delta_log"
    assert not dfiles.write_checksum(root, 1)
    odd = {"metadata": {"id": "x"}, "protocol": {"minReaderVersion": 1}}  # no sizes
    (log_dir / f"{0:020d}.crc").write_text(json.dumps(odd))
    assert not dfiles.write_checksum(root, 1)
    checksum = {
        "tableSizeBytes": 10,
        "numFiles": 1,
        "numMetadata": 1,
        "numProtocol": 1,
        "metadata": {"id": "x"},
        "protocol": {"minReaderVersion": 1, "minWriterVersion": 2},
    }
    (log_dir / f"{0:020d}.crc").write_text(json.dumps(checksum))
    (log_dir / f"{2:020d}.json").write_text(
        json.dumps({"remove": {"path": "gone.parquet", "dataChange": True}}) + "\n"
    )
    assert dfiles.write_checksum(root, 1)
    written = json.loads((log_dir / f"{1:020d}.crc").read_text())
    commit = (log_dir / f"{1:020d}.json").read_text().splitlines()
    added = next(json.loads(line)["add"]["size"] for line in commit if line.startswith('{"add"'))
    assert (written["numFiles"], written["tableSizeBytes"]) == (2, 10 + added)
    assert not dfiles.write_checksum(root, 2)
    assert not (log_dir / f"{2:020d}.crc").exists()
    assert not dfiles.write_checksum(root, 1)  # there already
    assert json.loads((log_dir / f"{1:020d}.crc").read_text()) == written
    # app transactions are carried where the table keeps them all, before and after a commit
    kept = {"setTransactions": [{"appId": "a", "version": 3}]}
    expiring = {"id": "x", "configuration": {"delta.setTransactionRetentionDuration": "1 day"}}
    for before, after in [({"id": "x"}, {"id": "x"}), (expiring, {"id": "x"})]:
        (log_dir / f"{1:020d}.crc").write_text(json.dumps({**written, **kept, "metadata": before}))
        (log_dir / f"{2:020d}.crc").unlink(missing_ok=True)
        commit = [{"metaData": after}, {"txn": {"appId": "b", "version": 0}}]
        (log_dir / f"{2:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in commit))
        assert dfiles.write_checksum(root, 2)
        derived = json.loads((log_dir / f"{2:020d}.crc").read_text())
        assert derived["metadata"] == after and derived["numFiles"] == written["numFiles"]
        carried = [{"appId": "a", "version": 3}, {"appId": "b", "version": 0}]
        assert derived.get("setTransactions") == (None if before is expiring else carried)


def test_update_mode_merge_skips_a_replayed_batch_and_unsets_its_confs(spark, store, settings):
    """An aggregation in update mode upserts the latest value per key; its replayed batch's
    MERGE is skipped and its confs unset; a restart carries its state; a new checkpoint at
    the same path is a new query."""
    append_versions(store, "bronze.u", [[(1, "a"), (2, "b")], [(1, "c")]])
    checkpoint = settings.checkpoint_path("gold", "u")

    def run():
        agg = (
            store.read_stream("bronze.u", max_files_per_trigger=1)
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.max("v").alias("latest"))
        )
        query = store.write_stream(
            agg, "gold.u", checkpoint, output_mode="update", keys=["k"],
            trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()

    run()
    expected = spark.createDataFrame([(1, 2, "c"), (2, 1, "b")], "k long, n long, latest string")
    assertDataFrameEqual(store.read("gold.u"), expected)
    before = version(store, "gold.u")
    forget_last_batch(checkpoint)
    run()  # batch 1 replayed: its MERGE is skipped
    assert version(store, "gold.u") == before
    assertDataFrameEqual(store.read("gold.u"), expected)
    for conf in TXN_CONFS:
        assert spark.conf.get(conf, None) is None, conf
    # a restart on the same checkpoint: the state carried over, rows updated in place (a key
    # twice in one micro-batch, a new key)
    append_versions(store, "bronze.u", [[(3, "d"), (2, "e"), (2, "f")]])
    run()
    expected = spark.createDataFrame(
        [(1, 2, "c"), (2, 3, "f"), (3, 1, "d")], "k long, n long, latest string"
    )
    assertDataFrameEqual(store.read("gold.u"), expected)

    # a new checkpoint at the same path is a new query: its batches are written, not skipped
    shutil.rmtree(checkpoint)
    append_versions(store, "bronze.u", [[(4, "g")]])
    run()  # counts from scratch, upserted over the rows there
    assertDataFrameEqual(
        store.read("gold.u"),
        spark.createDataFrame(
            [(1, 2, "c"), (2, 3, "f"), (3, 1, "d"), (4, 1, "g")], "k long, n long, latest string"
        ),
    )


def test_a_registered_table_is_in_the_catalog_with_history_and_time_travel(spark, store):
    schema = spark.createDataFrame([], KV).schema
    assert store.create("gold.hist", schema)
    # the tests' in-memory catalog dies with the process: a table is registered when asked
    assert not spark.catalog.tableExists("gold.hist")
    assert store.register("gold.hist")
    store.write(spark.createDataFrame(rows(0, 2), KV), "gold.hist")
    store.write(spark.createDataFrame(rows(2, 3), KV), "gold.hist")
    assertDataFrameEqual(spark.table("gold.hist"), spark.createDataFrame(rows(0, 3), KV))
    history = spark.sql("DESCRIBE HISTORY gold.hist").orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [
        (0, "CREATE TABLE"),
        (1, "WRITE"),
        (2, "WRITE"),
    ]
    assertDataFrameEqual(
        spark.sql("SELECT * FROM gold.hist VERSION AS OF 1"), spark.createDataFrame(rows(0, 2), KV)
    )
    location = spark.sql("DESCRIBE DETAIL gold.hist").collect()[0].location
    assert location.removeprefix("file:") == str(store.path("gold.hist"))


def test_spark_submit_without_the_jars_is_one_line(tmp_path):
    """Under spark-submit the JVM starts before the job: without --jars it has no Delta."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local[1]",
            str(PROJECT / "jobs" / "silver.py"),
            "--root",
            str(tmp_path),
            "--profile",
            "test",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    output = done.stdout + done.stderr  # spark-submit hands the driver's stderr to its stdout
    errors = [line for line in output.splitlines() if line.startswith("lakehouse: error:")]
    assert errors == [
        "lakehouse: error: delta-spark is not on the Spark classpath: under spark-submit pass "
        "the jars (--jars with the files of jars/lib, see `lakehouse cluster package`); "
        "elsewhere run make setup, or set native.jars_packages"
    ]
    assert "Traceback" not in output


def test_upserts_of_two_flows_at_once_each_record_only_their_own_app(spark, store):
    """Flows of one job run at once, each streaming query in a session of its own (a clone
    of the job's), and an upsert's app transaction goes to delta-spark through the confs of
    its batch's session: two MERGEs at once, without a lock between them, neither take the
    other's app id nor lose their version."""
    import threading

    for name in ("gold.left", "gold.right"):
        store.create(name, spark.createDataFrame([], KV).schema)
        store.upsert(spark.createDataFrame([(0, "start")], KV), name, ["k"], f"app-{name}", 0)
    errors = []

    def upserts(name: str) -> None:
        session = spark.newSession()  # as a streaming query's batches have
        try:
            for batch in (1, 2, 3):
                rows_ = session.createDataFrame([(0, f"{name} {batch}"), (batch, name)], KV)
                store.upsert(rows_, name, ["k"], f"app-{name}", batch)
        except Exception as exc:  # reported below, with the thread's table
            errors.append(f"{name}: {str(exc).splitlines()[0]}")

    threads = [threading.Thread(target=upserts, args=(n,)) for n in ("gold.left", "gold.right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for name, other in (("gold.left", "gold.right"), ("gold.right", "gold.left")):
        table = DeltaTable(str(store.path(name)))
        assert table.transaction_version(f"app-{name}") == 3
        assert table.transaction_version(f"app-{other}") is None
        expected = [(0, f"{name} 3"), (1, name), (2, name), (3, name)]
        assertDataFrameEqual(store.read(name), spark.createDataFrame(expected, KV))


def test_a_micro_batch_cut_by_a_stop_reaches_spark_as_a_short_interruption(spark):
    """A stop interrupts the JVM thread a foreachBatch function calls into: the function's
    error goes back to Spark in the short form its own pattern (run here, in the JVM) takes for
    a stop; any other error is left as it is."""
    jvm = spark._jvm
    jvm.java.lang.Thread.currentThread().interrupt()  # this Python thread's own JVM thread
    with pytest.raises(Py4JJavaError) as cut:
        jvm.java.lang.Thread.sleep(10_000)
    message = interruption(cut.value)
    assert message == (
        "py4j.protocol.Py4JJavaError: An error occurred while calling "
        "z:java.lang.Thread.sleep: java.lang.InterruptedException"
    )
    try:
        raise BatchInterrupted(message) from None
    except BatchInterrupted:
        returned = traceback.format_exc()  # what py4j hands the JVM
    assert len(returned) < 600
    proxy_error = jvm.org.apache.spark.sql.execution.streaming.runtime.StreamExecution
    assert proxy_error.PROXY_ERROR().findFirstIn(returned).isDefined()
    with pytest.raises(Exception, match="timeout value is negative") as failed:
        jvm.java.lang.Thread.sleep(-1)
    assert interruption(failed.value) is None


def test_a_new_query_reads_an_appended_table_commit_by_commit_and_keeps_that_choice(
    spark, store, tmp_path
):
    """A table whose log is appends since version 0 is read from version 0 by a new
    checkpoint (no snapshot to rebuild at each restart), with the same rows; the choice is
    kept in the checkpoint, and a table whose files were ever removed is read from its
    snapshot."""
    from lakehouse.flows import Flow, Output, TableInput
    from lakehouse.runner.queries import input_starts

    append_versions(store, "bronze.app", [rows(0, 2), rows(2, 3), rows(3, 5)])
    flow = Flow(
        name="silver.app",
        inputs=(TableInput("bronze.app"),),
        transform=lambda df: df,
        outputs=(Output("silver.app"),),
    )
    checkpoint = tmp_path / "checkpoint"
    assert dfiles.appends_only(store.path("bronze.app"))
    assert input_starts(store, flow, checkpoint) == {"bronze.app": 0}
    query = store.write_stream(
        store.read_stream("bronze.app", max_files_per_trigger=1, starting_version=0),
        "silver.app",
        checkpoint,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [2, 1, 2]
    assertDataFrameEqual(store.read("silver.app"), spark.createDataFrame(rows(0, 5), KV))

    store.write(spark.createDataFrame(rows(7, 8), KV), "bronze.app", mode="overwrite")
    assert not dfiles.appends_only(store.path("bronze.app"))
    assert input_starts(store, flow, checkpoint) == {"bronze.app": 0}  # as its batches were
    assert input_starts(store, flow, tmp_path / "new") == {"bronze.app": None}
    # a checkpoint that started before the choice was recorded goes on from the snapshot
    (checkpoint / checkpoints.STARTS).unlink()
    assert input_starts(store, flow, checkpoint) == {}
    # a log whose first commits were cleaned up is not read from version 0
    copy = tmp_path / "copy"
    append_versions(store, "bronze.app2", [rows(0, 1), rows(1, 2)])
    shutil.copytree(store.path("bronze.app2"), copy)
    (copy / "_delta_log" / f"{0:020d}.json").unlink()
    assert not dfiles.appends_only(copy)
