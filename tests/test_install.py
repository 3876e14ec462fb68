"""The project as a user gets it: a wheel built the way docker/Dockerfile builds it (``pip
install .`` on what the Dockerfile copies before that line), installed in a new virtual
environment outside the checkout, run with the image's environment (its ``ENV`` lines, their
``/opt/...`` paths mapped to local equivalents) from a folder that is not the checkout.

The first two tests run in the default suite (they read files, parse the command line). The
e2e ones build the wheel and the virtual environment once (about 45 seconds with pip's cache
warm; the dependencies from PyPI as pyproject.toml pins them); all but the last start no
Spark (``-m e2e -k "not demo"``). The DAG file's test needs Airflow (.venv-airflow).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from dockerfile_helpers import final_stage, image_env, workdir

PROJECT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((PROJECT / "pyproject.toml").read_text())
# Airflow's own virtual environment, as tests/test_orchestration.py finds it
AIRFLOW_BIN = Path(os.environ.get("LAKEHOUSE_AIRFLOW_BIN", PROJECT / ".venv-airflow" / "bin"))
VERSION = PYPROJECT["project"]["version"]


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

    assert lakehouse.__version__ == VERSION
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"lakehouse {importlib.metadata.version('lakehouse')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert lakehouse.version() == lakehouse.__version__


# ---- the image's work dir, a wheel built from it, a virtual environment -------------------


def _lay_out_workdir(dest: Path, until_install: bool) -> Path:
    """The image's work dir as the Dockerfile's final stage fills it, under ``dest``: with
    ``until_install``, what it holds when ``pip install .`` runs (the wheel's build context),
    else all of it (the jars, from the build stage that runs Maven on the project's pom, are
    the project's jars/lib: the same pom, fetched by `make setup`)."""
    dest.mkdir(parents=True)
    for line in final_stage():
        if until_install and line.startswith("RUN ") and re.search(r"pip install [^&]* \.$", line):
            return dest
        if not line.startswith("COPY "):
            continue
        *sources, target = line.split()[1:]
        if sources[0].startswith("--from="):
            assert target == "./jars/lib", f"a COPY this test does not know: {line}"
            (dest / "jars").mkdir(exist_ok=True)
            (dest / "jars" / "lib").symlink_to(PROJECT / "jars" / "lib")
            continue
        for source in sources:
            path, inside = PROJECT / source, dest / target
            if path.is_dir():  # Docker copies a folder's content into the target
                shutil.copytree(path, inside, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                if len(sources) > 1 or target.endswith("/"):
                    inside = inside / path.name
                inside.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, inside)
    if until_install:
        pytest.fail("docker/Dockerfile has no `pip install ... .` line")
    return dest


def _clean_env() -> dict[str, str]:
    """This process's environment without what points at the checkout or its virtualenv."""
    ours = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKEHOUSE_", "PYSPARK_", "PYTEST_"))
        and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME")
    }
    env["PATH"] = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != ours
    )
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps`` of the Dockerfile's build context (build isolation: setuptools
    from PyPI as [build-system] asks)."""
    base = tmp_path_factory.mktemp("wheel")
    context = _lay_out_workdir(base / "context", until_install=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist")]
        + [str(context)],
        capture_output=True,
        text=True,
        cwd=base,
        env=_clean_env(),
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
    assert wheel.name == f"lakehouse-{VERSION}-py3-none-any.whl"


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment outside the checkout with the wheel installed, and its
    dependencies from PyPI as pyproject.toml pins them (pip's cache makes it quick)."""
    venv = tmp_path_factory.mktemp("venv")
    env = _clean_env()
    for command in (
        [sys.executable, "-m", "venv", str(venv)],
        # (--no-compile, as make setup: the modules the tests import are compiled then)
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=venv)
        assert done.returncode == 0, done.stdout + done.stderr
    return venv


def _java_home() -> Path | None:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(java).resolve().parents[1] if java else None


