"""The native backend (delta-spark, jars from `make setup`): exactly-once on every write path,
tables the catalog knows, and one-line errors. The contract both backends share is in
test_storage_contract.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from storage_helpers import KV, append_versions, rows

from lakehouse.storage import NativeStore
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.store import FAILPOINT_ENV

pytestmark = pytest.mark.native
PROJECT = Path(__file__).resolve().parents[1]
TXN_CONFS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")


def forget_last_batch(checkpoint) -> None:
    """As if the job died after the table's commit and before Spark's own commit log."""
    commits = Path(checkpoint) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)


def version(store, name) -> int:
    return dfiles.latest_version(store.path(name))


def test_store_is_native(store):
    assert isinstance(store, NativeStore) and store.format == "delta"


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

    run()
    before = version(store, "gold.c")
    forget_last_batch(checkpoint)
    run()
    assert version(store, "gold.c") == before
    assert store.read("gold.c").collect() == [Row(count=4)]


def test_routed_writes_replay_only_the_table_that_missed_the_batch(
    spark, store, settings, monkeypatch
):
    """A foreachBatch flow writing two tables, killed between them: the restart writes the
    batch to the second table only, each table once per batch (txnAppId/txnVersion)."""
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
    app_id = dfiles.app_id_for_checkpoint(checkpoint)
    for name in ("silver.r_even", "silver.r_odd"):  # one commit per batch, each batch once
        table = DeltaTable(str(store.path(name)))
        assert table.transaction_version(app_id) == 1, name
        assert len(table.history()) == 2, name
    before = version(store, "silver.r_odd")
    forget_last_batch(checkpoint)
    run()  # the whole batch replayed: both tables skip it
    assert version(store, "silver.r_odd") == before
    assert store.read("silver.r_even").count() == 4


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


def test_update_mode_merge_skips_a_replayed_batch_and_unsets_its_confs(spark, store, settings):
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

    # a new checkpoint at the same path is a new query: its batches are written, not skipped
    import shutil

    shutil.rmtree(checkpoint)
    append_versions(store, "bronze.u", [[(3, "d")]])
    run()  # counts from scratch, upserted over the rows there
    assertDataFrameEqual(
        store.read("gold.u"),
        spark.createDataFrame(
            [(1, 2, "c"), (2, 1, "b"), (3, 1, "d")], "k long, n long, latest string"
        ),
    )


def test_tables_are_in_the_catalog_with_history_and_time_travel(spark, store):
    schema = spark.createDataFrame([], KV).schema
    assert store.create("gold.hist", schema)
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
        "lakehouse: error: the native backend needs delta-spark on the Spark classpath, and "
        "this Spark has none: under spark-submit pass the jars (--jars with the files of "
        "jars/lib, see `lakehouse cluster package`), or use the embedded backend "
        "(--backend embedded)"
    ]
    assert "Traceback" not in output


def test_upserts_of_two_flows_at_once_each_record_only_their_own_app(spark, store):
    """Flows of one job run in threads of one session, and an upsert's app transaction goes to
    delta-spark through the session's confs: two MERGEs at once must neither take the other's
    app id nor lose their version."""
    import threading

    for name in ("gold.left", "gold.right"):
        store.create(name, spark.createDataFrame([], KV).schema)
        store.upsert(spark.createDataFrame([(0, "start")], KV), name, ["k"], f"app-{name}", 0)
    errors = []

    def upserts(name: str) -> None:
        try:
            for batch in (1, 2, 3):
                rows_ = spark.createDataFrame([(0, f"{name} {batch}"), (batch, name)], KV)
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
