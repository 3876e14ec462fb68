import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse import jars as jars_module
from lakehouse.jars import (
    CLASS_ARCHIVE,
    DEFAULT_JARS_DIR,
    LOG4J_CONFIG,
    NativeJarsMissing,
    spark_submit_args,
)
from lakehouse.javacheck import JavaError, check_java
from lakehouse.session import ROCKSDB_PROVIDER, session_conf, worker_python
from lakehouse.tools.dist import Dist, driver_java_options


def test_session_conf_from_settings(settings):
    conf = session_conf(settings.with_overrides({"shuffle_partitions": 7}))
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert conf["spark.sql.streaming.join.stateFormatVersion"] == "3"
    hdfs = session_conf(settings.with_overrides({"state_store.provider": "hdfs"}))
    assert "spark.sql.streaming.join.stateFormatVersion" not in hdfs  # (RocksDB's only)


def test_driver_java_options_come_after_the_projects_log4j2_file(settings, tmp_path):
    log4j = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    (tmp_path / "delta.jar").touch()  # a jars folder without a class archive
    bare = settings.with_overrides({"native.jars_dir": str(tmp_path)})
    # the test profile's C1 alone, for the jobs and commands the tests start
    conf = session_conf(bare)
    assert conf["spark.driver.extraJavaOptions"] == f"{log4j} -XX:TieredStopAtLevel=1"
    none = bare.with_overrides({"driver_java_options": ""})
    assert session_conf(none)["spark.driver.extraJavaOptions"] == log4j
    two = bare.with_overrides({"driver_java_options": "-XX:+UseSerialGC -Xss4m"})
    assert spark_submit_args(two)[:2] == [
        "--driver-java-options",
        f"{log4j} -XX:+UseSerialGC -Xss4m",
    ]
    # with a class archive in the jars folder, the drivers map it, its warning silenced; not
    # a folder packed for other machines
    (tmp_path / CLASS_ARCHIVE).touch()
    mapped = f"-XX:SharedArchiveFile={tmp_path / CLASS_ARCHIVE} -Xlog:cds=off -Xlog:cds+dynamic=off"
    assert spark_submit_args(two)[1] == f"{log4j} {mapped} -XX:+UseSerialGC -Xss4m"
    assert session_conf(none)["spark.driver.extraJavaOptions"] == f"{log4j} {mapped}"
    packed = Dist(tmp_path / "dist")
    assert driver_java_options(packed, two) == (
        f"-Dlog4j2.configurationFile=file:{packed.log4j} -XX:+UseSerialGC -Xss4m"
    )


