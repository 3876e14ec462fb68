"""Short commands with and without the driver JVM's class archive (``make class-archive`` records
jars/lib/classes.jsa; docs/operations.md, "The class archive").

    python bench/class_archive.py [--rounds 3] [--events 2000] [--profile test]

Each round, in turn with and without the archive: ``lakehouse generate --events N`` into a new
lake, then ``lakehouse run --layer bronze`` on it, each a process of its own (one driver JVM
each), timed from start to exit. "Without" points ``native.jars_dir`` at a folder of links to
the same jars and no archive, so only the archive differs. Prints every round's seconds, then
each command's medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.jars import CLASS_ARCHIVE, DEFAULT_JARS_DIR  # noqa: E402

COMMANDS = ("generate", "run")


def timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "lakehouse", *args], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        sys.exit(f"error: lakehouse {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--profile", default="test")
    args = parser.parse_args()
    if not (DEFAULT_JARS_DIR / CLASS_ARCHIVE).is_file():
        sys.exit(f"error: no {DEFAULT_JARS_DIR / CLASS_ARCHIVE}: run make class-archive first")
    seconds: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-class-archive-") as work:
        bare = Path(work) / "jars"  # the same jars, no archive
        bare.mkdir()
        for jar in DEFAULT_JARS_DIR.glob("*.jar"):
            (bare / jar.name).symlink_to(jar)
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable}
        ways = {"with": env, "without": {**env, "LAKEHOUSE_NATIVE__JARS_DIR": str(bare)}}
        for round_ in range(1, args.rounds + 1):
            for way, way_env in ways.items():
                root = Path(work) / f"lake-{round_}-{way}"
                common = ["--root", str(root), "--profile", args.profile]
                gen = timed(["generate", "--events", str(args.events), *common], way_env)
                run = timed(["run", "--layer", "bronze", *common], way_env)
                seconds.setdefault(("generate", way), []).append(gen)
                seconds.setdefault(("run", way), []).append(run)
                print(f"round {round_} {way:>7} archive: generate {gen:5.1f} s, run {run:5.1f} s")
    print()
    for command in COMMANDS:
        with_, without = (statistics.median(seconds[(command, w)]) for w in ways)
        print(
            f"{command:>8}: median {with_:5.1f} s with the archive, {without:5.1f} s without "
            f"({with_ / without:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
