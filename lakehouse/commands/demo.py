"""``lakehouse demo``: the end-to-end demo on a small lake."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import non_negative_int, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="run the end-to-end demo on a small lake")
    p.add_argument(
        "--events",
        type=non_negative_int,
        default=100_000,
        help="events to generate when the lake has no landing data (default %(default)s)",
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from lakehouse.tools.demo import run_demo

    return run_demo(settings_from_args(args), events=args.events)
