"""The ``lakehouse`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from lakehouse.settings import Settings, SettingsError, load_settings


def common_parser() -> argparse.ArgumentParser:
    """Flags every command takes: where the lake is and which settings apply."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--root", help="lake root (settings key 'root')")
    parser.add_argument("--profile", help="settings profile (default: local or $LAKEHOUSE_PROFILE)")
    parser.add_argument("--config", help="settings file (default: conf/lakehouse.toml)")
    parser.add_argument("--backend", choices=["embedded", "native"], help="table backend")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by dotted key, e.g. --conf trigger.interval='10 seconds' (repeatable)",
    )
    return parser


def settings_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Settings:
    overrides: dict[str, Any] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"--conf expects KEY=VALUE; got {item!r}")
        overrides[key.strip()] = value.strip()
    overrides.update({"root": args.root, "backend": args.backend})
    overrides.update(extra or {})
    return load_settings(profile=args.profile, config_path=args.config, overrides=overrides)


def cmd_maintain(args: argparse.Namespace) -> int:
    from lakehouse.maintain import maintain

    settings = settings_from_args(args)
    reports = maintain(settings, args.table or None)
    if not reports:
        print(f"no tables under {settings.root / 'tables'}")
        return 0
    print(f"{'table':32} {'version':>15} {'files':>11} {'compacted':>10} {'vacuumed':>9}")
    for r in reports:
        print(
            f"{r.table:32} {r.version_before:>6} -> {r.version_after:<6} "
            f"{r.files_before:>4} -> {r.files_after:<4} {r.files_compacted:>10} {r.files_vacuumed:>9}"
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from lakehouse.demo import run_demo

    return run_demo(settings_from_args(args))


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(
        prog="lakehouse", description="Streaming medallion lakehouse on Spark and Delta"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "maintain",
        parents=[common],
        help="compact small files, checkpoint and vacuum every table",
    )
    p.add_argument("--table", action="append", help="only this table (layer.table; repeatable)")
    p.set_defaults(func=cmd_maintain)
    p = sub.add_parser("demo", parents=[common], help="run the end-to-end demo on a small lake")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from lakehouse.javacheck import JavaError
    from lakehouse.storage import SchemaMismatch, TableNotFound, UnsupportedChange

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SettingsError, JavaError, TableNotFound, SchemaMismatch, UnsupportedChange) as exc:
        print(f"lakehouse: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
