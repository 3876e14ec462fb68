"""One run per flow and lake: a second run of a running flow is refused before any query
starts, naming the flow, the process and since when; a run killed with kill -9 blocks nothing."""

from __future__ import annotations

import io
import re
import socket

import pytest
from probe_flows import lock_holder, probe_flow, write_probe
from pyspark.sql import functions as F

from lakehouse.locks import FlowRunning
from lakehouse.runner import run_flows


def _probe():
    def transform(lines):
        return lines.select(F.from_json("value", "id string").alias("r")).select("r.*")

    return probe_flow("gold.lock_probe", transform)


def test_a_second_run_is_refused_and_a_killed_run_blocks_nothing(spark, settings, store):
    write_probe(settings, [{"id": "a"}])
    checkpoint = settings.checkpoint_path("gold", "lock_probe")
    # another process runs the flow (holds its lock), until it is killed
    holder = lock_holder("gold.lock_probe", checkpoint)
    try:
        with pytest.raises(FlowRunning) as refused:
            run_flows(spark, settings, [_probe()], out=io.StringIO())
        assert re.fullmatch(
            rf"flow gold\.lock_probe is already running on this lake \(process {holder.pid} on "
            rf"{re.escape(socket.gethostname())}, since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC\); "
            r"wait for that run to end, or stop it, before starting another",
            str(refused.value),
        )
        assert spark.streams.active == []
        assert not store.exists("gold.lock_probe")  # no query started
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    run_flows(spark, settings, [_probe()], out=io.StringIO())
    assert [r.id for r in store.read("gold.lock_probe").collect()] == ["a"]
