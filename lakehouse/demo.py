"""``lakehouse demo``: the end-to-end slice that exists so far.

Until the generator and the layers land, the demo exercises the platform itself: it appends a
few batches of events to a table, streams them to a second table one file per micro-batch
(exactly-once appends), keeps per-user counts up to date in a third (update mode, upserted by key)
and prints what each table holds.
"""

from __future__ import annotations

import datetime as dt

from lakehouse.settings import Settings
from lakehouse.storage import table_store, trigger_kwargs

EVENTS_SCHEMA = (
    "event_id string, user_id long, event_type string, amount double, event_time timestamp"
)
TYPES = ("page_view", "search", "add_to_cart", "purchase")


def _batch(spark, start: int, rows: int):
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    data = [
        (
            f"e{n:06d}",
            n % 7,
            TYPES[n % 4],
            float(n % 50) if n % 4 == 3 else None,
            base + dt.timedelta(seconds=17 * n),
        )
        for n in range(start, start + rows)
    ]
    return spark.createDataFrame(data, EVENTS_SCHEMA)


def run_demo(settings: Settings) -> int:
    from pyspark.sql import functions as F

    from lakehouse.session import build_session

    spark = build_session(settings, app_name="lakehouse-demo")
    store = table_store(spark, settings)
    source, copy, counts = "bronze.demo_events", "silver.demo_events", "gold.demo_user_counts"
    start = store.read(source).count() if store.exists(source) else 0
    for i in range(3):
        store.write(_batch(spark, start + i * 100, 100), source)
    print(f"appended 300 rows to {source} in 3 commits")

    query = store.write_stream(
        store.read_stream(source, max_files_per_trigger=1),
        copy,
        settings.checkpoint_path("silver", "demo_events"),
        trigger=trigger_kwargs(settings.trigger),
    )
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    print(f"{copy}: {len(batches)} micro-batches, {sum(p['numInputRows'] for p in batches)} rows")

    per_user = (
        store.read_stream(copy)
        .groupBy("user_id")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("revenue"))
    )
    query = store.write_stream(
        per_user,
        counts,
        settings.checkpoint_path("gold", "demo_user_counts"),
        output_mode="update",
        keys=["user_id"],
        trigger=trigger_kwargs(settings.trigger),
    )
    query.awaitTermination()
    for name in (source, copy, counts):
        print(f"{name:28} {store.read(name).count():>8} rows  at {store.path(name)}")
    store.read(counts).orderBy("user_id").show(truncate=False)
    return 0
