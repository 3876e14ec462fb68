"""Every gold table equals its batch computation (lakehouse.proof.oracle) on generated data without
late events, whatever the micro-batch sizes and across a restart of the gold job."""

from __future__ import annotations

import io

import pandas as pd
from verify_helpers import verify_all_equal

from lakehouse.ops.status import current_marks
from lakehouse.progress import Progress
from lakehouse.proof.verify import reference_silver, run_verify
from lakehouse.runner import declared_tables, layer_flows, run_layers
from lakehouse.settings import duration_seconds
from lakehouse.storage.deltafiles import open_table
from lakehouse.tools import generate as gen

EVENTS_LATENESS = pd.Timedelta(minutes=10)  # watermarks.events of the test settings
ATTRIBUTION_LATENESS = pd.Timedelta(hours=5)  # watermarks.attribution


def _table(store, name: str, keys: list[str]) -> pd.DataFrame:
    frame = store.read(name).toPandas()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].dt.tz_localize("UTC")
    return frame.sort_values(keys, ignore_index=True)


def _same(found: pd.DataFrame, expected: pd.DataFrame, name: str, some: bool = True) -> None:
    assert len(expected) > 0 or not some, f"{name}: the generated data gives no expected rows"
    found = found[list(expected.columns)]
    # sums of amounts are added in another order: equal to a millionth
    pd.testing.assert_frame_equal(
        found, expected, check_dtype=False, check_exact=False, atol=1e-6, obj=name
    )


def test_gold_tables_equal_their_batch_computation(spark, settings, store, generated_code):
    """Two deliveries of 4 hours, each layer reading a delivery in one micro-batch (every job
    stops after the first and restarts from its checkpoints); each gold
    table's complete-through mark after each delivery. (Other micro-batch sizes, with a stop
    inside gold: test_event_order.) The layers run with Spark's code generation, as the
    project's jobs do (the tests' session interprets expressions): every layer's results are
    checked on production's paths here."""
    assert pd.Timedelta(seconds=duration_seconds(settings.watermarks.events)) == EVENTS_LATENESS
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    outputs = [o for flow in layer_flows("gold") for o in flow.outputs]
    marks, tables = [], []  # after each delivery: the marks, and the gold tables
    for delivery in range(2):
        params = gen.params_from_settings(
            settings,
            events=1500,
            hours=4.0,
            file_minutes=30.0,
            late_fraction=0.0,
            users=40,
            seed=11 + delivery,
            conversion=0.3,  # enough checkouts of 3 or 4 purchases for purchase alerts
            invalid_fraction=0.005,  # records silver quarantines
        )
        gen.generate(spark, settings.root, params, progress=quiet)
        with generated_code():
            run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
            run_layers(spark, settings, ["gold"], out=io.StringIO())
        marks.append(current_marks(settings).set_index("table")["complete_through"])
        tables.append({o.table: _table(store, o.table, list(o.reference.keys)) for o in outputs})

    events = store.read("silver.events").toPandas()
    attribution = store.read("silver.ad_attribution").toPandas()
    silver = reference_silver(settings, events, attribution)
    assert silver.events_lateness == EVENTS_LATENESS
    assert silver.attribution_lateness == ATTRIBUTION_LATENESS
    for output in outputs:
        keys = list(output.reference.keys)
        expected = output.reference.rows(silver).sort_values(keys, ignore_index=True)
        found = _table(store, output.table, keys)
        if output.reference.columns:
            columns = list(output.reference.columns)
            _same(found[columns], expected[columns], output.table)
        _same(found, expected, output.table)
    # complete-through marks: every gold table has one after each delivery, it moves forward,
    # and the rows before it were final: after the first delivery they are already the rows
    # the reference over both deliveries has there
    assert sorted(marks[0].index) == sorted(marks[1].index) == sorted(o.table for o in outputs)
    assert (marks[1] > marks[0]).all(), pd.concat(marks, axis=1)
    final_first = 0  # rows already final after the first delivery
    for output in outputs:
        keys, column = list(output.reference.keys), output.complete_by
        expected = output.reference.rows(silver).sort_values(keys, ignore_index=True)
        columns = list(output.reference.columns or expected.columns)
        for mark, found in zip(marks, tables, strict=True):
            before = found[output.table]
            before = before[before[column] < mark[output.table]].reset_index(drop=True)
            final = expected[expected[column] < mark[output.table]].reset_index(drop=True)
            # (none may be final yet: ad hours wait for a 5-hour watermark)
            name = f"{output.table} before {mark[output.table]}"
            _same(before[columns], final[columns], name, some=False)
            final_first += len(before) if found is tables[0] else 0
    assert final_first == 819  # (the seeds fix it: not an empty comparison)
    # (an alert carries the figures of the moment it was raised: the same purchases alert
    # whatever the batches, and with one batch per delivery their figures are those of the
    # whole minute, so the alerts' figures equal the reference's here too)

    # lakehouse verify, computing silver and gold from the landing files alone, agrees, and
    # only silver.late_events is empty (no line is late)
    text = verify_all_equal(settings, empty=("silver.late_events",))
    # one line per table, for every table the flows declare
    lines = text.splitlines()[1:-1]
    assert sorted(line.split()[0] for line in lines if not line.startswith(" ")) == sorted(
        declared_tables()
    )
    # it sees books short of the duplicates of batches whose progress was never recorded
    # (a job killed between its commit and its record), and the next start recounts them
    progress = open_table(settings.table_path("ops.stream_progress"))
    predicate = "flow = 'silver.events' AND duplicates_dropped > 0"
    lost = progress.to_pandas(filters=[("flow", "=", "silver.events")])
    lost = lost[lost["duplicates_dropped"] > 0]
    assert len(lost) == 2  # one batch of each delivery
    progress.delete(predicate)
    report = io.StringIO()
    assert run_verify(settings, report) == 1
    books = [line for line in report.getvalue().splitlines() if "silver.events books:" in line]
    # the rows balance (each bronze row in one place), the operators' counts fall short
    assert books[0].endswith("duplicates of kept rows, row by row"), books
    duplicates = int(books[0].split(" + ")[3].split()[0].replace(",", ""))
    counted = duplicates - int(lost["duplicates_dropped"].sum())
    assert books[1] == (
        f"  silver.events books: the stateful operator counted {counted:,} duplicates and 0 "
        "late rows: DIFFERENT"
    ), books
    out = io.StringIO()
    run_layers(spark, settings, ["silver"], out=out)
    assert sum("recounted" in line for line in out.getvalue().splitlines()) == 2
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()

    # and it sees a row that is not where it should be: one silver event deleted
    victim = events.sort_values("event_id")["event_id"].iloc[0]
    open_table(settings.table_path("silver.events")).delete(f"event_id = '{victim}'")
    report = io.StringIO()
    assert run_verify(settings, report) == 1
    lines = report.getvalue().splitlines()
    (row,) = [line for line in lines if line.startswith("silver.events ")]
    assert row.split()[1:] == [
        f"{len(events):,}",
        f"{len(events) - 1:,}",
        "1",
        "0",
        "0",
        "DIFFERENT",
        "row",
        "for",
        "row",
    ]
    assert any(line.startswith("  silver.events missing: ") and victim in line for line in lines)
    assert lines[-1] == "verify: 1 table(s) differ from the reference: silver.events"
