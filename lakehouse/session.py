"""The one place a SparkSession is built. Jobs and tests call :func:`build_session`; nothing
creates a session at import time."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import IO, TYPE_CHECKING

from lakehouse.jars import LOG4J_CONFIG, NativeJarsMissing, java_options, native_jars
from lakehouse.javacheck import check_java
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FAIR_POOLS = Path(__file__).with_name("fairscheduler.xml")
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
QUIET_LEVELS = ("WARN", "ERROR", "FATAL", "OFF")  # the log levels that hide the chatter below
# What transformWithState's driver-side Python worker prints at every query start, although
# nothing is wrong (each line followed by an empty one); Spark copies it to the JVM's stderr.
WORKER_CHATTER = (
    "Starting Streaming TransformWithStateInPandas Python worker",
    "Streaming TransformWithStateInPandas Python worker ",
)
# source options Spark shows redacted, beside those of spark.redaction.regex
SPARK_REDACTED_OPTIONS = r"(?i)url|jaas|password|secret|token|credential|\.key$|keystore\.key"
# what the JVM prints at its start because Spark 4 adds the incubating vector module
JVM_CHATTER = ("WARNING: Using incubator modules: jdk.incubator.vector",)


def session_conf(settings: Settings, submitted: bool = False) -> dict[str, str]:
    """The Spark configuration the settings ask for (pure, so it can be tested without a JVM).
    ``submitted``: the JVM runs already (spark-submit), its classpath is what --jars gave."""
    store = settings.state_store
    conf = {
        "spark.app.name": settings.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.partitions),
        "spark.sql.streaming.stateStore.providerClass": (
            ROCKSDB_PROVIDER if store.provider == "rocksdb" else HDFS_PROVIDER
        ),
        "spark.sql.streaming.minBatchesToRetain": str(store.min_batches_to_retain),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # A JSON line with a repeated key must not fail a whole micro-batch with a duplicate
        # map key error in map functions (bronze reads the first value of a repeated key).
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        # Micro-batches cached for a moment (a flow writing several tables) are read back at
        # once: compressing the cache costs more time than the memory it saves.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # the runner's per-flow report reads the progress of every micro-batch of a run
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
        # A file source lists the files of a micro-batch in a Spark job of its own, a task per
        # file, above 32 files (bronze.clicks spent 5.6 s of its first batch of 1,373 lines so
        # on 102 files); on the driver that is a few milliseconds per hundred files
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "10000",
        # A union whose branches share one partitioning passes it on (Spark 4.2's default):
        # a silver flow's routed micro-batch is such a union (its branches read one shuffle),
        # and cached, each later read of it ran its stateful operators again (three times
        # the duplicates, and the state, of silver.events)
        "spark.sql.unionOutputPartitioning": "false",
        # Spark keeps the classes it generates for plans in a cache of 100 by default. The flows
        # of one process (gold's eight, re-planned every micro-batch) need more: each miss is a
        # Janino compile and a new class for the JIT to compile again (the test of gold against
        # its batch computation: 1,163 compiles taking 41 s with 100, 505 taking 19 s with 1,000
        # or 10,000). Read once, when the JVM's first session starts.
        "spark.sql.codegen.cache.maxEntries": "1000",
        # Delta wants INT64 microsecond timestamps in Parquet, not Spark's default INT96
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.enabled": str(settings.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_options(settings, LOG4J_CONFIG),
        # a pool of the fair scheduler per layer (lakehouse.runner.queries puts each flow's
        # jobs in its layer's)
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": fair_pools_file().as_uri(),
        # options of a source whose key or value matches are shown redacted in plans (an
        # error's, the UI's, the event log's): Spark's own (url; secret, password, token,
        # access key), and Kafka's client secrets (a JAAS config, a PEM key)
        "spark.sql.redaction.options.regex": SPARK_REDACTED_OPTIONS,
    }
    if store.provider == "rocksdb":
        conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = str(
            store.changelog_checkpointing
        ).lower()
        # A stream-stream join keeps its state in one RocksDB store per partition (column
        # families) instead of four (Spark's version 2): a fresh query's micro-batch opens,
        # loads and commits a quarter of the stores. A query keeps the version its checkpoint
        # recorded at its first batch, so a checkpoint written before goes on with version 2.
        conf["spark.sql.streaming.join.stateFormatVersion"] = "3"
    if settings.master.startswith("local"):
        # A single machine: keep the driver on loopback so a laptop's VPN cannot break it, and
        # run Python workers with this interpreter (the one that has the project installed).
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
    conf.update(delta_conf(settings, submitted))
    from lakehouse.s3conf import hadoop_conf

    conf.update(hadoop_conf(settings))
    conf.update(settings.spark_conf)
    return conf


def fair_pools_file() -> Path:
    """:data:`FAIR_POOLS` as a file Spark can open. Imported from a zip (spark-submit
    --py-files puts the code zip first on the driver's path) the package's file is inside the
    zip, where Spark cannot read it: then a copy in the temporary folder, named after its
    content."""
    if FAIR_POOLS.is_file():
        return FAIR_POOLS
    data = resources.files("lakehouse").joinpath(FAIR_POOLS.name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    copy = Path(tempfile.gettempdir()) / f"lakehouse-fairscheduler-{digest}.xml"
    if not copy.is_file():
        partial = copy.with_name(f".{copy.name}.{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, copy)
    return copy


WORKER_SCRIPT = """#!/bin/sh
# Written by lakehouse.session: Spark's Python workers on this machine, with this pyspark
# imported from its installed package, whose compiled modules Python keeps, rather than from
# the zips of the same install that Spark puts first on their PYTHONPATH, which Python
# compiles again at every worker's start (half a second of CPU each).
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {zips}) ;;
    *) kept=${{kept:+$kept:}}$entry ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""
