"""``lakehouse flows``: what each flow reads, writes and keeps, analysed without a query."""

from __future__ import annotations

import argparse
import sys

from lakehouse.commands.params import add_layer, settings_from_args
from lakehouse.session import spark_session


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "flows",
        parents=[common],
        help="analyse every flow without starting a query; print what each reads, writes and keeps",
    )
    add_layer(p, default="all")
    p.set_defaults(func=cmd_flows)


def cmd_flows(args: argparse.Namespace) -> int:
    from lakehouse.analysis import analyse_flows, print_flows
    from lakehouse.runner import pipeline

    settings = settings_from_args(args)
    # every flow is analysed (a layer's inputs are its upstream layers' outputs); one printed
    flows = list(pipeline().flows)
    with spark_session(settings, "lakehouse-flows") as spark:
        analysed = analyse_flows(spark, settings, flows)
    shown = [a for a in analysed if args.layer in ("all", a.flow.layer)]
    print_flows(shown, settings, sys.stdout)
    return 0
