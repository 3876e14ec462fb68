"""The project as a user gets it: a wheel built the way docker/Dockerfile builds it (``pip
install .`` on what the Dockerfile copies before that line), installed in a fresh virtual
environment outside the checkout, run with the image's environment (its ``ENV`` lines, with
``/opt/...`` paths mapped to local equivalents) from a folder that is not the checkout.

Only the first test runs in the default suite (it reads files); the others build a wheel and a
virtual environment (about 45 seconds with pip's cache warm, their dependencies from PyPI as
pinned in pyproject.toml), and one of them runs the demo on Spark.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
DOCKERFILE = PROJECT / "docker" / "Dockerfile"
PYPROJECT = tomllib.loads((PROJECT / "pyproject.toml").read_text())


def _packages() -> list[str]:
    """The top-level packages the wheel holds (pyproject's packages.find include patterns)."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return [pattern.removesuffix("*") for pattern in include]


def _data_files() -> list[str]:
    """Every file of the packages that is not Python: what they read at run time."""
    found = []
    for package in _packages():
        for path in sorted((PROJECT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".py":
                found.append(path.relative_to(PROJECT).as_posix())
    return found


def test_every_data_file_of_the_packages_is_declared_package_data():
    """setuptools puts only modules in a wheel: a rules file or log4j2.properties left out of
    [tool.setuptools.package-data] is missing from every installed copy (the demo then stops
    with "no rules file at .../site-packages/silver/rules/impressions.toml")."""
    declared = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    assert _data_files(), "the packages read some files; the search found none"
    for name in _data_files():
        package, inner = name.split("/", 1)
        patterns = declared.get(package, [])
        assert any(fnmatch.fnmatch(inner, p) for p in patterns), (
            f"{name} is not in [tool.setuptools.package-data] {package} = {patterns}"
        )


def test_version_prints_the_package_version(capsys, monkeypatch):
    """`lakehouse --version`: the installed distribution's version, or in a checkout that is
    not installed the package's own __version__, which is pyproject's."""
    import importlib.metadata

    import lakehouse
    from lakehouse.cli import main

    assert lakehouse.__version__ == PYPROJECT["project"]["version"]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"lakehouse {importlib.metadata.version('lakehouse')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert lakehouse.version() == lakehouse.__version__


# ---- a built wheel -----------------------------------------------------------------------


def _dockerfile_lines() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):  # also inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
        else:
            lines.append(current + line)
            current = ""
    return lines


def _build_context(dest: Path) -> Path:
    """What the Dockerfile's stage that runs ``pip install .`` copied from the project by
    then, laid out as in the image's work dir, under ``dest``: a wheel built from it holds what
    the image's does (and nothing that a stale build/ folder of the checkout holds)."""
    copies: list[tuple[list[str], str]] = []
    for line in _dockerfile_lines():
        if line.startswith("FROM "):
            copies = []
        elif line.startswith("COPY ") and "--from=" not in line:
            *sources, target = line.split()[1:]
            copies.append((sources, target))
        elif line.startswith("RUN ") and re.search(r"pip install [^&]* \.$", line):
            break
    else:
        pytest.fail("docker/Dockerfile has no `pip install ... .` line")
    for sources, target in copies:
        for source in sources:
            path, inside = PROJECT / source, dest / target
            if path.is_dir():  # Docker copies a folder's content into the target
                shutil.copytree(path, inside, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                if len(sources) > 1 or target.endswith("/"):
                    inside = inside / path.name
                inside.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, inside)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps`` of the Dockerfile's build context (build isolation: setuptools
    from PyPI as [build-system] asks)."""
    base = tmp_path_factory.mktemp("wheel")
    context = _build_context(base / "context")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist")]
        + [str(context)],
        capture_output=True,
        text=True,
        cwd=base,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (base / "dist").glob("lakehouse-*.whl")
    return built


@pytest.mark.e2e
def test_the_wheel_holds_the_files_the_packages_read(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in _data_files() if name not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    for package in _packages():
        assert f"{package}/__init__.py" in names, package
    version = PYPROJECT["project"]["version"]
    assert re.fullmatch(rf"lakehouse-{re.escape(version)}-py3-none-any\.whl", wheel.name)
