"""Writes by delta-spark, through its public API only: ``DeltaTable.createIfNotExists``, the
DataFrame writer with ``txnAppId``/``txnVersion``, and ``DeltaTable.merge`` with the session
confs ``spark.databricks.delta.write.txnAppId``/``txnVersion``. delta-spark skips a write whose
app transaction the table records at that version or later (``hasBeenExecuted``), looking it
up in the table's reconstructed state: Spark jobs over the log at every write (about 1.6 s
more than the same append without it, in ``python bench/public_writes.py``), which is why the
lake's tables are delta-rs's unless a table's declaration says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.storage.faults import failpoint
from lakehouse.storage.rs_writes import DUPLICATE_KEYS, duplicate_keys_message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

ENGINE = "delta-spark"
TXN_CONFS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")


def create(
    spark: SparkSession, root: Path, schema: StructType, partition_by: Sequence[str] = ()
) -> None:
    """Create the Delta table at ``root`` empty, unless one is there."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(str(root)).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    builder.execute()


def write(
    root: Path,
    df: DataFrame,
    name: str,
    mode: str,
    txn: tuple[str, int] | None,
    *,
    partition_by: Sequence[str] = (),
    schema: bool = False,
) -> None:
    """delta-spark's writer, in one call (it writes and commits, and skips a write whose
    ``txn`` the table records). ``schema``: an overwrite replaces the table's schema too."""
    writer = df.write.format("delta").mode(mode)
    if schema:
        writer = writer.option("overwriteSchema", "true")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if txn:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
    failpoint(f"before-commit:{name}")  # delta-spark writes and commits in one call
    writer.save(str(root))


def merge(
    root: Path,
    df: DataFrame,
    name: str,
    keys: Sequence[str],
    updates: dict[str, str] | None,
    txn: tuple[str, int],
) -> None:
    """MERGE ``df`` into the table at ``root`` by ``keys`` in a commit that records ``txn``
    (skipped by delta-spark when the table records it). The confs are set on the batch's own
    session (each streaming query runs in one of its own, so no other flow sees them) and
    unset after: left set, they would skip the session's later plain writes too."""
    from delta.tables import DeltaTable

    df = unique_keys(df, name, keys, txn[1])
    conf = df.sparkSession.conf
    for key, value in zip(TXN_CONFS, (txn[0], str(txn[1])), strict=True):
        conf.set(key, value)
    try:
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
        merger = (
            DeltaTable.forPath(df.sparkSession, str(root))
            .alias("t")
            .merge(df.alias("s"), condition)
        )
        if updates:
            merger = merger.whenMatchedUpdate(set=dict(updates))
        else:
            merger = merger.whenMatchedUpdateAll()
        failpoint(f"before-commit:{name}")
        merger.whenNotMatchedInsertAll().execute()
    except Exception as exc:  # Spark's error, or py4j's around it
        if DUPLICATE_KEYS in str(exc):
            message = str(exc)[str(exc).index(f"cannot upsert into {name}") :]
            raise ValueError(message.splitlines()[0].rstrip(". ")) from None
        raise
    finally:
        for key in TXN_CONFS:
            conf.unset(key)


def unique_keys(df: DataFrame, name: str, keys: Sequence[str], batch_id: int) -> DataFrame:
    """``df`` that fails the job writing it when a key occurs more than once (update mode needs
    one row per key). Checked inside the write's own job: a second action on a micro-batch of
    a streaming aggregation would run it again (and Spark 4.2 fails to cache one that is
    grouped again: 'key not found')."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    copies = F.count(F.lit(1)).over(Window.partitionBy(*keys))
    before, after = duplicate_keys_message(name, keys, batch_id)
    message = F.concat(F.lit(before), F.to_json(F.struct(*keys)), F.lit(after))
    return (
        df.withColumn("_copies", copies)
        .where(F.assert_true(F.col("_copies") == 1, message).isNull())
        .drop("_copies")
    )
