"""``lakehouse cluster start|stop|status|package``: a Spark standalone cluster on this
machine's loopback, from the installed pyspark (``spark-class`` Master and Worker), and the
project's code packed for ``spark-submit --py-files``.

The master's address comes from the settings' ``master`` (``spark://127.0.0.1:7077`` in the
``cluster`` profile). Processes, logs and pid files live under ``<root>/cluster/``; a worker's
executors run Python with this interpreter (the project's virtual environment), which has the
third-party packages; the project's own code reaches them in the zip ``package`` writes, one of
the files ``package_dist`` puts in a folder for spark-submit (lakehouse.tools.dist).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lakehouse.errors import LakehouseError
from lakehouse.settings import Settings
from lakehouse.tools.dist import Dist, of_code
from lakehouse.tools.processes import PidFile, listening

PACKAGES = ("lakehouse", "bronze", "silver", "gold")
# the lakehouse package (this module is in lakehouse/tools/): a checkout's or an installed copy's
PACKAGE_DIR = Path(__file__).resolve().parents[1]


class ClusterError(LakehouseError, RuntimeError):
    """The cluster could not be started, reached or stopped."""


@dataclass(frozen=True)
class Endpoints:
    host: str
    port: int
    master_ui: int
    worker_ui: int

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"


def endpoints(settings: Settings, master_ui: int = 8080, worker_ui: int = 8081) -> Endpoints:
    if not settings.master.startswith("spark://"):
        raise ClusterError(
            f"setting 'master' is {settings.master!r}: a standalone cluster needs "
            "spark://HOST:PORT (use --profile cluster)"
        )
    host, _, port = settings.master.removeprefix("spark://").partition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ClusterError(f"lakehouse cluster starts processes on loopback only; got {host}")
    return Endpoints("127.0.0.1", int(port or 7077), master_ui, worker_ui)


def _spark_class() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(Path(_find_spark_home()) / "bin" / "spark-class")


def _folder(settings: Settings) -> Path:
    folder = settings.root / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _master_state(ep: Endpoints) -> dict:
    with urllib.request.urlopen(f"http://{ep.host}:{ep.master_ui}/json/", timeout=5) as r:
        return json.load(r)


# the two processes: their main classes, and the variable whose Java options spark-class adds
# to the command line of each
MAIN_CLASSES = {
    "master": ("org.apache.spark.deploy.master.Master", "SPARK_MASTER_OPTS"),
    "worker": ("org.apache.spark.deploy.worker.Worker", "SPARK_WORKER_OPTS"),
}


def _marker(settings: Settings) -> str:
    """The Java option that names this lake's cluster folder on the command line of the master
    and the worker, so a stop can tell them from other processes (a pid file outlives them)."""
    return f"-Dlakehouse.cluster={(settings.root / 'cluster').absolute()}"


def _process(settings: Settings, name: str) -> PidFile:
    main_class, _ = MAIN_CLASSES[name]
    folder = (settings.root / "cluster").absolute()
    return PidFile(
        settings.root / "cluster" / f"{name}.pid",
        f"the Spark {name} of {folder}",
        (main_class, _marker(settings)),
    )


def _launch(settings: Settings, name: str, args: list[str]) -> int:
    folder = _folder(settings)
    _, options = MAIN_CLASSES[name]
    # (spark-class splits the options as a shell would: a folder with spaces is quoted)
    own = _marker(settings).replace("\\", "\\\\").replace('"', '\\"')
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
        options: f'{os.environ.get(options, "")} "{own}"'.strip(),
    }
    with (folder / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [_spark_class(), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C in the caller's terminal does not reach it
        )
    (folder / f"{name}.pid").write_text(str(process.pid))
    return process.pid


def _pid(settings: Settings, name: str) -> int | None:
    """The pid of the master or worker of this lake when it runs (a pid file naming another
    process does not count)."""
    return _process(settings, name).pid()


def start(
    settings: Settings,
    cores: int = 2,
    memory: str = "2g",
    master_ui: int = 8080,
    worker_ui: int = 8081,
    timeout_s: float = 120,
) -> Endpoints:
    """Start a master and one worker (``cores`` and ``memory`` for executors) and wait until
    the worker has registered."""
    ep = endpoints(settings, master_ui, worker_ui)
    if _pid(settings, "master") or listening(ep.host, ep.port):
        raise ClusterError(f"something already listens at {ep.url}: `lakehouse cluster stop`?")
    master = [MAIN_CLASSES["master"][0], "--host", ep.host, "--port", str(ep.port)]
    _launch(settings, "master", [*master, "--webui-port", str(ep.master_ui)])
    _wait(lambda: listening(ep.host, ep.port), timeout_s, f"the master at {ep.url}", settings)
    worker = [MAIN_CLASSES["worker"][0], ep.url, "--host", ep.host]
    worker += ["--cores", str(cores), "--memory", memory, "--webui-port", str(ep.worker_ui)]
    worker += ["--work-dir", str(_folder(settings) / "work")]
    _launch(settings, "worker", worker)

    def registered() -> bool:
        try:
            return _master_state(ep).get("aliveworkers", 0) >= 1
        except OSError:
            return False

    _wait(registered, timeout_s, "the worker to register with the master", settings)
    return ep


def _wait(ready, timeout_s: float, what: str, settings: Settings) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            logs = settings.root / "cluster"
            raise ClusterError(
                f"timed out after {timeout_s:.0f} s waiting for {what} (logs: {logs})"
            )
        time.sleep(0.5)


class Stopped(NamedTuple):
    names: list[str]  # the processes stopped: worker, master
    found: list[str]  # per pid file that named another process, what it named (left running)


def stop(settings: Settings, timeout_s: float = 30) -> Stopped:
    """Stop the worker, then the master: each only when its pid file names the process
    started for this lake (its main class and this lake's cluster folder on its command line);
    a pid file naming another process stops nothing and is removed."""
    stopped = Stopped([], [])
    for name in ("worker", "master"):
        pid, found = _process(settings, name).stop(timeout_s)
        if pid is not None:
            stopped.names.append(name)
        if found:
            stopped.found.append(found)
    return stopped


def status(settings: Settings, master_ui: int = 8080) -> dict:
    """The master's view: its status, alive workers, cores and running applications."""
    ep = endpoints(settings, master_ui)
    try:
        state = _master_state(ep)
    except OSError as exc:
        raise ClusterError(
            f"no master answers at http://{ep.host}:{ep.master_ui}/ ({exc})"
        ) from None
    return {
        "url": state.get("url"),
        "status": state.get("status"),
        "workers": state.get("aliveworkers"),
        "cores": state.get("cores"),
        "applications": [a.get("name") for a in state.get("activeapps", [])],
    }


def _replace(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file beside it: a job starting
    meanwhile reads the old file or the new one, never half of one."""
    partial = target.with_name(f".{target.name}.partial")
    shutil.copy2(source, partial)
    os.replace(partial, target)


def package_jars(settings: Settings, dest: Path) -> list[Path]:
    """Copy the project's jars (lakehouse.jars) into folder ``dest`` for ``spark-submit
    --jars``: the driver and every executor load Delta from them. A jar already there (same
    size and time) is not copied again; a jar of ``dest`` the project no longer has is deleted,
    so ``dest/*.jar`` is the classpath."""
    from lakehouse.jars import native_jars

    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for jar in map(Path, native_jars(settings)):
        target = dest / jar.name
        have, want = target.stat() if target.exists() else None, jar.stat()
        if have is None or (have.st_size, have.st_mtime_ns) != (want.st_size, want.st_mtime_ns):
            _replace(jar, target)
        copied.append(target)
    for stale in set(dest.glob("*.jar")) - set(copied):
        stale.unlink()
    return copied


def package(dest: Path) -> Path:
    """The project's packages (code and their data files, such as quality rules) in one zip
    for ``spark-submit --py-files``, from where this module is: a checkout or an installed
    project. Written beside ``dest`` first, then moved over it."""
    root = PACKAGE_DIR.parent
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in PACKAGES:
            for path in sorted((root / name).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(root))
    os.replace(partial, dest)
    return dest


def job_script(layer: str) -> Path:
    """The package's spark-submit entry point of ``layer`` (lakehouse.jobs), to copy:
    spark-submit runs a file."""
    from lakehouse.runner.declarations import PIPELINE

    if layer not in PIPELINE:
        raise ValueError(f"unknown layer {layer!r}: use one of {', '.join(PIPELINE)}")
    return PACKAGE_DIR / "jobs" / f"{layer}.py"


def package_dist(settings: Settings, code: Path) -> tuple[Dist, list[Path]]:
    """Everything spark-submit needs to run a layer, in the folder of code zip ``code``
    (lakehouse.tools.dist): the zip, the layers' entry points, the log4j2 file and the jars; the
    folder and the jars copied."""
    from lakehouse.jars import LOG4J_CONFIG
    from lakehouse.runner.declarations import PIPELINE

    dist = of_code(code)
    package(dist.code)
    dist.jobs.mkdir(parents=True, exist_ok=True)
    for layer in PIPELINE:
        _replace(job_script(layer), dist.job(layer))
    _replace(LOG4J_CONFIG, dist.log4j)
    return dist, package_jars(settings, dist.jars)
