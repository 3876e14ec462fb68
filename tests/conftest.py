"""One Spark session for the whole test run (local[2], 2 shuffle partitions, UTC, UI off, the
JIT's every tier, expressions interpreted)."""

from __future__ import annotations

import contextlib

import pytest

from lakehouse.settings import load_settings

# The tests' session evaluates expressions without generating code: on their rows (tens to
# thousands) Spark's code generation cost more than it saved. Generating the source and
# compiling it with Janino were about a fifth of this JVM's Java samples in a profile (Java
# Flight Recorder) of tests/test_gold.py, and that file's ten tests took 0.86 of their time
# without it (medians of two runs each; 0.94 with only whole-stage code generation off).
# The jobs and commands the tests start (spark-submit, the demo, the fault matrix, the
# cluster) keep Spark's defaults, which generate code, as the project's sessions do. A test of
# code generation itself sets these back (``spark_conf``).
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    # (Spark's own tests run their expressions both ways with this setting)
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from lakehouse.session import build_session

    # This one JVM lives the whole run: the JIT's top tier pays here, where the test profile's
    # C1 alone (for the short jobs and commands the tests start) made the suite 1.3 times slower
    overrides = {"root": str(tmp_path_factory.mktemp("lake")), "driver_java_options": ""}
    settings = load_settings("test", overrides=overrides)
    session = build_session(settings, app_name="lakehouse-tests", extra_conf=INTERPRETED)
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path):
    """Test-profile settings with a fresh lake root per test."""
    return load_settings("test", overrides={"root": str(tmp_path / "lake")})


@pytest.fixture
def store(spark, settings):
    from lakehouse.storage import table_store

    return table_store(spark, settings)


@pytest.fixture
def run_stream(store):
    """Stream table ``source`` into ``sink`` with availableNow until done; return the progress
    of the micro-batches that read rows."""

    def run(source, sink, checkpoint, max_files=None, **kwargs):
        query = store.write_stream(
            store.read_stream(source, max_files_per_trigger=max_files),
            sink,
            checkpoint,
            trigger={"availableNow": True},
            **kwargs,
        )
        query.awaitTermination()
        return [p for p in query.recentProgress if p["numInputRows"] > 0]

    return run


@pytest.fixture
def spark_conf(spark):
    """``with spark_conf(key, value):`` runs its block with the session's ``key`` set to
    ``value``, and sets it back after."""

    @contextlib.contextmanager
    def use(key: str, value: str):
        before = spark.conf.get(key)
        spark.conf.set(key, value)
        try:
            yield
        finally:
            spark.conf.set(key, before)

    return use


@pytest.fixture
def generated_code(spark_conf):
    """``with generated_code():`` runs its block with Spark's code generation (whole-stage and
    expressions), as the project's jobs run, instead of the session's :data:`INTERPRETED`: for
    the suite that checks every layer's results on the paths production takes."""

    @contextlib.contextmanager
    def on():
        with (
            spark_conf("spark.sql.codegen.wholeStage", "true"),
            spark_conf("spark.sql.codegen.factoryMode", "FALLBACK"),
        ):
            yield

    return on


@pytest.fixture
def shuffle_partitions(spark_conf):
    """``with shuffle_partitions(n):`` runs its block with ``n`` shuffle partitions."""
    return lambda n: spark_conf("spark.sql.shuffle.partitions", str(n))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Apache Kafka's broker (KRaft, from jars/kafka-lib) on a free loopback port for the whole
    run, started on first use and stopped at the end."""
    from lakehouse.tools import kafka
    from lakehouse.tools.processes import free_port

    broker = kafka.Broker(tmp_path_factory.mktemp("kafka"), free_port())
    kafka.start(broker)
    yield broker
    kafka.stop(broker)
