"""Who may use the JDBC server, and on which catalog, checked without Spark: the login rule
(no server beyond loopback without a password file, refused in one line before Spark starts),
the password file lakehouse sql-passwd writes and the server's Java login reads, the server's
Spark configuration, and the lock of the embedded catalog."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse.cli import main
from lakehouse.jars import sql_jar
from lakehouse.settings import SettingsError, load_settings
from lakehouse.tools import catalog, sqlauth
from lakehouse.tools.serve import GUARD, server_conf

PROJECT = Path(__file__).resolve().parents[1]


def _settings(tmp_path, **sql):
    overrides = {"root": str(tmp_path / "lake"), **{f"sql.{k}": v for k, v in sql.items()}}
    return load_settings("test", overrides=overrides)


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("sql.example.com", False),
    ],
)
def test_loopback_addresses(host, loopback):
    assert sqlauth.is_loopback(host) is loopback


def test_no_login_on_loopback_only(tmp_path):
    assert sqlauth.server_login(_settings(tmp_path)) is None
    with pytest.raises(sqlauth.SqlAccessError) as refused:
        sqlauth.server_login(_settings(tmp_path, host="0.0.0.0"))
    message = str(refused.value)
    assert message.startswith("lakehouse serve-sql binds to 0.0.0.0, beyond loopback, where it")
    assert "sql.auth_file" in message and "\n" not in message


def test_a_password_file_the_server_cannot_use_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "none"
    with pytest.raises(sqlauth.SqlAccessError, match="cannot read .*none: No such file"):
        sqlauth.server_login(_settings(tmp_path, host="0.0.0.0", auth_file=str(missing)))
    plain = tmp_path / "plain"
    plain.write_text("# users\nanalyst:secret\n")
    with pytest.raises(sqlauth.SqlAccessError) as refused:
        sqlauth.server_login(_settings(tmp_path, auth_file=str(plain)))
    assert str(refused.value) == (
        f"setting 'sql.auth_file': {plain} line 2 is not user:pbkdf2_sha256$<iterations>$<salt>"
        "$<hash> (lakehouse sql-passwd writes such lines)"
    )
    empty = tmp_path / "empty"
    empty.write_text("# nobody yet\n")
    with pytest.raises(sqlauth.SqlAccessError, match="names no user"):
        sqlauth.server_login(_settings(tmp_path, host="0.0.0.0", auth_file=str(empty)))


def test_serve_sql_beyond_loopback_without_a_login_stops_before_spark(tmp_path):
    """One line, exit code 2, and no JVM started: the only java on the command's PATH and
    JAVA_HOME records every start, and none is recorded."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    started = tmp_path / "java-started"
    java.write_text(f'#!/bin/sh\necho "$@" >> {started}\nexit 1\n')
    java.chmod(0o755)
    env = {**os.environ, "JAVA_HOME": str(java.parents[1]),
           "PATH": f"{java.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "serve-sql", "--host", "0.0.0.0",
         "--root", str(tmp_path / "lake"), "--profile", "test"],
        capture_output=True, text=True, timeout=120, cwd=PROJECT, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "lakehouse: error: lakehouse serve-sql binds to 0.0.0.0, beyond loopback, where it needs "
        "a login: set sql.auth_file to a file of users and password hashes (lakehouse "
        "sql-passwd USER --file FILE writes one), or bind to 127.0.0.1"
    ]
    assert not started.exists()
    assert not (tmp_path / "lake" / "catalog").exists()


def _passwd(monkeypatch, capsys, *args, password="s3cret pässword"):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{password}\n"))
    code = main(["sql-passwd", *args, "--iterations", "1000"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sql_passwd_adds_changes_and_removes_users(tmp_path, monkeypatch, capsys):
    users = tmp_path / "secrets" / "sql_users"
    code, out, _ = _passwd(monkeypatch, capsys, "analyst", "--file", str(users))
    assert (code, out) == (0, f"user analyst added to {users}\n")
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    assert "pässword" not in users.read_text()
    _passwd(monkeypatch, capsys, "viewer", "--file", str(users), password="other one")
    found = sqlauth.read_users(users)
    assert sorted(found) == ["analyst", "viewer"]
    assert sqlauth.verify(found, "analyst", "s3cret pässword")
    assert not sqlauth.verify(found, "analyst", "other one")
    code, out, _ = _passwd(monkeypatch, capsys, "analyst", "--file", str(users), password="new")
    assert out == f"the password of analyst changed in {users}\n"
    assert sqlauth.verify(sqlauth.read_users(users), "analyst", "new")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["sql-passwd", "viewer", "--delete", "--file", str(users)]) == 0
    assert capsys.readouterr().out == f"user viewer removed from {users}\n"
    assert sorted(sqlauth.read_users(users)) == ["analyst"]


def test_sql_passwd_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    code, out, err = _passwd(monkeypatch, capsys, "analyst")
    assert (code, err) == (2, "lakehouse: error: give the password file: --file FILE, or set "
                              "sql.auth_file\n")  # fmt: skip
    users = str(tmp_path / "users")
    code, _, err = _passwd(monkeypatch, capsys, "analyst", "--file", users, password="")
    assert (code, err) == (2, "lakehouse: error: a password must not be empty\n")
    code, _, err = _passwd(monkeypatch, capsys, "an alyst", "--file", users)
    assert code == 2 and err.startswith("lakehouse: error: user name 'an alyst': use letters")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["sql-passwd", "nobody", "--delete", "--file", users]) == 2


