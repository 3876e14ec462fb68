"""Continuous mode from the command line: the flows run until Ctrl-C, then stop after their
micro-batch, print their report and record the run in ops.runs."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakehouse import generate as gen
from lakehouse.progress import Progress
from lakehouse.status import read_table


def test_ctrl_c_stops_the_flows_and_records_the_run(spark, settings):
    params = gen.params_from_settings(settings, events=400, hours=0.5, late_fraction=0.0)
    entry = gen.generate(
        spark, settings.root, params, progress=lambda label: Progress(label, io.StringIO())
    )
    expected = {source: entry["sources"][source]["bronze_rows"] for source in gen.SOURCES}
    command = [
        str(Path(sys.executable).with_name("lakehouse")),
        "run",
        "--root",
        str(settings.root),
        "--profile",
        "test",
        "--layer",
        "bronze",
        "--trigger",
        "continuous",
    ]
    with subprocess.Popen(
        command,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as run:
        deadline = time.monotonic() + 240
        while any(
            len(read_table(settings, f"bronze.{source}")) < rows
            for source, rows in expected.items()
        ):
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "bronze did not take in the landing files in 4 min"
            time.sleep(0.5)
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            out, err = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            raise AssertionError("the run did not stop within 2 minutes of Ctrl-C") from None
    assert run.returncode == 0, err[-3000:]
    assert "interrupted: stopping the flows after their current micro-batch" in err
    for source, rows in expected.items():
        assert f"bronze.{source}" in out
        assert len(read_table(settings, f"bronze.{source}")) == rows
    runs = read_table(settings, "ops.runs")
    assert sorted(zip(runs["flow"], runs["status"], strict=True)) == [
        ("bronze.clicks", "stopped"),
        ("bronze.events", "stopped"),
        ("bronze.impressions", "stopped"),
    ]
