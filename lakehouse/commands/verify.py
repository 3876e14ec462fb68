"""``lakehouse verify``: every table against a batch computation from the landing files."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="compare every table with a batch computation from the landing files",
        description="Compute every bronze, silver and gold table in batch with pandas from the "
        "landing files, the quality rules and the generator's manifest, compare the lake's "
        "tables with it and print, per table, rows expected, found, missing, unexpected and "
        "differing. With events later than the watermark in the data, silver and gold are "
        "checked by their books instead. Exit 1 on any difference.",
    )
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from lakehouse.proof.verify import run_verify

    return run_verify(settings_from_args(args))
