"""The catalog SQL sees the lake through: every Delta table as ``layer.table`` and the views
``gold.<table>_final``, kept in a Hive metastore that lasts across restarts and that ``lakehouse
serve-sql`` and ``lakehouse sql`` share.

Where it lives (setting ``sql.metastore``):

- ``embedded`` (default): a Derby database under ``sql.catalog_dir`` (``<root>/catalog``:
  ``metastore_db/``, ``warehouse/``, ``derby.log``), which needs no server of its own. Derby
  lets one process open it at a time, so the process that uses it holds ``catalog.lock`` there
  (an ``flock``, released by the operating system however the process ends): the JDBC server
  for as long as it runs; ``lakehouse sql`` for one statement, or, while the server holds it, a
  catalog of its own in memory (it registers the tables itself, and says so).
- ``external``: the metastore ``spark_conf`` (``spark.hadoop.javax.jdo.option.*``,
  ``spark.hadoop.hive.metastore.uris``) or a ``hive-site.xml`` on Spark's classpath names: a
  metastore database or service a cluster shares, open to any number of processes.

Jobs never open it: a flow's tables are folders of the lake, and the processes that serve SQL
register what the lake holds (the server also every ``sql.refresh_interval``), once: a table
registered at its location already is left as it is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.errors import LakehouseError
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCK_NAME = "catalog.lock"
SERVER = "serve-sql"
# how long a command waits for another one to let go of the embedded catalog
WAIT_SECONDS = 120.0


class CatalogBusy(LakehouseError, RuntimeError):
    """Another process holds the embedded catalog."""


def catalog_dir(settings: Settings) -> Path:
    """The embedded catalog's folder: ``sql.catalog_dir``, or ``<root>/catalog``."""
    folder = (
        Path(settings.sql.catalog_dir) if settings.sql.catalog_dir else settings.root / "catalog"
    )
    return folder.absolute()


def embedded(settings: Settings) -> bool:
    return settings.sql.metastore == "embedded"


def hive_conf(settings: Settings) -> dict[str, str]:
    """The Spark configuration of a session whose catalog is the lake's metastore."""
    conf = {
        "spark.sql.catalogImplementation": "hive",
        # each Delta table's schema is written to its catalog entry too: JDBC clients list a
        # table's columns from there (DBeaver's tree, getColumns), not from the Delta log
        "spark.databricks.delta.catalog.update.enabled": "true",
    }
    if embedded(settings):
        folder = catalog_dir(settings)
        conf["spark.sql.warehouse.dir"] = str(folder / "warehouse")
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true"
        )
    return conf


def describe(settings: Settings) -> str:
    if embedded(settings):
        return f"a Derby database in {catalog_dir(settings)} (sql.metastore = embedded)"
    return "the metastore spark_conf or hive-site.xml name (sql.metastore = external)"


def prepare(spark: SparkSession, settings: Settings) -> None:
    """Before the session's catalog is first used: Derby's log into the catalog's folder (not
    the working directory)."""
    if embedded(settings):
        folder = catalog_dir(settings)
        folder.mkdir(parents=True, exist_ok=True)
        system = spark._jvm.java.lang.System
        system.setProperty("derby.stream.error.file", str(folder / "derby.log"))


@contextlib.contextmanager
def held_by_server(settings: Settings) -> Iterator[None]:
    """The embedded catalog for the JDBC server, for the block: it waits for a ``lakehouse sql``
    to finish, and refuses in one line when another server holds it."""
    if not embedded(settings):
        yield
        return
    with _Lock(settings, SERVER) as lock:
        deadline = time.monotonic() + WAIT_SECONDS
        while not lock.take():
            holder = lock.holder()
            if holder.get("command") == SERVER or time.monotonic() > deadline:
                raise CatalogBusy(
                    f"the catalog in {catalog_dir(settings)} is held by {_who(holder)}: one "
                    "process at a time opens an embedded catalog; stop that one, or give this "
                    "server a catalog of its own (sql.catalog_dir)"
                )
            time.sleep(0.5)
        yield


@contextlib.contextmanager
def for_statement(settings: Settings) -> Iterator[str | None]:
    """The catalog of one ``lakehouse sql`` statement, for the block: yields None when the
    statement uses the lake's metastore, or else why not (the JDBC server holds the embedded
    one: the statement gets a catalog of its own, in memory). Waits for another ``lakehouse
    sql`` to finish."""
    if not embedded(settings):
        yield None
        return
    with _Lock(settings, "sql") as lock:
        deadline = time.monotonic() + WAIT_SECONDS
        while not lock.take():
            holder = lock.holder()
            if holder.get("command") == SERVER:
                yield (
                    f"the catalog is held by {_who(holder)}; this statement ran on the lake's "
                    "tables registered in memory, and what it creates is not kept"
                )
                return
            if time.monotonic() > deadline:
                raise CatalogBusy(
                    f"the catalog in {catalog_dir(settings)} is held by {_who(holder)}"
                )
            time.sleep(0.5)
        yield None


def _who(holder: dict) -> str:
    if not holder:
        return "a process that has not said which yet"
    return (
        f"lakehouse {holder.get('command')} (process {holder.get('pid')} on "
        f"{holder.get('host')}, since {holder.get('since')})"
    )


class _Lock:
    """``flock`` on ``<catalog_dir>/catalog.lock``, with a record of its holder."""

    def __init__(self, settings: Settings, command: str):
        self.path = catalog_dir(settings) / LOCK_NAME
        self.command = command
        self.fd = -1

    def __enter__(self) -> _Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self

    def __exit__(self, *_exc) -> None:
        os.close(self.fd)  # releases the lock, if taken

    def take(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({**record, "since": since}).encode(), 0)
        return True

    def holder(self) -> dict:
        try:
            return json.loads(os.pread(self.fd, 4096, 0) or b"{}")
        except (ValueError, OSError):
            return {}
