"""With events later than the watermark, ``lakehouse verify`` checks the books, and they
balance: every bronze row is in silver.events, in silver.quarantine, or counted in
ops.stream_progress as a duplicate or a late row dropped by the watermark. (Without late events
it passes whatever the micro-batch sizes: test_event_order.)"""

from __future__ import annotations

import io
import json
import re

import pytest

from lakehouse.ops.status import read_table
from lakehouse.progress import Progress
from lakehouse.proof.verify import run_verify
from lakehouse.runner import declared_tables, run_layers
from lakehouse.storage.deltafiles import open_table
from lakehouse.tools import generate as gen

pytestmark = pytest.mark.slow


def test_with_late_events_verify_checks_the_books(spark, settings, shuffle_partitions):
    # one landing file per micro-batch: a late line then meets a watermark already past it
    params = gen.params_from_settings(
        settings,
        events=1000,
        hours=1.0,
        users=600,
        late_fraction=0.02,
        invalid_fraction=0.01,
        seed=41,
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    batches = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    with shuffle_partitions(1):
        reports = run_layers(spark, batches, ["bronze", "silver"], out=io.StringIO())
    run_layers(spark, settings, ["gold"], out=io.StringIO())  # gold: all at once
    # the run's report of silver.events says what its operators counted, and kept one row
    # per event
    (silver,) = [r for r in reports if r.flow == "silver.events"]
    progress = read_table(settings, "ops.stream_progress")
    progress = progress[progress["flow"] == "silver.events"]
    assert (silver.late_rows, silver.duplicates) == (
        progress["rows_dropped_by_watermark"].sum(),
        progress["duplicates_dropped"].sum(),
    )
    kept = read_table(settings, "silver.events")["event_id"]
    assert kept.is_unique and len(kept) > 0
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    lines = report.getvalue().splitlines()
    (books,) = [
        line for line in lines if line.startswith("  silver.events books: ") and "=" in line
    ]
    # late rows were dropped by the watermark, kept in silver.late_events, and the books
    # balance row by row: each bronze row in one place, or a copy of a kept one
    kept, quarantined, late, duplicates = (
        int(part.split()[0].replace(",", "")) for part in books.split(" = ")[1].split(" + ")
    )
    bronze = int(books.split("books: ")[1].split()[0].replace(",", ""))
    # (enough of each kind for the books to mean something)
    assert late >= 5 and duplicates >= 5, books
    assert bronze == kept + quarantined + duplicates + late
    assert books.endswith("duplicates of kept rows, row by row"), books
    (events_late,) = [
        line
        for line in lines
        if line.startswith("  silver.late_events books: ") and "events," in line
    ]
    assert events_late.endswith(
        f"{late:,} rows of silver.events, {late:,} dropped as late by its operators"
    )
    # bronze and silver row for row, each by its line
    status = {line.split()[0]: line.split()[6] for line in lines[1:] if line[:1].isalpha()}
    upstream = [t for t in declared_tables() if t.startswith(("bronze.", "silver."))]
    assert {t: status[t] for t in upstream} == dict.fromkeys(upstream, "ok"), report.getvalue()
    (pairs,) = [line for line in lines if line.startswith("  silver.ad_attribution books: ")]
    assert re.fullmatch(
        r"  silver\.ad_attribution books: 0 impressions not in the reference; matched pairs "
        r"compared, [\d,]+ missing with a side kept in silver\.late_events",
        pairs,
    ), pairs

    # A matched pair lost, neither side of it late: the books of late data do not cover it
    late = read_table(settings, "silver.late_events")
    late_ids = {json.loads(r).get(k) for r in late["record"] for k in ("impression_id", "click_id")}
    found = read_table(settings, "silver.ad_attribution")
    matched = found[found["click_id"].notna()]
    lost = next(
        row
        for row in matched.itertuples()
        if row.impression_id not in late_ids and row.click_id not in late_ids
    )
    table = open_table(settings.table_path("silver.ad_attribution"))
    table.delete(f"impression_id = '{lost.impression_id}' AND click_id = '{lost.click_id}'")
    report = io.StringIO()
    assert run_verify(settings, report) == 1
    lines = report.getvalue().splitlines()
    missing = [line for line in lines if line.startswith("  silver.ad_attribution missing: ")]
    assert len(missing) == 1 and f"'{lost.impression_id}'" in missing[0], lines
    assert f"'{lost.click_id}'" in missing[0]
    assert lines[-1].startswith("verify: ") and "silver.ad_attribution" in lines[-1]
