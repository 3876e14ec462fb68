"""Every declared flow analyses, and gives each output table the schema declared for it."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from lakehouse.analysis import FlowDoesNotAnalyse, analyse_flows, schema_differences
from lakehouse.flows import Flow, Output, TableInput
from lakehouse.proof.verify import Check, VerifyError, _every_table_checked
from lakehouse.runner import PipelineGraph, declared_tables, layer_flows, pipeline


def test_every_flow_analyses_and_produces_its_declared_schemas(spark, settings):
    flows = list(pipeline().flows)
    analysed = analyse_flows(spark, settings, flows)
    assert [a.flow.name for a in analysed] == [f.name for f in flows]
    differences = {
        (a.flow.name, o.table): schema_differences(o.schema, a.outputs[o.table])
        for a in analysed
        for o in a.flow.outputs
        if o.schema is not None
    }
    assert {k: v for k, v in differences.items() if v} == {}
    assert all(o.schema is not None for f in flows for o in f.outputs)


def test_schema_differences_name_each_kind():
    declared = T.StructType(
        [T.StructField("a", T.LongType(), False), T.StructField("b", T.StringType())]
    )
    assert schema_differences(declared, declared) == []
    produced = T.StructType(
        [T.StructField("a", T.IntegerType(), True), T.StructField("c", T.StringType())]
    )
    assert schema_differences(declared, produced) == [
        "columns ['a', 'c'], declared ['a', 'b']",
        "a is int, declared bigint",
        "a may be null, declared not null",
    ]


def test_a_flow_that_does_not_analyse_is_named_in_one_line(spark, settings):
    silver = [flow for layer in ("bronze", "silver") for flow in layer_flows(layer)]
    broken = Flow(
        name="gold.broken",
        inputs=(TableInput("silver.events"),),
        transform=lambda events: events.select("no_such_column"),
        outputs=(Output("gold.broken"),),
    )
    with pytest.raises(FlowDoesNotAnalyse) as caught:
        analyse_flows(spark, settings, [*silver, broken])
    message = str(caught.value)
    assert message.startswith("flow gold.broken does not analyse: [UNRESOLVED_COLUMN")
    assert "\n" not in message


def test_every_gold_table_declares_its_reference():
    """lakehouse verify and the streaming-equals-batch test compare the tables the gold flows
    declare, each with its declared reference: a table without one would go unchecked."""
    outputs = [o for flow in layer_flows("gold") for o in flow.outputs]
    assert [o.table for o in outputs if o.reference is None] == []
    for o in outputs:
        keys = set(o.reference.keys)
        assert keys <= {f.name for f in o.schema.fields}, o.table
        assert keys <= set(o.reference.columns or keys), o.table


def test_every_gold_table_declares_the_column_its_mark_closes():
    """ops.completeness records a mark for each gold table, over a column of its own that its
    flow's watermark closes: a table without one would have no complete-through mark."""
    outputs = [o for flow in layer_flows("gold") for o in flow.outputs]
    assert [o.table for o in outputs if o.complete_by is None] == []
    for o in outputs:
        assert o.complete_by in {f.name for f in o.schema.fields}, o.table
        assert str(o.schema[o.complete_by].dataType) == "TimestampType()", o.table


def test_a_table_several_flows_write_says_whose_rows_are_whose():
    """A full refresh replaces a flow's rows of a shared table (the quarantine tables,
    silver.late_events): each writer declares the column and value of its rows, one column per
    table, a value per writer."""
    graph = pipeline()
    shared = {
        table: [o.shared_by for f in graph.writers(table) for o in f.outputs if o.table == table]
        for table in graph.tables
        if len(graph.writers(table)) > 1
    }
    assert sorted(shared) == ["bronze.quarantine", "silver.late_events", "silver.quarantine"]
    for table, owners in shared.items():
        assert None not in owners, table
        assert len({column for column, _ in owners}) == 1, table
        assert len({value for _, value in owners}) == len(owners), table


def test_each_table_is_written_by_one_engine_its_declarations_name():
    """Every table of the lake is delta-rs's; an engine that is not one of the two, and a table
    whose writers name two (its commits are made through one engine's public API), are
    refused in one line naming the table."""
    graph = pipeline()
    engines = {
        table: {o.engine for f in graph.writers(table) for o in f.outputs if o.table == table}
        for table in graph.tables
    }
    assert {table: e for table, e in engines.items() if e != {"delta-rs"}} == {}
    with pytest.raises(ValueError) as err:
        Output("silver.x", engine="duckdb")
    assert str(err.value) == (
        "table silver.x: engine must be one of delta-rs, delta-spark; got 'duckdb'"
    )
    flows = [
        Flow(
            f"silver.{n}", (TableInput("bronze.x"),), lambda df: df, (Output("silver.x", engine=e),)
        )
        for n, e in (("a", "delta-rs"), ("b", "delta-spark"))
    ]
    with pytest.raises(ValueError) as err:
        PipelineGraph.of(flows)
    assert str(err.value) == (
        "table silver.x is declared with two engines (delta-rs, delta-spark): a table is "
        "written by one"
    )


