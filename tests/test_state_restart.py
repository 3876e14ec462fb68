"""A flow restarted on a checkpoint whose state it cannot use fails with an error that names the
flow and the way out (a new checkpoint), not a stack trace from deep inside the state store."""

from __future__ import annotations

import io

import pytest
from probe_flows import probe_flow, write_probe
from pyspark.sql import functions as F

from lakehouse.runner import FlowFailed, run_flows

LINES = [
    {"id": "a", "n": 1, "t": "2026-01-05T10:00:00Z"},
    {"id": "b", "n": 2, "t": "2026-01-05T10:01:00Z"},
    {"id": "a", "n": 1, "t": "2026-01-05T10:00:00Z"},
]


def _flow(key: str):
    def transform(lines):
        rows = lines.select(F.from_json("value", "id string, n long, t timestamp").alias("r"))
        return (
            rows.select("r.*").withWatermark("t", "10 minutes").dropDuplicatesWithinWatermark([key])
        )

    return probe_flow("gold.restart_probe", transform)


def test_a_changed_state_schema_names_the_flow_and_the_way_out(spark, settings, store):
    write_probe(settings, LINES)
    run_flows(spark, settings, [_flow("id")], out=io.StringIO())
    assert sorted(store.read("gold.restart_probe").select("id").toPandas()["id"]) == ["a", "b"]

    # the deduplication key changes from id (a string) to n (a long): the state stored per id
    # cannot serve the new query
    write_probe(settings, [LINES[0] | {"id": "c"}], "probe-000001.json")
    checkpoint = settings.checkpoint_path("gold", "restart_probe")
    with pytest.raises(FlowFailed) as failed:
        run_flows(spark, settings, [_flow("n")], out=io.StringIO())
    assert str(failed.value) == (
        f"flow gold.restart_probe failed: the state in the checkpoint of gold.restart_probe "
        f"({checkpoint}) does not fit this version of the flow "
        "(STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE): a stateful operator or its state schema "
        f"changed. Start the flow on a new checkpoint: move {checkpoint} aside, and its output "
        "tables if they must not get the input again; the flow then rebuilds its state from its "
        "whole input"
    )


def _windows_flow():
    def transform(lines):
        rows = lines.select(F.from_json("value", "id string, n long, t timestamp").alias("r"))
        return (
            rows.select("r.*")
            .withWatermark("t", "10 minutes")
            .groupBy(F.window("t", "5 minutes"))
            .count()
            .select(F.col("window.start").alias("start"), "count")
        )

    return probe_flow("gold.windows_probe", transform)


def test_a_no_data_batch_a_stop_took_away_runs_on_the_next_start(spark, settings, store):
    """Stopped after a batch that moved the watermark and before the no-data batch that closes
    the windows behind it, the flow runs that batch first on its next start: the windows come
    out then, not with the next new data."""
    import datetime as dt
    import shutil

    from lakehouse import checkpoints

    times = ["2026-01-05T10:00:00Z", "2026-01-05T10:06:00Z", "2026-01-05T10:31:00Z"]
    lines = [{"id": str(i), "n": i, "t": t} for i, t in enumerate(times)]
    write_probe(settings, lines)
    run_flows(spark, settings, [_windows_flow()], out=io.StringIO())
    expected = [(dt.datetime(2026, 1, 5, 10, 0), 1), (dt.datetime(2026, 1, 5, 10, 5), 1)]
    assert sorted(tuple(r) for r in store.read("gold.windows_probe").collect()) == expected

    # the same run, stopped before its no-data batch 1: the checkpoint and the table as batch
    # 0 left them (it wrote no row)
    checkpoint = settings.checkpoint_path("gold", "windows_probe")
    assert checkpoints.committed_batches(checkpoint) == [0, 1]
    for log in ("offsets", "commits"):
        (checkpoint / log / "1").unlink()
        (checkpoint / log / ".1.crc").unlink(missing_ok=True)
    shutil.rmtree(store.path("gold.windows_probe"))
    assert checkpoints.plan_lost_no_data_batch(checkpoint, 0) == 1
    (checkpoint / "offsets" / "1").unlink()  # (planned by the runner's start below instead)

    reports = run_flows(spark, settings, [_windows_flow()], out=io.StringIO())
    assert [r.batches for r in reports] == [0]
    assert sorted(tuple(r) for r in store.read("gold.windows_probe").collect()) == expected
    assert checkpoints.committed_batches(checkpoint) == [0, 1]