# the interpreter each worker script runs (script -> interpreter), to undo it for a master
# whose workers run on other machines
_WRAPPED: dict[str, str] = {}


def worker_python(python: str) -> str:
    """The interpreter for Spark's Python workers on a local master: ``python`` behind a
    small script that drops from their PYTHONPATH the zips of this installed pyspark (and of
    py4j, when the installed one is the zip's version), the very code installed, which
    Python imports from a zip by compiling every module at each worker's start: about 6 s
    of CPU in a gold run of the demo. The script is kept in the user's cache folder, named
    after its content. ``python`` itself when it is another interpreter than this process's
    (its pyspark may not be this one), when there is nothing to drop, when it is such a
    script already, or when no script can be written."""
    import shlex
    import shutil
    from importlib import metadata

    import pyspark

    if python in _WRAPPED:
        return python
    found = shutil.which(python)
    if found is None or Path(found).absolute() != Path(sys.executable).absolute():
        return python
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [lib / "pyspark.zip"]
    with contextlib.suppress(metadata.PackageNotFoundError):
        zips.append(lib / f"py4j-{metadata.version('py4j')}-src.zip")
    # as Spark may name them: from SPARK_HOME, which can be the resolved folder
    names = sorted({str(p) for z in zips if z.is_file() for p in (z, z.resolve())})
    if not names:
        return python
    script = WORKER_SCRIPT.format(
        python=shlex.quote(python), zips="|".join(shlex.quote(name) for name in names)
    )
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    try:
        cache = os.environ.get("XDG_CACHE_HOME", "")
        folder = (Path(cache) if os.path.isabs(cache) else Path.home() / ".cache") / "lakehouse"
        path = folder / f"python-worker-{digest}"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(script)
            partial.chmod(0o755)
            os.replace(partial, path)
    except (OSError, RuntimeError):  # (RuntimeError: no home folder)
        return python
    _WRAPPED[str(path)] = python
    return str(path)


def delta_conf(settings: Settings, submitted: bool = False) -> dict[str, str]:
    """Classpath, extensions and catalog of delta-spark (and the jars of Spark's Kafka source). Under
    spark-submit the jars come with --jars (the job's code may come from a zip, with no jar
    folder beside it): a missing folder is then not an error here, and a JVM without Delta is
    reported by the table store in one line."""
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta rebuilds a table's snapshot with this many tasks (default 50): on tables of
        # a few hundred files that is 50 tasks of nothing per read and per commit
        "spark.databricks.delta.snapshotPartitions": str(max(2, settings.partitions)),
        # A checkpoint every 50 commits of a new table, not 10: each one rebuilds the table's
        # state and writes it (an append of a small micro-batch averaged 1.05 s with 10, 0.67 s
        # with 50); `lakehouse maintain` writes one of each table's latest version
        "spark.databricks.delta.properties.defaults.checkpointInterval": "50",
    }
    try:
        jars = native_jars(settings)
    except NativeJarsMissing:
        if submitted:
            return conf
        raise
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = settings.native.jars_packages
    return conf


