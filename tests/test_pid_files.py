"""A stop kills only the process it started: ``lakehouse kafka stop`` and ``lakehouse cluster
stop`` check the command line of the process a pid file names (no broker, no Spark started)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lakehouse.cli import main
from lakehouse.tools import kafka
from lakehouse.tools.processes import PidFile, alive, command_line


@pytest.fixture
def sleeper():
    """A live process that is none of the project's: ``sleep 60``."""
    process = subprocess.Popen(["sleep", "60"])
    _started(process, ["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _started(process: subprocess.Popen, args: list[str]) -> None:
    """Wait until the child runs its program (before, its command line is this Python's)."""
    deadline = time.monotonic() + 10
    while command_line(process.pid) != args:
        assert time.monotonic() < deadline, command_line(process.pid)
        time.sleep(0.01)


def _stale(path, pid: int, what: str) -> str:
    return (
        f"{path} names pid {pid}, which runs sleep, not {what}: left it running and removed "
        "the stale pid file"
    )


def test_kafka_stop_leaves_a_process_it_did_not_start_alone(tmp_path, capsys, sleeper):
    folder = tmp_path / "broker"
    folder.mkdir()
    pid_file = folder / "broker.pid"
    args = ["--root", str(tmp_path / "lake"), "--dir", str(folder)]

    pid_file.write_text(str(sleeper.pid))
    assert main(["kafka", "status", *args]) == 1  # not counted as a running broker
    assert capsys.readouterr().out == f"kafka: not running (folder {folder})\n"
    assert main(["kafka", "stop", *args]) == 0
    what = f"the Kafka broker of {folder}"
    assert capsys.readouterr().out == (
        f"kafka: nothing stopped: {_stale(pid_file, sleeper.pid, what)}\n"
    )
    assert sleeper.poll() is None and not pid_file.exists()

    # a pid file of a process that ended, or no pid file: nothing to say
    pid_file.write_text("999999999")
    assert main(["kafka", "stop", *args]) == 0
    assert capsys.readouterr().out == f"kafka: not running ({folder})\n"
    assert not pid_file.exists()


def test_cluster_stop_leaves_processes_it_did_not_start_alone(tmp_path, capsys, sleeper):
    root = tmp_path / "lake"
    (root / "cluster").mkdir(parents=True)
    for name in ("master", "worker"):
        (root / "cluster" / f"{name}.pid").write_text(f"{sleeper.pid}\n")
    assert main(["cluster", "stop", "--root", str(root)]) == 0
    folder = root / "cluster"
    assert capsys.readouterr().out.splitlines() == [
        f"nothing stopped: {_stale(folder / f'{n}.pid', sleeper.pid, f'the Spark {n} of {folder}')}"
        for n in ("worker", "master")
    ]
    assert sleeper.poll() is None
    assert not any((folder / f"{n}.pid").exists() for n in ("master", "worker"))
    assert main(["cluster", "stop", "--root", str(root)]) == 0
    assert capsys.readouterr().out == "no cluster process was running\n"


def test_the_process_started_is_stopped(tmp_path):
    """A process whose command line holds the markers is the one a stop ends, whether it leads
    its process group (as the project starts them) or not."""
    broker = kafka.Broker(tmp_path / "broker", 9)
    broker.dir.mkdir()
    for own_group in (True, False):
        # (a Python process posing as the broker: Kafka's main class and this folder's
        # config on its command line; it notes the SIGTERM of a controlled shutdown)
        termed = broker.dir / f"termed-{own_group}"
        code = (
            "import pathlib, signal, sys, time\n"
            "def down(*_): pathlib.Path(sys.argv[1]).write_text('SIGTERM'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, down)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)"
        )
        args = [sys.executable, "-c", code, str(termed)]
        args += ["kafka.Kafka", str(broker.properties.absolute())]
        process = subprocess.Popen(args, start_new_session=own_group, stdout=subprocess.PIPE)
        try:
            assert process.stdout.readline() == b"ready\n"
            broker.pid_file.write_text(str(process.pid))
            assert broker.pid() == process.pid
            assert kafka.stop(broker, timeout_s=10) == (process.pid, "")
            assert not alive(process.pid) and termed.read_text() == "SIGTERM"
            assert not broker.pid_file.exists()
        finally:
            process.kill()
            process.wait()
            process.stdout.close()


def test_a_marker_must_be_a_whole_argument(tmp_path, sleeper):
    """``sleep 60`` holds "60" as an argument, not "6": a marker is matched whole."""
    path = tmp_path / "x.pid"
    path.write_text(str(sleeper.pid))
    assert PidFile(path, "sleep", ("60",)).pid() == sleeper.pid
    stop = PidFile(path, "a six", ("6",)).stop(timeout_s=1)
    assert stop.pid is None and "which runs sleep, not a six" in stop.found
    assert alive(sleeper.pid) and not path.exists()
