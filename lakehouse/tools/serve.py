"""``lakehouse serve-sql``: the Spark Thrift JDBC/ODBC server (shipped with pyspark) over the
lake's catalog, for BI tools and ``beeline``, safe to hand to them:

- read-only: a JDBC connection may query the tables and views of the catalog, and SHOW,
  DESCRIBE, EXPLAIN and USE; anything else (INSERT, DELETE, CREATE, DROP, TRANSFORM ... USING,
  a file read by path, INSERT OVERWRITE DIRECTORY, ADD JAR, reflect(), ...) is refused with a
  message naming it. The guard is a Spark session extension of ``jars/sql``
  (``lakehouse.sql.ReadOnlyGuard``) in every session of the server but its own, which
  registers the tables;
- a login (user and password, checked against the password file ``sql.auth_file`` by
  ``lakehouse.sql.PasswordFileAuthenticator``) whenever it binds beyond loopback: without one it
  refuses to start, in one line, before Spark starts;
- a Spark session per connection (``spark.sql.hive.thriftServer.singleSession=false``): what
  one connection sets is not another's;
- the catalog is the lake's metastore (lakehouse.tools.catalog), which lasts across restarts: tables
  and the ``gold.<table>_final`` views registered once, and a table written after the start
  registered within ``sql.refresh_interval``.

It binds to ``sql.host`` (127.0.0.1 by default) and ``sql.port`` and serves until interrupted
(Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from lakehouse.jars import NativeJarsMissing, native_jars
from lakehouse.settings import Settings, duration_seconds
from lakehouse.tools import catalog

GUARD = "lakehouse.sql.ReadOnlyGuard"
AUTHENTICATOR = "lakehouse.sql.PasswordFileAuthenticator"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def server_conf(settings: Settings) -> dict[str, str]:
    """The Spark configuration of the server's driver, beyond a job's."""
    extensions = [
        name.strip()
        for name in settings.spark_conf.get("spark.sql.extensions", DELTA_EXTENSION).split(",")
        if name.strip() and name.strip() != GUARD
    ]
    conf = {
        # a session per JDBC connection (Spark's newSession(): the catalog is shared, what a
        # connection sets or creates for itself is not)
        "spark.sql.hive.thriftServer.singleSession": "false",
        # the Thrift server's own web UI page is not needed, and the UI is off by default
        "spark.sql.thriftServer.ui.retainedSessions": "0",
        # the read-only guard, in every session after Delta's extension
        "spark.sql.extensions": ",".join([*extensions, GUARD]),
        # no table named by a file path (text.`/etc/passwd`, delta.`/x`): the guard refuses a
        # connection that turns it back on
        "spark.sql.runSQLOnFiles": "false",
        # queries run as the server's user, whatever user name a client logs in with
        "spark.hadoop.hive.server2.enable.doAs": "false",
        **catalog.hive_conf(settings),
        # The Thrift server's HiveConf: in the Hadoop configuration from the JVM's start, not
        # only set on the session before the server starts: once the metastore client holds a
        # Hive session (registering the tables), the server reuses that session's HiveConf,
        # made before, and bound to port 10000 whatever sql.port said (and with no login)
        "spark.hadoop.hive.server2.thrift.port": str(settings.sql.port),
        "spark.hadoop.hive.server2.thrift.bind.host": settings.sql.host,
        "spark.hadoop.hive.server2.authentication": "CUSTOM" if settings.sql.auth_file else "NONE",
    }
    if settings.sql.auth_file:
        conf["spark.hadoop.hive.server2.custom.authentication.class"] = AUTHENTICATOR
    # The jars (delta-spark's, the guard's) on the driver's own classpath too, not only in
    # spark.jars' class loader: the Thrift server opens a connection's session in a thread of
    # its own, whose class loader is the JVM's, and there DeltaCatalog and the guard were not
    # found ("Cannot find catalog plugin class for catalog 'spark_catalog'": no connection).
    try:
        jars = native_jars(settings)
    except NativeJarsMissing:
        jars = []  # serve_sql says what to build before it gets here
    if jars:
        before = settings.spark_conf.get("spark.driver.extraClassPath", "")
        conf["spark.driver.extraClassPath"] = os.pathsep.join([*filter(None, [before]), *jars])
    return conf


def serve_sql(settings: Settings) -> int:
    from lakehouse.jars import sql_jar
    from lakehouse.session import spark_session
    from lakehouse.tools.sql import LakeCatalog, SqlError
    from lakehouse.tools.sqlauth import server_login

    login = server_login(settings)  # a server beyond loopback without a login stops here
    sql_jar(settings)
    interval = duration_seconds(settings.sql.refresh_interval)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    conf = server_conf(settings)
    with (
        catalog.held_by_server(settings),
        spark_session(settings, "lakehouse-sql-server", conf) as spark,
    ):
        jvm = spark._jvm
        catalog.prepare(spark, settings)
        guard = jvm.lakehouse.sql.ReadOnlyGuard
        guard.trust(spark._jsparkSession)  # this session registers the tables; no other may
        system = jvm.java.lang.System
        method = "NONE"
        if login is not None:
            # read by the login class at every login, from a fresh HiveConf: system properties
            system.setProperty("lakehouse.sql.passwords", str(login))
            system.setProperty("hive.server2.custom.authentication.class", AUTHENTICATOR)
            method = "CUSTOM"
        system.setProperty("hive.server2.authentication", method)
        guard.lockSystemProperties()  # no client may change them (set:system: in its URL)
        for key, value in {
            "hive.server2.thrift.port": str(settings.sql.port),
            "hive.server2.thrift.bind.host": settings.sql.host,
            "hive.server2.authentication": method,
        }.items():
            spark.conf.set(key, value)
        lake = LakeCatalog(spark, settings)
        warned: set[str] = set()

        def refresh() -> list[str]:
            try:
                return lake.refresh()
            except SqlError as exc:  # a table not registered: tried again at the next refresh
                if str(exc) not in warned:
                    warned.add(str(exc))
                    print(f"lakehouse: warning: {exc}", file=sys.stderr, flush=True)
                return []

        refresh()
        thrift = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
        server = thrift.startWithSparkSession(spark._jsparkSession, False)
        url = f"jdbc:hive2://{settings.sql.host}:{settings.sql.port}/"
        print(
            f"serving {len(lake.names())} tables and views of {settings.root} at {url} "
            f"({len(lake.written)} registered now, the others found in the catalog)",
            flush=True,
        )
        print(f"  catalog: {catalog.describe(settings)}", flush=True)
        if login is not None:
            print(f"  logins checked against {login} (sql.auth_file)", flush=True)
            hint = f"beeline -u {url} -n USER -w FILE_OF_THE_PASSWORD"
        else:
            print("  no login: loopback only (set sql.auth_file for one)", flush=True)
            hint = f"beeline -u {url}"
        print(f"  {hint} -e 'SHOW TABLES IN gold'   (Ctrl-C stops)", flush=True)
        try:
            due = time.monotonic() + interval
            while not stop.wait(0.5):  # a timed wait lets the signal handler run
                if time.monotonic() < due:
                    continue
                due = time.monotonic() + interval
                for name in refresh():
                    print(f"  serving {name} (new)", flush=True)
        finally:
            server.stop()
    print("stopped", file=sys.stderr)
    return 0
