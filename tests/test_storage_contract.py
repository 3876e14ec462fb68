"""The table storage contract, proven on both backends: every test here runs on native
(delta-spark) and on embedded (delta-rs), which must behave the same."""

from __future__ import annotations

import shutil

import pytest
from deltalake import DeltaTable
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual
from storage_helpers import KV, append_versions, rows

from lakehouse.storage import SchemaMismatch, TableNotFound


@pytest.fixture(params=["native", "embedded"])
def backend(request):
    return request.param


def test_missing_table_names_table_and_path(spark, store):
    with pytest.raises(TableNotFound) as err:
        store.read("gold.nothing")
    assert "table gold.nothing does not exist at" in str(err.value)
    assert str(store.path("gold.nothing")) in str(err.value)
    with pytest.raises(TableNotFound, match="table gold.nothing does not exist at"):
        store.read_stream("gold.nothing")


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


def test_update_mode_upserts_latest_value_per_key(spark, store, settings):
    append_versions(
        store, "bronze.kv", [[(1, "a"), (2, "b")], [(1, "c")], [(3, "d"), (2, "e"), (2, "f")]]
    )
    from pyspark.sql import functions as F

    def start():
        agg = (
            store.read_stream("bronze.kv", max_files_per_trigger=1)
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.max("v").alias("latest"))
        )
        query = store.write_stream(
            agg,
            "gold.kv",
            settings.checkpoint_path("gold", "kv"),
            output_mode="update",
            keys=["k"],
            trigger={"availableNow": True},
        )
        query.awaitTermination()
        return query

    start()
    expected = spark.createDataFrame(
        [(1, 2, "c"), (2, 3, "f"), (3, 1, "d")], "k long, n long, latest string"
    )
    assertDataFrameEqual(store.read("gold.kv"), expected)
    append_versions(store, "bronze.kv", [[(3, "z")]])
    start()  # restart on the same checkpoint: state carried over, row updated in place
    expected = spark.createDataFrame(
        [(1, 2, "c"), (2, 3, "f"), (3, 2, "z")], "k long, n long, latest string"
    )
    assertDataFrameEqual(store.read("gold.kv"), expected)


def test_update_mode_replayed_batch_is_skipped(spark, store, settings):
    df = spark.createDataFrame([(1, 1, "a")], "k long, n long, latest string")
    store.upsert(df, "gold.once", ["k"], "app", 0)
    df2 = spark.createDataFrame([(1, 5, "b")], "k long, n long, latest string")
    store.upsert(df2, "gold.once", ["k"], "app", 0)  # replay of batch 0 with other content
    assertDataFrameEqual(store.read("gold.once"), df)
    store.upsert(df2, "gold.once", ["k"], "app", 1)
    assertDataFrameEqual(store.read("gold.once"), df2)


def test_upsert_by_two_key_columns(spark, store):
    """Each key comparison is parenthesized: unparenthesized, DataFusion read the MERGE
    predicate of two keys as ``a IS NOT DISTINCT FROM (b AND c)`` and failed."""
    schema = "k long, w string, n long"
    store.upsert(
        spark.createDataFrame([(1, "a", 1), (1, "b", 2)], schema), "gold.kw", ["k", "w"], "app", 0
    )
    store.upsert(
        spark.createDataFrame([(1, "b", 7), (2, "a", 3)], schema), "gold.kw", ["k", "w"], "app", 1
    )
    assertDataFrameEqual(
        store.read("gold.kw"),
        spark.createDataFrame([(1, "a", 1), (1, "b", 7), (2, "a", 3)], schema),
    )


def test_update_mode_refuses_duplicate_keys_in_a_batch(spark, store):
    df = spark.createDataFrame([(1, 1), (1, 2)], "k long, n long")
    with pytest.raises(ValueError, match=r"key\(s\) of \(k\) occur more than once in batch 0"):
        store.upsert(df, "gold.dupes", ["k"], "app", 0)


def test_update_mode_needs_keys(spark, store, settings):
    append_versions(store, "bronze.nokeys", [rows(0, 1)])
    with pytest.raises(ValueError, match="update mode on gold.nokeys needs key columns"):
        store.write_stream(
            store.read_stream("bronze.nokeys").groupBy("k").count(),
            "gold.nokeys",
            settings.checkpoint_path("gold", "nokeys"),
            output_mode="update",
        )


def test_complete_mode_overwrites_each_batch(spark, store, settings):
    append_versions(store, "bronze.c", [rows(0, 3), rows(3, 4)])
    query = store.write_stream(
        store.read_stream("bronze.c", max_files_per_trigger=1).groupBy().count(),
        "gold.c",
        settings.checkpoint_path("gold", "c"),
        output_mode="complete",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert store.read("gold.c").collect() == [Row(count=4)]


def test_new_checkpoint_at_the_same_path_is_a_new_query(spark, store, settings, run_stream):
    append_versions(store, "bronze.re", [rows(0, 3), rows(3, 6)])
    checkpoint = settings.checkpoint_path("silver", "re")
    run_stream("bronze.re", "silver.re", checkpoint, max_files=1)
    DeltaTable(str(store.path("silver.re"))).delete()  # reprocess: empty the sink ...
    shutil.rmtree(checkpoint)  # ... and start over from a new checkpoint at the same path
    run_stream("bronze.re", "silver.re", checkpoint, max_files=1)
    assertDataFrameEqual(store.read("silver.re"), spark.createDataFrame(rows(0, 6), KV))


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

    from pyspark.sql import functions as F

    from lakehouse.storage import deltafiles as dfiles
    from lakehouse.storage import table_store
    from lakehouse.storage.store import Route
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
    assert len(dfiles.snapshot_files(dfiles.open_table(str(store.path("bronze.t"))))) == 4

    store.create("silver.t", upstream.schema)
    store.write_stream_routed(
        store.read_stream("bronze.t"),
        [Route("silver.t", lambda batch: batch, (), "t")],
        settings.checkpoint_path("silver", "t"),
        trigger={"availableNow": True},
    ).awaitTermination()
    root = str(store.path("silver.t"))
    committed = dfiles.read_version(root, dfiles.latest_version(root)).added
    snapshot = dfiles.snapshot_files(dfiles.open_table(root))
    assert [f.path for f in snapshot] == [f.path for f in committed]
    assert [first_time(f.stats, "t") for f in committed] == [
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
