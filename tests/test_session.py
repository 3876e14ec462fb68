import os
import stat

import pytest

from lakehouse.javacheck import JavaError, check_java
from lakehouse.session import ROCKSDB_PROVIDER, session_conf
from lakehouse.settings import SettingsError


def test_session_conf_from_settings(settings):
    conf = session_conf(settings.with_overrides({"shuffle_partitions": 7}))
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert "spark.sql.extensions" not in conf  # embedded backend: no delta-spark


def test_native_backend_adds_delta_spark(settings, tmp_path):
    conf = session_conf(settings.with_overrides({"backend": "native"}))
    assert conf["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.4.1"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    with pytest.raises(SettingsError, match="holds no jar"):
        session_conf(
            settings.with_overrides({"backend": "native", "native.jars_dir": str(tmp_path)})
        )


def test_live_session_settings(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass") == ROCKSDB_PROVIDER


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
