"""What the runner raises: a flow that failed, a layer or input that does not exist, a run a
signal cut short."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse.errors import LakehouseError

if TYPE_CHECKING:
    from lakehouse.runner.books import FlowReport


class FlowFailed(LakehouseError, RuntimeError):
    """A streaming query of a flow stopped with an error: exit code 1, as a scheduler expects
    of a run that failed."""

    exit_code = 1


class UnknownLayer(LakehouseError, ValueError):
    """A layer that does not exist or declares no flows."""


class MissingInput(LakehouseError, FileNotFoundError):
    """A flow's input (landing folder or table) does not exist."""


class RunStopped(RuntimeError):
    """SIGINT or SIGTERM cut an available-now run short: a flow was stopped before it was
    done, or a flow or layer was not started. ``reports`` has the flows that ran."""

    def __init__(self, reports: list[FlowReport]):
        super().__init__("stopped before every flow was done")
        self.reports = reports
