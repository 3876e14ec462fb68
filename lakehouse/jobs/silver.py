"""spark-submit entry point of the silver layer (a shim over ``lakehouse run --layer silver``),
shipped in the package: ``lakehouse cluster package`` copies it to ``<dist>/jobs/silver.py``.

    spark-submit --py-files <dist>/lakehouse-code.zip <dist>/jobs/silver.py --root DIR
        [--trigger available-now|continuous] [--max-files-per-trigger N] [--profile P]
        [--conf KEY=VALUE]
"""

import sys

from lakehouse.jobs import submit_main

if __name__ == "__main__":
    sys.exit(submit_main("silver", __file__))
