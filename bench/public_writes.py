"""A micro-batch's exactly-once append through Delta's public APIs, against the store's path.

For each size, four tables of the same schema receive the same cached micro-batches, each
append recording app transaction ("bench", i), and are read back by delta-spark after each
append as a stream's next micro-batch would (``spark.read`` of the new version's schema:
the snapshot update, its protocol and metadata):

- ``spark-txn``: delta-spark's DataFrame writer with ``txnAppId``/``txnVersion`` (public);
- ``spark-plain``: the same writer without them (public, not exactly-once: the floor);
- ``store``: :meth:`TableStore.write` with ``txn`` (the store's path on this tree);
- ``rs``: delta-rs's ``write_deltalake`` with the app transaction in its commit properties
  (public; delta-rs writes no checksum file).

Prints, per size and table, the median seconds of the append and of the read after it, over
the batches after the first two (warm-up), and whether every table holds the same rows.

    python bench/public_writes.py [--sizes 100 10000 100000] [--batches 9] [--history 20]
                                  [--checkpoint-interval 50] [--kinds spark-txn rs ...]

``--checkpoint-interval``: the tables' ``delta.checkpointInterval`` (delta-spark reads a
version without a checksum by replaying the log since the last checkpoint, in a Spark job).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument(
        "--history", type=int, default=20, help="appends each table has before the measured ones"
    )
    parser.add_argument("--checkpoint-interval", type=int, default=50)
    parser.add_argument("--kinds", nargs="+", default=["spark-txn", "spark-plain", "store", "rs"])
    args = parser.parse_args(argv)

    from deltalake import CommitProperties, Transaction, write_deltalake
    from pyspark.sql import functions as F

    from lakehouse.session import build_session
    from lakehouse.settings import load_settings
    from lakehouse.storage import table_store

    settings = load_settings("test", overrides={"root": tempfile.mkdtemp(prefix="public-")})
    spark = build_session(settings, app_name="bench-public-writes")
    spark.conf.set(
        "spark.databricks.delta.properties.defaults.checkpointInterval",
        str(args.checkpoint_interval),
    )
    store = table_store(spark, settings)

    def batch(i: int, n: int):
        return spark.range(i * n, i * n + n).select(
            F.col("id").alias("k"),
            F.lit(i).cast("long").alias("v"),
            F.expr("uuid()").alias("s1"),
            F.concat(F.lit("page/"), F.col("id").cast("string")).alias("s2"),
            F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id") % 3600).alias("t"),
        )

    def spark_write(txn: bool):
        def write(rows, path: str, i: int) -> None:
            writer = rows.coalesce(1).write.format("delta").mode("append")
            if txn:
                writer = writer.option("txnAppId", "bench").option("txnVersion", str(i))
            writer.save(path)

        return write

    def store_write(rows, path: str, i: int) -> None:
        store.write(
            rows.coalesce(1), names["store"], txn=("bench", i), event_time="t", rows=rows.count()
        )

    def rs_write(rows, path: str, i: int) -> None:
        props = CommitProperties(app_transactions=[Transaction("bench", i)])
        write_deltalake(path, rows.toArrow(), mode="append", commit_properties=props)

    paths = {
        "spark-txn": spark_write(True),
        "spark-plain": spark_write(False),
        "store": store_write,
        "rs": rs_write,
    }
    paths = {kind: paths[kind] for kind in args.kinds}
    print(f"{'rows':>8} {'table':>12} {'append s':>9} {'read s':>7}")
    for n in args.sizes:
        names = {kind: f"bronze.{kind.replace('-', '_')}_{n}" for kind in paths}
        for name in names.values():
            store.create(name, batch(0, 1).schema)
        laps = {kind: ([], []) for kind in paths}
        for i in range(1, args.history + args.batches + 1):
            rows = batch(i, n).coalesce(2).persist()
            rows.count()
            for kind, write in paths.items():
                path = str(store.path(names[kind]))
                start = time.perf_counter()
                write(rows, path, i)
                appended = time.perf_counter()
                spark.read.format("delta").load(path).schema  # noqa: B018 (the snapshot update)
                read = time.perf_counter()
                if i > args.history + 2:
                    laps[kind][0].append(appended - start)
                    laps[kind][1].append(read - appended)
            rows.unpersist()
        first = store.read(names[args.kinds[0]])
        same = all(
            first.exceptAll(store.read(name)).isEmpty()
            and store.read(name).exceptAll(first).isEmpty()
            for name in names.values()
        )
        for kind, (append_s, read_s) in laps.items():
            print(
                f"{n:>8,} {kind:>12} {statistics.median(append_s):>9.3f} "
                f"{statistics.median(read_s):>7.3f}",
                flush=True,
            )
        print(f"{n:>8,} same rows in every table: {same}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