def build_session(
    settings: Settings, app_name: str | None = None, extra_conf: dict[str, str] | None = None
) -> SparkSession:
    """Build (or return the active) SparkSession for these settings (plus ``extra_conf``, for
    what one command needs)."""
    check_java()
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM
    if submitted:
        settings = submitted_settings(settings)
    if settings.master.startswith("local"):
        # Spark's Python workers (data source planning among them) read this variable.
        os.environ["PYSPARK_PYTHON"] = worker_python(
            os.environ.get("PYSPARK_PYTHON", sys.executable)
        )
    elif os.environ.get("PYSPARK_PYTHON") in _WRAPPED:  # a script on this machine only
        os.environ["PYSPARK_PYTHON"] = _WRAPPED[os.environ["PYSPARK_PYTHON"]]
    from pyspark.sql import SparkSession

    conf = {
        **session_conf(settings, submitted),
        **(extra_conf or {}),
        "spark.master": settings.master,
    }
    if app_name:
        conf["spark.app.name"] = app_name
    quiet = settings.log_level.upper() in QUIET_LEVELS
    if quiet:
        # pandas' FutureWarnings from inside PySpark's own serializers, printed by every Python
        # worker (they inherit this from the JVM, which inherits it from here)
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    _launch_jvm_apart(conf, quiet)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.log_level)
    return spark


def submitted_settings(settings: Settings) -> Settings:
    """Under spark-submit, the settings with spark-submit's master (``--master``, which an
    Airflow connection holds, say): the session would otherwise replace it with the settings'.
    spark-submit gives one always (``local[*]`` when left out)."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()  # the gateway of spark-submit's JVM
    master = SparkContext._jvm.java.lang.System.getProperty("spark.master")
    if not master or master == settings.master:
        return settings
    return settings.with_overrides({"master": master})


def _launch_jvm_apart(conf: dict[str, str], quiet: bool = True) -> None:
    """Start Spark's JVM in a session (process group) of its own. PySpark starts it in this
    process's group, ignoring SIGINT in the JVM alone: the Python workers it forks turn SIGINT
    back on, so Ctrl-C in a terminal failed the tasks running in them, and a SIGTERM to the
    group (schedulers send it so) ended the JVM at once. Apart, only this process gets those
    signals, and the runner stops the flows between micro-batches. The JVM still ends with this
    process: it exits when its stdin, a pipe from here, closes. Nothing to do when the JVM runs
    already: a session built before, or ``spark-submit``, where the JVM is the parent.

    ``quiet``: the JVM's standard output is relayed to this process's without
    :data:`WORKER_CHATTER` (:func:`_relay`)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    spark_conf = SparkConf()
    for key, value in conf.items():
        spark_conf.set(key, value)
    # what SparkContext does with no gateway yet, plus the session of its own
    popen_kwargs: dict = {"start_new_session": True}
    if quiet:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    SparkContext._gateway = launch_gateway(spark_conf, popen_kwargs=popen_kwargs)
    SparkContext._jvm = SparkContext._gateway.jvm
    if quiet:
        process = SparkContext._gateway.proc
        for stream, fd in ((process.stdout, 1), (process.stderr, 2)):
            name = f"jvm-{'stdout' if fd == 1 else 'stderr'}"
            threading.Thread(target=_relay, args=(stream, fd), name=name, daemon=True).start()


def _relay(stream: IO[bytes], fd: int) -> None:
    """Copy one of the JVM's output streams to this process's (file descriptor ``fd``, where
    the JVM wrote before) line by line, without :data:`WORKER_CHATTER` and the empty line after
    each, and without :data:`JVM_CHATTER`. (Spark copies its Python workers' output to the
    JVM's standard error.)"""
    after_chatter = False
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        if text.startswith(WORKER_CHATTER):
            after_chatter = True
            continue
        if text.startswith(JVM_CHATTER):
            continue
        if after_chatter and not line.strip():
            after_chatter = False
            continue
        after_chatter = False
        with contextlib.suppress(OSError):  # a closed stdout: keep draining, or the JVM blocks
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]


@contextlib.contextmanager
def spark_session(settings: Settings, app_name: str, extra_conf: dict[str, str] | None = None):
    """The session for one command; stopped at the end when the command started it (so the
    last progress events reach their listeners before the process exits)."""
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None
    spark = build_session(settings, app_name=app_name, extra_conf=extra_conf)
    try:
        yield spark
    finally:
        if owned:
            spark.stop()


@contextlib.contextmanager
def spark_log_at(spark: SparkSession, level: str):
    """Spark's log at ``level`` for the block, then back at the level it had (for a step that
    makes Spark log warnings or errors although nothing failed)."""
    root = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    before = root.getLevel().toString()
    spark.sparkContext.setLogLevel(level)
    try:
        yield
    finally:
        spark.sparkContext.setLogLevel(before)
