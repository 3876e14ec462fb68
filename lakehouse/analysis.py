"""Every flow analysed without starting a query.

Spark analyses a streaming DataFrame (resolves its columns, checks its operators) when its
schema is asked for; no micro-batch runs. The flows are analysed in pipeline order on a scratch
lake: each flow's inputs are its upstream flows' tables, created empty from their declared
schemas, so a flow analyses whether or not the user's lake holds data yet, and the user's lake
is not touched.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lakehouse.errors import LakehouseError
from lakehouse.flows import Flow, LandingInput, TableInput
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse.storage import TableStore


class FlowDoesNotAnalyse(LakehouseError, ValueError):
    """A flow's transform does not analyse over its inputs' schemas."""


@dataclass(frozen=True)
class AnalysedFlow:
    flow: Flow
    # per output table, the schema the transform gives it (after the output's ``rows``)
    outputs: dict[str, StructType]
    # the query's watermarks and stateful operators, as read from its analysed plan
    operators: tuple[str, ...] = ()


def analyse_flows(
    spark: SparkSession, settings: Settings, flows: Sequence[Flow]
) -> list[AnalysedFlow]:
    """``flows`` (in pipeline order) analysed on a scratch lake; raises FlowDoesNotAnalyse,
    naming the flow, on the first one that does not."""
    from lakehouse.runner import flow_frame
    from lakehouse.storage import table_store
    from lakehouse.storage.streams import route_rows, with_batch_columns

    with tempfile.TemporaryDirectory(prefix="lakehouse-analyse-") as scratch:
        lake = settings.with_overrides({"root": scratch})
        store = table_store(spark, lake)
        analysed = []
        for flow in flows:
            for source in flow.inputs:
                if isinstance(source, LandingInput):
                    lake.landing_path(source.source).mkdir(parents=True, exist_ok=True)
            _seed(spark, settings, store, flow)
            checkpoint = Path(scratch) / "checkpoints" / flow.name
            try:
                frame = flow_frame(spark, store, lake, flow, checkpoint)
                if len(flow.outputs) > 1 or flow.outputs[0].rows:  # routed, as start_flow
                    batch = with_batch_columns(frame, 0, 0)
                    identity = lambda df: df  # noqa: E731
                    outputs = {
                        o.table: route_rows(o.rows or identity, batch).schema for o in flow.outputs
                    }
                else:
                    outputs = {flow.outputs[0].table: frame.schema}
            except LakehouseError:
                raise
            except Exception as exc:  # Spark's AnalysisException, or the transform's own error
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise FlowDoesNotAnalyse(f"flow {flow.name} does not analyse: {first}") from exc
            for output in flow.outputs:
                schema = output.schema or outputs[output.table]
                if not store.exists(output.table):
                    store.create(output.table, schema, output.partition_by, engine=output.engine)
            analysed.append(AnalysedFlow(flow, outputs, tuple(stateful_operators(frame))))
        return analysed


def _seed(spark: SparkSession, settings: Settings, scratch: TableStore, flow: Flow) -> None:
    """The flow's seed table (initial state), empty on the scratch lake with the schema it has
    on the user's lake."""
    from lakehouse.runner import MissingInput
    from lakehouse.storage import table_store

    seed = flow.seed_table(settings) if flow.seed_table else ""
    if not seed or scratch.exists(seed):
        return
    lake = table_store(spark, settings)
    if not lake.exists(seed):
        raise MissingInput(
            f"flow {flow.name}: its seed table {seed} does not exist at {lake.path(seed)}"
        )
    scratch.create(seed, lake.read(seed).schema)


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


# ---- the stateful operators of an analysed plan ---------------------------------------------

_ATTRIBUTE_ID = re.compile(r"#\d+L?(-T\d+ms)?")


def _name(expression) -> str:
    """An expression of the plan as a user wrote it: ``user_id#12L`` -> ``user_id``."""
    return _ATTRIBUTE_ID.sub("", expression.toString())


