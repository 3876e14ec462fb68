"""Stopping ``lakehouse run``: on Ctrl-C or SIGTERM the flows finish the micro-batch they are
in, then stop, print their report and record the run in ops.runs. Continuous mode ends so; an
available-now run cut short says so and exits 130, without starting the next layers."""

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


def _generate(spark, settings, events: int) -> dict[str, int]:
    """Landing data; the bronze rows the generator's manifest expects per source."""
    params = gen.params_from_settings(settings, events=events, hours=0.5, late_fraction=0.0)
    entry = gen.generate(
        spark, settings.root, params, progress=lambda label: Progress(label, io.StringIO())
    )
    return {source: entry["sources"][source]["bronze_rows"] for source in gen.SOURCES}


def _start(settings, layer: str = "bronze", trigger: str = "continuous") -> subprocess.Popen:
    """``lakehouse run --layer LAYER --trigger TRIGGER`` in its own process group."""
    command = [
        str(Path(sys.executable).with_name("lakehouse")),
        "run",
        "--root",
        str(settings.root),
        "--profile",
        "test",
        "--layer",
        layer,
        "--trigger",
        trigger,
    ]
    return subprocess.Popen(
        command,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stopped(run: subprocess.Popen, sig: signal.Signals, group: bool) -> tuple[str, str]:
    """Send ``sig`` to the run's process group, or to the run's process alone; the run's output
    once it ended (2 minutes at most)."""
    (os.killpg if group else os.kill)(run.pid, sig)
    try:
        return run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        raise AssertionError(f"the run did not stop within 2 minutes of {sig.name}") from None


def _batches(settings, flow: str, log: str) -> list[int]:
    """The micro-batch ids in a bronze flow's checkpoint ``offsets`` or ``commits`` log."""
    folder = settings.checkpoint_path("bronze", flow) / log
    return sorted(int(p.name) for p in folder.glob("[0-9]*")) if folder.exists() else []


def test_ctrl_c_stops_the_flows_and_records_the_run(spark, settings):
    expected = _generate(spark, settings, events=400)
    with _start(settings) as run:
        deadline = time.monotonic() + 240
        while any(
            len(read_table(settings, f"bronze.{source}")) < rows
            for source, rows in expected.items()
        ):
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "bronze did not take in the landing files in 4 min"
            time.sleep(0.5)
        # what Ctrl-C in a terminal does: Spark's JVM ignores it, the flows stop
        out, err = _stopped(run, signal.SIGINT, group=True)
    assert run.returncode == 0, err[-3000:]
    assert "interrupted: stopping the flows after their current micro-batch" in err
    assert "Traceback" not in err, err[-3000:]
    for source, rows in expected.items():
        assert f"bronze.{source}" in out
        assert len(read_table(settings, f"bronze.{source}")) == rows
    runs = read_table(settings, "ops.runs")
    assert sorted(zip(runs["flow"], runs["status"], strict=True)) == [
        ("bronze.clicks", "stopped"),
        ("bronze.events", "stopped"),
        ("bronze.impressions", "stopped"),
    ]


def _stopped_in_first_batch(
    run: subprocess.Popen, settings, sig: signal.Signals, group: bool
) -> tuple[str, str]:
    """Send ``sig`` while bronze.events' first micro-batch (every landing file) runs."""
    deadline = time.monotonic() + 240
    while not _batches(settings, "events", "offsets"):  # batch 0 planned: it runs now
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "bronze.events did not start in 4 min"
        time.sleep(0.02)
    running = not _batches(settings, "events", "commits")
    out, err = _stopped(run, sig, group)
    assert running, "batch 0 ended before the signal: the test needs more landing data"
    return out, err


def test_sigterm_during_a_micro_batch_lets_it_commit(spark, settings):
    """What ``docker stop`` or ``kill`` sends, to the command's process (a SIGTERM to the whole
    group reaches Spark's JVM too, which stops at once): the micro-batch running when it comes
    is committed before the run stops."""
    expected = _generate(spark, settings, events=60_000)
    with _start(settings) as run:
        out, err = _stopped_in_first_batch(run, settings, signal.SIGTERM, group=False)
    assert run.returncode == 0, err[-3000:]
    assert "interrupted: stopping the flows after their current micro-batch" in err
    assert "Traceback" not in err, err[-3000:]
    assert _batches(settings, "events", "commits") == _batches(settings, "events", "offsets")
    assert len(read_table(settings, "bronze.events")) == expected["events"]
    # the flows after bronze.events were not started, or stopped between micro-batches
    for source in ("impressions", "clicks"):
        assert _batches(settings, source, "commits") == _batches(settings, source, "offsets")
    runs = read_table(settings, "ops.runs")
    assert dict(zip(runs["flow"], runs["status"], strict=True))["bronze.events"] == "stopped"
    assert set(runs["status"]) == {"stopped"}


def test_ctrl_c_cuts_an_available_now_run_short_after_the_micro_batch(spark, settings):
    expected = _generate(spark, settings, events=60_000)
    with _start(settings, layer="all", trigger="available-now") as run:
        out, err = _stopped_in_first_batch(run, settings, signal.SIGINT, group=True)
    assert run.returncode == 130, err[-3000:]
    assert "error: stopped before every flow was done" in err
    assert "Traceback" not in err, err[-3000:]
    assert _batches(settings, "events", "commits") == [0]
    assert len(read_table(settings, "bronze.events")) == expected["events"]
    assert not (settings.root / "checkpoints" / "silver").exists()  # the next layer never ran
    runs = read_table(settings, "ops.runs")
    assert set(runs["status"]) == {"stopped"}
    assert {flow.split(".")[0] for flow in runs["flow"]} == {"bronze"}
