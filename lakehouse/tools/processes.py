"""Background services the project starts on this machine (the Spark standalone cluster, the
Kafka broker): is a process alive, does a port answer, stop a process group, and is the process a
pid file names the one that was started (:class:`PidFile`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


def alive(pid: int) -> bool:
    """The process runs. A child of this process that ended is reaped here: a zombie still
    answers signal 0, and a stop waiting for it to vanish would wait forever."""
    try:
        ended, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its parent reaps it
        ended = 0
    if ended == pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(host: str, port: int) -> bool:
    """Something accepts connections at ``host:port``."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens at now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """This process could listen at ``host:port`` (nothing holds it, not even a socket in
    TIME_WAIT that a listener without SO_REUSEADDR would trip over)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def stop_group(pid: int, timeout_s: float) -> bool:
    """SIGTERM to the process group ``pid`` leads (to the process alone when it leads none),
    SIGKILL if it is still there after ``timeout_s``; True when it ended on the SIGTERM."""
    try:
        leads = os.getpgid(pid) == pid
    except ProcessLookupError:
        return True
    kill = os.killpg if leads else os.kill
    try:
        kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not alive(pid):
        return True
    try:
        kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    while alive(pid):
        time.sleep(0.1)
    return False


def command_line(pid: int) -> list[str] | None:
    """The arguments process ``pid`` runs with, None when there is no such process; [] when
    they cannot be read (a zombie, a kernel thread). From ``/proc/<pid>/cmdline``, or from
    ``ps`` where there is no /proc (arguments then split at spaces)."""
    if not Path("/proc/self/cmdline").exists():
        done = subprocess.run(
            ["ps", "-ww", "-o", "command=", "-p", str(pid)], capture_output=True, text=True
        )
        return done.stdout.split() if done.returncode == 0 else None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return None
    except OSError:  # gone while read, or not ours to read
        return [] if alive(pid) else None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()  # the NUL that ends the last argument
    return [part.decode(errors="replace") for part in parts]


class Stop(NamedTuple):
    """What stopping the process of a pid file did: the pid stopped (None: none), and a line
    saying what the pid file named instead ("" when it named nothing, or a process that ended)."""

    pid: int | None
    found: str

    def line(self, service: str, folder: Path) -> str:
        """What a ``stop`` command prints for ``service`` (``kafka``) of ``folder``."""
        if self.pid:
            return f"{service}: stopped (pid {self.pid})"
        if self.found:  # a pid file naming another process: left running
            return f"{service}: nothing stopped: {self.found}"
        return f"{service}: not running ({folder})"


@dataclass(frozen=True)
class PidFile:
    """The pid file of a process this project started, and arguments its command line holds
    (the main class, the folder it was started for). A pid file outlives its process when that
    process is killed or the machine restarts; its pid may then be another process's, which a
    stop must not kill: the command line says whose it is."""

    path: Path
    what: str  # the process, for messages: "the Kafka broker of /lake/kafka"
    markers: tuple[str, ...]  # arguments the command line must hold, each whole

    def recorded(self) -> int | None:
        """The pid the file holds, None when there is no readable pid file."""
        try:
            return int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None

    def check(self) -> tuple[int | None, str]:
        """(pid, "") when the file names a live process whose command line holds every marker;
        else (None, what the file names instead), "" when it names nothing or a process that
        ended."""
        pid = self.recorded()
        if pid is None or pid <= 0 or not alive(pid):
            return None, ""
        args = command_line(pid)
        if args is None:
            return None, ""
        if all(marker in args for marker in self.markers):
            return pid, ""
        # (only the program's name: another process's arguments may hold its own secrets)
        program = os.path.basename(args[0]) if args else "no command line"
        return None, (
            f"{self.path} names pid {pid}, which runs {program}, not {self.what}: "
            "left it running and removed the stale pid file"
        )

    def pid(self) -> int | None:
        """The pid of the process started so, when it runs."""
        return self.check()[0]

    def stop(self, timeout_s: float) -> Stop:
        """Stop the process started so (:func:`stop_group`) and remove the pid file; a pid file
        naming another process, or one that ended, is only removed."""
        pid, found = self.check()
        if pid is not None:
            stop_group(pid, timeout_s)
        self.path.unlink(missing_ok=True)
        return Stop(pid, found)
