"""A micro-batch's append, by delta-spark and by delta-rs, side by side in one process.

For each size, one table per engine receives the same micro-batches (cached, as a flow's
batch is): delta-spark's path is :meth:`TableStore._append_once` as the routes ran it (a
write job, then a commit that records the app transaction), delta-rs's is the batch collected
as Arrow and appended in a commit that records it. Prints each path's median of the batches
after the first two (warm-up) and whether both tables hold the same rows.

    python bench/appends.py [--sizes 100 10000 100000 500000] [--batches 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000, 500_000])
    parser.add_argument("--batches", type=int, default=7)
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from lakehouse.session import build_session
    from lakehouse.settings import load_settings
    from lakehouse.storage import deltafiles as dfiles
    from lakehouse.storage import table_store

    settings = load_settings("test", overrides={"root": tempfile.mkdtemp(prefix="appends-")})
    spark = build_session(settings, app_name="bench-appends")
    store = table_store(spark, settings)

    def batch(i: int, n: int):
        return spark.range(i * n, i * n + n).select(
            F.col("id").alias("k"),
            F.lit(i).cast("long").alias("v"),
            F.expr("uuid()").alias("s1"),
            F.concat(F.lit("page/"), F.col("id").cast("string")).alias("s2"),
            (F.current_timestamp() - F.expr("make_interval(0, 0, 0, 0, 0, 0, id % 3600)")).alias(
                "t"
            ),
        )

    print(f"{'rows':>9} {'delta-spark s':>14} {'delta-rs s':>11}  same rows")
    for n in args.sizes:
        spark_table, rs_table = f"bronze.spark_{n}", f"bronze.rs_{n}"
        for name in (spark_table, rs_table):
            store.create(name, batch(0, 1).schema)
        laps: dict[str, list[float]] = {"spark": [], "rs": []}
        for i in range(1, args.batches + 1):
            rows = batch(i, n).coalesce(2).persist()
            rows.count()
            start = time.perf_counter()
            store.write(rows.coalesce(1), spark_table, txn=("bench", i), order_by="t")
            laps["spark"].append(time.perf_counter() - start)
            start = time.perf_counter()
            dfiles.append_once(store.path(rs_table), rows.toArrow(), "bench", i)
            laps["rs"].append(time.perf_counter() - start)
            rows.unpersist()
        a, b = store.read(spark_table), store.read(rs_table)
        same = a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()
        spark_s, rs_s = (statistics.median(laps[k][2:]) for k in ("spark", "rs"))
        print(f"{n:>9,} {spark_s:>14.3f} {rs_s:>11.3f}  {same}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
