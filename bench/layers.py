"""Each layer's wall seconds on a lake whose landing files are there: the demo's measure.

    python bench/layers.py LAKE [--profile local]

Runs bronze, silver and gold one after the other in one Spark session, as ``lakehouse demo``
does after generating (``run_layers`` per layer, each layer's flows at once), and prints each
layer's seconds. Copy the same landing folder into a fresh LAKE before each run, and run it
from two trees, one after the other, to compare them (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", type=Path, help="a lake root holding landing/")
    parser.add_argument("--profile", default="local")
    args = parser.parse_args(argv)

    from lakehouse.runner import run_layers
    from lakehouse.session import build_session
    from lakehouse.settings import load_settings

    settings = load_settings(args.profile, overrides={"root": str(args.lake)})
    spark = build_session(settings, app_name="bench-layers")
    spark.range(1).count()  # the JVM's start is not a layer's
    for layer in ("bronze", "silver", "gold"):
        started = time.perf_counter()
        run_layers(spark, settings, [layer], out=io.StringIO())
        print(f"{layer} {time.perf_counter() - started:.1f} s", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
