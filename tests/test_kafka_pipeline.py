"""Bronze on Kafka: records produced by ``lakehouse generate --sink kafka`` to a real broker,
read by the bronze flows, and every table of the lake equal to its reference."""

from __future__ import annotations

import io

import pytest

from lakehouse import generate as gen
from lakehouse.progress import Progress
from lakehouse.runner import declared_tables, run_layers
from lakehouse.status import read_table
from lakehouse.verify import run_verify

ALL_EQUAL = f"verify: all {len(declared_tables())} tables equal the reference"
SEED = 20261126


def _kafka_lake(settings, broker, prefix: str, partitions: int, max_offsets: int = 0):
    return settings.with_overrides(
        {
            "bronze.source": "kafka",
            "kafka.bootstrap_servers": broker.bootstrap,
            "kafka.topic_prefix": prefix,
            "kafka.partitions": partitions,
            "kafka.max_offsets_per_trigger": max_offsets,
        }
    )


def _produce(spark, lake, events: int = 600):
    params = gen.params_from_settings(lake, events=events, hours=1.0, users=20, seed=SEED)
    sink = gen.KafkaSink(
        lake.kafka.bootstrap_servers, lake.kafka.partitions, lake.kafka.topic_prefix
    )
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    return gen.generate(spark, lake.root, params, progress=quiet, sink=sink)


@pytest.mark.parametrize(("partitions", "max_offsets"), [(1, 0), (3, 0), (1, 250), (3, 250)])
def test_every_table_equals_its_reference_when_bronze_reads_kafka(
    spark, settings, kafka_broker, partitions, max_offsets
):
    lake = _kafka_lake(
        settings, kafka_broker, f"p{partitions}m{max_offsets}.", partitions, max_offsets
    )
    entry = _produce(spark, lake)
    books = entry["sources"]["events"]
    spans = books["kafka"]["offsets"]
    assert books["kafka"]["topic"] == f"p{partitions}m{max_offsets}.events"
    assert len(spans) == partitions
    assert sum(end - first for first, end in spans.values()) == books["lines"]

    reports = run_layers(spark, lake, ["bronze", "silver", "gold"], out=io.StringIO())
    bronze = {r.flow: r for r in reports if r.flow.startswith("bronze.")}
    assert bronze["bronze.events"].input_rows == books["lines"]
    if max_offsets:  # at most max_offsets records per micro-batch, over the partitions
        batches = bronze["bronze.events"].batches
        assert batches >= -(-books["lines"] // max_offsets)
    else:
        assert bronze["bronze.events"].batches == 1
    report = io.StringIO()
    assert run_verify(lake, report) == 0, report.getvalue()
    assert report.getvalue().splitlines()[-1] == ALL_EQUAL

    # lineage: each bronze row names its record's topic, partition, offset and time
    rows = read_table(lake, "bronze.events")
    places = rows["_source_file"].str.extract(r"^kafka:([^/]+)/(\d+)/(\d+)@\d{4}-\d\d-\d\dT")
    assert set(places[0]) == {f"p{partitions}m{max_offsets}.events"}
    assert len(set(zip(places[1], places[2], strict=True))) == len(rows)
