"""``lakehouse state``: the health of a flow's state, read from its checkpoint."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import settings_from_args
from lakehouse.session import spark_session


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "state",
        parents=[common],
        help="a flow's state from its checkpoint: rows per partition, skew, timers",
    )
    p.add_argument("flow", help="layer.flow, e.g. gold.sessions_custom")
    p.set_defaults(func=cmd_state)


def cmd_state(args: argparse.Namespace) -> int:
    from lakehouse.ops.state import print_health, state_health

    settings = settings_from_args(args)
    with spark_session(settings, "lakehouse-state") as spark:
        health = state_health(spark, settings, args.flow)
    print_health(args.flow, health)
    return 0
