"""``lakehouse serve-sql`` in its own process, with a login, and beeline (the JDBC client
pyspark ships) as the BI tool: the right password is served the example BI queries, a wrong
one is refused, every statement that would write, run a program or read a path is refused
with its message (and left nothing behind), each connection has a session of its own, and a
table written after the start is served, then found again in the catalog after a restart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sql_helpers import QUERIES, SESSIONS_PER_HOUR, TOP_ADS, beeline, write_gold

from lakehouse.settings import load_settings
from lakehouse.tools import sqlauth

pytestmark = pytest.mark.e2e

USER, PASSWORD = "analyst", "s3cret-Passw0rd"
STARTUP_SECONDS = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """lakehouse serve-sql on the lake ``root``, logins checked against ``users``, tables
    written after the start registered every second."""

    def __init__(self, root: Path, users: Path, log: Path):
        self.root, self.users, self.log = root, users, log
        self.port = _free_port()
        self.url = f"jdbc:hive2://127.0.0.1:{self.port}/"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> str:
        """Start it and wait until it serves; the lines it printed so far."""
        self.starts += 1
        log = self.log.with_suffix(f".{self.starts}.log")
        env = {
            **os.environ,
            # the password file from a setting (compose: a secret), never a command line
            "LAKEHOUSE_SQL__AUTH_FILE": str(self.users),
            "LAKEHOUSE_SQL__REFRESH_INTERVAL": "1 seconds",
        }
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "lakehouse.cli", "serve-sql", "--root", str(self.root),
                 "--profile", "test", "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_SECONDS
        try:
            while True:  # until it says it serves, and listens
                text = log.read_text()
                assert self.process.poll() is None, text[-3000:]
                # the Thrift server binds in a thread of its own: the line may come first
                if "(Ctrl-C stops)" in text and _listens(self.port):
                    return text
                assert time.monotonic() < deadline, f"not serving in {STARTUP_SECONDS} s: {text}"
                time.sleep(1)
        except BaseException:
            self.process.kill()  # no server left behind by a failed start
            self.process.wait()
            raise

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            assert self.process.wait(timeout=120) == 0
        self.process = None

    def run(self, *args: str, password: str = PASSWORD, user: str = USER):
        """beeline, logged in as ``user`` with ``password`` (from a file: never on a command
        line, here either)."""
        secret = self.log.parent / "beeline-password"
        secret.write_text(password)
        return beeline(self.url, *args, user=user, password_file=secret)

    def query(self, sql: str) -> list[str]:
        done = self.run("-e", sql)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.rows


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    from lakehouse.storage import table_store

    folder = tmp_path_factory.mktemp("served")
    settings = load_settings("test", overrides={"root": str(folder / "lake")})
    write_gold(spark, table_store(spark, settings), settings)
    return settings


@pytest.fixture(scope="module")
def server(lake):
    folder = Path(lake.root).parent
    users = folder / "secrets" / "sql_users"
    sqlauth.set_user(users, USER, PASSWORD, iterations=1000)
    sqlauth.set_user(users, "viewer", "another-one", iterations=1000)
    served = Server(Path(lake.root), users, folder / "server")
    served.first_lines = served.start()
    try:
        yield served
    finally:
        served.stop()


def test_the_server_says_where_and_how_it_serves(server):
    lines = server.first_lines
    # 3 tables and the final views of the two gold tables, all new to the catalog
    assert f"serving 5 tables and views of {server.root} at jdbc:hive2://127.0.0.1:" in lines
    assert "(5 registered now, the others found in the catalog)" in lines
    assert f"  logins checked against {server.users} (sql.auth_file)" in lines
    assert PASSWORD not in lines


def test_the_right_password_is_served_the_example_queries(server):
    done = server.run("-f", str(QUERIES / "top_ads_by_ctr_per_hour.sql"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.rows == TOP_ADS
    done = server.run("-f", str(QUERIES / "sessions_per_hour.sql"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.rows == SESSIONS_PER_HOUR
    assert server.query("SHOW TABLES IN gold") == [
        "namespace,tableName,isTemporary",
        "gold,ad_performance_hourly,false",
        "gold,ad_performance_hourly_final,false",
        "gold,sessions,false",
        "gold,sessions_final,false",
    ]


@pytest.mark.parametrize(
    "user, password",
    [(USER, "s3cret-Passw0rd!"), (USER, "another-one"), ("nobody", PASSWORD), (USER, "")],
    ids=["wrong-password", "another-users-password", "unknown-user", "no-password"],
)
def test_a_wrong_login_is_refused(server, user, password):
    done = server.run("-e", "SELECT count(*) FROM gold.sessions", user=user, password=password)
    assert done.returncode != 0
    assert done.rows == []
    assert "Error validating the login" in done.stderr, done.stderr[-2000:]


def test_each_forbidden_statement_is_refused_and_changes_nothing(server, tmp_path):
    outside = tmp_path / "outside"
    ran = tmp_path / "ran"
    secret = tmp_path / "not-in-the-catalog.txt"
    secret.write_text("a file of the server's machine\n")
    read_only = (
        "is not allowed: this JDBC server is read-only (queries, SHOW, DESCRIBE, EXPLAIN, USE)"
    )
    by_path = "reading files by path is not allowed; query the tables of the catalog (SHOW TABLES IN gold)"
    statements = {  # each statement, and the refusal the client gets
        "DELETE FROM gold.sessions WHERE true": f"DELETE {read_only}",
        "UPDATE gold.sessions SET revenue = 0": f"UPDATE {read_only}",
        "MERGE INTO gold.sessions t USING gold.sessions s ON t.user_id = s.user_id "
        "WHEN MATCHED THEN DELETE": f"MERGE {read_only}",
        "INSERT INTO gold.sessions SELECT * FROM gold.sessions": f"INSERT {read_only}",
        f"INSERT OVERWRITE DIRECTORY '{outside}' USING parquet SELECT 1 AS a": (
            f"INSERT OVERWRITE DIRECTORY {read_only}"
        ),
        "CREATE TABLE gold.mine (a INT) USING delta": f"CREATE {read_only}",
        "CREATE VIEW gold.mine AS SELECT 1 AS a": f"CREATE {read_only}",
        "DROP TABLE gold.sessions": f"DROP {read_only}",
        "ALTER TABLE gold.sessions RENAME TO gold.gone": f"ALTER ... RENAME {read_only}",
        "TRUNCATE TABLE gold.sessions": f"TRUNCATE {read_only}",
        f"SELECT TRANSFORM('x') USING 'touch {ran}' AS (o)": (
            "TRANSFORM ... USING is not allowed: it runs a program on the server"
        ),
        f"SELECT * FROM text.`{secret}`": f"{secret}: {by_path}",
        f"SELECT * FROM delta.`{server.root}/gold/sessions`": (
            f"{server.root}/gold/sessions: {by_path}"
        ),
        "SELECT java_method('java.lang.System', 'getProperty', 'user.home')": (
            "reflect()/java_method() call Java methods on the server: not allowed on this server"
        ),
        "SET spark.sql.runSQLOnFiles=true": (
            "SET spark.sql.runSQLOnFiles is not allowed: on this server a connection may set "
            "only spark.sql.ansi.enabled and spark.sql.session.timeZone"
        ),
        f"ADD JAR {tmp_path}/x.jar": f"ADD JAR {read_only}",
    }
    script = tmp_path / "forbidden.sql"
    script.write_text("".join(f"{sql};\n" for sql in statements))
    done = server.run("--force=true", "-f", str(script))
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    prefix = "Error: org.apache.hive.service.cli.HiveSQLException: Error running query: "
    assert errors == [f"{prefix}[LAKEHOUSE_READ_ONLY] {why}" for why in statements.values()], (
        done.stderr[-4000:]
    )
    assert done.rows == []
    # nothing written, run or read
    assert not outside.exists()
    assert not ran.exists()
    assert server.query("SELECT count(*) FROM gold.sessions") == ["count(1)", "3"]
    assert server.query("SHOW TABLES IN gold LIKE 'mine|gone'") == [
        "namespace,tableName,isTemporary"
    ]


def test_a_session_per_connection(server):
    """What one connection sets is its own: the next connection has the server's setting."""
    done = server.run(
        "-e", "SET spark.sql.session.timeZone=America/New_York",
        "-e", "SELECT current_timezone() AS tz",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.rows[-2:] == ["tz", "America/New_York"]
    assert server.query("SELECT current_timezone() AS tz") == ["tz", "UTC"]


def test_a_table_written_after_the_start_is_served_and_kept_across_a_restart(server, lake, spark):
    from sql_helpers import at

    from gold.sessions import SCHEMA as SESSIONS_SCHEMA
    from lakehouse.storage import table_store

    rows = [(7, at(12, 5), at(12, 35), 1, 0, 0.0)]
    table_store(spark, lake).write(spark.createDataFrame(rows, SESSIONS_SCHEMA), "gold.late")
    deadline = time.monotonic() + 60
    while True:  # registered at the server's next refresh (every second here)
        done = server.run("-e", "SELECT user_id FROM gold.late")
        if done.returncode == 0:
            break
        assert time.monotonic() < deadline, done.stderr[-2000:]
        time.sleep(2)
    assert done.rows == ["user_id", "7"]
    server.stop()
    lines = server.start()
    # the catalog kept every table and view: none written again
    assert "serving 6 tables and views" in lines
    assert "(0 registered now, the others found in the catalog)" in lines
    assert server.query("SELECT user_id FROM gold.late") == ["user_id", "7"]
    assert server.query("SELECT count(*) FROM gold.sessions_final") == ["count(1)", "2"]