class Image:
    """The image's environment here: its ENV lines, the paths in them mapped to local
    equivalents (a path nobody mapped fails the test: a new ENV needs a thought here), the
    virtual environment's bin first on the PATH, and a working dir outside the checkout."""

    def __init__(self, base: Path, venv: Path):
        self.workdir = _lay_out_workdir(base / "opt-lakehouse", until_install=False)
        self.cwd = base / "elsewhere"
        self.cwd.mkdir()
        java = _java_home()
        self.paths = {  # the image's folders -> here
            workdir(): self.workdir,
            "/opt/java": java or base / "no-java",
            "/opt/airflow-venv": AIRFLOW_BIN.parent,
            "/opt/airflow": base / "airflow",
            "/lake": base / "lake",
            "/tmp": base / "tmp",
        }
        self.java = java
        self.venv = venv
        env = _clean_env()
        for key, value in image_env().items():
            env[key] = self.local(value)
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])
        self.env = env

    def local(self, value: str) -> str:
        if not value.startswith("/"):
            return value
        for folder in sorted(self.paths, key=len, reverse=True):
            if value == folder or value.startswith(folder + "/"):
                return str(self.paths[folder]) + value[len(folder) :]
        pytest.fail(f"the image's ENV has a path this test does not map: {value}")

    def run(self, *command: str, env: dict[str, str] | None = None, **kwargs):
        return subprocess.run(
            [str(c) for c in command],
            capture_output=True,
            text=True,
            cwd=self.cwd,
            env=self.env if env is None else env,
            **kwargs,
        )

    def python(self, code: str, env: dict[str, str] | None = None):
        return self.run(self.venv / "bin" / "python", "-c", code, env=env)


@pytest.fixture(scope="module")
def image(venv, tmp_path_factory) -> Image:
    return Image(tmp_path_factory.mktemp("image"), venv)


INSTALLED = """
import json
from importlib import resources

import lakehouse, silver
from lakehouse.jars import LOG4J_CONFIG, jars_dir
from lakehouse.quality import load_rules
from lakehouse.session import FAIR_POOLS
from lakehouse.settings import load_settings

settings = load_settings()
print(json.dumps({
    "packages": [lakehouse.__file__, silver.__file__],
    "rules": {f.name: len(load_rules(f)) for f in (resources.files("silver") / "rules").iterdir()},
    "log4j": LOG4J_CONFIG.is_file(),
    "pools": FAIR_POOLS.is_file(),
    "profile": settings.profile,
    "master": settings.master,
    "root": str(settings.root),
    "jars": str(jars_dir(settings)),
}))
"""


@pytest.mark.e2e
def test_the_installed_package_runs_outside_the_checkout(image):
    """Installed, in the image's environment, from a folder that is not the checkout: the code
    and its data files come from the virtual environment, `lakehouse --version` answers, the
    image's LAKEHOUSE_* variables load without a word, and without a settings file the
    built-in defaults apply."""
    version = image.run("lakehouse", "--version")
    assert (version.returncode, version.stdout, version.stderr) == (0, f"lakehouse {VERSION}\n", "")

    done = image.python(INSTALLED)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no warning about the image's own variables
    found = json.loads(done.stdout)
    site = image.venv / "lib"
    assert all(Path(p).is_relative_to(site) for p in found["packages"]), found["packages"]
    rules = sorted(p.name for p in (PROJECT / "silver" / "rules").glob("*.toml"))
    assert sorted(found["rules"]) == rules and all(found["rules"].values()), found["rules"]
    assert found["log4j"] and found["pools"]
    # the image's settings file (LAKEHOUSE_CONFIG), its jars (LAKEHOUSE_NATIVE__JARS_DIR)
    assert (found["profile"], found["master"]) == ("local", "local[*]")
    assert found["jars"] == str(image.workdir / "jars" / "lib")

    # no settings file at all (a pip install elsewhere): the built-in defaults
    bare = {k: v for k, v in image.env.items() if not k.startswith("LAKEHOUSE_")}
    done = image.python(INSTALLED, env=bare)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["profile"], found["master"], found["root"]) == (
        "local",
        "local[*]",
        "lakehouse-data",
    )


@pytest.mark.e2e
def test_an_unknown_variable_is_one_warning_for_the_installed_command(image):
    env = {**image.env, "LAKEHOUSE_NOT_A_SETTING": "1"}
    done = image.python("from lakehouse.settings import load_settings; load_settings()", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "lakehouse: warning: ignoring environment variable LAKEHOUSE_NOT_A_SETTING: no setting "
        "is named 'not_a_setting'\n"
    )


DAG_PROBE = """
import importlib.util, json, os
path = os.path.join(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], "lakehouse_dags.py")
spec = importlib.util.spec_from_file_location("lakehouse_dags", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({
    "dags": {d.dag_id: sorted(d.task_dict) for d in (module.pipeline, module.maintenance)},
    "bronze": {
        "application": module.pipeline.get_task("bronze").application,
        "py_files": module.pipeline.get_task("bronze").py_files,
        "jars": module.pipeline.get_task("bronze").jars,
    },
    "package": module.pipeline.get_task("package").bash_command,
}))
"""


