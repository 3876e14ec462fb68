"""``lakehouse sql-passwd``: the users of the JDBC server (serve-sql) in its password file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lakehouse.commands.params import non_negative_int, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
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
        type=non_negative_int,
        help="PBKDF2 rounds of the new hash (default 210,000; at least 1,000)",
    )
    p.set_defaults(func=cmd_sql_passwd)


def cmd_sql_passwd(args: argparse.Namespace) -> int:
    from lakehouse.tools.sqlauth import ITERATIONS, SqlAccessError, set_user

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

    from lakehouse.tools.sqlauth import SqlAccessError

    if sys.stdin.isatty():
        password = getpass.getpass(f"password of {user}: ")
        if getpass.getpass("again: ") != password:
            raise SqlAccessError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise SqlAccessError("a password must not be empty")
    return password