@pytest.mark.slow
def test_a_driver_loads_sparks_classes_from_the_archive_recorded_beside_the_jars(
    tmp_path, monkeypatch
):
    """``make class-archive`` records classes.jsa in the jars folder (lakehouse.class_archive); a
    command's driver then takes Spark's classes from it rather than from the jars, and says
    nothing of it. Recorded here by a short command, into a jars folder of the test's own."""
    from lakehouse.class_archive import build

    folder = tmp_path / "jars"
    folder.mkdir()
    for jar in DEFAULT_JARS_DIR.glob("*.jar"):
        (folder / jar.name).symlink_to(jar)
    monkeypatch.setenv("LAKEHOUSE_NATIVE__JARS_DIR", str(folder))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    build(folder / CLASS_ARCHIVE, [sys.executable, "-m", "lakehouse", "sql", "--root"]
          + [str(tmp_path / "recording"), "--profile", "test", "SELECT 1 AS one"])  # fmt: skip
    assert (folder / CLASS_ARCHIVE).is_file()
    assert not list(folder.glob("*.tmp")), "the partial archive is renamed, none left behind"
    loaded = tmp_path / "classes.log"
    result = subprocess.run(
        [sys.executable, "-m", "lakehouse", "sql", "--root", str(tmp_path / "lake")]
        + ["--profile", "test", "SELECT 6 * 7 AS answer"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "LAKEHOUSE_DRIVER_JAVA_OPTIONS": f"-Xlog:class+load=info:file={loaded}",
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "42" in result.stdout.split(), result.stdout
    assert "cds" not in result.stderr.lower() and "shared archive" not in result.stderr
    sources = {}
    for line in loaded.read_text().splitlines():
        match = re.search(r"\] (\S+) source: (.+)$", line)
        if match:
            sources[match[1]] = match[2]
    for name in ("org.apache.spark.SparkContext", "org.apache.spark.sql.SparkSession"):
        assert sources[name] == "shared objects file (top)", (name, sources.get(name))
    # of the classes read from files (not made at run time: lambdas, generated code), nearly
    # all came from the archive: not janino's (a signed jar, which Java does not archive), a
    # few of delta-spark's (loaded by Spark's own class loader) (13,336 of 13,878 with the
    # demo's archive)
    files = [s for s in sources.values() if s.startswith(("shared objects file", "jar:", "file:"))]
    shared = sum(source.startswith("shared objects file") for source in files)
    assert shared >= 0.9 * len(files), (shared, len(files))


@pytest.mark.parametrize(
    ("master", "given", "partitions"),
    [
        ("local[*]", 0, os.cpu_count()),
        ("local[3]", 0, 3),
        ("local[2, 4]", 0, 2),
        ("local", 0, 1),
        ("spark://127.0.0.1:7077", 0, 8),
        ("local[*]", 5, 5),
    ],
)
def test_shuffle_partitions_are_one_per_local_core_unless_given(
    settings, master, given, partitions
):
    chosen = settings.with_overrides({"master": master, "shuffle_partitions": given})
    assert chosen.partitions == partitions
    conf = session_conf(chosen)
    assert conf["spark.sql.shuffle.partitions"] == str(partitions)
    assert conf["spark.databricks.delta.snapshotPartitions"] == str(max(2, partitions))


def test_session_has_delta_spark(settings, tmp_path):
    conf = session_conf(settings)
    jars = conf["spark.jars"].split(",")
    assert jars == sorted(str(p) for p in DEFAULT_JARS_DIR.glob("*.jar"))
    assert any(Path(j).name == "delta-spark_4.2_2.13-4.4.0.jar" for j in jars)
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"] == (
        "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    )
    assert "spark.jars.packages" not in conf  # nothing is downloaded at start-up
    with pytest.raises(NativeJarsMissing, match="holds no jar") as err:
        session_conf(settings.with_overrides({"native.jars_dir": str(tmp_path)}))
    assert "\n" not in str(err.value)
    packages = settings.with_overrides(
        {"native.jars_packages": "io.delta:delta-spark_4.2_2.13:4.4.0"}
    )
    assert session_conf(packages)["spark.jars"] == conf["spark.jars"]  # the folder wins


def test_missing_jars_say_what_to_do(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(jars_module, "DEFAULT_JARS_DIR", tmp_path / "jars" / "lib")
    with pytest.raises(NativeJarsMissing) as err:
        session_conf(settings)
    message = str(err.value)
    assert "make setup" in message and "apt-get install maven" in message
    assert "native.jars_packages" in message and "\n" not in message
    # a machine without the jars may let Spark resolve them itself, if told to
    packages = settings.with_overrides(
        {"native.jars_packages": "io.delta:delta-spark_4.2_2.13:4.4.0"}
    )
    assert session_conf(packages)["spark.jars.packages"] == "io.delta:delta-spark_4.2_2.13:4.4.0"


def test_a_cli_command_without_jars_is_one_line(tmp_path, capsys):
    from lakehouse.cli import main

    code = main(
        ["sql", "SELECT 1", "--root", str(tmp_path), "--conf", f"native.jars_dir={tmp_path}"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("lakehouse: error: setting 'native.jars_dir' points to") and "\n" not in err
    )


def test_live_session_settings(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass") == ROCKSDB_PROVIDER


def test_a_plan_seen_before_is_not_compiled_again_after_a_hundred_others(spark, spark_conf):
    """Spark's cache of generated classes holds 1,000 (its default, 100, made gold's flows
    compile their plans again and again): a query run again after 120 others that generate
    code of their own finds its classes in the cache. (With code generation on, as in the
    project's sessions: the tests' session interprets, tests/conftest.py.)"""
    from pyspark.sql import functions as F

    with (
        spark_conf("spark.sql.codegen.wholeStage", "true"),
        spark_conf("spark.sql.codegen.factoryMode", "FALLBACK"),
    ):
        compiled = (
            spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
        )

        def run(i: int) -> int:  # (the literal is part of the generated code)
            return spark.range(3).select((F.col("id") * 1000 + F.lit(i)).alias("v")).collect()[2].v

        assert run(-1) == 1999
        before = compiled.getCount()
        assert [run(i) for i in range(120)] == [2000 + i for i in range(120)]
        assert compiled.getCount() >= before + 120  # each of them compiled its own class
        again = compiled.getCount()
        assert run(-1) == 1999
        assert compiled.getCount() == again


def _fake_java(tmp_path, version_line):
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


def test_old_or_missing_java_gives_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "JAVA_HOME", str(_fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15'))
    )
    with pytest.raises(JavaError) as err:
        check_java()
    assert "found Java 11" in str(err.value) and "openjdk-17" in str(err.value)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(JavaError, match="has no bin/java"):
        check_java()
    monkeypatch.setenv(
        "JAVA_HOME", str(_fake_java(tmp_path / "new", 'openjdk version "17.0.15" 2025-04-15'))
    )
    assert check_java().endswith(os.path.join("bin", "java"))


def test_the_workers_start_script_drops_only_this_installs_zips(tmp_path, monkeypatch):
    """Spark puts its pyspark and py4j zips first on a worker's PYTHONPATH: the start script
    drops those of this install (the same code, installed and compiled) and keeps every other
    entry as it is, spaces and glob characters included."""
    import pyspark

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    script = worker_python(sys.executable)
    assert Path(script).parent == tmp_path / "cache" / "lakehouse"
    assert worker_python(script) == script  # not wrapped twice
    other = str(tmp_path / "python3")  # another interpreter: its own pyspark, its own zips
    assert worker_python(other) == other
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(z) for z in lib.glob("*.zip"))
    assert len(zips) == 2, zips  # pyspark.zip and py4j's
    odd = str(tmp_path / "a b*")
    shown = "import os, pyspark; print(os.environ['PYTHONPATH']); print(pyspark.__file__)"
    result = subprocess.run(
        [script, "-c", shown],
        env={**os.environ, "PYTHONPATH": ":".join([*zips, odd, "/x"])},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == [f"{odd}:/x", pyspark.__file__]
