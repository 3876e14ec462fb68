"""Batch floors: what the layers cost without streaming.

A *contract floor* is the hand-written batch job a data engineer would write instead of the
streaming flows if freshness did not matter: it reads a layer's whole input once and writes the
same Delta tables the flows write, by the same contract (bronze with its quarantine; silver
with its quality rules, quarantine, deduplication and great-expectations results; all nine gold
tables, with the rows the flows' final watermark has closed), reusing the project's own
transforms where a batch job can (``parse_lines``, the rule predicates, ``validate``). What the
flows cost beyond it is the price of streaming: micro-batches, state stores, checkpoints,
exactly-once commits.

A *raw floor* is the storage and parse limit: the landing JSON read with the explicit schemas
straight into Parquet, bronze rows deduplicated by id (and the impressions joined to their
clicks), the gold aggregations, into Parquet, with no quarantine, rules or books.

Each function takes the Spark session, the lake settings of its input (``base``) and a work
root to write under, and returns the rows it wrote per table.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from lakehouse.settings import Settings, duration_seconds


def _delta(df: DataFrame, path: Path) -> int:
    """Append ``df`` to the Delta table at ``path``; the rows written (from the commit)."""
    df.write.format("delta").mode("append").save(str(path))
    return _rows_written(df.sparkSession, path)


def _rows_written(spark: SparkSession, path: Path) -> int:
    from delta.tables import DeltaTable

    metrics = DeltaTable.forPath(spark, str(path)).history(1).collect()[0].operationMetrics
    return int(metrics.get("numOutputRows", 0))


def _table(work: Path, name: str) -> Path:
    layer, table = name.split(".")
    return work / "tables" / layer / table


# ---- contract floors ---------------------------------------------------------------------


def contract_bronze(spark: SparkSession, base: Settings, work: Path) -> dict[str, int]:
    """Each source's landing lines parsed once, written to bronze.<source> and its bad lines
    to bronze.quarantine with their reasons."""
    from bronze.sources import SOURCES, bronze_rows, parse_lines, quarantine_rows

    written = {}
    for source in SOURCES:
        lines = spark.read.text(str(base.landing_path(source).absolute())).select(
            "value", F.col("_metadata.file_path").alias("_source_file")
        )
        parsed = parse_lines(lines, source, base.bronze.max_record_bytes).cache()
        written[f"bronze.{source}"] = _delta(
            bronze_rows(parsed, source), _table(work, f"bronze.{source}")
        )
        written.setdefault("bronze.quarantine", 0)
        written["bronze.quarantine"] += _delta(
            quarantine_rows(parsed, source), _table(work, "bronze.quarantine")
        )
        parsed.unpersist()
    return written


def _checked(rows: DataFrame, rules, table: str, work: Path, written: dict) -> DataFrame:
    """Flag ``rows`` by ``rules``, write the rows a drop rule sends to silver.quarantine and
    great-expectations' results on every row; the rows kept (cached)."""
    from lakehouse.quality import RESULTS_TABLE, dropped, flag, validate
    from silver.quarantine import quarantine_rows, to_quarantine

    flagged = flag(rows, rules).cache()
    routed = to_quarantine(flagged, table, dropped(rules))
    written["silver.quarantine"] = written.get("silver.quarantine", 0) + _delta(
        quarantine_rows(routed), _table(work, "silver.quarantine")
    )
    results = validate(flagged.drop("_failed_rules"), rules, table, 0)
    if results is not None:
        from deltalake import write_deltalake

        write_deltalake(str(_table(work, RESULTS_TABLE)), results, mode="append")
        written[RESULTS_TABLE] = written.get(RESULTS_TABLE, 0) + results.num_rows
    return flagged.where(~dropped(rules))


