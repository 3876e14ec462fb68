"""``lakehouse kafka``: Apache Kafka's broker on loopback (KRaft, one process)."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import UsageError, non_negative_int, positive, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from lakehouse.tools.kafka import START_TIMEOUT_S

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
        type=non_negative_int,
        help="its client port on 127.0.0.1 (default: the port of kafka.bootstrap_servers, 9092)",
    )
    p.add_argument(
        "--timeout",
        type=positive,
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


def cmd_kafka(args: argparse.Namespace) -> int:
    from lakehouse.tools import kafka

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
        print(kafka.stop(broker).line("kafka", broker.dir))
        return 0
    lines = kafka.status_lines(broker)
    print("\n".join(lines))
    return 0 if broker.pid() else 1
