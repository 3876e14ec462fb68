"""``lakehouse maintain`` of a whole lake, one table at a time against several at once.

Builds one lake (generated events through the three layers, bronze and silver a few landing
files or versions per micro-batch, so the upstream tables have small files to compact), keeps
a copy, then in each round maintains a fresh copy of it (with ``--force`` and a 0-hour
retention, as the fault matrix and a busy lake's schedule do) once per value of
``maintenance.parallel_tables``, in turns, in one Spark session. Prints each run's seconds
and the tables' versions and files, then the medians; every run must leave the same files.
With ``--again``, each copy is maintained a second time at once (what a schedule finds when
nothing was written since): that run's seconds and the commits it made are printed too.
With ``--aged HOURS``, each copy's data files are made HOURS old first and the retention is
Delta's default 168 hours, without ``--force``: a lake written long ago, maintained daily.

    python bench/maintain.py [--events 3000] [--rounds 3] [--parallel 1 4] [--again]
                             [--aged HOURS]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the project's flow packages (bronze, silver, gold) before this folder's bench scripts
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _commits(reports) -> int:
    """The commits a maintain's reports say it made."""
    return sum(r.version_after - r.version_before for r in reports)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--again", action="store_true", help="maintain each copy twice")
    parser.add_argument("--aged", type=float, default=0.0, help="data files this many hours old")
    args = parser.parse_args(argv)

    from lakehouse.ops.maintain import maintain
    from lakehouse.progress import Progress
    from lakehouse.runner import run_layers
    from lakehouse.session import build_session
    from lakehouse.settings import load_settings
    from lakehouse.tools import generate as gen

    work = Path(tempfile.mkdtemp(prefix="maintain-"))
    built = work / "built"
    settings = load_settings("test", overrides={"root": str(built)})
    spark = build_session(settings, app_name="bench-maintain")
    params = gen.params_from_settings(
        settings, events=args.events, hours=3.0, file_minutes=5.0, late_fraction=0.0, seed=7
    )
    gen.generate(spark, built, params, progress=lambda s: Progress(s, io.StringIO()))
    started = time.perf_counter()
    small = settings.with_overrides({"trigger.max_files_per_trigger": 4})
    run_layers(spark, small, ["bronze", "silver"], out=io.StringIO())
    run_layers(spark, settings, ["gold"], out=io.StringIO())
    print(f"lake built in {time.perf_counter() - started:.0f} s", flush=True)

    laps: dict[int, list[float]] = {n: [] for n in args.parallel}
    again: dict[int, list[float]] = {n: [] for n in args.parallel}
    commits_again = 0
    outcome: dict[int, list[tuple]] = {}
    for round_ in range(1, args.rounds + 1):
        for n in args.parallel:
            root = work / f"r{round_}-p{n}"
            shutil.copytree(built, root, symlinks=True)
            if args.aged:
                then = time.time() - args.aged * 3600
                for data in (root / "tables").rglob("*.parquet"):
                    os.utime(data, (then, then))
            lake = settings.with_overrides(
                {
                    "root": str(root),
                    "maintenance.vacuum_retention_hours": 168 if args.aged else 0,
                    "maintenance.parallel_tables": n,
                }
            )
            force = not args.aged
            spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
            start = time.perf_counter()
            reports = maintain(lake, None, spark, force=force)
            laps[n].append(time.perf_counter() - start)
            outcome[n] = [
                (r.table, r.version_after - r.version_before, r.files_after, r.files_vacuumed)
                for r in reports
            ]
            line = (
                f"round {round_}  parallel_tables={n}  {len(reports)} tables  "
                f"{laps[n][-1]:6.1f} s ({_commits(reports)} commits)"
            )
            if args.again:
                start = time.perf_counter()
                second = maintain(lake, None, spark, force=force)
                again[n].append(time.perf_counter() - start)
                commits = _commits(second)
                commits_again += commits
                line += f"  again {again[n][-1]:6.1f} s ({commits} commits)"
            print(line, flush=True)
            shutil.rmtree(root)
    print(f"{'parallel_tables':>15} {'median s':>9}  runs")
    for n in args.parallel:
        runs = " ".join(f"{s:.1f}" for s in laps[n])
        print(f"{n:>15} {statistics.median(laps[n]):>9.1f}  {runs}")
        if args.again:
            runs = " ".join(f"{s:.1f}" for s in again[n])
            print(f"{'again':>15} {statistics.median(again[n]):>9.1f}  {runs}")
    if args.again:
        print(f"commits made by the second runs: {commits_again}")
    same = len({tuple(v) for v in outcome.values()}) == 1
    print(f"same versions, files and vacuumed files per table in every run: {same}")
    spark.stop()
    shutil.rmtree(work)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
