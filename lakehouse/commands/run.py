"""``lakehouse run``: a layer's streaming flows, or a full refresh of some tables."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lakehouse.commands.params import UsageError, add_layer, non_negative_int, settings_from_args
from lakehouse.session import spark_session


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run the streaming flows of a layer (or of all layers, in order)",
    )
    add_layer(p)
    _add_full_refresh(p)
    p.add_argument(
        "--trigger",
        choices=["available-now", "continuous"],
        help="available-now: process what is new, then stop; continuous: every "
        "trigger.interval until stopped (default: settings trigger.mode)",
    )
    p.add_argument(
        "--max-files-per-trigger",
        type=non_negative_int,
        help="bound each micro-batch to this many files (0: no bound)",
    )
    p.set_defaults(func=cmd_run)


def _add_full_refresh(p: argparse.ArgumentParser) -> None:
    """--full-refresh(-all) and the flags that go with it."""
    p.add_argument(
        "--full-refresh",
        action="append",
        metavar="TABLE",
        help="rebuild this table (layer.table; repeatable) from its flow's inputs on a new "
        "checkpoint, switching it in one commit when done, instead of running the flows",
    )
    p.add_argument(
        "--full-refresh-all",
        action="store_true",
        help="rebuild every table of --layer that way",
    )
    p.add_argument(
        "--with-downstream",
        action="store_true",
        help="with --full-refresh(-all): rebuild the tables built from the rebuilt ones too, "
        "layer by layer (without it they keep what they were built from, and their flows go on "
        "with what comes after the rewrite)",
    )
    p.add_argument(
        "--allow-shrink",
        action="store_true",
        help="with --full-refresh(-all): switch a rebuilt table even when it has fewer rows "
        "than the table had (its inputs shrank: landing files removed, Kafka records past "
        "retention); without it such a refresh is refused, saying the rows before and after, "
        "and nothing is switched",
    )


def cmd_run(args: argparse.Namespace) -> int:
    from lakehouse.runner import (
        RunStopped,
        declared_layers,
        layer_flows,
        run_layers,
        stop_on_signals,
    )

    extra: dict[str, Any] = {}
    if args.trigger:
        extra["trigger.mode"] = args.trigger
    if args.max_files_per_trigger is not None:
        extra["trigger.max_files_per_trigger"] = args.max_files_per_trigger
    settings = settings_from_args(args, extra)
    if args.full_refresh or args.full_refresh_all:
        return _full_refresh(args, settings)
    for flag in ("allow_shrink", "with_downstream"):
        if getattr(args, flag):
            raise UsageError(
                f"--{flag.replace('_', '-')} goes with --full-refresh or --full-refresh-all"
            )
    if args.layer is None:
        raise UsageError("give --layer (bronze, silver, gold or all), or --full-refresh TABLE")
    layers = declared_layers() if args.layer == "all" else [args.layer]
    for layer in layers:
        layer_flows(layer)  # an unknown layer fails before Spark starts
    stopped = None
    # signals are counted from here on: one during Spark's start-up stops the run before any
    # flow starts, one after the flows ended (while Spark shuts down) is not fatal: the run is
    # done, and Python's default would kill it amid the JVM's shutdown traces
    with stop_on_signals() as stop, spark_session(settings, f"lakehouse-{args.layer}") as spark:
        try:
            reports = run_layers(spark, settings, layers, stop=stop)
        except RunStopped as exc:  # a signal is how continuous mode ends, not available-now
            reports, stopped = exc.reports, exc
    _print_reports(reports)
    if stopped:  # not done: a scheduler must not take the next step
        print(f"error: {stopped}; the next run goes on from the checkpoints", file=sys.stderr)
        return 130
    return 0


def _print_reports(reports) -> None:
    for r in reports:
        print(
            f"{r.flow:28} {r.batches:>5} micro-batches {r.input_rows:>12,} input rows"
            f" {r.duplicates:>9,} duplicates dropped {r.late_rows:>7,} late rows dropped"
        )


def _full_refresh(args: argparse.Namespace, settings) -> int:
    """``lakehouse run --full-refresh TABLE`` / ``--layer L --full-refresh-all``."""
    from lakehouse.runner import declared_layers, layer_flows
    from lakehouse.runner.refresh import flows_writing, refresh, with_downstream
    from lakehouse.settings import split_table_name

    if args.full_refresh and args.full_refresh_all:
        raise UsageError("give --full-refresh TABLE or --full-refresh-all, not both")
    if args.full_refresh_all:
        if args.layer is None:
            raise UsageError("--full-refresh-all rebuilds the tables of --layer: give it")
        layers = declared_layers() if args.layer == "all" else [args.layer]
        groups = [list(layer_flows(layer)) for layer in layers]
    else:
        for table in args.full_refresh:
            split_table_name(table)  # a malformed name fails before Spark starts
        groups = [flows_writing(args.full_refresh)]
    if args.with_downstream:
        groups = with_downstream([f for group in groups for f in group])
        print(
            "full refresh with downstream: "
            + "; then ".join(", ".join(f.name for f in group) for group in groups)
        )
    with spark_session(settings, "lakehouse-refresh") as spark:
        reports = []
        for flows in groups:  # layer by layer: a layer reads what the one before rebuilt
            reports += refresh(
                spark,
                settings,
                flows,
                out=sys.stdout,
                allow_shrink=args.allow_shrink,
                quiet_downstream=args.with_downstream,
            )
    _print_reports(reports)
    return 0
