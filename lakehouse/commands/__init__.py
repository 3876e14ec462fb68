"""The ``lakehouse`` commands, one module each: ``register(sub, common)`` adds its subparser, and
its ``cmd_*`` function runs it. Shared flags and argument types are in :mod:`.params`."""

from lakehouse.commands import (
    cluster,
    demo,
    flows,
    generate,
    kafka,
    maintain,
    objectstore,
    report,
    run,
    serve_sql,
    sql,
    sql_passwd,
    state,
    status,
    verify,
)

# the order of ``lakehouse --help``
COMMANDS = (
    maintain,
    generate,
    verify,
    run,
    demo,
    sql,
    status,
    state,
    flows,
    report,
    serve_sql,
    sql_passwd,
    cluster,
    kafka,
    objectstore,
)
