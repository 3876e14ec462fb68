"""How gold.sessions_custom writes its sessions and hourly statistics: three designs measured
side by side on the same silver.events, read one file per micro-batch.

    python bench/session_designs.py [--events 200000] [--hours 24] [--file-minutes 15]
                                    [--runs 1] [--root DIR]

- ``merged`` (the flow's design): the processor's sessions appended in the micro-batch whose
  watermark closes them, each batch's hourly statistics MERGEd into their hours;
- ``flow``: the same design run by the runner as ``lakehouse run`` does (it also records the
  query's progress, the complete-through marks and the runner's books after each batch);
- ``chained-append`` (the design before): the processor chained into a 1-hour window
  aggregation in append mode, which holds the hour's sessions (collect_list) until the
  watermark passes the hour, then both tables appended;
- ``chained-update``: the same chain in update mode: each micro-batch emits every hour it
  changed with all of that hour's sessions so far; the writer MERGEs the statistics by hour
  and inserts the sessions it does not have yet (MERGE on user and start).

Per design: wall seconds over every micro-batch, median micro-batch seconds, peak state
memory and rows (from the query's progress), sessions the query handed its writer, and the
sessions gold.sessions had at the end and the design's table did not (session_window closes
a session in the same micro-batch as the processor does).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.settings import checkpoint_key, load_settings  # noqa: E402

DESIGNS = ("merged", "flow", "chained-append", "chained-update")


def build_base(spark, settings, events: int, hours: float, file_minutes: float) -> None:
    """Landing files, then bronze and silver one landing file per micro-batch: silver.events
    gets one file per hour slice of arrival, which the designs then read one at a time."""
    from lakehouse.runner import run_layers
    from lakehouse.tools import generate as gen

    params = gen.params_from_settings(
        settings, events=events, hours=hours, file_minutes=file_minutes, late_fraction=0.0
    )
    gen.generate(spark, settings.root, params)
    one = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    run_layers(spark, one, ["bronze", "silver"], out=io.StringIO())


def chained(events, *, watermark: str, update: bool):
    """The processor chained into the hourly aggregation holding the hour's sessions."""
    from pyspark.sql import functions as F

    from gold import sessions_custom as cs
    from lakehouse.settings import duration_seconds

    processor = cs.SessionProcessor(duration_seconds(cs.GAP) * 1000, cs.MAX_PAGES)
    sessions = (
        events.withWatermark("event_time", watermark)
        .select(cs.bucket(cs.BUCKETS), *cs.INPUT_COLUMNS)
        .mapInArrow(cs.pack_events, cs.PACKED_SCHEMA)
        .groupBy("bucket")
        .transformWithStateInPandas(
            processor, cs.SCHEMA, "append", "EventTime", eventTimeColumnName="session_end"
        )
    )
    duration = F.col("session_end").cast("double") - F.col("session_start").cast("double")
    return sessions.groupBy(F.window("session_end", "1 hour").alias("hour")).agg(
        F.count(F.lit(1)).alias("sessions"),
        F.avg(duration).alias("mean_duration_s"),
        F.avg("events").alias("mean_events"),
        F.count(F.when(F.col("purchases") > 0, 1)).alias("purchasing_sessions"),
        F.collect_list(F.struct(*cs.SCHEMA.fieldNames())).alias("closed"),
    )


