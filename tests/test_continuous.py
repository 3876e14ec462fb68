"""Stopping ``lakehouse run``: on Ctrl-C or SIGTERM the flows finish the micro-batch they are
in, then stop, print their report and record the run in ops.runs. Continuous mode ends so; an
available-now run cut short says so and exits 130, without starting the next layers."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from lakehouse.ops.status import read_table
from lakehouse.progress import Progress
from lakehouse.proof import verify
from lakehouse.settings import load_settings
from lakehouse.tools import generate as gen

# `lakehouse run` in processes of their own, signalled: with the suites of separate processes
pytestmark = pytest.mark.e2e


def _generate(spark, settings, events: int) -> dict[str, int]:
    """Landing data; the bronze rows the generator's manifest expects per source."""
    params = gen.params_from_settings(settings, events=events, hours=0.5, late_fraction=0.0)
    entry = gen.generate(
        spark, settings.root, params, progress=lambda label: Progress(label, io.StringIO())
    )
    return {source: entry["sources"][source]["bronze_rows"] for source in gen.SOURCES}


@pytest.fixture(scope="module")
def large_landing(spark, tmp_path_factory):
    """60,000 events' landing files (bronze's first micro-batch then lasts long enough to be
    signalled), generated once for the tests that stop one; with the bronze rows expected."""
    settings = load_settings("test", overrides={"root": str(tmp_path_factory.mktemp("large"))})
    return settings.landing_path(), _generate(spark, settings, events=60_000)


def _copy_landing(large_landing, settings) -> dict[str, int]:
    """The landing files into the test's own lake (their times, which order them, kept)."""
    landing, expected = large_landing
    shutil.copytree(landing, settings.landing_path())
    return expected


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


def _stopped(run: subprocess.Popen, sig: signal.Signals) -> tuple[str, str]:
    """Send ``sig`` to the run's process group, as a terminal or a scheduler does; the run's
    output once it ended (2 minutes at most)."""
    os.killpg(run.pid, sig)
    try:
        return run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        raise AssertionError(f"the run did not stop within 2 minutes of {sig.name}") from None


def _batches(settings, flow: str, log: str) -> list[int]:
    """The micro-batch ids in the checkpoint's ``offsets`` or ``commits`` log of ``flow``
    (``layer.flow``)."""
    folder = settings.checkpoint_path(*flow.split(".")) / log
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
        out, err = _stopped(run, signal.SIGINT)  # what Ctrl-C in a terminal does
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
    run: subprocess.Popen, settings, sig: signal.Signals, flow: str = "bronze.events"
) -> tuple[str, str]:
    """Send ``sig`` to the run's process group while the first micro-batch of ``flow`` (every
    row of its input) runs."""
    deadline = time.monotonic() + 300
    while not _batches(settings, flow, "offsets"):  # batch 0 planned: it runs now
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{flow} did not start in 5 min"
        time.sleep(0.02)
    running = not _batches(settings, flow, "commits")
    out, err = _stopped(run, sig)
    assert running, "batch 0 ended before the signal: the test needs more landing data"
    return out, err


def test_sigterm_during_a_micro_batch_lets_it_commit(spark, settings, large_landing):
    """What a scheduler sends, to the command's process group (Spark's JVM and its Python
    workers run in a group of their own, so only the command gets it): the micro-batch running
    when it comes is committed before the run stops."""
    expected = _copy_landing(large_landing, settings)
    with _start(settings) as run:
        out, err = _stopped_in_first_batch(run, settings, signal.SIGTERM)
    assert run.returncode == 0, err[-3000:]
    assert "interrupted: stopping the flows after their current micro-batch" in err
    trace = min((i for i in (err.find("Traceback"), err.find("\tat ")) if i >= 0), default=-1)
    assert trace < 0, err[max(0, trace - 1500) : trace + 1500]  # (Python's nor Java's)
    assert "flow bronze.events: stopped with micro-batch 0 committed; " in err
    assert _batches(settings, "bronze.events", "commits") == [0]
    assert len(read_table(settings, "bronze.events")) == expected["events"]
    # the flows after bronze.events were not started, or stopped between micro-batches
    for flow in ("bronze.impressions", "bronze.clicks"):
        assert _batches(settings, flow, "commits") == _batches(settings, flow, "offsets")
    runs = read_table(settings, "ops.runs")
    assert dict(zip(runs["flow"], runs["status"], strict=True))["bronze.events"] == "stopped"
    assert set(runs["status"]) == {"stopped"}


def test_ctrl_c_cuts_an_available_now_run_short_after_the_micro_batch(
    spark, settings, large_landing
):
    """Ctrl-C while silver.events runs its first micro-batch lets the batch commit, exits 130
    and starts no gold flow."""
    _copy_landing(large_landing, settings)
    with _start(settings, layer="all", trigger="available-now") as run:
        out, err = _stopped_in_first_batch(run, settings, signal.SIGINT, flow="silver.events")
    assert run.returncode == 130, err[-3000:]
    assert "error: stopped before every flow was done" in err
    # a stateful flow begins a no-data micro-batch at once after the last: it is let finish
    # (a silver flow may then end by itself); no stack trace, one line per flow stopped
    trace = min((i for i in (err.find("Traceback"), err.find("\tat ")) if i >= 0), default=-1)
    assert trace < 0, err[max(0, trace - 1500) : trace + 1500]
    lines = [line for line in err.splitlines() if re.match(r"flow \S+: stopped", line)]
    for line in lines:
        assert re.fullmatch(
            r"flow silver\.\w+: stopped with micro-batch \d+ committed; (its next run goes on "
            r"from there|micro-batch \d+ had begun, and its next run repeats it)",
            line,
        ), line
    # each silver flow either stopped, and said so in one of those lines, or ended by itself
    status = dict(
        zip(*(read_table(settings, "ops.runs")[c] for c in ("flow", "status")), strict=True)
    )
    said = {line.split()[1].rstrip(":") for line in lines}
    assert {f: status[f] for f in ("silver.events", "silver.ad_attribution")} == {
        f: "stopped" if f in said else "succeeded"
        for f in ("silver.events", "silver.ad_attribution")
    }, (status, err[-3000:])
    assert _batches(settings, "silver.events", "commits")[0] == 0
    # silver.events against its reference from the landing lines, with its books (verify's own
    # check; the rest of verify would compute every gold table's reference, and gold never ran)
    bronze_events, _ = verify.bronze_reference(settings, "events")
    check = verify._events_check(settings, bronze_events, pd.Timestamp.now(tz="UTC"), False).check
    assert check.same, (check.missing[:3], check.unexpected[:3], check.differing[:3])
    assert check.found == check.expected
    assert not (settings.root / "checkpoints" / "gold").exists()  # the next layer never ran
    runs = read_table(settings, "ops.runs")
    assert sorted(zip(runs["flow"], runs["status"], strict=True))[:3] == [
        ("bronze.clicks", "succeeded"),
        ("bronze.events", "succeeded"),
        ("bronze.impressions", "succeeded"),
    ]
    assert set(runs["flow"]) <= {"bronze.events", "bronze.impressions", "bronze.clicks"} | {
        "silver.events",
        "silver.ad_attribution",
    }
