"""``lakehouse maintain``: compact, vacuum and checkpoint the lake's tables."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import settings_from_args
from lakehouse.session import spark_session


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "maintain",
        parents=[common],
        help="compact small files, vacuum and checkpoint every table",
    )
    p.add_argument("--table", action="append", help="only this table (layer.table; repeatable)")
    p.add_argument(
        "--force",
        action="store_true",
        help="vacuum with a maintenance.vacuum_retention_hours under Delta's 168-hour floor, "
        "Delta's retentionDurationCheck off. The risk: files still needed are deleted, and "
        "what needs them fails until a full refresh: a write in progress in another process, "
        "a stream reading the table from a checkpoint outside this lake, a time-travel query. "
        "(Files the lake's own checkpoints have not read yet are kept regardless: the "
        "retention is never shorter than the age of the oldest version they have not read.)",
    )
    p.set_defaults(func=cmd_maintain)


def cmd_maintain(args: argparse.Namespace) -> int:
    from lakehouse.ops.maintain import MaintainFailed, maintain

    settings = settings_from_args(args)
    failed = None
    with spark_session(settings, "lakehouse-maintain") as spark:
        try:
            reports = maintain(settings, args.table or None, spark, force=args.force)
        except MaintainFailed as exc:
            reports, failed = exc.reports, exc
    if not reports and not failed:
        print(f"no tables under {settings.root / 'tables'}")
        return 0
    if reports:
        print(f"{'table':32} {'version':>15} {'files':>11} {'compacted':>10} {'vacuumed':>9}")
    for r in reports:
        print(
            f"{r.table:32} {r.version_before:>6} -> {r.version_after:<6} "
            f"{r.files_before:>4} -> {r.files_after:<4} {r.files_compacted:>10} {r.files_vacuumed:>9}"
        )
    for r in reports:
        if r.retention_note:
            print(f"  {r.table}: {r.retention_note}")
    if failed:
        raise failed
    return 0
