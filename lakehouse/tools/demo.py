"""``lakehouse demo``: generate a small lake and run the layers that exist so far.

It generates a day of synthetic landing data (100,000 events by default; skipped when the lake root
already has a manifest), runs bronze, silver and gold in available-now mode, and prints what
each table holds next to what the generator's manifest says should be there, then what silver
dropped (duplicates, late rows) and quarantined (per rule), then the first rows of every gold
table.
"""

from __future__ import annotations

import json
import sys

from lakehouse.settings import Settings

# a day of traffic (its daily curve; more than the 5-hour watermark of the ad statistics, so
# their hours close), in quarter-hour landing files
DEMO_HOURS = 24.0
DEMO_FILE_MINUTES = 15.0


def run_demo(settings: Settings, events: int = 100_000) -> int:
    from lakehouse.session import spark_session
    from lakehouse.storage import table_store

    with spark_session(settings, "lakehouse-demo") as spark:
        return _demo(spark, table_store(spark, settings), settings, events)


def _demo(spark, store, settings: Settings, events: int) -> int:
    from pyspark.sql import functions as F

    from bronze.sources import QUARANTINE_TABLE, SOURCES
    from lakehouse.runner import RunStopped, run_layers
    from lakehouse.tools import generate as gen

    manifest_path = settings.landing_path() / gen.MANIFEST
    if manifest_path.exists():
        print(f"landing data found ({manifest_path}); not generating more")
    else:
        params = gen.params_from_settings(
            settings, events=events, hours=DEMO_HOURS, file_minutes=DEMO_FILE_MINUTES
        )
        entry = gen.generate(spark, settings.root, params)
        print("the generated traffic:")
        for line in gen.profile_lines(entry["profile"]):
            print(f"  {line}")
    try:
        reports = {r.flow: r for r in run_layers(spark, settings, ["bronze", "silver", "gold"])}
    except RunStopped as exc:
        print(f"error: {exc}; the next demo goes on from the checkpoints", file=sys.stderr)
        return 130
    totals = json.loads(manifest_path.read_text())["totals"]
    quarantine = store.read(QUARANTINE_TABLE)
    print()
    print(f"{'source':12} {'landing lines':>14} {'bronze rows':>12} {'quarantined':>12}")
    balanced = True
    for source in SOURCES:
        rows = store.read(f"bronze.{source}").count()
        bad = quarantine.where(F.col("source") == source).count()
        balanced &= rows + bad == totals[source]["lines"]
        print(f"{source:12} {totals[source]['lines']:>14,} {rows:>12,} {bad:>12,}")
    print()
    print(f"{QUARANTINE_TABLE} by reason (expected from the manifest in brackets):")
    found = {
        (r["source"], r["reason"]): r["count"]
        for r in quarantine.groupBy("source", "reason").count().collect()
    }
    for source in SOURCES:
        for reason, expected in totals[source]["quarantine"].items():
            got = found.get((source, reason), 0)
            balanced &= got == expected
            print(f"  {source:12} {reason:16} {got:>7,} [{expected:,}]")
    print()
    print("a few quarantined lines:")
    (
        quarantine.select("source", "reason", "detail", F.substring("raw", 1, 60).alias("raw"))
        .dropDuplicates(["source", "reason"])
        .orderBy("source", "reason")
        .show(truncate=False)
    )
    if any(flow.startswith("silver.") for flow in reports):
        balanced &= _silver_books(store)
    _gold_rows(store, [name for name in reports if name.startswith("gold.")])
    balanced &= _gold_marks(store, settings)
    if not balanced:
        print("the books do not balance: some rows are not where they should be (see above)")
        return 1
    print("the books balance: every landing line is in one place, as the manifest says")
    _next_steps(settings)
    return 0


def _next_steps(settings: Settings) -> None:
    root = f"--root {settings.root}"
    print()
    print("next:")
    for what, command in (
        ("check every table against the reference", f"lakehouse verify {root}"),
        ("see runs, state and drops", f"lakehouse status {root}"),
        ("plots of the runs, one HTML file", f"lakehouse report {root}"),
        ("query gold", f'lakehouse sql {root} "SELECT * FROM gold.sessions LIMIT 10"'),
        ("serve the tables to a BI tool (JDBC)", f"lakehouse serve-sql {root}"),
    ):
        print(f"  {what:38} {command}")


SILVER_INPUTS = {
    "silver.events": ("bronze.events",),
    "silver.ad_attribution": ("bronze.impressions", "bronze.clicks"),
}


