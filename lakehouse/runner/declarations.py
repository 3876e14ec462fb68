"""Finding the layers and the flows they declare, and the pipeline graph built from them."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lakehouse.flows import Flow, TableInput
from lakehouse.runner.errors import UnknownLayer

PIPELINE = ("bronze", "silver", "gold")


@functools.cache
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


@dataclass(frozen=True)
class PipelineGraph:
    """The declared pipeline: its flows in run order (layer by layer, each layer's in
    declaration order), the tables they write, the writers and readers of each table, and
    what is built from a table. The runner, refresh, maintain, verify, the report and the
    tests read it; :func:`pipeline` builds the lake's once per process, :meth:`of` one over
    any flows (no discovery, no Spark)."""

    flows: tuple[Flow, ...]

    @classmethod
    def of(cls, flows: Iterable[Flow]) -> PipelineGraph:
        flows = tuple(flows)
        names = [f.name for f in flows]
        if len(set(names)) != len(names):
            raise ValueError(f"a flow is declared twice: {names}")
        engines: dict[str, set[str]] = {}
        for flow in flows:
            for output in flow.outputs:
                engines.setdefault(output.table, set()).add(output.engine)
        for table, found in engines.items():
            if len(found) > 1:
                raise ValueError(
                    f"table {table} is declared with two engines ({', '.join(sorted(found))}): "
                    "a table is written by one"
                )
        return cls(flows)

    @property
    def layers(self) -> list[str]:
        """The layers that declare flows, in pipeline order."""
        return list(dict.fromkeys(f.layer for f in self.flows))

    def layer(self, layer: str) -> tuple[Flow, ...]:
        return tuple(f for f in self.flows if f.layer == layer)

    def flow(self, name: str) -> Flow:
        for flow in self.flows:
            if flow.name == name:
                return flow
        raise KeyError(f"no flow is named {name}")

    @property
    def tables(self) -> list[str]:
        """Every table the flows write, once each, in run order."""
        return list(dict.fromkeys(o.table for f in self.flows for o in f.outputs))

    def writers(self, table: str) -> list[Flow]:
        """The flows that write ``table`` (several for a shared table, the quarantines)."""
        return [f for f in self.flows if any(o.table == table for o in f.outputs)]

    def readers(self, table: str) -> list[Flow]:
        """The flows that read ``table`` as a stream."""
        return [
            f
            for f in self.flows
            if any(isinstance(i, TableInput) and i.table == table for i in f.inputs)
        ]

    def downstream(self, tables: Sequence[str]) -> list[str]:
        """The tables built, directly or not, from ``tables`` (not those themselves), nearest
        first."""
        found: list[str] = []
        frontier = set(tables)
        while frontier:
            readers = {r.name: r for t in frontier for r in self.readers(t)}.values()
            frontier = {o.table for f in readers for o in f.outputs} - set(tables) - set(found)
            found += sorted(frontier)
        return found


@functools.cache
def pipeline() -> PipelineGraph:
    """The lake's pipeline graph: every flow the layers' packages declare (built once)."""
    return PipelineGraph.of(f for layer in declared_layers() for f in layer_flows(layer))


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
    return pipeline().tables


def completeness_columns() -> dict[str, list[tuple[str, str]]]:
    """Per flow, the (table, column) of each output that declares its complete-through
    column (``Output.complete_by``)."""
    return {
        flow.name: [(o.table, o.complete_by) for o in flow.outputs if o.complete_by]
        for flow in pipeline().flows
        if any(o.complete_by for o in flow.outputs)
    }
