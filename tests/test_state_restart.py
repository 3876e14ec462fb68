"""A flow restarted on a checkpoint whose state it cannot use fails with an error that names the
flow and the way out (a new checkpoint), not a stack trace from deep inside the state store."""

from __future__ import annotations

import io
import json

import pytest
from pyspark.sql import functions as F

from lakehouse.flows import Flow, LandingInput, Output
from lakehouse.runner import FlowFailed, run_flows

LINES = [
    {"id": "a", "n": 1, "t": "2026-01-05T10:00:00Z"},
    {"id": "b", "n": 2, "t": "2026-01-05T10:01:00Z"},
    {"id": "a", "n": 1, "t": "2026-01-05T10:00:00Z"},
]


def _flow(key: str) -> Flow:
    def transform(lines):
        rows = lines.select(F.from_json("value", "id string, n long, t timestamp").alias("r"))
        return (
            rows.select("r.*").withWatermark("t", "10 minutes").dropDuplicatesWithinWatermark([key])
        )

    return Flow(
        name="gold.restart_probe",
        inputs=(LandingInput("probe"),),
        transform=transform,
        outputs=(Output("gold.restart_probe"),),
    )


def test_a_changed_state_schema_names_the_flow_and_the_way_out(spark, settings, store):
    folder = settings.landing_path("probe")
    folder.mkdir(parents=True)
    (folder / "probe-000000.json").write_text("".join(json.dumps(r) + "\n" for r in LINES))
    run_flows(spark, settings, [_flow("id")], out=io.StringIO())
    assert sorted(store.read("gold.restart_probe").select("id").toPandas()["id"]) == ["a", "b"]

    # the deduplication key changes from id (a string) to n (a long): the state stored per id
    # cannot serve the new query
    (folder / "probe-000001.json").write_text(json.dumps(LINES[0] | {"id": "c"}) + "\n")
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
