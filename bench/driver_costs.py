"""What the driver pays outside the flows' jobs: a table's creation, a progress event's delivery.

    python bench/driver_costs.py [--tables 12] [--events 8000] [--root DIR]

1. **Creation.** Creates ``--tables`` empty tables of silver.ad_attribution's schema with
   delta-spark's CREATE TABLE (``DeltaTable.createIfNotExists``) and ``--tables`` with the
   store's (``TableStore.create``: delta-rs's ``DeltaTable.create``), alternating, in a session that created a
   table already (the first creation of a JVM loads Delta's classes), and prints the median
   seconds of each. Every flow creates its output tables at its first start: a new lake (the
   demo, every test) pays it per table.
2. **Progress.** Runs bronze, silver and gold on ``--events`` generated events, one landing
   file or table version per micro-batch, with a listener that converts every progress event
   Spark delivers both ways, in turns: PySpark's ``StreamingQueryProgress.fromJObject`` (what a
   ``StreamingQueryListener`` is given, through one py4j call per field, list and map entry)
   and one call for the progress's JSON, parsed in Python (what the runner's listener takes
   now). Prints the number of events, and the median milliseconds and total seconds of each
   way. The listener's thread does this while the flows run, on the same cores.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse.settings import load_settings  # noqa: E402


class TwoWays:
    """A py4j listener timing both conversions of every progress event."""

    def __init__(self) -> None:
        self.objects: list[float] = []
        self.json: list[float] = []
        self.lock = threading.Lock()

    def onQueryStarted(self, jevent) -> None:
        pass

    def onQueryProgress(self, jevent) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryProgress

        def by_objects() -> None:
            StreamingQueryProgress.fromJObject(jevent.progress())

        def by_json() -> None:
            json.loads(jevent.progress().json())

        ways = [(self.objects, by_objects), (self.json, by_json)]
        if len(self.json) % 2:
            ways.reverse()
        for times, convert in ways:
            started = time.perf_counter()
            convert()
            with self.lock:
                times.append(time.perf_counter() - started)

    def onQueryIdle(self, jevent) -> None:
        pass

    def onQueryTerminated(self, jevent) -> None:
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def creations(spark, store, tables: int) -> tuple[list[float], list[float]]:
    from delta.tables import DeltaTable

    from silver.attribution import SCHEMA

    by_spark, by_store = [], []
    DeltaTable.createIfNotExists(spark).location(str(store.path("gold.warm_up"))).addColumns(
        SCHEMA
    ).execute()
    for i in range(tables):
        started = time.perf_counter()
        builder = DeltaTable.createIfNotExists(spark).location(str(store.path(f"gold.s{i}")))
        builder.addColumns(SCHEMA).execute()
        by_spark.append(time.perf_counter() - started)
        started = time.perf_counter()
        store.create(f"gold.t{i}", SCHEMA)
        by_store.append(time.perf_counter() - started)
    return by_spark, by_store


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--events", type=int, default=8_000)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "lakehouse-bench"))
    args = parser.parse_args(argv)

    from pyspark import SparkContext
    from pyspark.java_gateway import ensure_callback_server_started

    from lakehouse.progress import Progress
    from lakehouse.runner import run_layers
    from lakehouse.session import build_session
    from lakehouse.storage import table_store
    from lakehouse.tools import generate as gen

    root = Path(args.root) / f"driver-costs-{args.events}"
    shutil.rmtree(root, ignore_errors=True)
    settings = load_settings(
        "local", overrides={"root": str(root), "trigger.max_files_per_trigger": 1}
    )
    spark = build_session(settings, app_name="bench-driver-costs")

    by_spark, by_store = creations(spark, table_store(spark, settings), args.tables)
    print(f"creating an empty table, median of {args.tables} each, seconds:")
    print(f"  delta-spark's CREATE TABLE {statistics.median(by_spark):.4f}")
    print(f"  the store's own first commit {statistics.median(by_store):.4f}")

    params = gen.params_from_settings(settings, events=args.events, hours=args.hours)
    gen.generate(spark, root, params, progress=lambda s: Progress(s, io.StringIO()))
    ensure_callback_server_started(SparkContext._gateway)
    listener = TwoWays()
    wrapper = SparkContext._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
    spark._jsparkSession.streams().addListener(wrapper(listener))
    started = time.perf_counter()
    run_layers(spark, settings, ["bronze", "silver", "gold"], out=io.StringIO())
    wall = time.perf_counter() - started
    spark.stop()  # delivers the last events
    print(
        f"progress events of bronze, silver and gold on {args.events:,} events "
        f"({wall:.0f} s): {len(listener.json)}"
    )
    for name, times in (("PySpark's objects", listener.objects), ("its JSON", listener.json)):
        print(
            f"  {name:<18} median {statistics.median(times) * 1000:.2f} ms, "
            f"total {sum(times):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