def contract_silver(spark: SparkSession, base: Settings, work: Path) -> dict[str, int]:
    """silver.events and silver.ad_attribution from the whole of bronze: the quality rules
    (quarantine, great-expectations' results), each id kept once, the impressions joined to
    the clicks within an hour."""
    from silver import attribution, events

    read = lambda name: spark.read.format("delta").load(str(base.table_path(name)))  # noqa: E731
    written: dict[str, int] = {}
    kept = _checked(
        events.clean_events(read("bronze.events")), events.rules(), events.TABLE, work, written
    )
    written[events.TABLE] = _delta(
        kept.dropDuplicates(["event_id"]).select(*events.COLUMNS), _table(work, events.TABLE)
    )
    imp = _checked(
        read("bronze.impressions").select(*attribution.IMPRESSION_COLUMNS, "_source_file"),
        attribution.impression_rules(),
        attribution.TABLE,
        work,
        written,
    ).dropDuplicates(["impression_id"])
    clk = _checked(
        read("bronze.clicks").select(*attribution.CLICK_COLUMNS, "_source_file"),
        attribution.click_rules(),
        attribution.TABLE,
        work,
        written,
    ).dropDuplicates(["click_id"])
    joined = (
        imp.alias("i")
        .join(
            clk.alias("c"),
            F.expr(
                "c.impression_id = i.impression_id AND c.click_time >= i.impression_time"
                f" AND c.click_time <= i.impression_time + interval {attribution.CLICK_WINDOW}"
            ),
            "left",
        )
        .select(
            *[F.col(f"i.{c}") for c in attribution.IMPRESSION_COLUMNS],
            "c.click_id",
            "c.click_time",
        )
    )
    written[attribution.TABLE] = _delta(joined, _table(work, attribution.TABLE))
    return written


