"""``lakehouse sql``: one Spark SQL statement over the lake's tables, its rows printed."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from lakehouse.commands.params import non_negative_int, settings_from_args
from lakehouse.session import spark_session
from lakehouse.settings import Settings
from lakehouse.tools import catalog


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sql",
        parents=[common],
        help="run a Spark SQL statement over the lake's tables (named layer.table)",
    )
    p.add_argument("statement", nargs="?", help='e.g. "SELECT * FROM gold.sessions LIMIT 10"')
    p.add_argument("--file", help="read the statement from this file (e.g. queries/*.sql)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument(
        "--max-rows",
        type=non_negative_int,
        default=10_000,
        help="print at most this many rows (default %(default)s)",
    )
    p.set_defaults(func=cmd_sql)


def cmd_sql(args: argparse.Namespace) -> int:
    from lakehouse.tools.sql import SqlError, print_rows, register_tables, run_sql

    settings = settings_from_args(args)
    if (args.statement is None) == (args.file is None):
        raise SqlError("give a statement or --file, one of the two")
    statement = args.statement
    if args.file is not None:
        try:
            statement = Path(args.file).read_text()
        except OSError as exc:
            raise SqlError(f"cannot read --file {args.file}: {exc.strerror}") from None
    with (
        _sql_catalog(settings) as (conf, elsewhere),
        spark_session(settings, "lakehouse-sql", conf) as spark,
    ):
        if conf:
            catalog.prepare(spark, settings)
        if not register_tables(spark, settings):
            print(f"lakehouse: note: no tables under {settings.root / 'tables'}", file=sys.stderr)
        columns, rows, more = run_sql(spark, statement, args.max_rows)
    print_rows(columns, rows, args.format)
    if elsewhere:
        print(f"lakehouse: note: {elsewhere}", file=sys.stderr)
    if more:
        print(
            f"lakehouse: note: only the first {args.max_rows:,} rows (raise --max-rows)",
            file=sys.stderr,
        )
    return 0


@contextlib.contextmanager
def _sql_catalog(settings: Settings):
    """The catalog of a ``lakehouse sql`` statement: (Spark configuration, why the lake's
    metastore is not used or None). A session running already (the tests') is used as it is."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        yield {}, None
        return
    with catalog.for_statement(settings) as elsewhere:
        yield ({} if elsewhere else catalog.hive_conf(settings)), elsewhere
