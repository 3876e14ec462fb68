"""``lakehouse cluster``: a Spark standalone cluster on loopback, and the code packed for it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from lakehouse.commands.params import non_negative_int, settings_from_args


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "cluster",
        parents=[common],
        help="a Spark standalone cluster on loopback: start, stop, status; package the code",
        description="Start or stop a master and one worker of the installed pyspark at the "
        "settings' master URL (use --profile cluster), or pack the project's code for "
        "spark-submit --py-files.",
    )
    p.add_argument("action", choices=["start", "stop", "status", "package"])
    p.add_argument("--cores", type=non_negative_int, default=2, help="worker cores (default 2)")
    p.add_argument("--memory", default="2g", help="worker memory (default %(default)s)")
    p.add_argument("--output", default="dist/lakehouse-code.zip", help="package: the zip to write")
    p.set_defaults(func=cmd_cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    from lakehouse.tools import cluster

    settings = settings_from_args(args)
    if args.action == "package":
        return _package(settings, Path(args.output).absolute())
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


def _package(settings, output: Path) -> int:
    """``cluster package``: the code zip, entry points and jars, and the spark-submit line."""
    from lakehouse.tools import cluster
    from lakehouse.tools.dist import driver_java_options

    dist, jars = cluster.package_dist(settings, output)
    print(f"project code packed in {dist.code}, the layers' entry points in {dist.jobs}")
    submit = (
        f"spark-submit --master {settings.master} --py-files {dist.code} "
        f"--driver-java-options {shlex.quote(driver_java_options(dist, settings))}"
    )
    if jars:
        print(f"delta-spark jars copied to {dist.jars} ({len(jars)} files)")
        submit += " --jars " + ",".join(str(j) for j in jars)
    elif settings.native.jars_packages:
        submit += f" --packages {settings.native.jars_packages}"
    print(f"submit with: {submit} {dist.jobs}/<layer>.py --root <lake root>")
    return 0
