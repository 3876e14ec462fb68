"""``lakehouse report``: one self-contained HTML file with plots of the runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from lakehouse.commands.params import settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "report",
        parents=[common],
        help="write one self-contained HTML file with plots of the runs",
    )
    p.add_argument("--output", default="lakehouse-report.html", help="default %(default)s")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from lakehouse.ops.report import write_report

    path = write_report(settings_from_args(args), Path(args.output))
    print(f"report written to {path}")
    return 0
