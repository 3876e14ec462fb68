"""``lakehouse generate``: synthetic landing data (files or Kafka records) with counted faults."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import (
    fraction,
    non_negative_int,
    positive,
    settings_from_args,
    share,
)
from lakehouse.session import spark_session


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from lakehouse.tools.generate import DEFAULT_START, GenerateParams

    defaults = GenerateParams()
    p = sub.add_parser(
        "generate",
        parents=[common],
        help="write synthetic events, impressions and clicks to landing/ (dbldatagen)",
        description="Write JSON-lines landing files for events, impressions and clicks, with "
        "injected faults counted in landing/_manifest.json. Running it again adds new files.",
    )
    p.add_argument(
        "--events",
        type=non_negative_int,
        default=defaults.events,
        help="number of events (impressions are 0.4 per event; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=defaults.seed, help="default %(default)s")
    p.add_argument(
        "--start",
        help=f"first event time, ISO-8601 (default {DEFAULT_START}, or the hour after the "
        "last run in this lake)",
    )
    p.add_argument(
        "--hours",
        type=positive,
        default=defaults.hours,
        help="hours over which sessions start (default %(default)s)",
    )
    p.add_argument(
        "--file-minutes",
        type=positive,
        default=defaults.file_minutes,
        help="minutes of arrival time per landing file (default %(default)s)",
    )
    p.add_argument(
        "--users",
        type=non_negative_int,
        default=0,
        help="number of users (default: enough that a user takes a fifth of its 3-hour session slots on average, at least 50)",
    )
    p.add_argument(
        "--conversion",
        type=share,
        default=defaults.conversion,
        help="share of sessions (of 4 or more events) that end in purchases (default %(default)s)",
    )
    for name in ("duplicate", "disorder", "late", "malformed", "invalid"):
        key = f"{name}_fraction"
        p.add_argument(
            f"--{name}-fraction",
            type=fraction,
            default=getattr(defaults, key),
            help="share of records (default %(default)s)",
        )
    _add_follow(p)
    _add_sink(p)
    p.set_defaults(func=cmd_generate)


def _add_follow(p: argparse.ArgumentParser) -> None:
    """--follow and how it paces its files."""
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep writing a small file per source every --interval seconds",
    )
    p.add_argument(
        "--rate",
        type=positive,
        default=200.0,
        help="events per second with --follow (default %(default)s)",
    )
    p.add_argument(
        "--interval",
        type=positive,
        default=5.0,
        help="seconds between files with --follow (default %(default)s)",
    )
    p.add_argument(
        "--ticks",
        type=non_negative_int,
        default=0,
        help="with --follow, stop after this many files (default 0: until Ctrl-C)",
    )


def _add_sink(p: argparse.ArgumentParser) -> None:
    """--sink and the Kafka flags that go with it."""
    p.add_argument(
        "--sink",
        choices=["files", "kafka"],
        default="files",
        help="landing files (default), or records to the Kafka topics events, impressions and "
        "clicks (key: the user id)",
    )
    p.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="with --sink kafka: the broker (default: settings kafka.bootstrap_servers)",
    )
    p.add_argument(
        "--partitions",
        type=non_negative_int,
        help="with --sink kafka: partitions of a topic it creates (default: kafka.partitions, 3)",
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from lakehouse.tools import generate as gen

    settings = settings_from_args(
        args, {"kafka.bootstrap_servers": args.bootstrap, "kafka.partitions": args.partitions}
    )
    params = gen.params_from_settings(
        settings,
        events=args.events,
        seed=args.seed,
        start=args.start,
        hours=args.hours,
        file_minutes=args.file_minutes,
        users=args.users,
        duplicate_fraction=args.duplicate_fraction,
        disorder_fraction=args.disorder_fraction,
        late_fraction=args.late_fraction,
        malformed_fraction=args.malformed_fraction,
        invalid_fraction=args.invalid_fraction,
        conversion=args.conversion,
    )
    gen.Landing(settings.root)  # an unwritable root fails here, before Spark starts
    sink = None
    if args.sink == "kafka":  # a broker that does not answer fails here too
        sink = gen.KafkaSink.from_settings(settings)
    with spark_session(settings, "lakehouse-generate") as spark:
        if args.follow:
            gen.follow(
                spark,
                settings.root,
                params,
                rate=args.rate,
                interval_s=args.interval,
                ticks=args.ticks,
                sink=sink,
            )
            entry = None
        else:
            entry = gen.generate(spark, settings.root, params, sink=sink)
    if entry is not None:
        _print_entry(entry, "batches" if sink else "files")
    if sink:
        topics = ", ".join(settings.topic(source) for source in gen.SOURCES)
        print(f"topics {topics} at {settings.kafka.bootstrap_servers}")
    print(f"manifest: {settings.landing_path() / gen.MANIFEST}")
    return 0


def _print_entry(entry: dict, unit: str) -> None:
    """A run's manifest entry: lines, files (or batches) and faults per source, its profile."""
    from lakehouse.tools import generate as gen

    for source, tally in entry["sources"].items():
        faults = ", ".join(f"{k} {v:,}" for k, v in tally["faults"].items() if v)
        print(f"{source:12} {tally['lines']:>10,} lines in {tally['files']:>4} {unit}  ({faults})")
    for line in gen.profile_lines(entry["profile"]):
        print(f"profile: {line}")
