"""Table storage on delta-spark: reads, appends, upserts and streams, exactly-once on every
write path (a replayed micro-batch is skipped), tables the catalog knows, one-line errors."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

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
from lakehouse.storage.faults import FAILPOINT_ENV
from lakehouse.storage.streams import BatchInterrupted, Route, interruption

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


def _log_actions(path: Path, version: int = 0) -> dict[str, dict]:
    """The actions of commit ``version`` of the table at ``path``, by kind (one of each)."""
    lines = (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return {k: v for a in map(json.loads, filter(None, lines)) for k, v in a.items()}


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_table_is_created_by_its_engine_and_read_and_written_by_spark(spark, store, engine):
    """A table is created by the engine its declaration names, through that engine's public
    API: its schema (every column nullable, times in UTC), its partitions and the session's
    default table properties are the declared ones, Spark writes and reads it, and a second
    creation is a no-op. A partition column the schema lacks is refused in one line, leaving
    no table behind (delta-rs 1.6 would commit one it then cannot read)."""
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
        TimestampType,
    )

    fields = [
        ("id", LongType()),
        ("at", TimestampType()),
        ("day", DateType()),
        ("amount", DecimalType(12, 2)),
        ("tags", ArrayType(StringType())),
        ("pages", MapType(StringType(), DoubleType())),
        ("user", StructType([StructField("name", StringType())])),
        ("country", StringType()),
    ]
    schema = StructType([StructField(n, t, nullable=(n != "id")) for n, t in fields])
    assert store.create("gold.made", schema, ["day", "country"], engine=engine) is True
    path = store.path("gold.made")
    actions = _log_actions(path)
    assert actions["metaData"]["partitionColumns"] == ["day", "country"]
    assert actions["metaData"]["configuration"] == {"delta.checkpointInterval": "50"}
    made_by = actions["commitInfo"].get("engineInfo") or actions["commitInfo"]["clientVersion"]
    assert made_by.startswith({"delta-rs": "delta-rs:", "delta-spark": "Apache-Spark/"}[engine])
    assert [(f.name, f.dataType) for f in store.read("gold.made").schema] == fields
    assert store.create("gold.made", schema, ["day", "country"], engine=engine) is False

    row = spark.sql(
        "SELECT 7L AS id, TIMESTAMP'2026-11-28 10:00:00' AS at, DATE'2026-11-28' AS day,"
        " CAST(3.25 AS DECIMAL(12,2)) AS amount, array('a') AS tags, map('home', 1.5D) AS pages,"
        " named_struct('name', 'ann') AS user, 'NZ' AS country"
    )
    store.write(row, "gold.made", engine=engine)
    assert [r.asDict(recursive=True) for r in store.read("gold.made").collect()] == [
        r.asDict(recursive=True) for r in row.collect()
    ]
    assert dfiles.latest_version(path) == 1

    with pytest.raises(ValueError) as refused:
        store.create("gold.refused", schema, ["nowhere"], engine=engine)
    assert (
        str(refused.value) == "table gold.refused: partition column(s) nowhere not in its columns"
    )
    assert not store.exists("gold.refused")


def test_the_product_code_makes_no_call_into_delta_sparks_internals():
    """The default write path uses the engines' public APIs only: no module of the product
    names a class of delta-spark's ``org.apache.spark.sql.delta`` package through py4j (the
    session's catalog setting names Delta's catalog by its class: configuration, not a
    call), and none writes a Delta log or checksum file itself."""
    found = []
    for package in ("lakehouse", "bronze", "silver", "gold"):
        for source in sorted((PROJECT / package).rglob("*.py")):
            for number, line in enumerate(source.read_text().splitlines(), 1):
                calls_delta = "sql.delta" in line and "DeltaCatalog" not in line
                writes_log = ".crc" in line and "write" in line
                if calls_delta or writes_log:
                    found.append(f"{source.relative_to(PROJECT)}:{number}: {line.strip()}")
    assert found == []


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


# a table is upserted by the engine its declaration names: both engines, the same rows and
# the same exactly-once
UPSERT_PATHS = pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])


class _Engine:
    """The store's writes by one engine (what a table's declaration says)."""

    def __init__(self, store, engine: str):
        self.store, self.engine = store, engine

    def upsert(self, *args, **kwargs):
        return self.store.upsert(*args, engine=self.engine, **kwargs)

    def create(self, *args, **kwargs):
        return self.store.create(*args, engine=self.engine, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.fixture
def upserts(store, engine):
    return _Engine(store, engine)


def _made_by(commit: dict) -> str:
    return commit.get("engineInfo") or commit.get("clientVersion") or ""


@UPSERT_PATHS
def test_update_mode_replayed_batch_is_skipped(spark, upserts, engine):
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
    assert ("delta-rs" in _made_by(history[0])) == (engine == "delta-rs"), history[0]


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
def test_an_upsert_into_a_table_with_no_rows_is_an_append(spark, upserts, engine):
    """Nothing to match: delta-rs appends the batch, once (delta-spark MERGEs it); keys
    that occur twice in it are still refused."""
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
    operation, made_by = {
        "delta-rs": ("WRITE", "delta-rs:"),
        "delta-spark": ("MERGE", "Apache-Spark/"),
    }[engine]
    assert last["operation"] == operation and _made_by(last).startswith(made_by), last


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


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_routed_batch_is_written_in_event_time_order_and_read_back_so(spark, settings, engine):
    """40 events over 4 hours come in one micro-batch, from 4 upstream files that each span
    the 4 hours. delta-rs writes the batch in one file; delta-spark, at 10 rows per file, in
    4 files of one hour each, listed in time order by the commit. A stream that reads the
    table from its first version one file at a time with a 5-minute watermark drops
    nothing."""
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
    store.write(upstream, "bronze.t", engine="delta-spark")
    assert len(committed_files(store.path("bronze.t"), 0)) == 4

    store.create("silver.t", upstream.schema, engine=engine)
    store.write_stream_routed(
        store.read_stream("bronze.t"),
        [Route("silver.t", lambda batch: batch, (), "t", engine=engine)],
        settings.checkpoint_path("silver", "t"),
        trigger={"availableNow": True},
    ).awaitTermination()
    root = str(store.path("silver.t"))
    committed = committed_files(root, dfiles.latest_version(root))
    hours = {"delta-rs": 1, "delta-spark": 4}[engine]
    assert [first_time(stats, "t") for _path, stats in committed] == [
        start + dt.timedelta(hours=h) for h in range(hours)
    ]

    hourly = (
        store.read_stream("silver.t", max_files_per_trigger=1, starting_version=0)
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
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == hours
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


# both engines (delta-spark's in make test-all: its exactly-once on appends is CI's in
# test_appends_with_an_app_transaction_skip_a_version_the_table_records)
@pytest.mark.parametrize(
    "engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.full)]
)
def test_routed_writes_replay_only_the_table_that_missed_the_batch(
    spark, store, settings, monkeypatch, engine
):
    """A foreachBatch flow writing two tables, killed between them: the restart writes the
    batch to the second table only, each table once per batch (its app transaction), each by
    its engine."""
    append_versions(store, "bronze.r", [rows(0, 4), rows(4, 8)])
    checkpoint = settings.checkpoint_path("silver", "r")
    routes = [
        Route("silver.r_even", lambda b: b.where("k % 2 = 0"), engine=engine),
        Route("silver.r_odd", lambda b: b.where("k % 2 = 1"), engine=engine),
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
        assert [("delta-rs" in _made_by(w)) for w in writes] == [engine == "delta-rs"] * 2
    before = version(store, "silver.r_odd")
    forget_last_batch(checkpoint)
    run()  # the whole batch replayed: both tables skip it
    assert version(store, "silver.r_odd") == before
    assert store.read("silver.r_even").count() == 4


def test_a_large_micro_batch_reaches_delta_rs_in_chunks_and_one_commit(spark, store, monkeypatch):
    """A micro-batch larger than one chunk (Spark's estimate of the cached batch; a chunk is
    64 MiB, 2,000 bytes here) reaches delta-rs a chunk at a time, and is still one commit
    that records its app transaction: in one file for a table streams read, its partitions'
    for a partitioned table; a replay is skipped, and every row is there once."""
    from lakehouse.storage import rs_writes

    monkeypatch.setattr(rs_writes, "CHUNK_BYTES", 2_000)
    batch = spark.createDataFrame(rows(0, 400), KV).repartition(4).persist()
    assert batch.count() == 400 and rs_writes.estimated_bytes(batch) > 3 * 2_000
    chunks = []
    monkeypatch.setattr(rs_writes, "_chunks", _recording(rs_writes._chunks, chunks))
    txn = ("app", 0)
    store.write(batch, "silver.large", txn=txn, event_time="k", rows=400)
    store.write(batch.limit(1), "silver.large", txn=txn, rows=1)  # replayed: skipped
    assert chunks == [4]  # (the replay read nothing)
    assertDataFrameEqual(store.read("silver.large"), spark.createDataFrame(rows(0, 400), KV))
    path = store.path("silver.large")
    assert dfiles.latest_version(path) == 1 and len(committed_files(path, 1)) == 1
    assert DeltaTable(str(path)).transaction_version("app") == 0

    thirds = batch.selectExpr("k", "concat('v', k % 3) AS v").persist()
    assert thirds.count() == 400
    store.create("silver.parts", spark.createDataFrame([], KV).schema, ["v"])
    store.write(thirds, "silver.parts", txn=txn, rows=400)
    expected = [(n, f"v{n % 3}") for n in range(400)]
    assertDataFrameEqual(store.read("silver.parts"), spark.createDataFrame(expected, KV))
    table = DeltaTable(str(store.path("silver.parts")))
    assert table.metadata().partition_columns == ["v"] and table.version() == 1
    assert sorted(p["v"] for p in table.partitions()) == ["v0", "v1", "v2"]


def _recording(chunks_of, calls: list):
    def chunks(df, count, schema):
        calls.append(count)
        return chunks_of(df, count, schema)

    return chunks


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_appends_with_an_app_transaction_skip_a_version_the_table_records(spark, store, engine):
    """Appends with (app id, version) skip a version the table records, or an earlier one of
    that app; a schema that does not fit is refused in one line naming the column."""
    write = functools.partial(store.write, engine=engine)
    write(spark.createDataFrame(rows(0, 2), KV), "silver.t")  # created with them: version 0
    write(spark.createDataFrame(rows(2, 4), KV), "silver.t", txn=("app", 3))
    write(spark.createDataFrame(rows(2, 4), KV), "silver.t", txn=("app", 3))  # replay
    write(spark.createDataFrame(rows(7, 9), KV), "silver.t", txn=("app", 2))  # an earlier one
    assert version(store, "silver.t") == 1
    write(spark.createDataFrame(rows(4, 5), KV), "silver.t", txn=("app", 4))
    assert version(store, "silver.t") == 2
    assert DeltaTable(str(store.path("silver.t"))).transaction_version("app") == 4
    assertDataFrameEqual(store.read("silver.t"), spark.createDataFrame(rows(0, 5), KV))
    wrong = spark.createDataFrame([(9, 9)], "k long, v long")
    with pytest.raises(Exception, match="v"):
        write(wrong, "silver.t", txn=("app", 5))
    if engine == "delta-rs":  # (delta-spark refuses it in its own words)
        with pytest.raises(dfiles.SchemaMismatch, match="cannot write to table silver.t: .*v"):
            write(wrong, "silver.t", txn=("app", 5))
    assert version(store, "silver.t") == 2


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