def _silver_books(store) -> bool:
    """Print, per silver flow and over every run so far: rows in, rows out, what each stateful
    operator dropped (duplicates, rows behind the watermark; from ops.stream_progress) and the
    rows quarantined per rule. True when silver.events' books balance."""
    from pyspark.sql import functions as F

    progress = store.read("ops.stream_progress")
    quarantine = store.read("silver.quarantine")
    balanced = True
    print()
    print("silver, over every run so far (drops per stateful operator from ops.stream_progress):")
    for flow, inputs in SILVER_INPUTS.items():
        if not store.exists(flow):
            continue
        rows_in = {name: store.read(name).count() for name in inputs}
        rows_out = store.read(flow).count()
        quarantined = quarantine.where(F.col("table") == flow)
        quarantined_rows = quarantined.count()
        print(
            f"  {flow}: in {' + '.join(f'{n:,} ({t})' for t, n in rows_in.items())}, "
            f"out {rows_out:,}, quarantined {quarantined_rows:,}"
        )
        operators = (
            progress.where((F.col("flow") == flow) & F.col("operator").isNotNull())
            .groupBy("operator_index", "operator")
            .agg(
                # a join reports no duplicates: null, counted as none
                F.coalesce(F.sum("duplicates_dropped"), F.lit(0)).alias("duplicates"),
                F.coalesce(F.sum("rows_dropped_by_watermark"), F.lit(0)).alias("late"),
                F.coalesce(F.max("state_rows"), F.lit(0)).alias("peak_state"),
            )
            .orderBy("operator_index")
            .collect()
        )
        for op in operators:
            print(
                f"    operator {op['operator_index']} {op['operator']}: "
                f"{op['duplicates']:,} duplicates dropped, {op['late']:,} late rows dropped, "
                f"peak state {op['peak_state']:,} rows"
            )
        if store.exists("silver.late_events"):
            late = store.read("silver.late_events").where(F.col("flow") == flow).count()
            print(f"    late rows kept in silver.late_events: {late:,}")
        for row in (
            quarantined.select(F.explode("rules").alias("rule"))
            .groupBy("rule")
            .count()
            .orderBy("rule")
            .collect()
        ):
            print(f"    quarantined by rule {row['rule']}: {row['count']:,}")
        if flow == "silver.events":  # one input row, at most one output row
            bronze = rows_in["bronze.events"]
            dropped = sum(op["duplicates"] + op["late"] for op in operators)
            accounted = rows_out + quarantined_rows + dropped
            balanced &= accounted == bronze
            verdict = "balanced" if accounted == bronze else f"OFF BY {bronze - accounted:,}"
            print(
                f"    books: {bronze:,} bronze rows = {rows_out:,} kept + "
                f"{quarantined_rows:,} quarantined + {dropped:,} dropped: {verdict}"
            )
    failures = store.read("ops.quality_results").where("not success")
    for row in (
        failures.groupBy("table", "rule", "action")
        .agg(F.sum("unexpected_count").alias("rows"))
        .orderBy("table", "rule")
        .collect()
    ):
        print(
            f"  great-expectations: {row['table']} rule {row['rule']} ({row['action']}) "
            f"failed on {row['rows']:,} row(s)"
        )
    return balanced


def _gold_marks(store, settings: Settings) -> bool:
    """Print up to when each gold table is final (ops.completeness) and whether the two session
    tables hold the same sessions; True when they do."""
    from lakehouse.ops.status import current_marks
    from lakehouse.proof.verify import session_tables

    marks = current_marks(settings)
    print()
    print("gold rows final before (ops.completeness; a view gold.<table>_final holds them):")
    for mark in marks.itertuples():
        print(
            f"  {mark.table:32} rows whose {mark.column} is before {mark.complete_through:%Y-%m-%d %H:%M:%S}"
        )
    if not (store.exists("gold.sessions") and store.exists("gold.sessions_custom")):
        return True
    pair = session_tables(settings)  # verify's comparison: revenue sums may differ in the ulp
    if pair.apart:
        print(
            f"gold.sessions_custom and gold.sessions: {pair.apart:,} sessions in one only or "
            "different: DIFFERENT"
        )
    else:
        print(f"gold.sessions_custom holds the same {pair.found:,} sessions as gold.sessions")
    return not pair.apart


def _gold_rows(store, flows: list[str], rows: int = 5) -> None:
    """Print each gold table's row count and its first rows by key (its first two columns)."""
    from lakehouse.runner import layer_flows

    FLOWS = layer_flows("gold")

    tables = [o.table for f in FLOWS if f.name in flows for o in f.outputs]
    for table in tables:
        frame = store.read(table)
        print()
        print(f"{table}: {frame.count():,} rows; the first {rows}:")
        frame.orderBy(*frame.columns[:2]).show(rows, truncate=48)
