"""``python -m lakehouse``: the lakehouse command."""

import sys

from lakehouse.cli import main

if __name__ == "__main__":  # (not on import: tests import every module)
    sys.exit(main())
