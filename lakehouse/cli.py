"""The ``lakehouse`` command line: the parser of every command (lakehouse.commands) and main."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lakehouse import version
from lakehouse.commands import COMMANDS
from lakehouse.commands.params import UsageError, common_parser, settings_from_args
from lakehouse.errors import LakehouseError

__all__ = ["UsageError", "build_parser", "common_parser", "main", "settings_from_args"]


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line (and the exit code 2), not the whole usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = _Parser(
        prog="lakehouse", description="Streaming medallion lakehouse on Spark and Delta"
    )
    parser.add_argument("--version", action="version", version=f"lakehouse {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LakehouseError as exc:  # bad input or configuration (2), a failed run (1)
        from lakehouse.redaction import redact

        print(f"lakehouse: error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
