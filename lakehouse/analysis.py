"""Every flow analysed without starting a query.

Spark analyses a streaming DataFrame (resolves its columns, checks its operators) when its
schema is asked for; no micro-batch runs. The flows are analysed in pipeline order on a scratch
lake: each flow's inputs are its upstream flows' tables, created empty from their declared
schemas, so a flow analyses whether or not the user's lake holds data yet, and the user's lake
is not touched.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.errors import LakehouseError
from lakehouse.flows import Flow, LandingInput
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


class FlowDoesNotAnalyse(LakehouseError, ValueError):
    """A flow's transform does not analyse over its inputs' schemas."""


@dataclass(frozen=True)
class AnalysedFlow:
    flow: Flow
    # per output table, the schema the transform gives it (after the output's ``rows``)
    outputs: dict[str, StructType]


def analyse_flows(
    spark: SparkSession, settings: Settings, flows: Sequence[Flow]
) -> list[AnalysedFlow]:
    """``flows`` (in pipeline order) analysed on a scratch lake; raises FlowDoesNotAnalyse,
    naming the flow, on the first one that does not."""
    from lakehouse.runner import flow_frame
    from lakehouse.storage import table_store

    with tempfile.TemporaryDirectory(prefix="lakehouse-analyse-") as scratch:
        lake = settings.with_overrides({"root": scratch})
        store = table_store(spark, lake)
        analysed = []
        for flow in flows:
            for source in flow.inputs:
                if isinstance(source, LandingInput):
                    lake.landing_path(source.source).mkdir(parents=True, exist_ok=True)
            checkpoint = Path(scratch) / "checkpoints" / flow.name
            try:
                frame = flow_frame(spark, store, lake, flow, checkpoint)
                outputs = {
                    o.table: (o.rows(frame) if o.rows else frame).schema for o in flow.outputs
                }
            except LakehouseError:
                raise
            except Exception as exc:  # Spark's AnalysisException, or the transform's own error
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise FlowDoesNotAnalyse(f"flow {flow.name} does not analyse: {first}") from exc
            for output in flow.outputs:
                schema = output.schema or outputs[output.table]
                if not store.exists(output.table):
                    store.create(output.table, schema, output.partition_by)
            analysed.append(AnalysedFlow(flow, outputs))
        return analysed


def schema_differences(declared: StructType, produced: StructType) -> list[str]:
    """How the schema a transform produces differs from the declared one: missing, extra or
    reordered columns, other types, or nulls in a column declared not null. Empty: they agree."""
    want = [(f.name, f.dataType.simpleString()) for f in declared.fields]
    have = [(f.name, f.dataType.simpleString()) for f in produced.fields]
    found = []
    if [n for n, _ in want] != [n for n, _ in have]:
        found.append(f"columns {[n for n, _ in have]}, declared {[n for n, _ in want]}")
    types = dict(have)
    for name, kind in want:
        if name in types and types[name] != kind:
            found.append(f"{name} is {types[name]}, declared {kind}")
    nullable = {f.name: f.nullable for f in produced.fields}
    for f in declared.fields:
        if not f.nullable and nullable.get(f.name):
            found.append(f"{f.name} may be null, declared not null")
    return found
