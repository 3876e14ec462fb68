"""What the ``jobs/<layer>.py`` spark-submit shims run."""

from __future__ import annotations

import os
import sys


def submit_main(layer: str, script: str) -> int:
    """``lakehouse run --layer <layer>`` with the script's arguments.

    Python puts the script's folder first on the path, where ``jobs/bronze.py`` would shadow
    the ``bronze`` package it runs: the folder is taken off the path first."""
    here = os.path.dirname(os.path.abspath(script))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from lakehouse.cli import main

    return main(["run", "--layer", layer, *sys.argv[1:]])
