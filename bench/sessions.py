"""Sessions benchmark: gold.sessions_custom (a Python stateful processor) against gold.sessions
(Spark's native session_window) on the same silver.events.

    python bench/sessions.py [--events 1000000] [--runs 3] [--max-files-per-trigger N]
                             [--root DIR] [--profile-processor]

Generates the events and runs bronze and silver once (kept under the bench root for the next
run), then times, ``--runs`` times each and interleaved, each flow alone in available-now mode
on fresh gold tables and checkpoints. Every run checks that the two flows found the same
sessions. Prints rows/s of each (medians) and ends with ``sessions_custom ratio: <x>``: the
throughput of gold.sessions_custom over that of gold.sessions (1.0: as fast).

``--profile-processor`` also runs gold.sessions_custom once with cProfile in its Python
workers (``spark.python.profile``) and prints the top functions by cumulative time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.settings import load_settings  # noqa: E402

FLOWS = ("gold.sessions", "gold.sessions_custom")
COMMON = ["user_id", "session_start", "session_end", "events", "purchases", "revenue"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--max-files-per-trigger",
        type=int,
        default=0,
        help="silver.events files per gold micro-batch (0: all in one)",
    )
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    parser.add_argument("--profile-processor", action="store_true")
    args = parser.parse_args(argv)

    from lakehouse.runner import pipeline, run_flows, run_layers
    from lakehouse.session import build_session
    from lakehouse.storage import table_store
    from lakehouse.tools import generate as gen

    root = Path(args.root) / f"sessions-{args.events}"
    settings = load_settings("local", overrides={"root": str(root)})
    spark = build_session(settings, app_name="bench-sessions")
    store = table_store(spark, settings)
    manifest = root / "landing" / gen.MANIFEST
    quiet = open(os.devnull, "w")  # noqa: SIM115 (progress events may arrive after a run)
    if (
        not manifest.exists()
        or json.loads(manifest.read_text())["runs"][0]["params"]["events"] != args.events
        or not store.exists("silver.events")
    ):
        shutil.rmtree(root, ignore_errors=True)
        gen.generate(spark, root, gen.params_from_settings(settings, events=args.events))
        print("bronze and silver ...", flush=True)
        run_layers(spark, settings, ["bronze", "silver"], out=quiet)
    silver_rows = store.read("silver.events").count()
    users = store.read("silver.events").select("user_id").distinct().count()
    run_settings = settings.with_overrides(
        {"trigger.max_files_per_trigger": args.max_files_per_trigger}
    )
    declared = {f.name: f for f in pipeline().layer("gold")}

    def once(name: str) -> tuple[float, int]:
        for sub in ("tables/gold", "checkpoints/gold"):
            shutil.rmtree(root / sub, ignore_errors=True)
        started = time.perf_counter()
        [report] = run_flows(spark, run_settings, [declared[name]], out=quiet)
        return time.perf_counter() - started, report.batches

    def sessions_of(name: str):
        table = "gold.sessions" if name == "gold.sessions" else "gold.sessions_custom"
        return store.read(table).select(COMMON)

    for name in FLOWS:  # warm-up: JIT, Python workers
        once(name)
    times: dict[str, list[float]] = {name: [] for name in FLOWS}
    sessions = None
    for run in range(args.runs):  # interleaved, so a noisy minute hurts both alike
        line = []
        found = {}
        for name in FLOWS:
            elapsed, batches = once(name)
            times[name].append(elapsed)
            found[name] = sessions_of(name).toPandas().sort_values(COMMON, ignore_index=True)
            line.append(f"{name} {elapsed:.1f} s")
        print(f"run {run + 1}: {', '.join(line)} ({batches} micro-batches)", flush=True)
        native, custom = found["gold.sessions"], found["gold.sessions_custom"]
        # sessions_custom comes out by hour of session end: compare the hours it closed
        closed = custom["session_end"].max().floor("h") + pd.Timedelta(hours=1)
        native = native[native["session_end"] < closed].reset_index(drop=True)
        # revenue is summed in a different order: equal to the cent
        pd.testing.assert_frame_equal(native, custom, check_exact=False, atol=1e-6)
        sessions = len(custom)
    native_s, custom_s = (statistics.median(times[name]) for name in FLOWS)
    print(f"silver.events rows: {silver_rows:,} ({users:,} users, {sessions:,} sessions agreed)")
    for name, median in (("gold.sessions", native_s), ("gold.sessions_custom", custom_s)):
        print(f"{name}: {silver_rows / median:,.0f} rows/s (median {median:.1f} s of {args.runs})")
    if args.profile_processor:
        _profile(once, root / "profile")
    print(f"sessions_custom ratio: {native_s / custom_s:.2f}")
    spark.stop()
    return 0


def _profile(once, folder: Path) -> None:
    """One gold.sessions_custom run with cProfile around every processor call in the Python
    workers; prints the functions that took the most time, summed over the workers."""
    import pstats

    from gold import sessions_custom

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    original = sessions_custom.PROCESSOR
    # (every handler, from the start: the driver's init worker then imports the flow's module)
    sessions_custom.PROCESSOR = _profiled(sessions_custom.SessionProcessor, str(folder))
    try:
        elapsed, _ = once("gold.sessions_custom")
    finally:
        sessions_custom.PROCESSOR = original
    dumps = sorted(str(p) for p in folder.glob("*.prof"))
    print(f"profiled run: {elapsed:.1f} s; {len(dumps)} worker profiles")
    if dumps:
        stats = pstats.Stats(*dumps)
        stats.sort_stats("tottime").print_stats(25)


def _profiled(base, folder: str):
    """``base`` with cProfile on while its handlers run (defined here, so it is pickled to
    the workers by value)."""
    import cProfile
    import uuid

    class Profiled(base):
        def init(self, handle):
            self._profile = cProfile.Profile()
            self._profile.enable()
            try:
                super().init(handle)
            finally:
                self._profile.disable()

        def handleInputRows(self, key, rows, timerValues):
            self._profile.enable()
            try:
                return iter(list(super().handleInputRows(key, rows, timerValues)))
            finally:
                self._profile.disable()

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            self._profile.enable()
            try:
                return iter(list(super().handleExpiredTimer(key, timerValues, expiredTimerInfo)))
            finally:
                self._profile.disable()

        def close(self):
            self._profile.dump_stats(f"{folder}/{uuid.uuid4().hex}.prof")
            super().close()

    Profiled.__module__ = "__main__"
    return Profiled


if __name__ == "__main__":
    sys.exit(main())
