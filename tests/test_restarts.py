"""Continuous mode keeps flows apart: a flow whose query fails is started again alone, after
its delay, while the others run on; one that fails again and again stops for good with one
line, and the others still run on. ops.runs keeps a row per restarted attempt."""

from __future__ import annotations

import io
import threading
import time

from probe_flows import probe_flow, write_probe
from pyspark.sql import functions as F

from lakehouse.ops.status import read_table
from lakehouse.runner import run_flows
from lakehouse.runner.errors import FlowFailed
from lakehouse.runner.stopping import StopRequest

# the line of each probe's error the runner prints and records (Python's, from the UDF)
_ERROR_OF = {
    "flaky": "RuntimeError: flaky probe: failed once",
    "broken": "RuntimeError: broken probe: fails every time",
}


def _ids(lines):
    return lines.select(F.from_json("value", "id string").alias("r")).select("r.id")


def _failing(marker: str | None, message: str):
    """A transform whose Python UDF raises ``message``: once (and removes ``marker``) while
    ``marker`` exists, or always when ``marker`` is None."""

    def transform(lines):
        @F.udf("string")
        def check(value):
            import os

            if marker is None:
                raise RuntimeError(message)
            if os.path.exists(marker):
                os.remove(marker)
                raise RuntimeError(message)
            return value

        return _ids(lines).select(check("id").alias("id"))

    return transform


def test_a_failed_flow_restarts_alone_and_one_failing_for_good_stops_alone(
    spark, settings, store, tmp_path
):
    once = tmp_path / "fail-once"
    once.touch()
    write_probe(settings, [{"id": "a"}, {"id": "b"}])
    lake = settings.with_overrides(
        {
            "trigger.mode": "continuous",
            "trigger.interval": "1 second",
            "trigger.restarts": 1,
            "trigger.restart_delay": "1 second",
        }
    )
    flows = [
        probe_flow("gold.steady_probe", _ids),
        probe_flow("gold.flaky_probe", _failing(str(once), "flaky probe: failed once")),
        probe_flow("gold.broken_probe", _failing(None, "broken probe: fails every time")),
    ]
    out, stop, ended = io.StringIO(), StopRequest(), {}

    def run():
        try:
            ended["reports"] = run_flows(spark, lake, flows, out=out, stop=stop)
        except Exception as exc:
            ended["error"] = exc

    def rows(table):
        return sorted(r.id for r in store.read(table).collect()) if store.exists(table) else []

    runner = threading.Thread(target=run)
    runner.start()
    try:
        # until the broken flow gave up and the flaky one, started again, wrote its rows
        deadline = time.monotonic() + 300
        while runner.is_alive() and time.monotonic() < deadline:
            if "failed for good" in out.getvalue() and rows("gold.flaky_probe") == ["a", "b"]:
                break
            time.sleep(0.2)
        assert runner.is_alive(), (ended, out.getvalue())  # the steady flow ran on
        assert rows("gold.steady_probe") == ["a", "b"]
    finally:
        stop.signals += 1
        runner.join(timeout=300)
    assert not runner.is_alive()

    # the run ends with the broken flow's failure, once stopped
    assert isinstance(ended.get("error"), FlowFailed), ended
    assert str(ended["error"]).startswith("flow gold.broken_probe failed: ")
    said = out.getvalue().splitlines()
    restart = "starting it again alone in 1 s (1 of 1), the other flows run on"
    flaky = [line for line in said if line.startswith("flow gold.flaky_probe failed")]
    broken = [line for line in said if line.startswith("flow gold.broken_probe failed")]
    assert flaky == [f"flow gold.flaky_probe failed: {_ERROR_OF['flaky']}; {restart}"], said
    assert broken == [
        f"flow gold.broken_probe failed: {_ERROR_OF['broken']}; {restart}",
        f"flow gold.broken_probe failed for good after 1 restart(s): {_ERROR_OF['broken']}; "
        "the other flows run on",
    ], said
    assert rows("gold.broken_probe") == []

    runs = read_table(settings, "ops.runs").sort_values(["flow", "status"])
    assert list(zip(runs["flow"], runs["status"], strict=True)) == [
        ("gold.broken_probe", "failed"),
        ("gold.broken_probe", "restarted"),
        ("gold.flaky_probe", "restarted"),
        ("gold.flaky_probe", "stopped"),
        ("gold.steady_probe", "stopped"),
    ]
    restarted = runs[runs["status"] == "restarted"]
    assert restarted["error"].tolist() == [_ERROR_OF["broken"], _ERROR_OF["flaky"]]
