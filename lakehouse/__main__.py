"""``python -m lakehouse``: the lakehouse command."""

import sys

from lakehouse.cli import main

sys.exit(main())
