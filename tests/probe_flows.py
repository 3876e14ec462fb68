"""Probe flows the runner tests share: one landing source ``probe`` into one gold table."""

from __future__ import annotations

import json
import subprocess
import sys

from lakehouse.flows import Flow, LandingInput, Output


def probe_flow(table: str, transform) -> Flow:
    """Flow ``table`` (``gold.<name>``): ``transform`` over the lines of ``landing/probe``."""
    return Flow(
        name=table, inputs=(LandingInput("probe"),), transform=transform, outputs=(Output(table),)
    )


def lock_holder(flow: str, checkpoint) -> subprocess.Popen:
    """Another process that holds ``flow``'s run lock (as a run of it does) until killed;
    returned once it holds it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pathlib import Path; from lakehouse.locks import flow_locks\n"
            f"with flow_locks([({flow!r}, Path({str(checkpoint)!r}))]):\n"
            "    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def write_probe(settings, records: list[dict], name: str = "probe-000000.json") -> None:
    """One landing file of ``probe``: a JSON line per record."""
    folder = settings.landing_path("probe")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
