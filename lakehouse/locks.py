"""One run per flow and lake: a second ``lakehouse run`` of a flow that is running is refused
before any query starts, in one line naming the flow, the process and since when it runs.

Each flow of a run holds an exclusive ``flock`` on ``checkpoints/<layer>/<flow>.lock`` while
it runs. The operating system releases it when the process ends, however it ends, so a run
killed with ``kill -9`` leaves nothing that blocks the next one. (Spark itself would let the
second query start and then fail it with ``CONCURRENT_STREAM_LOG_UPDATE``.) The lock is as
good as the file system's ``flock``: local disks, and the shared folder of a cluster whose
driver runs on one machine.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

from lakehouse.errors import LakehouseError


class FlowRunning(LakehouseError, RuntimeError):
    """Another run of the flow holds its lock."""


def lock_path(checkpoint: Path) -> Path:
    return checkpoint.parent / f"{checkpoint.name}.lock"


@contextlib.contextmanager
def flow_locks(flows: Sequence[tuple[str, Path]]) -> Iterator[None]:
    """Hold the lock of every (flow name, checkpoint) for the block; raise
    :class:`FlowRunning` (holding none) when another run holds one."""
    held: list[int] = []
    try:
        for name, checkpoint in flows:
            held.append(_acquire(name, lock_path(checkpoint)))
        yield
    finally:
        for fd in held:
            os.close(fd)


def _acquire(name: str, path: Path) -> int:
    try:
        fd = _locked(path, wait=False)
    except BlockingIOError:
        raise FlowRunning(
            f"flow {name} is already running on this lake ({_holder(path)}); wait for that run "
            "to end, or stop it, before starting another"
        ) from None
    since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


def _locked(path: Path, *, wait: bool) -> int:
    """A descriptor of ``path`` (made, with its folder, when missing) holding its exclusive
    ``flock``; waiting for it when ``wait``, else BlockingIOError while another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holder(path: Path) -> str:
    try:
        record = json.loads(path.read_bytes() or b"{}")
        return f"process {record['pid']} on {record['host']}, since {record['since']}"
    except (ValueError, KeyError, OSError):
        return "a process that has not said which yet"


@contextlib.contextmanager
def creating(table: Path) -> Iterator[None]:
    """Hold, waiting for it, the creation lock of the table at ``table``
    (``.<name>.create.lock`` beside its folder) for the block: processes creating one table
    take turns, so none mistakes another's creation in progress (a log folder with no version
    yet) for one that was killed, and removes it."""
    fd = _locked(table.parent / f".{table.name}.create.lock", wait=True)
    try:
        yield
    finally:
        os.close(fd)
