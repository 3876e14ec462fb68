"""``lakehouse objectstore``: an S3 object store on loopback (SeaweedFS's ``weed mini``)."""

from __future__ import annotations

import argparse

from lakehouse.commands.params import non_negative_int, positive, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from lakehouse.tools.objectstore import DEFAULT_BUCKET, DEFAULT_PORT, START_TIMEOUT_S

    p = sub.add_parser(
        "objectstore",
        parents=[common],
        help="an S3 object store on loopback (SeaweedFS): start, stop, status, env",
        description="Start SeaweedFS's S3 server in the background with one bucket and wait "
        "until the bucket answers; stop it; say whether it runs. start and env print what a "
        "shell needs to reach it as export lines for eval (the secret's line reads the "
        "credentials file in --dir: no output holds it). Its data, keys and log live in --dir.",
    )
    p.add_argument("action", choices=["start", "stop", "status", "env"])
    p.add_argument("--dir", help="the store's folder (default: <root>/objectstore)")
    p.add_argument(
        "--port",
        type=non_negative_int,
        default=DEFAULT_PORT,
        help="its S3 port on 127.0.0.1 (default %(default)s)",
    )
    p.add_argument("--bucket", default=DEFAULT_BUCKET, help="its bucket (default %(default)s)")
    p.add_argument(
        "--timeout",
        type=positive,
        default=START_TIMEOUT_S,
        help="start: seconds to wait for the bucket to answer (default %(default)s)",
    )
    p.set_defaults(func=cmd_objectstore)


def cmd_objectstore(args: argparse.Namespace) -> int:
    import sys

    from lakehouse.tools import objectstore

    settings = settings_from_args(args)
    s = objectstore.store(settings, args.dir, args.port, args.bucket)
    if args.action == "start":
        pid, started = objectstore.start(s, args.timeout)
        state = "started" if started else "already running"
        # the exports on stdout (for eval), what happened on stderr
        print(
            f"objectstore: {state} (pid {pid}) at {s.endpoint}, bucket {s.uri}; log {s.log}",
            file=sys.stderr,
        )
        print("\n".join(s.exports()))
        return 0
    if args.action == "env":
        if not s.credentials.exists():
            raise objectstore.ObjectStoreError(
                f"no object store was started in {s.dir}: `lakehouse objectstore start` first"
            )
        print("\n".join(s.exports()))
        return 0
    if args.action == "stop":
        print(objectstore.stop(s).line("objectstore", s.dir))
        return 0
    print("\n".join(objectstore.status_lines(s)))
    return 0 if s.pid() else 1
