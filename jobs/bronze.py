"""spark-submit entry point of the bronze layer (a shim over ``lakehouse run --layer bronze``).

    spark-submit jobs/bronze.py --root DIR [--trigger available-now|continuous]
                                [--max-files-per-trigger N] [--profile P] [--conf KEY=VALUE]

The project must be installed where the driver runs (``pip install .``).
"""

import sys

from lakehouse.jobs import submit_main

if __name__ == "__main__":
    sys.exit(submit_main("bronze", __file__))
