"""The native backend (delta-spark). Its jars come from Maven, which this build machine cannot
reach; on a machine where they are on the classpath these tests run the same contract."""

from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from lakehouse.storage import NativeStore, NativeUnavailable
from lakehouse.storage.store import native_available


@pytest.fixture
def native(spark, settings):
    if not native_available(spark):
        pytest.skip(
            "delta-spark jars are not on the Spark classpath: Maven is unreachable from this "
            "machine, so spark.jars.packages cannot resolve io.delta:delta-spark_2.13:4.4.1"
        )
    return NativeStore(spark, settings.with_overrides({"backend": "native"}))


def test_native_refuses_to_start_without_jars(spark, settings):
    if native_available(spark):
        pytest.skip("delta-spark is on the classpath here")
    with pytest.raises(NativeUnavailable, match="needs delta-spark on the Spark classpath"):
        NativeStore(spark, settings)


@pytest.mark.native
def test_native_round_trip_and_stream(native, spark, settings):
    df = spark.createDataFrame([(1, "a"), (2, "b")], "k long, v string")
    native.write(df, "bronze.kv")
    assertDataFrameEqual(native.read("bronze.kv"), df)
    query = native.write_stream(
        native.read_stream("bronze.kv"),
        "silver.kv",
        settings.checkpoint_path("silver", "kv"),
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assertDataFrameEqual(native.read("silver.kv"), df)


@pytest.mark.native
def test_native_upsert_skips_replayed_batch(native, spark):
    first = spark.createDataFrame([(1, 1)], "k long, n long")
    native.upsert(first, "gold.kv", ["k"], "app", 0)
    native.upsert(spark.createDataFrame([(1, 9)], "k long, n long"), "gold.kv", ["k"], "app", 0)
    assertDataFrameEqual(native.read("gold.kv"), first)
