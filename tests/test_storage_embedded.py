"""The embedded Delta backend: round trips, streaming reads, exactly-once streaming writes."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual
from storage_helpers import KV, append_versions, rows

from lakehouse.storage import TableNotFound
from lakehouse.storage import deltafiles as dfiles

pytestmark = pytest.mark.embedded

UTC = dt.UTC


def arrow_of(path) -> pa.Table:
    """Read a table independently of Spark (with pyarrow's file system: see delta-rs#2184)."""
    table = DeltaTable(str(path))
    return table.to_pyarrow_table(
        filesystem=pafs.SubTreeFileSystem(str(path), pafs.LocalFileSystem())
    )


def data_files_on_disk(root: Path) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), root)
        for d, _, files in os.walk(root)
        if "_delta_log" not in d
        for f in files
        if f.endswith(".parquet")
    }


# ---- round trip -------------------------------------------------------------------------------

ALL_TYPES = (
    "event_id string, user_id long, n int, amount double, flag boolean, event_time timestamp, "
    "day date, price decimal(10,2), pages array<string>, counts map<string,long>, "
    "window struct<start:timestamp,end:timestamp>"
)


def test_round_trip_of_every_contract_type(spark, store):
    t0 = dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
    data = [
        (
            "e1",
            42,
            7,
            19.99,
            True,
            t0,
            dt.date(2026, 3, 1),
            Decimal("12.34"),
            ["home", "cart"],
            {"purchase": 2},
            (t0, t0 + dt.timedelta(minutes=15)),
        ),
        ("e2", None, None, None, None, None, None, None, None, None, None),
    ]
    df = spark.createDataFrame(data, ALL_TYPES)
    store.write(df, "bronze.types")

    assertDataFrameEqual(store.read("bronze.types"), df)

    arrow = arrow_of(store.path("bronze.types")).sort_by("event_id").to_pylist()
    assert arrow[0] == {
        "event_id": "e1",
        "user_id": 42,
        "n": 7,
        "amount": 19.99,
        "flag": True,
        "event_time": t0,
        "day": dt.date(2026, 3, 1),
        "price": Decimal("12.34"),
        "pages": ["home", "cart"],
        "counts": [("purchase", 2)],
        "window": {"start": t0, "end": t0 + dt.timedelta(minutes=15)},
    }
    assert arrow[1] == {k: (None if k != "event_id" else "e2") for k in arrow[0]}

    # UTC-aware timestamps keep the table at the protocol every delta-spark reads
    table = DeltaTable(str(store.path("bronze.types")))
    protocol = table.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    types = {f["name"]: f["type"] for f in json.loads(table.schema().to_json())["fields"]}
    assert types["event_time"] == "timestamp"
    # per-file statistics are recorded so readers can skip data
    stats = [json.loads(f.stats) for f in dfiles.snapshot_files(table)]
    e1 = next(x for x in stats if x["minValues"].get("event_id") == "e1")
    assert e1["numRecords"] == 1
    # milliseconds, the lower bound rounded down and the upper bound rounded up
    assert e1["minValues"]["event_time"] == "2026-03-01T12:30:15.123Z"
    assert e1["maxValues"]["event_time"] == "2026-03-01T12:30:15.124Z"
    assert e1["minValues"]["window"]["end"] == "2026-03-01T12:45:15.123Z"
    assert "price" not in e1["maxValues"]  # no decimal bounds: JSON floats could round past them


def test_missing_table_names_table_and_path(spark, store):
    with pytest.raises(TableNotFound) as err:
        store.read("gold.nothing")
    assert "table gold.nothing does not exist at" in str(err.value)
    assert str(store.path("gold.nothing")) in str(err.value)
    with pytest.raises(Exception, match=r"Delta table at /nowhere/t does not exist"):
        spark.read.format("deltalake").load("/nowhere/t").collect()


def test_reused_dataframe_reads_every_row_after_a_filtered_action(spark, store):
    """Spark 4.2.0 keeps a filter-pushdown read plan on the DataFrame's source object; with
    pushdown on, the second count below would see only partition b (see session.py)."""
    df = spark.createDataFrame([(n, "a" if n < 5 else "b") for n in range(10)], "id long, p string")
    store.write(df, "silver.reuse", partition_by=["p"])
    table = store.read("silver.reuse")
    assert table.where("p = 'b'").count() == 5
    assert table.count() == 10
    assert sorted(r.p for r in table.groupBy("p").count().collect()) == ["a", "b"]


