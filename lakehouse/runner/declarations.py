"""Finding the layers and the flows they declare."""

from __future__ import annotations

import importlib
import pkgutil

from lakehouse.flows import Flow
from lakehouse.runner.errors import UnknownLayer

PIPELINE = ("bronze", "silver", "gold")


def layer_flows(layer: str) -> tuple[Flow, ...]:
    """The flows a layer declares: every module of the package ``<layer>`` (in name order)
    that declares a ``FLOW`` or ``FLOWS``, next to its transform."""
    if layer not in PIPELINE:
        raise UnknownLayer(f"unknown layer {layer!r}: use one of {', '.join(PIPELINE)} or all")
    try:
        package = importlib.import_module(layer)
    except ModuleNotFoundError as exc:
        if exc.name != layer:
            raise
        raise UnknownLayer(f"the {layer} layer has no package") from None
    flows: list[Flow] = []
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        declared = importlib.import_module(f"{layer}.{module.name}")
        flows += [declared.FLOW] if hasattr(declared, "FLOW") else getattr(declared, "FLOWS", ())
    if not flows:
        raise UnknownLayer(f"the {layer} layer declares no flows yet")
    names = [flow.name for flow in flows]
    if len(set(names)) != len(names):
        raise ValueError(f"the {layer} layer declares a flow twice: {names}")
    return tuple(flows)


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


def declared_tables() -> list[str]:
    """Every table the flows of the pipeline write, once each, in pipeline order."""
    tables = [o.table for layer in declared_layers() for f in layer_flows(layer) for o in f.outputs]
    return list(dict.fromkeys(tables))


def completeness_columns() -> dict[str, list[tuple[str, str]]]:
    """Per flow, the (table, column) of each output that declares its complete-through
    column (``Output.complete_by``)."""
    return {
        flow.name: [(o.table, o.complete_by) for o in flow.outputs if o.complete_by]
        for layer in declared_layers()
        for flow in layer_flows(layer)
        if any(o.complete_by for o in flow.outputs)
    }
