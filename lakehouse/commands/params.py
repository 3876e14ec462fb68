"""What several commands share: the common flags, the settings they make, the argument types,
and the arguments more than one command declares (declared once here, alike everywhere)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lakehouse.errors import LakehouseError
from lakehouse.settings import Settings, SettingsError, load_settings

LAYERS = ["bronze", "silver", "gold", "all"]


class UsageError(LakehouseError, ValueError):
    """Command-line arguments that do not go together."""


def common_parser() -> argparse.ArgumentParser:
    """Flags every command takes: where the lake is and which settings apply."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--root", help="lake root (settings key 'root')")
    parser.add_argument("--profile", help="settings profile (default: local or $LAKEHOUSE_PROFILE)")
    parser.add_argument("--config", help="settings file (default: conf/lakehouse.toml)")
    # retired: says so in one line (lakehouse.settings.RETIRED)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="Spark's INFO log, the Python workers' start-up lines and pandas' warnings too",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by dotted key, e.g. --conf trigger.interval='10 seconds' (repeatable)",
    )
    return parser


def settings_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Settings:
    """The settings of a command: its profile with --conf over it, and the flags over both (the
    common ones and ``extra``, the command's own; a flag that is None is left out)."""
    overrides: dict[str, Any] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"--conf expects KEY=VALUE; got {item!r}")
        overrides[key.strip()] = value.strip()
    flags = {"root": args.root, "backend": args.backend, **(extra or {})}
    if args.verbose:
        flags["log_level"] = "INFO"
    # a flag left out keeps what --conf says (generate's --bootstrap left out had replaced
    # --conf kafka.bootstrap_servers=... with the settings' default broker)
    overrides.update({key: value for key, value in flags.items() if value is not None})
    return load_settings(profile=args.profile, config_path=args.config, overrides=overrides)


def add_layer(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--layer``: one of the layers, or all of them."""
    parser.add_argument("--layer", choices=LAYERS, default=default)


def non_negative_int(text: str) -> int:
    """A whole number, 0 or more (``1_000`` too)."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more; got {value}")
    return value


def _number(expected: str, must: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argument type: a number ``ok`` accepts; else ``expected`` or ``must`` in one line."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {must}; got {value:g}")
        return value

    return parse


# a share of records: 0 or more, under 1
fraction = _number("a number in [0, 1)", "in [0, 1)", lambda v: 0 <= v < 1)
# a share from 0 to 1, both included
share = _number("a number in [0, 1]", "in [0, 1]", lambda v: 0 <= v <= 1)
# a number more than 0
positive = _number("a number", "more than 0", lambda v: v > 0)