def contract_gold(spark: SparkSession, base: Settings, work: Path) -> dict[str, int]:
    """The nine gold tables from the whole of silver, each with the rows the flows' final
    watermark has closed (gold.user_activity_5m, in update mode, has every window)."""
    from gold.sessions import activity_totals

    read = lambda name: spark.read.format("delta").load(str(base.table_path(name)))  # noqa: E731
    ev = read("silver.events").cache()
    ads = read("silver.ad_attribution")
    lateness = duration_seconds(base.watermarks.events)
    closed = F.lit(ev.agg(F.max("event_time")).first()[0]) - F.expr(f"INTERVAL {lateness} SECONDS")
    ads_lateness = duration_seconds(base.watermarks.attribution)
    ads_closed = F.lit(ads.agg(F.max("impression_time")).first()[0]) - F.expr(
        f"INTERVAL {ads_lateness} SECONDS"
    )
    tables: dict[str, DataFrame] = {}

    def window(frame, column, size, *keys):
        return frame.groupBy(*keys, F.window(column, size).alias("w"))

    five = window(ev, "event_time", "5 minutes", "user_id").agg(*activity_totals())
    tables["gold.user_activity_5m"] = five.select(
        "user_id", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        "events", "purchases", "revenue",
    )  # fmt: skip
    tables["gold.user_activity_hourly"] = (
        five.groupBy("user_id", F.window("w.start", "1 hour").alias("h"))
        .agg(
            F.sum("events").alias("events"),
            F.count(F.lit(1)).alias("active_5m_windows"),
            F.avg("events").alias("mean_events_per_5m"),
            F.max("events").alias("max_events_per_5m"),
        )
        .where(F.col("h.end") <= closed)
        .select("user_id", F.col("h.start").alias("hour_start"), F.col("h.end").alias("hour_end"),
                "events", "active_5m_windows", "mean_events_per_5m", "max_events_per_5m")
    )  # fmt: skip
    country = F.coalesce("country", F.lit("unknown")).alias("country")
    tables["gold.revenue_by_country_hourly"] = (
        window(ev, "event_time", "1 hour", country)
        .agg(*activity_totals())
        .where(F.col("w.end") <= closed)
        .select("country", F.col("w.start").alias("hour_start"), F.col("w.end").alias("hour_end"),
                "events", "purchases", "revenue")
    )  # fmt: skip
    per_impression = window(ads, "impression_time", "1 hour", "ad_id", "impression_id").agg(
        F.count("click_id").alias("clicks")
    )
    tables["gold.ad_performance_hourly"] = (
        per_impression.groupBy("ad_id", "w")
        .agg(F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks"))
        .where(F.col("w.end") <= ads_closed)
        .select("ad_id", F.col("w.start").alias("hour_start"), F.col("w.end").alias("hour_end"),
                "impressions", "clicks",
                (F.col("clicks") / F.col("impressions")).alias("click_through_rate"))
    )  # fmt: skip
    sessions = _sessions(ev, base.gold.session_max_pages).where(F.col("session_end") <= closed)
    sessions = sessions.cache()
    tables["gold.sessions"] = sessions.select(
        "user_id", "session_start", "session_end", "events", "purchases", "revenue"
    )
    tables["gold.sessions_custom"] = sessions
    duration = F.col("session_end").cast("double") - F.col("session_start").cast("double")
    tables["gold.session_stats_hourly"] = (
        sessions.groupBy(F.window("session_end", "1 hour").alias("h"))
        .agg(
            F.count(F.lit(1)).alias("sessions"),
            F.avg(duration).alias("mean_duration_s"),
            F.avg("events").alias("mean_events"),
            F.count(F.when(F.col("purchases") > 0, 1)).alias("purchasing_sessions"),
        )
        .select(F.col("h.start").alias("hour_start"), F.col("h.end").alias("hour_end"),
                "sessions", "mean_duration_s", "mean_events", "purchasing_sessions")
    )  # fmt: skip
    tables["gold.purchase_alerts"] = _alerts(ev)
    tables["gold.user_activity_spans"] = _spans(ev).where(F.col("span_end") < closed)
    return {name: _delta(frame, _table(work, name)) for name, frame in tables.items()}


def _sessions(ev: DataFrame, max_pages: int) -> DataFrame:
    """gold.sessions_custom's columns from session windows of 15 minutes."""
    from gold.sessions_custom import EVENT_TYPES

    visits = F.array_sort(F.collect_list(F.struct("event_time", "page")))
    counts = F.map_filter(
        F.create_map(
            *[x for t in EVENT_TYPES for x in (F.lit(t), F.count_if(F.col("event_type") == t))]
        ),
        lambda _k, v: v > 0,
    )
    purchase = F.col("event_type") == "purchase"
    return (
        ev.groupBy("user_id", F.session_window("event_time", "15 minutes").alias("s"))
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.count(F.when(purchase, 1)).alias("purchases"),
            F.coalesce(F.sum(F.when(purchase, F.col("amount"))), F.lit(0.0)).alias("revenue"),
            visits.alias("visits"),
            counts.alias("event_counts"),
        )
        .select(
            "user_id",
            F.col("s.start").alias("session_start"),
            F.col("s.end").alias("session_end"),
            "events",
            "purchases",
            "revenue",
            F.col("visits")[0]["page"].alias("landing_page"),
            F.element_at("visits", -1)["page"].alias("exit_page"),
            F.slice(F.transform("visits", lambda v: v["page"]), 1, max_pages).alias("pages"),
            "event_counts",
        )
    )


def _alerts(ev: DataFrame) -> DataFrame:
    """Each purchase that is its user's 3rd or later in the minute up to it."""
    ms = F.unix_millis("event_time")
    minute = Window.partitionBy("user_id").orderBy("ms").rangeBetween(-59_999, 0)
    return (
        ev.where(F.col("event_type") == "purchase")
        .withColumn("ms", ms)
        .select(
            "user_id",
            "event_id",
            F.col("event_time").alias("purchase_time"),
            F.count(F.lit(1)).over(minute).alias("purchases_in_minute"),
            F.sum(F.coalesce("amount", F.lit(0.0))).over(minute).alias("amount_in_minute"),
        )
        .where(F.col("purchases_in_minute") >= 3)
    )


