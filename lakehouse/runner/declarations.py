"""Finding the layers and the flows they declare."""

from __future__ import annotations

import importlib

from lakehouse.flows import Flow
from lakehouse.runner.errors import UnknownLayer

PIPELINE = ("bronze", "silver", "gold")


def layer_flows(layer: str) -> tuple[Flow, ...]:
    """The flows a layer declares (module ``<layer>.flows``, attribute ``FLOWS``)."""
    if layer not in PIPELINE:
        raise UnknownLayer(f"unknown layer {layer!r}: use one of {', '.join(PIPELINE)} or all")
    try:
        module = importlib.import_module(f"{layer}.flows")
    except ModuleNotFoundError as exc:
        if exc.name != f"{layer}.flows":
            raise
        raise UnknownLayer(f"the {layer} layer declares no flows yet") from None
    return tuple(module.FLOWS)


def declared_layers() -> list[str]:
    """The layers of the pipeline that declare flows, in pipeline order."""
    found = []
    for layer in PIPELINE:
        try:
            layer_flows(layer)
        except UnknownLayer:
            continue
        found.append(layer)
    return found
