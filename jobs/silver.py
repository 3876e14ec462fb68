"""spark-submit entry point of the silver layer (a shim over ``lakehouse run --layer silver``).

    spark-submit jobs/silver.py --root DIR [--trigger available-now|continuous]
                                [--max-files-per-trigger N] [--profile P] [--conf KEY=VALUE]

The project must be installed where the driver runs (``pip install .``).
"""

import sys

from lakehouse.jobs import submit_main

if __name__ == "__main__":
    sys.exit(submit_main("silver", __file__))
