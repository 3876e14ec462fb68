"""SQL over the lake: every Delta table registered under its ``layer.table`` name, and for
each gold table a view ``layer.table_final`` of its final rows (see :func:`final_views`).

``lakehouse sql "SELECT ..."`` runs one statement and prints its result as a table, CSV or
JSON lines; the Thrift JDBC/ODBC server registers the same tables. Each layer is a database of
the session catalog and each table an external Delta table over its folder.
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
from lakehouse.maintain import lake_tables
from lakehouse.settings import Settings
from lakehouse.text import aligned

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("table", "csv", "json")


class SqlError(LakehouseError, ValueError):
    """A statement Spark could not analyse or run: its own message, on one line."""


def register_tables(spark: SparkSession, settings: Settings) -> list[str]:
    """Register every table of the lake as ``layer.table``; the names registered."""
    from lakehouse.storage import table_store

    store = table_store(spark, settings)
    names = []
    for name, _path in lake_tables(settings):
        store.register(name)
        names.append(name)
    return names + final_views(spark, names)


def final_views(spark: SparkSession, registered: Sequence[str]) -> list[str]:
    """For each gold table with a complete-through column, the view ``<table>_final``: its
    rows before the table's mark in ops.completeness, those that will not change any more
    (none while the table has no mark). The names created."""
    from lakehouse.monitoring import COMPLETENESS_TABLE
    from lakehouse.runner import completeness_columns

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
            spark.sql(
                f"CREATE OR REPLACE VIEW `{layer}`.`{name}_final` AS "
                f"SELECT * FROM `{layer}`.`{name}` WHERE {where}"
            )
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