def run_design(spark, settings, design: str) -> dict:
    """One design on a fresh gold: its figures (see the module docstring)."""
    from pyspark.sql import functions as F

    from gold import sessions_custom as cs
    from lakehouse.checkpoints import app_id
    from lakehouse.runner import pipeline, run_flows
    from lakehouse.storage import table_store

    store = table_store(spark, settings)
    for table in ("gold.sessions", "gold.sessions_custom", "gold.session_stats_hourly"):
        shutil.rmtree(settings.table_path(table), ignore_errors=True)
    # new checkpoints each run: the state store's background maintenance of the previous
    # query may still be writing into the old ones, so they are not deleted under it
    fresh = settings.root / "checkpoints" / f"gold-{uuid.uuid4().hex[:8]}"
    names = ("gold.sessions", "gold.sessions_custom", "gold.design")
    one = dataclasses.replace(
        settings.with_overrides({"trigger.max_files_per_trigger": 1}),
        relocated={checkpoint_key(name): str(fresh / name.split(".")[1]) for name in names},
    )
    # gold.sessions first, recording what it had after each of its micro-batches
    sessions_flow = pipeline().flow("gold.sessions")
    run_flows(spark, one, [sessions_flow], out=io.StringIO())
    reference = store.read("gold.sessions").select("user_id", "session_start", "session_end")
    reference = reference.toPandas()

    emitted, durations, memory, state_rows = [], [], [], []
    started = time.monotonic()
    if design == "flow":
        flow = pipeline().flow("gold.sessions_custom")
        run_flows(spark, one, [flow], out=io.StringIO())
        progress = store.read("ops.stream_progress").where(F.col("flow") == flow.name)
    else:
        update = design == "chained-update"
        checkpoint = one.checkpoint_path("gold", "design")
        for table, schema in ((cs.TABLE, cs.SCHEMA), (cs.STATS_TABLE, cs.STATS_SCHEMA)):
            store.create(table, schema)
        app: list[str] = []

        def write(batch, batch_id):
            app.append(app[0] if app else app_id(Path(checkpoint)))
            batch = batch.persist()
            if design == "merged":
                emitted.append(batch.count())
                store.write(batch, "gold.sessions_custom", txn=(app[0], batch_id))
                stats = cs.hourly_increments(batch)
                keys, updates = list(cs.STATS_UPSERT.keys), dict(cs.STATS_UPSERT.updates)
                store.upsert(stats, cs.STATS_TABLE, keys, app[0], batch_id, updates=updates)
                batch.unpersist()
                return
            emitted.append(batch.select(F.size("closed")).groupBy().sum().first()[0] or 0)
            rows = batch.select(F.explode("closed").alias("s")).select("s.*")
            stats = batch.select(
                F.col("hour.start").alias("hour_start"),
                F.col("hour.end").alias("hour_end"),
                "sessions",
                "mean_duration_s",
                "mean_events",
                "purchasing_sessions",
            )
            if update:
                store.upsert(stats, cs.STATS_TABLE, ["hour_start"], app[0], batch_id)
                store.upsert(
                    rows,
                    "gold.sessions_custom",
                    ["user_id", "session_start"],
                    app[0],
                    batch_id,
                    updates={"session_end": "t.session_end"},  # known: left as it is
                )
            else:
                store.write(rows, "gold.sessions_custom", txn=(app[0], batch_id))
                store.write(stats, cs.STATS_TABLE, txn=(app[0], batch_id))
            batch.unpersist()

        events = store.read_stream("silver.events", max_files_per_trigger=1)
        if design == "merged":
            stream = cs.custom_sessions(events, watermark=settings.watermarks.events)
        else:
            stream = chained(events, watermark=settings.watermarks.events, update=update)
        query = (
            stream.writeStream.outputMode("update" if update else "append")
            .option("checkpointLocation", str(checkpoint))
            .queryName("gold.design")
            .trigger(availableNow=True)
            .foreachBatch(write)
            .start()
        )
        query.awaitTermination()
        progress = None
        for p in query.recentProgress:
            durations.append(p["batchDuration"] / 1000)
            ops = p.get("stateOperators") or []
            memory.append(sum(op.get("memoryUsedBytes") or 0 for op in ops))
            state_rows.append(sum(op.get("numRowsTotal") or 0 for op in ops))
    wall = time.monotonic() - started
    if progress is not None:
        frame = progress.toPandas()
        # this run's query only (the new checkpoint gave it a new query id)
        frame = frame[frame["query_id"] == frame.sort_values("timestamp")["query_id"].iloc[-1]]
        per_batch = frame.groupby("batch_id").agg(
            seconds=("batch_duration_ms", "first"),
            memory=("state_memory_bytes", "sum"),
            rows=("state_rows", "sum"),
        )
        durations = list(per_batch["seconds"] / 1000)
        memory, state_rows = list(per_batch["memory"]), list(per_batch["rows"])
        emitted = [store.read("gold.sessions_custom").count()]
    found = store.read("gold.sessions_custom").select("user_id", "session_start").toPandas()
    missing = len(reference) - len(found.merge(reference, on=["user_id", "session_start"]))
    return {
        "design": design,
        "wall_s": wall,
        "batches": len(durations),
        "median_batch_s": statistics.median(durations) if durations else 0.0,
        "peak_state_mib": max(memory, default=0) / 2**20,
        "peak_state_rows": max(state_rows, default=0),
        "rows_to_writer": sum(emitted),
        "sessions": len(found),
        "missing_at_end": missing,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--file-minutes", type=float, default=15.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench-designs")
    )
    args = parser.parse_args(argv)

    from lakehouse.session import build_session

    root = Path(args.root) / f"designs-{args.events}"
    settings = load_settings("local", overrides={"root": str(root)})
    spark = build_session(settings, app_name="bench-session-designs")
    if not (root / "tables" / "silver" / "events").is_dir():
        build_base(spark, settings, args.events, args.hours, args.file_minutes)
    results = {d: [] for d in DESIGNS}
    for _ in range(args.runs):
        for design in DESIGNS:
            result = run_design(spark, settings, design)
            results[design].append(result)
            print(result, flush=True)
    print()
    print(
        "design           wall s  batches  batch s  peak state MiB  state rows  "
        "rows to writer  sessions  missing"
    )
    for design, runs in results.items():
        median = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "design"}
        print(
            f"{design:15} {median['wall_s']:7.1f} {median['batches']:8.0f}"
            f" {median['median_batch_s']:8.2f} {median['peak_state_mib']:15.1f}"
            f" {median['peak_state_rows']:11,.0f} {median['rows_to_writer']:15,.0f}"
            f" {median['sessions']:9,.0f} {median['missing_at_end']:8,.0f}"
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
