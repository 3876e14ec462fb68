"""``lakehouse status``: the lake at a glance, from the Delta logs and the runner's books."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "status",
        parents=[common],
        help="tables, last runs, state per stateful operator, quality failures, dropped rows",
    )
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from lakehouse.ops.status import print_status

    print_status(settings_from_args(args))
    return 0
