"""Every declared flow analyses, and gives each output table the schema declared for it."""

from __future__ import annotations

from pyspark.sql import types as T

from lakehouse.analysis import analyse_flows, schema_differences
from lakehouse.runner import declared_layers, layer_flows


def test_every_flow_analyses_and_produces_its_declared_schemas(spark, settings):
    flows = [flow for layer in declared_layers() for flow in layer_flows(layer)]
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
