"""The one base of every error a user can cause (bad input, settings, a missing table, a flow
that failed): ``lakehouse``'s ``main`` prints such an error as one line and exits with its
``exit_code``. Any other exception is a bug and keeps its traceback.

Each error also keeps the builtin base it always had (``ValueError``, ``FileNotFoundError``,
``RuntimeError``), so code that caught those still does."""

from __future__ import annotations


class LakehouseError(Exception):
    """An error a user can cause and mend: one line, exit code 2 (bad input or configuration)."""

    exit_code = 2