@pytest.mark.e2e
def test_the_dag_file_loads_in_the_image_environment(image):
    """The DAG file imports airflow (its operators, airflow.sdk) besides lakehouse's
    standard-library modules: in the image it runs in Airflow's own virtual environment, where
    the project is installed without its dependencies, as in .venv-airflow here (`make
    airflow-setup`); its tasks name the folder the package task packs, not a checkout."""
    dag_file = PROJECT / "orchestration" / "dags" / "lakehouse_dags.py"
    assert re.search(r"^from airflow\.", dag_file.read_text(), re.M), "no longer needs airflow?"
    python = AIRFLOW_BIN / "python"
    if not python.exists():
        pytest.skip(
            f"the DAG file imports airflow, which is not in {AIRFLOW_BIN} "
            "(run `make airflow-setup`, or set LAKEHOUSE_AIRFLOW_BIN)"
        )
    image.paths["/opt/airflow"].mkdir(exist_ok=True)
    done = image.run(python, "-c", DAG_PROBE, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["dags"] == {
        "lakehouse_pipeline": ["bronze", "gold", "package", "silver"],
        "lakehouse_maintenance": ["maintain"],
    }
    # spark-submit gets the folder the package task packs under the lake root, not the checkout
    packed = image.cwd / "lakehouse-data" / "dist"
    bronze = found["bronze"]
    assert bronze["application"] == str(packed / "jobs" / "bronze.py")
    assert bronze["py_files"] == str(packed / "lakehouse-code.zip")
    jars = bronze["jars"].split(",")
    assert jars and all(Path(jar).parent == packed / "jars" for jar in jars), jars
    assert found["package"] == (
        f"lakehouse cluster package --root {packed.parent} --profile local "
        f"--output {packed / 'lakehouse-code.zip'}"
    )


@pytest.mark.e2e
# (CI: 500 events, none of its assertions depends on the size; make test-all: 2,000)
@pytest.mark.parametrize(
    "events", [500, pytest.param(2000, marks=pytest.mark.full, id="2000")], ids=str
)
def test_the_installed_demo_runs_outside_the_checkout(image, tmp_path, events):
    """`lakehouse demo` of the installed package, in the image's environment, from a folder
    that is not the checkout: Spark starts with the wheel's log4j2 and fair scheduler files, and
    silver reads the wheel's quality rules. What it prints, and nothing else (no warning, no
    stack trace, no Python worker's start-up lines), says the books of the rows it wrote.
    Starts Spark (about a minute)."""
    from lakehouse.ops.status import read_table
    from lakehouse.runner import layer_flows
    from lakehouse.settings import load_settings

    if image.java is None:
        pytest.skip("no Java here (the image has Java 17)")
    if not list((PROJECT / "jars" / "lib").glob("delta-spark_*.jar")):
        pytest.skip("no delta-spark jars in jars/lib: run `make setup`")
    root = tmp_path / "lake"
    done = image.run("lakehouse", "demo", "--events", str(events), "--root", root, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    for trouble in ("Reconfiguration failed", "no rules file"):
        assert trouble not in done.stderr, done.stderr[-3000:]
    noisy = ("WARN", " ERROR ", "Traceback", "Warning", "Python worker")
    noise = [line for line in (out + done.stderr).splitlines() if any(n in line for n in noisy)]
    assert noise == []
    # (the tables read with delta-rs: no Spark session in this process)
    lake = load_settings("test", overrides={"root": str(root)})

    def rows(table: str) -> int:
        return len(read_table(lake, table))

    bronze, kept = rows("bronze.events"), rows("silver.events")
    quarantine = read_table(lake, "silver.quarantine")
    quarantined = int((quarantine["table"] == "silver.events").sum())
    assert (
        f"books: {bronze:,} bronze rows = {kept:,} kept + {quarantined:,} quarantined + "
        f"{bronze - kept - quarantined:,} dropped: balanced"
    ) in out
    impressions, clicks = rows("bronze.impressions"), rows("bronze.clicks")
    attributed = rows("silver.ad_attribution")
    assert (
        f"silver.ad_attribution: in {impressions:,} (bronze.impressions) + {clicks:,} "
        f"(bronze.clicks), out {attributed:,}"
    ) in out
    operators = [
        line.split(":")[0].strip()
        for line in out.splitlines()
        if line.strip().startswith("operator ")
    ]
    assert operators == [
        "operator 0 dedupeWithinWatermark",
        "operator 0 symmetricHashJoin",
        "operator 1 dedupeWithinWatermark",
        "operator 2 dedupeWithinWatermark",
    ]
    # then every gold table, with its row count
    for table in [o.table for flow in layer_flows("gold") for o in flow.outputs]:
        assert f"{table}: {rows(table):,} rows; the first 5:" in out
    assert "the books balance: every landing line is in one place, as the manifest says" in out
    assert out.rstrip().splitlines()[-6:-4] == [
        "next:",
        f"  check every table against the reference lakehouse verify --root {root}",
    ]
