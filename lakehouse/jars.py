"""Where the JVM jars the project needs (delta-spark, Spark's Kafka source, the JDBC server's
guard) are, for sessions, spark-submit and clusters.

``make setup`` fetches them once with Maven from ``jars/pom.xml`` into ``jars/lib`` (delta-spark
and Spark's Kafka connector, without what pyspark ships), and builds ``lakehouse-sql.jar`` there
from ``jars/sql`` (Java: the read-only guard and the login of ``lakehouse serve-sql``). Standard
library only: the Airflow DAG file imports this module from an environment that has no pyspark.
"""

from __future__ import annotations

from pathlib import Path

from lakehouse.settings import Settings, SettingsError

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_JARS_DIR = PROJECT_DIR / "jars" / "lib"
# a class only delta-spark has: its presence on a classpath means the jars are there
DELTA_CLASS = "io.delta.tables.DeltaTable"
# what jars/sql builds (mvn package), copied into the jars folder by make setup
SQL_JAR = "lakehouse-sql.jar"
# the driver JVM's class archive, recorded by make class-archive (lakehouse.class_archive)
CLASS_ARCHIVE = "classes.jsa"


class NativeJarsMissing(SettingsError):
    """delta-spark's jars are not where the settings say."""


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
            "-DoutputDirectory=DIR)"
        )
    raise NativeJarsMissing(
        f"the lake's tables need delta-spark's jars in {folder}, which has none: run "
        "`make setup` (it fetches them with Maven; install it first, e.g. `apt-get install "
        "maven`), or let Spark fetch them itself with native.jars_packages"
    )


def sql_jar(settings: Settings) -> Path:
    """``lakehouse-sql.jar`` in the jars folder; NativeJarsMissing when it is not there (the JDBC
    server does not start without its guard)."""
    jar = jars_dir(settings).absolute() / SQL_JAR
    if not jar.is_file():
        raise NativeJarsMissing(
            f"lakehouse serve-sql needs its read-only guard and login, {SQL_JAR}, in "
            f"{jar.parent}: run `make setup` (it builds jars/sql with Maven), or copy it there "
            "(mvn -f jars/sql/pom.xml package; jars/sql/target/lakehouse-sql.jar)"
        )
    return jar


# Spark's logging for every JVM the project starts: warnings and errors only (sessions pass it
# to the driver they launch; spark-submit gets it from spark_submit_args)
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def java_options(settings: Settings, log4j: Path, *, archive: bool = True) -> str:
    """The driver JVM's options: the project's log4j2 file ``log4j``, the class archive of the
    jars folder when there is one (and ``archive``: not for a folder packed for other machines),
    then the setting ``driver_java_options``.

    The archive (``make class-archive`` records it) holds the classes a driver loads, parsed and
    verified: mapped, it took ``lakehouse run --layer bronze`` on a small lake 22.5 s against
    31.3 s (medians of 3). A JVM that cannot use it (another Java or classpath) loads its
    classes as before; its one warning saying so is silenced (``-Xlog``), as the archive only
    makes a start faster."""
    options = [f"-Dlog4j2.configurationFile=file:{log4j}"]
    recorded = jars_dir(settings).absolute() / CLASS_ARCHIVE
    if archive and recorded.is_file():
        options += [f"-XX:SharedArchiveFile={recorded}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    return " ".join([*options, settings.driver_java_options]).strip()


def spark_submit_args(settings: Settings) -> list[str]:
    """What spark-submit needs to run a job of the project: the project's log4j2 file for the
    driver (spark-submit starts the JVM, with Spark's own INFO logging otherwise), and
    ``--jars a.jar,b.jar`` (the driver and the executors load Delta from them)."""
    quiet = ["--driver-java-options", java_options(settings, LOG4J_CONFIG)]
    jars = native_jars(settings)
    if not jars:
        return [*quiet, "--packages", settings.native.jars_packages]
    return [*quiet, "--jars", ",".join(jars)]
