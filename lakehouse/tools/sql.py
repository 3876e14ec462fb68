"""SQL over the lake: every Delta table registered under its ``layer.table`` name, and for
each gold table a view ``layer.table_final`` of its final rows (see :func:`final_views`).

``lakehouse sql "SELECT ..."`` runs one statement and prints its result as a table, CSV or
JSON lines; the Thrift JDBC/ODBC server serves the same tables. Each layer is a database of
the catalog (lakehouse.tools.catalog: the lake's metastore, which both share) and each table an
external Delta table over its folder. A table or view registered already, as it should be, is
left alone: registering the lake in a catalog that has it costs a lookup per table.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from lakehouse.errors import LakehouseError
from lakehouse.ops.maintain import lake_tables
from lakehouse.settings import Settings
from lakehouse.text import aligned

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("table", "csv", "json")


class SqlError(LakehouseError, ValueError):
    """A statement Spark could not analyse or run: its own message, on one line."""


def register_tables(spark: SparkSession, settings: Settings) -> list[str]:
    """Register every table of the lake as ``layer.table``, and the final views; their names."""
    lake = LakeCatalog(spark, settings)
    lake.refresh()
    return lake.names()


class LakeCatalog:
    """The lake's tables and final views in a session's catalog, brought up to date with what
    the lake holds by :meth:`refresh` (the JDBC server calls it every ``sql.refresh_interval``:
    a table a flow creates is served without a restart)."""

    def __init__(self, spark: SparkSession, settings: Settings):
        self.spark = spark
        self.settings = settings
        self.tables: list[str] = []
        self.views: list[str] = []
        # the catalog entries this object wrote (the others were there already)
        self.written: list[str] = []

    def names(self) -> list[str]:
        return self.tables + self.views

    def refresh(self) -> list[str]:
        """Register the tables of the lake not registered yet by this object (and the final
        views, when there are new tables); the tables registered now. A table that cannot be
        registered yet (its first commit being written) is tried again at the next refresh."""
        from lakehouse.storage import table_store

        new = [name for name, _path in lake_tables(self.settings) if name not in self.tables]
        if not new:
            return []
        store = table_store(self.spark, self.settings)
        failed = []
        for name in new:
            try:
                if store.register(name):
                    self.written.append(name)
            except Exception as exc:  # py4j's error around Spark's
                failed.append(f"{name}: {str(exc).strip().splitlines()[0]}")
                continue
            self.tables.append(name)
        self.views = final_views(self.spark, self.tables, self.written)
        if failed:
            raise SqlError(f"could not register {'; '.join(failed)}")
        return [name for name in new if name in self.tables]


def final_views(
    spark: SparkSession, registered: Sequence[str], written: list[str] | None = None
) -> list[str]:
    """For each gold table with a complete-through column, the view ``<table>_final``: its
    rows before the table's mark in ops.completeness, those that will not change any more
    (none while the table has no mark, or no ops.completeness). The names of the views; a
    view the catalog holds already with this query is left as it is (those written now are
    added to ``written``)."""
    from lakehouse.runner import completeness_columns
    from lakehouse.runner.monitoring import COMPLETENESS_TABLE
    from lakehouse.storage.catalog import catalog_entry

    views = []
    for outputs in completeness_columns().values():
        for table, column in outputs:
            if table not in registered:
                continue
            layer, name = table.split(".")
            if COMPLETENESS_TABLE in registered:
                mark = (
                    f"(SELECT max(complete_through) FROM {COMPLETENESS_TABLE} "
                    f"WHERE `table` = '{table}')"
                )
                where = f"`{column}` < {mark}"
            else:
                where = "false"
            query = f"SELECT * FROM `{layer}`.`{name}` WHERE {where}"
            entry = catalog_entry(spark, layer, f"{name}_final")
            text = entry.viewText() if entry is not None else None
            if text is None or not text.isDefined() or text.get().strip() != query:
                spark.sql(f"CREATE OR REPLACE VIEW `{layer}`.`{name}_final` AS {query}")
                if written is not None:
                    written.append(f"{table}_final")
            views.append(f"{table}_final")
    return views


def run_sql(spark: SparkSession, statement: str, max_rows: int) -> tuple[list[str], list, bool]:
    """Run ``statement``: its column names, at most ``max_rows`` rows, and whether there were
    more."""
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.logger import PySparkLogger

    # PySpark logs a failed statement's error with its whole JVM stack as JSON; the caller
    # reports it in one line
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    try:
        frame = spark.sql(statement)
        rows = frame.limit(max_rows + 1).collect()
    except (AnalysisException, ParseException) as exc:
        # the message's first line says what is wrong; the rest is Spark's plan
        raise SqlError(str(exc).strip().splitlines()[0]) from None
    return frame.columns, rows[:max_rows], len(rows) > max_rows


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):  # a JSON number, as Spark's to_json writes it
        return float(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "asDict"):
        return _jsonable(value.asDict())
    return value


def print_rows(columns: Sequence[str], rows: Sequence, fmt: str, out: TextIO | None = None) -> None:
    """Print rows as an aligned table (numbers to the right), CSV with a header, or JSON lines."""
    out = out or sys.stdout
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
        return
    if fmt == "json":
        for row in rows:
            print(json.dumps(dict(zip(columns, map(_jsonable, row), strict=True))), file=out)
        return
    numeric = {
        i
        for i in range(len(columns))
        if all(isinstance(row[i], int | float | decimal.Decimal) or row[i] is None for row in rows)
    }
    cells = [[_text(v) for v in row] for row in rows]
    print("\n".join(aligned(columns, cells, numeric, sep=" | ", rule="-+-")), file=out)
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", file=out)