def _spans(ev: DataFrame) -> DataFrame:
    """Per span of a user's activity (events at most 30 minutes apart) and event type: first
    and last activity, events, and the span's end (its last event plus 30 minutes)."""
    by_time = Window.partitionBy("user_id").orderBy("event_time")
    gap = F.col("event_time") - F.lag("event_time").over(by_time)
    starts = F.coalesce(gap > F.expr("INTERVAL 30 MINUTES"), F.lit(True)).cast("int")
    spans = ev.withColumn("span", F.sum(starts).over(by_time))
    spans = spans.withColumn(
        "span_end",
        F.max("event_time").over(Window.partitionBy("user_id", "span"))
        + F.expr("INTERVAL 30 MINUTES"),
    )
    return (
        spans.groupBy("user_id", "span", "event_type", "span_end")
        .agg(
            F.min("event_time").alias("first_activity"),
            F.max("event_time").alias("last_activity"),
            F.count(F.lit(1)).alias("events"),
        )
        .select("user_id", "event_type", "first_activity", "last_activity", "events", "span_end")
    )


CONTRACT = {"bronze": contract_bronze, "silver": contract_silver, "gold": contract_gold}


# ---- raw floors: the parse and storage limit -----------------------------------------------


def raw(spark: SparkSession, base: Settings, work: Path, layer: str) -> dict[str, int]:
    """The layer's reads, deduplication and aggregations straight into Parquet."""
    from bronze.sources import SCHEMAS, SOURCES

    out = work / "raw"
    read = lambda name: spark.read.format("delta").load(str(base.table_path(name)))  # noqa: E731
    frames: dict[str, DataFrame] = {}
    if layer == "bronze":
        for source in SOURCES:
            path = str(base.landing_path(source))
            frames[source] = spark.read.schema(SCHEMAS[source]).json(path)
    elif layer == "silver":
        events = read("bronze.events").where("event_id IS NOT NULL AND event_time IS NOT NULL")
        frames["events"] = events.dropDuplicates(["event_id"])
        imp = read("bronze.impressions").dropDuplicates(["impression_id"]).alias("i")
        clk = read("bronze.clicks").dropDuplicates(["click_id"]).alias("c")
        frames["ad_attribution"] = imp.join(
            clk,
            F.expr(
                "c.impression_id = i.impression_id AND c.click_time >= i.impression_time"
                " AND c.click_time <= i.impression_time + interval 1 hour"
            ),
            "left",
        ).select("i.*", "c.click_id", "c.click_time")
    else:
        ev = read("silver.events")
        purchase = (F.col("event_type") == "purchase").cast("long")
        revenue = F.when(F.col("event_type") == "purchase", F.col("amount")).otherwise(0.0)
        frames["sessions"] = ev.groupBy(
            "user_id", F.session_window("event_time", "15 minutes")
        ).agg(F.count("*").alias("events"), F.sum(purchase), F.sum(revenue))
        five = ev.groupBy("user_id", F.window("event_time", "5 minutes")).agg(
            F.count("*").alias("events"), F.sum(purchase), F.sum(revenue)
        )
        frames["user_activity_5m"] = five
        frames["user_activity_hourly"] = five.groupBy(
            "user_id", F.window("window.start", "1 hour")
        ).agg(F.sum("events"), F.avg("events"), F.max("events"))
        frames["revenue_by_country_hourly"] = ev.groupBy(
            F.coalesce("country", F.lit("unknown")), F.window("event_time", "1 hour")
        ).agg(F.count("*"), F.sum(purchase), F.sum(revenue))
        frames["user_activity_spans"] = ev.groupBy(
            "user_id", "event_type", F.session_window("event_time", "30 minutes")
        ).agg(F.min("event_time"), F.max("event_time"), F.count("*"))
        frames["ad_performance_hourly"] = (
            read("silver.ad_attribution")
            .groupBy("ad_id", F.window("impression_time", "1 hour"))
            .agg(F.count("*"), F.count("click_id"))
        )
    written = {}
    for name, frame in frames.items():
        frame.write.parquet(str(out / name))
        written[name] = spark.read.parquet(str(out / name)).count()
    return written
