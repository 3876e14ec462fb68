"""ops.runs and ``lakehouse status`` after real runs: one that succeeds, one whose input is
missing."""

from __future__ import annotations

import datetime as dt
import io
import re

import pytest

from lakehouse.cli import main
from lakehouse.runner import MissingInput, layer_flows, run_flows
from silver.events import SCHEMA as EVENTS_SCHEMA

FLOWS = layer_flows("gold")

UTC = dt.UTC
T = dt.datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _flow(name):
    return next(f for f in FLOWS if f.name == name)


def _event(event_id, user_id, minute):
    return (
        event_id,
        user_id,
        "page_view",
        "/",
        None,
        T + dt.timedelta(minutes=minute),
        "web",
        "US",
        "f",
    )


def test_runs_are_recorded_and_the_status_shows_tables_runs_state_and_drops(
    spark, settings, store, capsys
):
    """gold.sessions runs over two silver.events versions (two micro-batches, 3 + 1 rows: the
    second moves the watermark past u1's session); gold.ad_performance_hourly then fails to
    start, its input missing."""
    store.create("silver.events", EVENTS_SCHEMA)
    for rows in ([_event("a", 1, 0), _event("b", 1, 5), _event("c", 2, 6)], [_event("d", 3, 60)]):
        store.write(spark.createDataFrame(rows, EVENTS_SCHEMA).coalesce(1), "silver.events")
    one = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    run_flows(spark, one, [_flow("gold.sessions")], out=io.StringIO())
    with pytest.raises(MissingInput):
        run_flows(spark, one, [_flow("gold.ad_performance_hourly")], out=io.StringIO())

    runs = {r.flow: r for r in store.read("ops.runs").collect()}
    assert set(runs) == {"gold.sessions", "gold.ad_performance_hourly"}
    ok, failed = runs["gold.sessions"], runs["gold.ad_performance_hourly"]
    assert (ok.status, ok.batches, ok.input_rows, ok.late_rows, ok.error) == (
        "succeeded", 2, 4, 0, None
    )  # fmt: skip
    assert ok.started_at <= ok.ended_at and ok.run_id != failed.run_id
    assert (failed.status, failed.query_id, failed.batches) == ("failed", None, 0)
    assert failed.error.startswith("input table silver.ad_attribution does not exist")
    sessions_state = (
        store.read("ops.stream_progress")
        .where("flow = 'gold.sessions'")
        .orderBy("timestamp", "batch_id")
        .collect()
    )

    assert main(["status", "--root", str(settings.root), "--profile", "test"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"gold\.sessions\s+\d+\s+2\s+\d+\s+" + WHEN, _line(out, "gold.sessions "))
    assert re.fullmatch(
        r"silver\.events\s+2\s+4\s+2\s+" + WHEN, _line(out, "silver.events ")
    )  # versions 0 (create), 1 and 2; 4 rows in 2 files
    assert re.fullmatch(
        rf"gold\.sessions\s+succeeded\s+{WHEN}\s+[\d.]+\s+2\s+4",
        _line(out, "gold.sessions ", section="last run per flow"),
    )
    assert re.fullmatch(
        rf"gold\.ad_performance_hourly\s+failed\s+{WHEN}\s+[\d.]+\s+0\s+0\s+"
        r"input table silver\.ad_attribution does not exist.*",
        _line(out, "gold.ad_performance_hourly", section="last run per flow"),
    )
    last = sessions_state[-1]
    growth = last.state_rows - sessions_state[max(0, len(sessions_state) - 5)].state_rows
    assert re.fullmatch(
        rf"gold\.sessions\s+0 sessionWindowStateStoreSaveExec\s+{last.state_rows}\s+"
        rf"{growth:+d}\s+[\d.]+\s+2026-01-05 10:50:00",  # 11:00 minus 10 minutes
        _line(out, "gold.sessions ", section="state per stateful operator"),
    )
    assert re.fullmatch(
        r"gold\.sessions\s+0\s+0", _line(out, "gold.sessions ", section="rows dropped")
    )


def _line(out: list[str], start: str, section: str = "tables") -> str:
    """The first line starting with ``start`` after the line starting with ``section``."""
    begin = next(i for i, line in enumerate(out) if line.startswith(section))
    return next(line for line in out[begin + 1 :] if line.startswith(start))


def test_state_shows_rows_per_partition_and_timers_of_each_state_variable(
    spark, settings, store, capsys
):
    """gold.sessions_custom after one micro-batch of users 1, 2 and 3, every session still
    open: per bucket one ValueState row, one ListState element (that batch's pages), one
    MapState entry (page views only) and one timer."""
    from gold.sessions_custom import bucket

    flow = _flow("gold.sessions_custom")
    assert main(["state", flow.name, "--root", str(settings.root), "--profile", "test"]) == 2
    assert "has no checkpoint" in capsys.readouterr().err
    store.create("silver.events", EVENTS_SCHEMA)
    rows = [_event("a", 1, 0), _event("b", 2, 1), _event("c", 3, 2)]
    store.write(spark.createDataFrame(rows, EVENTS_SCHEMA).coalesce(1), "silver.events")
    run_flows(spark, settings, [flow], out=io.StringIO())
    buckets = {
        r.bucket
        for r in spark.range(1, 4).withColumnRenamed("id", "user_id").select(bucket(64)).collect()
    }
    n = len(buckets)

    assert main(["state", flow.name, "--root", str(settings.root), "--profile", "test"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "state of gold.sessions_custom"
    assert out[1].split() == [
        "op", "operator", "store", "partitions", "rows", "min/partition", "max/partition",
        "skew", "timers",
    ]  # fmt: skip
    table = {tuple(line.split()[1:3]): line.split()[3:] for line in out[2:]}
    assert set(table) == {
        ("transformWithStateInPandasExec", "session"),
        ("transformWithStateInPandasExec", "pages"),
        ("transformWithStateInPandasExec", "counts"),
    }
    for variable in ("session", "pages", "counts"):
        partitions, total, *_, timers = table[("transformWithStateInPandasExec", variable)]
        assert (partitions, total, timers) == ("2", str(n), str(n))
