"""Where the JVM jars of the native backend are, for sessions, spark-submit and clusters.

``make setup`` fetches them once with Maven from ``jars/pom.xml`` into ``jars/lib`` (delta-spark
and Spark's Kafka connector, without what pyspark ships). Standard library only: the Airflow DAG
file imports this module from an environment that has no pyspark.
"""

from __future__ import annotations

from pathlib import Path

from lakehouse.settings import Settings, SettingsError

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_JARS_DIR = PROJECT_DIR / "jars" / "lib"
# a class only delta-spark has: its presence on a classpath means the jars are there
DELTA_CLASS = "io.delta.tables.DeltaTable"


class NativeJarsMissing(SettingsError):
    """The native backend was chosen and its jars are not where the settings say."""


def jars_dir(settings: Settings) -> Path:
    """The folder the settings point at (``native.jars_dir``, or the project's ``jars/lib``)."""
    return Path(settings.native.jars_dir) if settings.native.jars_dir else DEFAULT_JARS_DIR


def native_jars(settings: Settings) -> list[str]:
    """The jar files to put on the classpath, sorted; raises NativeJarsMissing when there are
    none (unless ``native.jars_packages`` lets Spark resolve them itself: then [])."""
    folder = jars_dir(settings)
    jars = sorted(str(p.absolute()) for p in folder.glob("*.jar"))
    if jars:
        return jars
    if settings.native.jars_packages and not settings.native.jars_dir:
        return []
    if settings.native.jars_dir:
        raise NativeJarsMissing(
            f"setting 'native.jars_dir' points to {folder}, which holds no jar; put the "
            "delta-spark jars there (mvn -f jars/pom.xml dependency:copy-dependencies "
            "-DoutputDirectory=DIR), or use the embedded backend (--backend embedded)"
        )
    raise NativeJarsMissing(
        f"the native Delta backend needs delta-spark's jars in {folder}, which has none: run "
        "`make setup` (it fetches them with Maven; install it first, e.g. `apt-get install "
        "maven`), or use the embedded backend (--backend embedded, or LAKEHOUSE_BACKEND=embedded)"
    )


# Spark's Kafka connector and what it needs, among the jars of jars/lib: the native backend
# loads all of them; the embedded one only these, when bronze reads Kafka
KAFKA_CONNECTOR = (
    "spark-sql-kafka-",
    "spark-token-provider-kafka-",
    "kafka-clients-",
    "commons-pool2-",
)


def kafka_connector_jars(settings: Settings) -> list[str]:
    """The jars of Spark's Kafka connector (for the embedded backend with ``bronze.source =
    "kafka"``; the native backend's jars include them)."""
    folder = jars_dir(settings)
    jars = sorted(
        str(p.absolute()) for p in folder.glob("*.jar") if p.name.startswith(KAFKA_CONNECTOR)
    )
    if len(jars) < len(KAFKA_CONNECTOR):
        raise NativeJarsMissing(
            f"bronze.source = kafka needs Spark's Kafka connector in {folder}, which lacks it: "
            "run `make setup` (it fetches it with Maven from jars/pom.xml)"
        )
    return jars


# Spark's logging for every JVM the project starts: warnings and errors only (sessions pass it
# to the driver they launch; spark-submit gets it from spark_submit_args)
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_submit_args(settings: Settings) -> list[str]:
    """What spark-submit needs to run a job of the project: the project's log4j2 file for the
    driver (spark-submit starts the JVM, with Spark's own INFO logging otherwise), and on the
    native backend ``--jars a.jar,b.jar`` (the driver and the executors load Delta from
    them)."""
    quiet = ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"]
    if settings.backend != "native":
        if settings.bronze.source == "kafka":
            return [*quiet, "--jars", ",".join(kafka_connector_jars(settings))]
        return quiet
    jars = native_jars(settings)
    if not jars:
        return [*quiet, "--packages", settings.native.jars_packages]
    return [*quiet, "--jars", ",".join(jars)]