def test_sql_view_and_partition_pruning_and_stats_skipping(spark, store, tmp_path):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        _pruning_and_stats_skipping(spark, store)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def _pruning_and_stats_skipping(spark, store):
    df = spark.createDataFrame(
        [(n, "a" if n < 100 else "b") for n in list(range(0, 10)) + list(range(200, 210))],
        "id long, p string",
    )
    store.write(df.repartition(1), "silver.parts", partition_by=["p"])
    path = store.path("silver.parts")
    spark.sql(
        "CREATE OR REPLACE TEMPORARY VIEW parts USING deltalake "
        f"OPTIONS (path '{path}', pruneFiles 'true')"
    )
    assert spark.sql("SELECT count(*) AS n FROM parts").collect() == [Row(n=20)]

    # remove partition a's data: a query on p = 'b' must not need it
    removed = 0
    for rel in data_files_on_disk(path):
        if "/p=a/" in f"/{rel}":
            os.remove(path / rel)
            removed += 1
    assert removed == 1
    got = spark.sql("SELECT id FROM parts WHERE p = 'b' ORDER BY id").collect()
    assert [r.id for r in got] == list(range(200, 210))
    # and id > 150 skips the file of partition a by its statistics even without a partition filter
    got = spark.sql("SELECT id FROM parts WHERE id > 205 ORDER BY id").collect()
    assert [r.id for r in got] == [206, 207, 208, 209]


def test_column_pruning_through_a_subset_schema(spark, store):
    store.write(spark.createDataFrame(rows(0, 3), KV), "silver.narrow")
    path = str(store.path("silver.narrow"))
    got = spark.read.format("deltalake").schema("v string").load(path).orderBy("v").collect()
    assert got == [Row(v="v0"), Row(v="v1"), Row(v="v2")]
    with pytest.raises(Exception, match="columns nope are not in the Delta table"):
        spark.read.format("deltalake").schema("nope string").load(path).collect()


# ---- streaming reads --------------------------------------------------------------------------


def test_stream_reads_snapshot_then_each_append_in_order(spark, store, settings):
    append_versions(store, "bronze.src", [rows(0, 3), rows(3, 6)])
    seen: list[tuple[int, list[int]]] = []

    def collect(batch, batch_id):
        seen.append((batch_id, sorted(r.k for r in batch.collect())))

    def run_collect():
        query = (
            store.read_stream("bronze.src", max_files_per_trigger=2)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(settings.checkpoint_path("silver", "collect")))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run_collect()
    assert seen == [(0, [0, 1, 2, 3, 4, 5])]  # the initial snapshot: two files, one batch

    append_versions(store, "bronze.src", [rows(6, 8), rows(8, 9), rows(9, 12)])
    run_collect()
    # admission control: two files, then the last one; each later append exactly once, in order
    assert seen[1:] == [(1, [6, 7, 8]), (2, [9, 10, 11])]

    run_collect()  # nothing new: no batch at all
    assert len(seen) == 3


def test_stream_refuses_a_version_that_deleted_data_unless_skipped(
    spark, store, settings, run_stream
):
    append_versions(store, "bronze.del", [rows(0, 3)])
    first = run_stream("bronze.del", "silver.del", settings.checkpoint_path("silver", "del"))
    assert sum(p["numInputRows"] for p in first) == 3
    DeltaTable(str(store.path("bronze.del"))).delete("k = 1")
    append_versions(store, "bronze.del", [rows(3, 4)])
    with pytest.raises(StreamingQueryException) as err:
        run_stream("bronze.del", "silver.del", settings.checkpoint_path("silver", "del"))
    assert "deleted or rewrote data" in str(err.value) and "skipChangeCommits" in str(err.value)

    query = (
        spark.readStream.format("deltalake")
        .option("skipChangeCommits", "true")
        .load(str(store.path("bronze.del")))
        .writeStream.format("deltalake")
        .option("checkpointLocation", str(settings.checkpoint_path("silver", "del")))
        .trigger(availableNow=True)
        .start(str(store.path("silver.del")))
    )
    query.awaitTermination()
    assert sorted(r.k for r in store.read("silver.del").collect()) == [0, 1, 2, 3]


# ---- exactly-once streaming writes ------------------------------------------------------------


def test_crash_after_files_before_delta_commit(spark, store, settings, run_stream):
    append_versions(store, "bronze.a", [rows(0, 5), rows(5, 10)])
    checkpoint = settings.checkpoint_path("silver", "a")
    with pytest.raises(StreamingQueryException, match="failpoint before-commit"):
        run_stream("bronze.a", "silver.a", checkpoint, options={"failpoint": "before-commit"})
    sink = store.path("silver.a")
    orphans = data_files_on_disk(sink)
    assert orphans and not store.exists("silver.a")  # files written, nothing committed

    run_stream("bronze.a", "silver.a", checkpoint)  # restart on the same checkpoint
    assertDataFrameEqual(store.read("silver.a"), spark.createDataFrame(rows(0, 10), KV))
    committed = {f.path for f in dfiles.snapshot_files(dfiles.open_table(sink))}
    assert committed.isdisjoint(orphans)  # the crashed attempt's files are garbage for vacuum


