"""Every error a user can cause derives from LakehouseError, which ``main`` prints as one line."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from lakehouse.cli import main
from lakehouse.errors import LakehouseError

PACKAGES = ("lakehouse", "bronze", "silver", "gold")
# exceptions that never reach a user: control flow inside the runner, a test's failpoint, the
# form of a stop Spark recognizes in a foreachBatch function
INTERNAL = {
    "lakehouse.runner.errors.RunStopped",
    "lakehouse.storage.faults.Failpoint",
    "lakehouse.storage.streams.BatchInterrupted",
}


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        names = [package] + [
            info.name for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}.")
        ]
        for name in names:
            for _, value in inspect.getmembers(importlib.import_module(name), inspect.isclass):
                if issubclass(value, BaseException) and value.__module__ == name:
                    found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_error_the_project_defines_is_a_lakehouse_error_or_declared_internal():
    found = _defined_exceptions()
    assert found.keys() >= INTERNAL, "an internal exception was renamed: update INTERNAL"
    stray = sorted(
        n for n, c in found.items() if n not in INTERNAL and not issubclass(c, LakehouseError)
    )
    assert stray == []


def test_a_failed_run_exits_1_and_bad_input_2(capsys):
    from lakehouse.quality import QualityFailure
    from lakehouse.runner import FlowFailed

    assert FlowFailed.exit_code == QualityFailure.exit_code == 1
    assert LakehouseError.exit_code == 2
    code = main(["sql", "--root", "/nonexistent-lake", "--profile", "test"])
    assert code == 2
    assert capsys.readouterr().err == (
        "lakehouse: error: give a statement or --file, one of the two\n"
    )


@pytest.mark.parametrize("argv", [["state", "gold.nope"], ["sql", "--file", "/nonexistent.sql"]])
def test_bad_input_is_one_line_on_stderr(argv, capsys, tmp_path):
    assert main([*argv, "--root", str(tmp_path), "--profile", "test"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lakehouse: error: ") and err.count("\n") == 1, err
