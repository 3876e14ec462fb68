"""spark-submit entry point of the gold layer (a shim over ``lakehouse run --layer gold``).

    spark-submit jobs/gold.py --root DIR [--trigger available-now|continuous]
                                [--max-files-per-trigger N] [--profile P] [--conf KEY=VALUE]

The project must be installed where the driver runs (``pip install .``).
"""

import sys

from lakehouse.jobs import submit_main

if __name__ == "__main__":
    sys.exit(submit_main("gold", __file__))