def test_crash_after_delta_commit_before_spark_commit_log(spark, store, settings, run_stream):
    append_versions(store, "bronze.b", [rows(0, 3), rows(3, 6), rows(6, 9)])
    checkpoint = settings.checkpoint_path("silver", "b")
    assert len(run_stream("bronze.b", "silver.b", checkpoint, max_files=1)) == 3
    sink = store.path("silver.b")
    version = dfiles.latest_version(sink)
    app_id = dfiles.app_id_for_checkpoint(checkpoint)
    assert DeltaTable(str(sink)).transaction_version(app_id) == 2

    # Spark never recorded batch 2 as done (its commit file and checksum are gone)
    (Path(checkpoint) / "commits" / "2").unlink()
    (Path(checkpoint) / "commits" / ".2.crc").unlink(missing_ok=True)
    replayed = run_stream("bronze.b", "silver.b", checkpoint, max_files=1)
    assert [p["batchId"] for p in replayed] == [2]  # Spark did replay it ...
    assert dfiles.latest_version(sink) == version  # ... and the sink skipped it: no new version
    assertDataFrameEqual(store.read("silver.b"), spark.createDataFrame(rows(0, 9), KV))
    committed = {f.path for f in dfiles.snapshot_files(dfiles.open_table(sink))}
    assert data_files_on_disk(sink) == committed  # the replay's files were removed


def test_first_batch_replayed_after_the_source_grew_reads_what_it_planned(
    spark, store, settings, run_stream
):
    """A stream starts from the snapshot its first micro-batch planned. Crashed before that
    batch committed and restarted once the source has a new version, the batch reads the same
    snapshot again, and the new version comes next, once."""
    append_versions(store, "bronze.g", [rows(0, 3)])
    checkpoint = settings.checkpoint_path("silver", "g")
    with pytest.raises(StreamingQueryException, match="failpoint before-commit"):
        run_stream("bronze.g", "silver.g", checkpoint, options={"failpoint": "before-commit"})
    append_versions(store, "bronze.g", [rows(3, 5)])
    batches = run_stream("bronze.g", "silver.g", checkpoint)
    assert [(p["batchId"], p["numInputRows"]) for p in batches] == [(0, 3), (1, 2)]
    assertDataFrameEqual(store.read("silver.g"), spark.createDataFrame(rows(0, 5), KV))


def test_first_batch_that_read_part_of_the_snapshot_replays_that_part(
    spark, store, settings, run_stream
):
    """One file per micro-batch: the first batch reads the first file of the starting snapshot.
    Crashed before its commit and restarted once the source has a new version, it reads that
    file again; the snapshot's other file and the new version follow, each once."""
    append_versions(store, "bronze.p", [rows(0, 3), rows(3, 5)])
    checkpoint = settings.checkpoint_path("silver", "p")
    with pytest.raises(StreamingQueryException, match="failpoint before-commit"):
        run_stream(
            "bronze.p", "silver.p", checkpoint, max_files=1, options={"failpoint": "before-commit"}
        )
    append_versions(store, "bronze.p", [rows(5, 6)])
    batches = run_stream("bronze.p", "silver.p", checkpoint, max_files=1)
    assert [(p["batchId"], p["numInputRows"]) for p in batches] == [(0, 3), (1, 2), (2, 1)]
    assertDataFrameEqual(store.read("silver.p"), spark.createDataFrame(rows(0, 6), KV))


def test_timestamp_and_date_partitions(spark, store):
    t = dt.datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    df = spark.createDataFrame(
        [(1, t, dt.date(2026, 5, 1)), (2, t + dt.timedelta(hours=1), dt.date(2026, 5, 2))],
        "k long, hour timestamp, day date",
    )
    store.write(df, "gold.byhour", partition_by=["hour", "day"])
    assertDataFrameEqual(store.read("gold.byhour"), df)
    got = store.read("gold.byhour").filter("day = DATE'2026-05-02'").collect()
    assert [r.k for r in got] == [2]
    with pytest.raises(Exception, match="cannot partition by floating-point column x"):
        store.write(spark.createDataFrame([(1.0,)], "x double"), "gold.byfloat", partition_by=["x"])


