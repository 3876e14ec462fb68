"""The ``lakehouse`` command line."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lakehouse import catalog, version
from lakehouse.errors import LakehouseError
from lakehouse.session import spark_session
from lakehouse.settings import Settings, SettingsError, load_settings


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


def cmd_maintain(args: argparse.Namespace) -> int:
    from lakehouse.maintain import MaintainFailed, maintain

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


def _non_negative_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more; got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1); got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1); got {value:g}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1]; got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1]; got {value:g}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0; got {value:g}")
    return value


def cmd_generate(args: argparse.Namespace) -> int:
    from lakehouse import generate as gen

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
        unit = "batches" if sink else "files"
        for source, tally in entry["sources"].items():
            faults = ", ".join(f"{k} {v:,}" for k, v in tally["faults"].items() if v)
            print(
                f"{source:12} {tally['lines']:>10,} lines in {tally['files']:>4} {unit}  ({faults})"
            )
        for line in gen.profile_lines(entry["profile"]):
            print(f"profile: {line}")
    if sink:
        topics = ", ".join(settings.topic(source) for source in gen.SOURCES)
        print(f"topics {topics} at {settings.kafka.bootstrap_servers}")
    print(f"manifest: {settings.landing_path() / gen.MANIFEST}")
    return 0


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
    from lakehouse.refresh import flows_writing, refresh, with_downstream
    from lakehouse.runner import declared_layers, layer_flows
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


def cmd_demo(args: argparse.Namespace) -> int:
    from lakehouse.demo import run_demo

    return run_demo(settings_from_args(args), events=args.events)


def cmd_sql(args: argparse.Namespace) -> int:
    from lakehouse.sql import SqlError, print_rows, register_tables, run_sql

    settings = settings_from_args(args)
    if (args.statement is None) == (args.file is None):
        raise SqlError("give a statement or --file, one of the two")
    statement = args.statement
    if args.file is not None:
        try:
            statement = Path(args.file).read_text()
        except OSError as exc:
            raise SqlError(f"cannot read --file {args.file}: {exc.strerror}") from None
    with (
        _sql_catalog(settings) as (conf, elsewhere),
        spark_session(settings, "lakehouse-sql", conf) as spark,
    ):
        if conf:
            catalog.prepare(spark, settings)
        if not register_tables(spark, settings):
            print(f"lakehouse: note: no tables under {settings.root / 'tables'}", file=sys.stderr)
        columns, rows, more = run_sql(spark, statement, args.max_rows)
    print_rows(columns, rows, args.format)
    if elsewhere:
        print(f"lakehouse: note: {elsewhere}", file=sys.stderr)
    if more:
        print(
            f"lakehouse: note: only the first {args.max_rows:,} rows (raise --max-rows)",
            file=sys.stderr,
        )
    return 0


@contextlib.contextmanager
def _sql_catalog(settings: Settings):
    """The catalog of a ``lakehouse sql`` statement: (Spark configuration, why the lake's
    metastore is not used or None). A session running already (the tests') is used as it is."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        yield {}, None
        return
    with catalog.for_statement(settings) as elsewhere:
        yield ({} if elsewhere else catalog.hive_conf(settings)), elsewhere


def cmd_sql_passwd(args: argparse.Namespace) -> int:
    from lakehouse.sqlauth import ITERATIONS, SqlAccessError, set_user

    settings = settings_from_args(args)
    path = args.file or settings.sql.auth_file
    if not path:
        raise SqlAccessError("give the password file: --file FILE, or set sql.auth_file")
    file = Path(path).expanduser()
    password = None if args.delete else _new_password(args.user)
    done = set_user(file, args.user, password, args.iterations or ITERATIONS)
    where = {"added": "added to", "changed": "changed in", "removed": "removed from"}[done]
    what = "the password of " if done == "changed" else "user "
    print(f"{what}{args.user} {where} {file}")
    return 0


def _new_password(user: str) -> str:
    """The password: asked twice on a terminal, else the first line of standard input (never an
    argument: command lines are visible to every user of the machine)."""
    import getpass

    from lakehouse.sqlauth import SqlAccessError

    if sys.stdin.isatty():
        password = getpass.getpass(f"password of {user}: ")
        if getpass.getpass("again: ") != password:
            raise SqlAccessError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise SqlAccessError("a password must not be empty")
    return password


def cmd_status(args: argparse.Namespace) -> int:
    from lakehouse.status import print_status

    print_status(settings_from_args(args))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from lakehouse.verify import run_verify

    return run_verify(settings_from_args(args))


def cmd_state(args: argparse.Namespace) -> int:
    from lakehouse.state import print_health, state_health

    settings = settings_from_args(args)
    with spark_session(settings, "lakehouse-state") as spark:
        health = state_health(spark, settings, args.flow)
    print_health(args.flow, health)
    return 0


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


def cmd_report(args: argparse.Namespace) -> int:
    from lakehouse.report import write_report

    path = write_report(settings_from_args(args), Path(args.output))
    print(f"report written to {path}")
    return 0


def cmd_serve_sql(args: argparse.Namespace) -> int:
    from lakehouse.serve import serve_sql

    extra: dict[str, Any] = {}
    if args.port is not None:
        extra["sql.port"] = args.port
    if args.host is not None:
        extra["sql.host"] = args.host
    return serve_sql(settings_from_args(args, extra))


def cmd_kafka(args: argparse.Namespace) -> int:
    from lakehouse import kafka

    settings = settings_from_args(args)
    broker = kafka.broker(settings, args.dir, args.port)
    if args.action == "start":
        if args.users and not args.sasl:
            raise UsageError("--users goes with --sasl")
        users = kafka.sasl_users(settings, args.users) if args.sasl else None
        pid, started = kafka.start(broker, args.timeout, users)
        state = "started" if started else "already running"
        sasl = kafka.sasl_note(broker)
        print(f"kafka: {state} (pid {pid}) at {broker.bootstrap}{sasl}; log {broker.log}")
        return 0
    if args.action == "stop":
        pid, found = kafka.stop(broker)
        if pid:
            print(f"kafka: stopped (pid {pid})")
        elif found:  # a pid file naming another process: left running
            print(f"kafka: nothing stopped: {found}")
        else:
            print(f"kafka: not running ({broker.dir})")
        return 0
    lines = kafka.status_lines(broker)
    print("\n".join(lines))
    return 0 if broker.pid() else 1


def cmd_cluster(args: argparse.Namespace) -> int:
    from lakehouse import cluster
    from lakehouse.dist import driver_java_options

    settings = settings_from_args(args)
    if args.action == "package":
        dist, jars = cluster.package_dist(settings, Path(args.output).absolute())
        print(f"project code packed in {dist.code}, the layers' entry points in {dist.jobs}")
        submit = (
            f"spark-submit --master {settings.master} --py-files {dist.code} "
            f"--driver-java-options {driver_java_options(dist)}"
        )
        if jars:
            print(f"delta-spark jars copied to {dist.jars} ({len(jars)} files)")
            submit += " --jars " + ",".join(str(j) for j in jars)
        elif settings.native.jars_packages:
            submit += f" --packages {settings.native.jars_packages}"
        print(f"submit with: {submit} {dist.jobs}/<layer>.py --root <lake root>")
        return 0
    if args.action == "start":
        ep = cluster.start(settings, cores=args.cores, memory=args.memory)
        print(f"cluster up: master {ep.url} (UI http://{ep.host}:{ep.master_ui}/), one worker")
        print(f"logs and pid files in {settings.root / 'cluster'}")
    elif args.action == "stop":
        stopped, found = cluster.stop(settings)
        for line in found:  # a pid file naming another process: nothing stopped for it
            print(f"nothing stopped: {line}")
        if stopped or not found:
            print(f"stopped: {', '.join(stopped)}" if stopped else "no cluster process was running")
    else:
        state = cluster.status(settings)
        print(
            f"{state['url']}: {state['status']}, {state['workers']} worker(s), "
            f"{state['cores']} cores, applications: {', '.join(state['applications']) or 'none'}"
        )
    return 0


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line (and the exit code 2), not the whole usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from lakehouse.generate import GenerateParams
    from lakehouse.kafka import START_TIMEOUT_S

    common = common_parser()
    parser = _Parser(
        prog="lakehouse", description="Streaming medallion lakehouse on Spark and Delta"
    )
    parser.add_argument("--version", action="version", version=f"lakehouse {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "maintain",
        parents=[common],
        help="compact small files, checkpoint and vacuum every table",
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
    from lakehouse.generate import DEFAULT_START as gen_default_start

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
        type=_non_negative_int,
        default=defaults.events,
        help="number of events (impressions are 0.4 per event; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=defaults.seed, help="default %(default)s")
    p.add_argument(
        "--start",
        help=f"first event time, ISO-8601 (default {gen_default_start}, or the hour after the "
        "last run in this lake)",
    )
    p.add_argument(
        "--hours",
        type=_positive,
        default=defaults.hours,
        help="hours over which sessions start (default %(default)s)",
    )
    p.add_argument(
        "--file-minutes",
        type=_positive,
        default=defaults.file_minutes,
        help="minutes of arrival time per landing file (default %(default)s)",
    )
    p.add_argument(
        "--users",
        type=_non_negative_int,
        default=0,
        help="number of users (default: enough that a user takes a fifth of its 3-hour session slots on average, at least 50)",
    )
    p.add_argument(
        "--conversion",
        type=_share,
        default=defaults.conversion,
        help="share of sessions (of 4 or more events) that end in purchases (default %(default)s)",
    )
    for name in ("duplicate", "disorder", "late", "malformed"):
        key = f"{name}_fraction"
        p.add_argument(
            f"--{name}-fraction",
            type=_fraction,
            default=getattr(defaults, key),
            help="share of records (default %(default)s)",
        )
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep writing a small file per source every --interval seconds",
    )
    p.add_argument(
        "--rate",
        type=_positive,
        default=200.0,
        help="events per second with --follow (default %(default)s)",
    )
    p.add_argument(
        "--interval",
        type=_positive,
        default=5.0,
        help="seconds between files with --follow (default %(default)s)",
    )
    p.add_argument(
        "--ticks",
        type=_non_negative_int,
        default=0,
        help="with --follow, stop after this many files (default 0: until Ctrl-C)",
    )
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
        type=_non_negative_int,
        help="with --sink kafka: partitions of a topic it creates (default: kafka.partitions, 3)",
    )
    p.set_defaults(func=cmd_generate)
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
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run the streaming flows of a layer (or of all layers, in order)",
    )
    p.add_argument("--layer", choices=["bronze", "silver", "gold", "all"])
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
    p.add_argument(
        "--trigger",
        choices=["available-now", "continuous"],
        help="available-now: process what is new, then stop; continuous: every "
        "trigger.interval until stopped (default: settings trigger.mode)",
    )
    p.add_argument(
        "--max-files-per-trigger",
        type=_non_negative_int,
        help="bound each micro-batch to this many files (0: no bound)",
    )
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("demo", parents=[common], help="run the end-to-end demo on a small lake")
    p.add_argument(
        "--events",
        type=_non_negative_int,
        default=100_000,
        help="events to generate when the lake has no landing data (default %(default)s)",
    )
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser(
        "sql",
        parents=[common],
        help="run a Spark SQL statement over the lake's tables (named layer.table)",
    )
    p.add_argument("statement", nargs="?", help='e.g. "SELECT * FROM gold.sessions LIMIT 10"')
    p.add_argument("--file", help="read the statement from this file (e.g. queries/*.sql)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument(
        "--max-rows",
        type=_non_negative_int,
        default=10_000,
        help="print at most this many rows (default %(default)s)",
    )
    p.set_defaults(func=cmd_sql)
    p = sub.add_parser(
        "status",
        parents=[common],
        help="tables, last runs, state per stateful operator, quality failures, dropped rows",
    )
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "state",
        parents=[common],
        help="a flow's state from its checkpoint: rows per partition, skew, timers",
    )
    p.add_argument("flow", help="layer.flow, e.g. gold.sessions_custom")
    p.set_defaults(func=cmd_state)
    p = sub.add_parser(
        "flows",
        parents=[common],
        help="analyse every flow without starting a query; print what each reads, writes and keeps",
    )
    p.add_argument("--layer", choices=["bronze", "silver", "gold", "all"], default="all")
    p.set_defaults(func=cmd_flows)
    p = sub.add_parser(
        "report",
        parents=[common],
        help="write one self-contained HTML file with plots of the runs",
    )
    p.add_argument("--output", default="lakehouse-report.html", help="default %(default)s")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser(
        "serve-sql",
        parents=[common],
        help="serve the lake's tables over JDBC/ODBC (Spark Thrift server) until stopped",
    )
    p.add_argument("--port", type=_non_negative_int, help="default: settings sql.port")
    p.add_argument(
        "--host",
        help="address to bind (default: settings sql.host, 127.0.0.1); beyond loopback the "
        "server needs a login, settings sql.auth_file",
    )
    p.set_defaults(func=cmd_serve_sql)
    p = sub.add_parser(
        "sql-passwd",
        parents=[common],
        help="add a user of the JDBC server to its password file, change their password, or "
        "remove them (the password is asked for, or read from standard input)",
    )
    p.add_argument("user", help="the name the user logs in with")
    p.add_argument("--file", help="the password file (default: settings sql.auth_file)")
    p.add_argument("--delete", action="store_true", help="remove the user")
    p.add_argument(
        "--iterations",
        type=_non_negative_int,
        help="PBKDF2 rounds of the new hash (default 210,000; at least 1,000)",
    )
    p.set_defaults(func=cmd_sql_passwd)
    p = sub.add_parser(
        "cluster",
        parents=[common],
        help="a Spark standalone cluster on loopback: start, stop, status; package the code",
        description="Start or stop a master and one worker of the installed pyspark at the "
        "settings' master URL (use --profile cluster), or pack the project's code for "
        "spark-submit --py-files.",
    )
    p.add_argument("action", choices=["start", "stop", "status", "package"])
    p.add_argument("--cores", type=_non_negative_int, default=2, help="worker cores (default 2)")
    p.add_argument("--memory", default="2g", help="worker memory (default %(default)s)")
    p.add_argument("--output", default="dist/lakehouse-code.zip", help="package: the zip to write")
    p.set_defaults(func=cmd_cluster)
    p = sub.add_parser(
        "kafka",
        parents=[common],
        help="Apache Kafka's broker on loopback (KRaft, one process): start, stop, status",
        description="Start Kafka's broker in the background (its storage formatted the first "
        "time) and wait until it serves; stop it; or list its topics with their partitions and "
        "end offsets. Its configuration, data and log live in --dir.",
    )
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--dir", help="the broker's folder (default: <root>/kafka)")
    p.add_argument(
        "--port",
        type=_non_negative_int,
        help="its client port on 127.0.0.1 (default: the port of kafka.bootstrap_servers, 9092)",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=START_TIMEOUT_S,
        help="start: seconds to wait for the broker to serve (default %(default)s)",
    )
    p.add_argument(
        "--sasl",
        action="store_true",
        help="start: its listener SASL_PLAINTEXT with the PLAIN mechanism, letting in the users "
        "of --users, or else the PLAIN user of kafka.options (the lake's own clients)",
    )
    p.add_argument(
        "--users",
        metavar="FILE",
        help="start --sasl: the users let in, one name=password line each",
    )
    p.set_defaults(func=cmd_kafka)
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
