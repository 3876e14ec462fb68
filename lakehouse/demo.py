"""``lakehouse demo``: generate a small lake and run the layers that exist so far.

It generates synthetic landing data (100,000 events by default; skipped when the lake root
already has a manifest), runs bronze and silver in available-now mode, and prints what each
table holds next to what the generator's manifest says should be there, then what silver
dropped (duplicates, late rows) and quarantined (per rule).
"""

from __future__ import annotations

import json

from lakehouse.settings import Settings


def run_demo(settings: Settings, events: int = 100_000) -> int:
    from lakehouse.cli import spark_session
    from lakehouse.storage import table_store

    with spark_session(settings, "lakehouse-demo") as spark:
        return _demo(spark, table_store(spark, settings), settings, events)


def _demo(spark, store, settings: Settings, events: int) -> int:
    from pyspark.sql import functions as F

    from bronze.sources import QUARANTINE_TABLE, SOURCES
    from lakehouse import generate as gen
    from lakehouse.runner import run_layers

    manifest_path = settings.landing_path() / gen.MANIFEST
    if manifest_path.exists():
        print(f"landing data found ({manifest_path}); not generating more")
    else:
        gen.generate(spark, settings.root, gen.params_from_settings(settings, events=events))
    reports = {r.flow: r for r in run_layers(spark, settings, ["bronze", "silver"])}
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
    silver = reports.get("silver.events")
    if silver is not None:
        bronze_rows = store.read("bronze.events").count()
        kept = store.read("silver.events").count()
        quarantined = store.read("silver.quarantine").where(F.col("table") == "silver.events")
        print(
            f"silver.events, this run: {silver.duplicates:,} duplicates and "
            f"{silver.late_rows:,} late rows dropped"
        )
        print(
            f"  bronze.events {bronze_rows:,} rows -> silver.events {kept:,} rows, "
            f"silver.quarantine {quarantined.count():,} rows"
        )
        for row in (
            quarantined.select(F.explode("rules").alias("rule"))
            .groupBy("rule")
            .count()
            .orderBy("rule")
            .collect()
        ):
            print(f"  quarantined by rule {row['rule']}: {row['count']:,}")
        results = store.read("ops.quality_results").where("not success")
        for row in (
            results.groupBy("rule", "action")
            .agg(F.sum("unexpected_count").alias("rows"))
            .orderBy("rule")
            .collect()
        ):
            print(f"  rule {row['rule']} ({row['action']}) failed on {row['rows']:,} row(s)")
    if not balanced:
        print("the books do not balance: some landing lines are not where the manifest says")
        return 1
    print("every landing line is in bronze or in the quarantine, as the manifest says")
    return 0
