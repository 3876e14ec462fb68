"""Storage benchmark: Delta (delta-spark) against Spark's own Parquet reader and writer, in one
run.

Writes N rows of the events schema (default 1,000,000) with ``df.write.parquet`` and through
delta-spark (``format("delta")``), then reads each back in full (into Spark's no-op sink),
interleaved in each round (and the Delta table a second time: delta-spark rebuilds a version's
state once per session), median of 3 rounds (after one warm-up round), and prints rows/s and
Delta's ratios to Parquet. Usage: python bench/storage.py [--rows N] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def events(spark, rows: int):
    from pyspark.sql import functions as F

    types = F.array(*[F.lit(t) for t in ("page_view", "search", "add_to_cart", "purchase")])
    return spark.range(rows).select(
        F.format_string("evt-%012d", "id").alias("event_id"),
        (F.col("id") % 100_000).alias("user_id"),
        F.element_at(types, (F.col("id") % 4 + 1).cast("int")).alias("event_type"),
        F.format_string("/p/%d", F.col("id") % 500).alias("page"),
        F.when(F.col("id") % 4 == 3, (F.col("id") % 997) / 10.0).alias("amount"),
        F.timestamp_seconds(F.lit(1_780_000_000) + F.col("id") % 86_400).alias("event_time"),
        F.element_at(
            F.array(F.lit("ios"), F.lit("android"), F.lit("web")), (F.col("id") % 3 + 1).cast("int")
        ).alias("device"),
        F.element_at(
            F.array(F.lit("US"), F.lit("DE"), F.lit("IN"), F.lit("BR")),
            (F.col("id") % 4 + 1).cast("int"),
        ).alias("country"),
    )


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from lakehouse.session import build_session
    from lakehouse.settings import load_settings

    settings = load_settings("local")
    spark = build_session(settings, app_name="bench-storage")
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    df = events(spark, args.rows).cache()
    df.count()  # materialise once: both writers read the same cached rows

    def noop(reader) -> None:
        reader.write.format("noop").mode("overwrite").save()

    def one_run(run: int) -> dict[str, float]:
        paths = {kind: str(work / f"{kind}{run}") for kind in ("parquet", "native")}
        times = {
            "parquet_write": timed(lambda: df.write.parquet(paths["parquet"])),
            "native_write": timed(
                lambda: df.write.format("delta").mode("append").save(paths["native"])
            ),
            "parquet_read": timed(lambda: noop(spark.read.parquet(paths["parquet"]))),
            "native_read": timed(lambda: noop(spark.read.format("delta").load(paths["native"]))),
            # the same version again: delta-spark rebuilds a table version's state (its file
            # list, from the log) once per session, then keeps it, as a long-running reader
            # (the SQL server, a continuous flow's downstream) sees it
            "native_reread": timed(lambda: noop(spark.read.format("delta").load(paths["native"]))),
        }
        assert spark.read.format("delta").load(paths["native"]).count() == args.rows
        return times

    results: dict[str, list[float]] = {}
    try:
        one_run(-1)  # warm-up (JIT, Python workers), not counted
        for run in range(args.runs):
            for key, value in one_run(run).items():
                results.setdefault(key, []).append(value)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()

    medians = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"storage benchmark: {args.rows:,} rows of the events schema, median of {args.runs}, local[*]"
    )
    print(f"{'operation':16} {'seconds':>8} {'rows/s':>12}   runs")
    for key, value in medians.items():
        runs = ", ".join(f"{x:.2f}" for x in results[key])
        print(f"{key:16} {value:8.2f} {args.rows / value:12,.0f}   [{runs}]")

    def ratios(kind: str) -> str:
        write = medians["parquet_write"] / medians[f"{kind}_write"]
        read = medians["parquet_read"] / medians[f"{kind}_read"]
        return f"write={write:.2f} read={read:.2f}"

    print(f"native storage ratios: {ratios('native')}")
    reread = medians["parquet_read"] / medians["native_reread"]
    print(f"native read of a version the session read before: read={reread:.2f}")


if __name__ == "__main__":
    main()