def _names(seq) -> str:
    return ", ".join(_name(seq.apply(i)) for i in range(seq.size())) or "(none)"


def _nodes(plan) -> Iterator:
    """The plan's nodes, leaves first (the order the rows flow through them)."""
    children = plan.children()
    for i in range(children.size()):
        yield from _nodes(children.apply(i))
    yield plan


_WATERMARK = re.compile(r"(?:[0-9a-f-]{36}, )?(\w+): \w+, (.+)$")
_UDF_ARGUMENTS = re.compile(r"^\w+\(([^)]*)\), (\d+),")
_TIME_MODE = re.compile(r", (EventTime|ProcessingTime|NoTime), ")


def _text(node) -> str:
    """A node's one-line description, with Spark's attribute ids left out."""
    return _ATTRIBUTE_ID.sub("", node.simpleString(25)).lstrip("~").removeprefix(node.nodeName())


def _describe(node) -> str | None:
    """One line for a watermark or a stateful operator; None for any other node."""
    kind = node.nodeName()
    text = _text(node).strip()
    if kind in ("EventTimeWatermark", "UpdateEventTimeWatermarkColumn"):
        found = _WATERMARK.search(text)
        where = " (on the rows the operator before it emits)" if kind.startswith("Update") else ""
        return f"watermark on {found[1]}, delay {found[2]}{where}" if found else f"watermark {text}"
    if not node.isStreaming():
        return None
    if kind == "Aggregate":
        return f"aggregation by {_names(node.groupingExpressions())}"
    if kind == "Deduplicate":
        return f"deduplication by {_names(node.keys())}"
    if kind == "DeduplicateWithinWatermark":
        return f"deduplication within the watermark by {_names(node.keys())}"
    if kind == "Join" and node.left().isStreaming() and node.right().isStreaming():
        return f"stream-stream join: {text}"
    if kind.startswith("TransformWithState"):
        arguments, mode = _UDF_ARGUMENTS.search(text), _TIME_MODE.search(text)
        keys = ", ".join(arguments[1].split(", ")[: int(arguments[2])]) if arguments else "?"
        return (
            f"transformWithState by {keys}, {mode[1] if mode else '?'} time mode "
            "(state: the processor's variables)"
        )
    if kind == "FlatMapGroupsInPandasWithState":
        return (
            f"applyInPandasWithState by {_names(node.groupingAttributes())}, "
            f"{node.timeout().toString()}"
        )
    return None


def stateful_operators(frame: DataFrame) -> list[str]:
    """The watermarks and stateful operators of a streaming DataFrame's analysed plan."""
    plan = frame._jdf.queryExecution().analyzed()
    return [line for line in (_describe(node) for node in _nodes(plan)) if line]


def _source(source: LandingInput | TableInput, settings: Settings) -> str:
    if isinstance(source, LandingInput) and settings.bronze.source == "kafka":
        topic = settings.topic(source.source)
        return f"Kafka topic {topic} at {settings.kafka.bootstrap_servers}"
    if isinstance(source, LandingInput):
        return f"landing files {settings.landing_path(source.source)}"
    return source.table


def print_flows(analysed: Sequence[AnalysedFlow], settings: Settings, out: TextIO) -> None:
    """The graph, flow by flow: what each reads and writes, how, its state and checkpoint."""
    for a in analysed:
        flow = a.flow
        mode = flow.modes
        rows = [
            ("reads", [_source(s, settings) for s in flow.inputs]),
            ("writes", [f"{', '.join(o.table for o in flow.outputs)} ({mode})"]),
            ("operators", list(a.operators) or ["none: each micro-batch stands alone"]),
            ("checkpoint", [str(settings.checkpoint_path(flow.layer, flow.flow))]),
        ]
        print(f"{flow.name}: {flow.description}" if flow.description else flow.name, file=out)
        for label, values in rows:
            for i, value in enumerate(values):
                print(f"  {label if i == 0 else '':11} {value}", file=out)
    print(f"{len(analysed)} flows analysed; no query was started", file=out)