def test_the_servers_java_login_accepts_what_sql_passwd_writes(tmp_path, monkeypatch, capsys):
    """lakehouse.sql.PasswordFile (the jar make setup builds) checks the file written here:
    the right password of each user, nobody else's, and UTF-8 passwords alike."""
    users = tmp_path / "users"
    _passwd(monkeypatch, capsys, "analyst", "--file", str(users), password="s3cret pässword")
    _passwd(monkeypatch, capsys, "viewer", "--file", str(users), password="x")
    jar = sql_jar(load_settings("test"))

    def login(user, password):
        return subprocess.run(
            ["java", "-cp", str(jar), "lakehouse.sql.PasswordFile", str(users), user],
            input=f"{password}\n", capture_output=True, text=True, timeout=60,
        ).returncode  # fmt: skip

    assert login("analyst", "s3cret pässword") == 0
    assert login("analyst", "s3cret password") == 1
    assert login("viewer", "x") == 0
    assert login("viewer", "s3cret pässword") == 1
    assert login("nobody", "x") == 1


def test_the_servers_spark_configuration(tmp_path):
    settings = _settings(tmp_path)
    conf = server_conf(settings)
    assert conf["spark.sql.extensions"] == f"io.delta.sql.DeltaSparkSessionExtension,{GUARD}"
    assert conf["spark.sql.hive.thriftServer.singleSession"] == "false"
    assert conf["spark.sql.runSQLOnFiles"] == "false"
    assert conf["spark.sql.catalogImplementation"] == "hive"
    folder = (tmp_path / "lake" / "catalog").absolute()
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"] == (
        f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true"
    )
    assert conf["spark.sql.warehouse.dir"] == str(folder / "warehouse")
    assert conf["spark.hadoop.hive.server2.thrift.port"] == "10000"
    assert conf["spark.hadoop.hive.server2.thrift.bind.host"] == "127.0.0.1"
    assert conf["spark.hadoop.hive.server2.authentication"] == "NONE"
    login = server_conf(_settings(tmp_path, host="0.0.0.0", port=10001, auth_file="/run/users"))
    assert login["spark.hadoop.hive.server2.thrift.port"] == "10001"
    assert login["spark.hadoop.hive.server2.thrift.bind.host"] == "0.0.0.0"
    assert login["spark.hadoop.hive.server2.authentication"] == "CUSTOM"
    assert login["spark.hadoop.hive.server2.custom.authentication.class"] == (
        "lakehouse.sql.PasswordFileAuthenticator"
    )
    # the jars on the JVM's own classpath: the Thrift server opens sessions in its threads
    classpath = conf["spark.driver.extraClassPath"].split(os.pathsep)
    assert str(sql_jar(settings)) in classpath
    assert any(Path(jar).name.startswith("delta-spark_") for jar in classpath)
    # a metastore of the cluster's: the settings' spark_conf or hive-site.xml say where
    external = load_settings(
        "test",
        overrides={
            "sql.metastore": "external",
            "spark_conf.spark.sql.extensions": "a.B,io.delta.sql.DeltaSparkSessionExtension",
        },
    )
    conf = server_conf(external)
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert not any(key.startswith("spark.hadoop.javax.jdo") for key in conf)
    assert "spark.sql.warehouse.dir" not in conf
    assert conf["spark.sql.extensions"] == f"a.B,io.delta.sql.DeltaSparkSessionExtension,{GUARD}"


def test_sql_settings_are_checked(tmp_path):
    with pytest.raises(SettingsError, match="'sql.metastore' must be one of embedded, external"):
        _settings(tmp_path, metastore="derby")
    with pytest.raises(SettingsError, match="'sql.refresh_interval'"):
        _settings(tmp_path, refresh_interval="often")
    assert _settings(tmp_path, catalog_dir=str(tmp_path / "cat")).sql.catalog_dir
    assert catalog.catalog_dir(_settings(tmp_path)) == (tmp_path / "lake" / "catalog").absolute()


def test_one_process_at_a_time_holds_the_embedded_catalog(tmp_path, monkeypatch):
    """The server holds it for good: another server is refused in one line, a lakehouse sql
    statement runs on a catalog of its own and says why; a lakehouse sql holds it for one
    statement: the server waits for it."""
    settings = _settings(tmp_path)
    with catalog.held_by_server(settings):
        with pytest.raises(catalog.CatalogBusy) as busy, catalog.held_by_server(settings):
            pass
        assert str(busy.value).startswith(
            f"the catalog in {catalog.catalog_dir(settings)} is held by lakehouse serve-sql "
            f"(process {os.getpid()} on "
        )
        with catalog.for_statement(settings) as elsewhere:
            assert elsewhere.startswith("the catalog is held by lakehouse serve-sql (process")
            assert elsewhere.endswith("registered in memory, and what it creates is not kept")
    with catalog.for_statement(settings) as elsewhere:
        assert elsewhere is None
        monkeypatch.setattr(catalog, "WAIT_SECONDS", 1.0)
        busy = pytest.raises(catalog.CatalogBusy, match="held by lakehouse sql")
        with busy, catalog.held_by_server(settings):
            pass
    with catalog.held_by_server(settings):  # free again
        pass
    external = load_settings("test", overrides={"sql.metastore": "external"})
    with catalog.held_by_server(external), catalog.for_statement(external) as elsewhere:
        assert elsewhere is None  # a metastore database: any number of processes
