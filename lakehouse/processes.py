"""Background services the project starts on this machine (the Spark standalone cluster, the
Kafka broker): is a process alive, does a port answer, stop a process group."""

from __future__ import annotations

import os
import signal
import socket
import time


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
    """SIGTERM to the process group ``pid`` leads, SIGKILL if it is still there after
    ``timeout_s``; True when it ended on the SIGTERM."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not alive(pid):
        return True
    os.killpg(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.1)
    return False
