"""``lakehouse serve-sql``: the lake's tables over JDBC/ODBC (Spark's Thrift server)."""

from __future__ import annotations

import argparse
from typing import Any

from lakehouse.commands.params import non_negative_int, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve-sql",
        parents=[common],
        help="serve the lake's tables over JDBC/ODBC (Spark Thrift server) until stopped",
    )
    p.add_argument("--port", type=non_negative_int, help="default: settings sql.port")
    p.add_argument(
        "--host",
        help="address to bind (default: settings sql.host, 127.0.0.1); beyond loopback the "
        "server needs a login, settings sql.auth_file",
    )
    p.set_defaults(func=cmd_serve_sql)


def cmd_serve_sql(args: argparse.Namespace) -> int:
    from lakehouse.tools.serve import serve_sql

    extra: dict[str, Any] = {}
    if args.port is not None:
        extra["sql.port"] = args.port
    if args.host is not None:
        extra["sql.host"] = args.host
    return serve_sql(settings_from_args(args, extra))