def test_verify_refuses_to_pass_a_declared_table_it_does_not_check():
    """Bronze and silver tables are checked by verify's own code, not by a declared reference:
    a new one there without a check makes verify fail instead of calling every table equal."""
    checks = [Check(table, 0, 0) for table in declared_tables()]
    _every_table_checked(checks)
    left_out = [c for c in checks if c.table not in ("silver.quarantine", "bronze.clicks")]
    with pytest.raises(VerifyError) as error:
        _every_table_checked(left_out)
    assert str(error.value) == (
        "verify has no check for the declared table(s) bronze.clicks, silver.quarantine"
    )


def test_lakehouse_flows_prints_each_flow_with_its_state_and_starts_no_query(
    spark, settings, capsys
):
    from lakehouse.cli import main

    root = str(settings.root)
    assert main(["flows", "--root", root, "--profile", "test", "--layer", "gold"]) == 0
    assert spark.streams.active == []
    assert not (settings.root / "tables").exists()  # analysed on a scratch lake
    out = capsys.readouterr().out
    blocks = out.split("\ngold.")
    gold = len(layer_flows("gold"))
    assert len(blocks) == gold
    assert out.rstrip().endswith(f"{gold} flows analysed; no query was started")
    (custom,) = [b for b in blocks if b.startswith("sessions_custom:")]
    assert custom.splitlines()[1:] == [
        "  reads       silver.events",
        "  writes      gold.sessions_custom, gold.session_stats_hourly (append; "
        "gold.session_stats_hourly merged by hour_start)",
        "  operators   watermark on event_time, delay 10 minutes",
        "              transformWithState by bucket, EventTime time mode (state: the "
        "processor's variables)",
        f"  checkpoint  {root}/checkpoints/gold/sessions_custom",
    ]
    (hourly,) = [b for b in blocks if b.startswith("user_activity_hourly:")]
    assert hourly.splitlines()[3:5] == [
        "  operators   watermark on event_time, delay 10 minutes",
        "              aggregation by user_id, window",
    ]


def _flow(name, inputs, outputs):
    return Flow(
        name=name,
        inputs=tuple(TableInput(t) for t in inputs),
        transform=lambda *frames: frames[0],
        outputs=tuple(Output(t) for t in outputs),
    )


def test_the_pipeline_graph_knows_writers_readers_and_what_is_downstream():
    """A graph over declarations alone (no discovery, no Spark): a table two flows write, a
    chain of three layers, and one branch that does not depend on the rebuilt table."""
    graph = PipelineGraph.of(
        [
            _flow("bronze.a", [], ["bronze.a", "bronze.quarantine"]),
            _flow("bronze.b", [], ["bronze.b", "bronze.quarantine"]),
            _flow("silver.a", ["bronze.a"], ["silver.a"]),
            _flow("gold.a", ["silver.a"], ["gold.a"]),
            _flow("gold.b", ["bronze.b"], ["gold.b"]),
        ]
    )
    assert graph.layers == ["bronze", "silver", "gold"]
    assert [f.name for f in graph.layer("gold")] == ["gold.a", "gold.b"]
    assert graph.tables == [
        "bronze.a", "bronze.quarantine", "bronze.b", "silver.a", "gold.a", "gold.b"
    ]  # fmt: skip
    assert [f.name for f in graph.writers("bronze.quarantine")] == ["bronze.a", "bronze.b"]
    assert [f.name for f in graph.readers("bronze.a")] == ["silver.a"]
    assert graph.downstream(["bronze.a"]) == ["silver.a", "gold.a"]
    assert graph.downstream(["gold.b"]) == []
    assert graph.flow("gold.b").name == "gold.b"
    with pytest.raises(KeyError, match="no flow is named gold.c"):
        graph.flow("gold.c")
    with pytest.raises(ValueError, match="a flow is declared twice"):
        PipelineGraph.of([_flow("gold.a", [], ["gold.a"]), _flow("gold.a", [], ["gold.x"])])


def test_the_lakes_graph_is_every_layers_declarations_in_run_order():
    graph = pipeline()
    assert graph.flows == tuple(f for layer in graph.layers for f in layer_flows(layer))
    assert graph.tables == declared_tables()
    assert [f.name for f in graph.writers("silver.quarantine")] == [
        "silver.ad_attribution",
        "silver.events",
    ]
    assert graph.downstream(["silver.ad_attribution"]) == ["gold.ad_performance_hourly"]
