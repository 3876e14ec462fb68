"""Probe flows the runner tests share: one landing source ``probe`` into one gold table."""

from __future__ import annotations

import json

from lakehouse.flows import Flow, LandingInput, Output


def probe_flow(table: str, transform) -> Flow:
    """Flow ``table`` (``gold.<name>``): ``transform`` over the lines of ``landing/probe``."""
    return Flow(
        name=table, inputs=(LandingInput("probe"),), transform=transform, outputs=(Output(table),)
    )


def write_probe(settings, records: list[dict], name: str = "probe-000000.json") -> None:
    """One landing file of ``probe``: a JSON line per record."""
    folder = settings.landing_path("probe")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
