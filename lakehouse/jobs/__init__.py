"""The spark-submit entry points of the layers: ``lakehouse/jobs/<layer>.py`` in the package
(``lakehouse cluster package`` copies them beside the code zip, so a machine with the project
installed and no checkout can submit them), and ``jobs/<layer>.py`` of a checkout, both thin
shims over :func:`submit_main`."""

from __future__ import annotations

import os
import sys

LAYERS = ("bronze", "silver", "gold")


def script(layer: str) -> str:
    """The file of the package's entry point of ``layer`` (to copy: spark-submit runs a file)."""
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}: use one of {', '.join(LAYERS)}")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{layer}.py")


def submit_main(layer: str, script: str) -> int:
    """``lakehouse run --layer <layer>`` with the script's arguments.

    Python puts the script's folder first on the path, where ``jobs/bronze.py`` would shadow
    the ``bronze`` package it runs: the folder is taken off the path first."""
    here = os.path.dirname(os.path.abspath(script))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from lakehouse.cli import main

    return main(["run", "--layer", layer, *sys.argv[1:]])
