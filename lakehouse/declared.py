"""The tables each layer's flows write, as their declarations say
(:mod:`lakehouse.runner.declarations`), kept in ``declared_tables.json`` beside this module for
code that cannot import the declarations: they import pyspark, and the Airflow DAG file runs
where there is none (its gold task publishes each gold table as an Airflow asset).

``python -m lakehouse.declared`` writes the file again from the declarations; a test of the
default suite fails while the two differ. Standard library only.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

FILE = "declared_tables.json"


def layer_tables(layer: str) -> list[str]:
    """The tables the flows of ``layer`` write, in the declarations' order (from the file)."""
    data = json.loads(resources.files("lakehouse").joinpath(FILE).read_text())
    if layer not in data:
        raise ValueError(f"no layer {layer!r} in {FILE}: layers {', '.join(data)}")
    return list(data[layer])


def from_declarations() -> dict[str, list[str]]:
    """Per declared layer, the tables its flows write (imports the layers, so pyspark)."""
    from lakehouse.runner.declarations import PipelineGraph, pipeline

    graph = pipeline()
    return {layer: PipelineGraph.of(graph.layer(layer)).tables for layer in graph.layers}


def render(tables: dict[str, list[str]]) -> str:
    return json.dumps(tables, indent=2) + "\n"


def main() -> int:
    path = Path(__file__).with_name(FILE)
    path.write_text(render(from_declarations()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
