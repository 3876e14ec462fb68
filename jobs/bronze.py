"""spark-submit entry point of the bronze layer: landing JSON lines to bronze tables.

    spark-submit jobs/bronze.py --root DIR [--trigger available-now|continuous]
                                [--max-files-per-trigger N] [--profile P] [--conf KEY=VALUE]

A shim over ``lakehouse run --layer bronze``; the project must be installed where the driver
runs (``pip install .``).
"""

import os
import sys

# Python puts this script's folder first on the path, where this file would shadow the
# ``bronze`` package it runs.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from lakehouse.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", "--layer", "bronze", *sys.argv[1:]]))
