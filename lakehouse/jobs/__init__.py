"""The spark-submit entry points of the layers: ``lakehouse/jobs/<layer>.py`` in the package
(``lakehouse cluster package`` copies them beside the code zip, so a machine with the project
installed and no checkout can submit them: :func:`lakehouse.tools.cluster.job_script`), and
``jobs/<layer>.py`` of a checkout, both thin shims over :func:`submit_main`."""

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
