"""Crashes injected on purpose by the tests of exactly-once (``LAKEHOUSE_FAILPOINT``)."""

from __future__ import annotations

import os

FAILPOINT_ENV = "LAKEHOUSE_FAILPOINT"


class Failpoint(RuntimeError):
    """A crash injected on purpose by a test (``LAKEHOUSE_FAILPOINT``)."""


def failpoint(name: str) -> None:
    """Crash here when ``$LAKEHOUSE_FAILPOINT`` names this point (tests of exactly-once)."""
    if os.environ.get(FAILPOINT_ENV) == name:
        raise Failpoint(f"failpoint {name} reached")