def test_replayed_batch_id_is_skipped(tmp_path):
    root = str(tmp_path / "t")
    schema = pa.schema([("k", pa.int64())])

    def write(ks):
        w = dfiles.DataFileWriter(root, schema)
        w.write(pa.record_batch([pa.array(ks, pa.int64())], schema=schema))
        return w.close()

    assert dfiles.commit_files(root, write([1, 2]), schema, app_id="app", batch_id=0)
    assert dfiles.commit_files(root, write([3]), schema, app_id="app", batch_id=1)
    assert not dfiles.commit_files(root, write([3]), schema, app_id="app", batch_id=1)
    assert not dfiles.commit_files(root, write([1, 2]), schema, app_id="app", batch_id=0)
    assert sorted(arrow_of(root).column("k").to_pylist()) == [1, 2, 3]
    assert dfiles.latest_version(root) == 1


def _append_many(root: str, writer: int, count: int) -> None:
    schema = pa.schema([("w", pa.int64()), ("i", pa.int64())])
    for i in range(count):
        w = dfiles.DataFileWriter(root, schema)
        w.write(pa.record_batch([pa.array([writer] * 3), pa.array([i] * 3)], schema=schema))
        dfiles.commit_files(root, w.close(), schema, app_id=f"writer-{writer}", batch_id=i)


def test_concurrent_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "t")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(root, w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    got = arrow_of(root).group_by(["w"]).aggregate([("i", "count"), ("i", "count_distinct")])
    assert sorted(got.to_pylist(), key=lambda r: r["w"]) == [
        {"w": w, "i_count": 45, "i_count_distinct": 15} for w in range(3)
    ]
    assert dfiles.latest_version(root) == 44  # 45 commits, none lost
    log = "".join(p.read_text() for p in sorted((Path(root) / "_delta_log").glob("*.json")))
    assert log.count('"metaData"') == 1  # one table: no second CREATE TABLE by a racing writer


def test_stats_give_no_bounds_that_could_skip_matching_rows():
    table = pa.table(
        {
            "x": pa.array([1.0, float("nan")]),
            "y": pa.array([1.0, 2.0]),
            "s": pa.array(["a" * 40, "b"]),
            "d": pa.array([Decimal("1.10"), Decimal("2.25")], pa.decimal128(10, 2)),
        }
    )
    stats = json.loads(dfiles.file_stats(table))
    assert stats == {
        "numRecords": 2,
        # x holds NaN (Spark orders it above every number): no bounds; s's max is too long to
        # bound by a prefix; decimals get no bounds at all
        "minValues": {"y": 1.0, "s": "a" * 32},
        "maxValues": {"y": 2.0, "s": "b"},
        "nullCount": {"x": 0, "y": 0, "s": 0, "d": 0},
    }


def test_footer_statistics_of_spark_written_files(spark, store, tmp_path):
    """Delta statistics taken from Parquet footers: bounds for integers, strings (a prefix as
    the lower bound only when long), timestamps rounded outward to milliseconds, nested fields;
    null counts everywhere; no bound that Python cannot hold instead of a failed commit."""
    from lakehouse.storage.sparkfiles import write_parquet

    t = dt.datetime(2026, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    long = "x" * 40
    df = spark.createDataFrame(
        [
            (1, "b", t, (5, "n"), 1.5),
            (7, long, t + dt.timedelta(seconds=1), (None, None), None),
            (None, None, None, None, float("nan")),
        ],
        "k long, s string, ts timestamp, st struct<a:int,b:string>, f double",
    )
    files = write_parquet(df.coalesce(1), str(tmp_path / "t"))
    assert len(files) == 1
    stats = json.loads(files[0].stats)
    assert stats == {
        "numRecords": 3,
        "minValues": {
            "k": 1,
            "s": "b",
            "ts": "2026-05-01T10:00:00.123Z",
            "st": {"a": 5, "b": "n"},
        },
        "maxValues": {"k": 7, "ts": "2026-05-01T10:00:01.124Z", "st": {"a": 5, "b": "n"}},
        "nullCount": {"k": 1, "s": 1, "ts": 1, "st": {"a": 2, "b": 2}, "f": 1},
    }
    far = spark.createDataFrame(
        [(dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),)], "ts timestamp"
    )
    stats = json.loads(write_parquet(far, str(tmp_path / "far"))[0].stats)
    assert stats["minValues"] == {"ts": "9999-12-31T23:59:59.999Z"}
    assert stats["maxValues"] == {}  # rounding up would pass year 9999
    store.write(far, "silver.far")
    assert store.read("silver.far").count() == 1
