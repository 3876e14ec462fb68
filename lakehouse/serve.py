"""``lakehouse serve-sql``: the Spark Thrift JDBC/ODBC server (shipped with pyspark) over the
lake's tables, for BI tools and ``beeline``.

The server runs inside this command's Spark driver, started on its session after every table
is registered under its ``layer.table`` name (:mod:`lakehouse.sql`). Every connection shares
that session (``spark.sql.hive.thriftServer.singleSession``), whose in-memory catalog holds
the registrations. It binds to ``sql.host`` (127.0.0.1 by default) and
``sql.port`` and serves until interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import signal
import sys
import threading

from lakehouse.settings import Settings

SERVER_CONF = {
    "spark.sql.hive.thriftServer.singleSession": "true",
    # the Thrift server's own web UI page is not needed, and the UI is off by default
    "spark.sql.thriftServer.ui.retainedSessions": "0",
}


def serve_sql(settings: Settings) -> int:
    from lakehouse.session import spark_session
    from lakehouse.sql import register_tables

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with spark_session(settings, "lakehouse-sql-server", SERVER_CONF) as spark:
        spark.conf.set("hive.server2.thrift.port", str(settings.sql.port))
        spark.conf.set("hive.server2.thrift.bind.host", settings.sql.host)
        tables = register_tables(spark, settings)
        thrift = spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
        server = thrift.startWithSparkSession(spark._jsparkSession, False)
        url = f"jdbc:hive2://{settings.sql.host}:{settings.sql.port}/"
        print(f"serving {len(tables)} tables and views of {settings.root} at {url}", flush=True)
        print(f"  beeline -u {url} -e 'SHOW TABLES IN gold'   (Ctrl-C stops)", flush=True)
        try:
            while not stop.wait(0.5):  # a timed wait lets the signal handler run
                pass
        finally:
            server.stop()
    print("stopped", file=sys.stderr)
    return 0
