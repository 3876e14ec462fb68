"""``lakehouse objectstore start|stop|status``: an S3 object store on this machine's loopback.

SeaweedFS (Apache-2.0) serves S3 from one process, ``weed mini``: master, volume server, filer
and S3 gateway together, with its data in ``--dir`` (default ``<root>/objectstore``). ``make
setup`` builds the ``weed`` command once from the Go module proxy into ``build/weed/``
(Makefile, ``weed``); Go's module and build caches keep the work for later builds.

The store serves one bucket, created at its start, to one identity whose keys are made at the
first start and kept in ``<dir>/credentials`` (readable by its owner only). ``start`` prints
what a shell needs to reach it as ``export`` lines to ``eval``; the secret is never printed:
its line reads the credentials file. Production lakes use their own store (AWS S3 or another
that speaks its protocol); this one is for tests, the demo and a laptop.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import LakehouseError
from lakehouse.jars import PROJECT_DIR
from lakehouse.s3client import Bucket, S3Error
from lakehouse.settings import Settings
from lakehouse.tools.processes import PidFile, Stop, free_port, listening, port_free, stop_group

WEED = PROJECT_DIR / "build" / "weed" / "weed"
HOST = "127.0.0.1"
REGION = "us-east-1"
DEFAULT_PORT = 8333
DEFAULT_BUCKET = "lake"
START_TIMEOUT_S = 60.0
# S3's bucket names: 3 to 63 lower-case letters, digits, '-' and '.', a letter or digit at
# each end
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class ObjectStoreError(LakehouseError):
    """The object store could not be started, reached or stopped."""


@dataclass(frozen=True)
class Store:
    """An object store this machine runs: its folder, its S3 port on loopback, its bucket."""

    dir: Path
    port: int = DEFAULT_PORT
    bucket: str = DEFAULT_BUCKET

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def log(self) -> Path:
        return self.dir / "weed.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "weed.pid"

    @property
    def credentials(self) -> Path:
        """Two lines: the access key id, then the secret key."""
        return self.dir / "credentials"

    @property
    def uri(self) -> str:
        """The bucket as Spark's S3A names it."""
        return f"s3a://{self.bucket}"

    @property
    def process(self) -> PidFile:
        """Its pid file, and what the command line of ``weed mini`` for this folder holds."""
        markers = ("mini", f"-dir={self.data.absolute()}")
        return PidFile(self.pid_file, f"the object store of {self.dir}", markers)

    def pid(self) -> int | None:
        return self.process.pid()

    def keys(self) -> tuple[str, str]:
        """(access key id, secret key), made at the first call and kept in the folder (a
        running store knows only the keys it started with: a file it cannot read is an error,
        never replaced)."""
        if not self.credentials.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            access = "LH" + secrets.token_hex(9).upper()
            secret = secrets.token_urlsafe(30)
            # written whole under another name, then linked: a reader sees no half file, and
            # of two first starts one makes the keys
            draft = self.dir / f".credentials.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"{access}\n{secret}\n")
            try:
                os.link(draft, self.credentials)
            except FileExistsError:
                pass  # the other start's keys
            finally:
                draft.unlink()
        try:
            access, secret = self.credentials.read_text().split()
        except (OSError, ValueError):
            raise ObjectStoreError(
                f"cannot read the store's keys in {self.credentials} (two lines: the access "
                "key id, the secret key); stop the store, remove the file and start it again"
            ) from None
        return access, secret

    def client(self) -> Bucket:
        """A client of its bucket with its keys."""
        access, secret = self.keys()
        return Bucket(self.endpoint, self.bucket, access, secret, REGION, timeout_s=10)

    def exports(self) -> list[str]:
        """What a shell needs to reach the store, as ``export`` lines (``eval`` them). The
        secret's line reads the credentials file: no output holds the secret."""
        access, _ = self.keys()
        secret = f'"$(sed -n 2p {shlex.quote(str(self.credentials.absolute()))})"'
        return [
            f"export AWS_ACCESS_KEY_ID={access}",
            f"export AWS_SECRET_ACCESS_KEY={secret}",
            f"export AWS_ENDPOINT_URL={self.endpoint}",
            f"export AWS_REGION={REGION}",
            # the bucket in the path (http://127.0.0.1:8333/lake), not in the host name
            "export LAKEHOUSE_S3__PATH_STYLE=true",
            f"export LAKEHOUSE_OBJECTSTORE_URI={self.uri}",
        ]


def store(
    settings: Settings,
    folder: str | Path | None = None,
    port: int | None = None,
    bucket: str | None = None,
) -> Store:
    """The store of ``lakehouse objectstore``: ``folder`` or ``<root>/objectstore``."""
    port = DEFAULT_PORT if port is None else port
    if not 0 < port < 65536:
        raise ObjectStoreError(f"port {port} is not a TCP port (1 to 65535)")
    bucket = bucket or DEFAULT_BUCKET
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ObjectStoreError(
            f"bucket name {bucket!r} cannot be used: 3 to 63 lower-case letters, digits, '-' "
            "and '.', starting and ending with a letter or digit"
        )
    return Store(Path(folder) if folder else settings.root / "objectstore", port, bucket)


def _weed() -> str:
    if not WEED.exists():
        raise ObjectStoreError(
            f"SeaweedFS's weed command is missing at {WEED}: run `make setup` (it builds it "
            "once from the Go module proxy; Go 1.26 is needed)"
        )
    return str(WEED)


def _failure(s: Store) -> str:
    """The log's first error line, for a start-up that went wrong."""
    lines = s.log.read_text(errors="replace").splitlines() if s.log.exists() else []
    errors = [line for line in lines if line[:1] in ("E", "F") and " " in line]
    return (errors or lines[-1:] or ["no log line"])[0]


def _serves(s: Store) -> bool:
    """Its S3 gateway answers and the bucket is there."""
    if not listening(HOST, s.port):
        return False
    try:
        return s.client().exists()
    except S3Error:
        return False


def start(s: Store, timeout_s: float = START_TIMEOUT_S) -> tuple[int, bool]:
    """Start ``weed mini`` in the background and wait until its bucket answers; (pid, whether
    this call started it: False when it ran already)."""
    running = s.pid()
    if running is not None:
        if not _serves(s):
            raise ObjectStoreError(
                f"an object store from {s.dir} runs (pid {running}) but its bucket does not "
                f"answer at {s.endpoint}; `lakehouse objectstore stop --dir {s.dir}` and start "
                "it again"
            )
        return running, False
    s.pid_file.unlink(missing_ok=True)  # (stale, if any: it names no store of this folder)
    weed = _weed()
    if not port_free(HOST, s.port):
        raise ObjectStoreError(
            f"port {s.port} on {HOST} is in use by another process; choose another with --port"
        )
    s.data.mkdir(parents=True, exist_ok=True)
    access, secret = s.keys()
    # every port but S3's is the kernel's pick (their gRPC ports too: by default each is its
    # port + 10000, which another service may hold); the parts the lake does not use are off
    ports = {name: free_port(HOST) for name in ("master", "volume", "filer")}
    grpc = {name: free_port(HOST) for name in (*ports, "s3")}
    logs = s.dir / "logs"
    logs.mkdir(exist_ok=True)
    # (its own log files in its folder, not in /tmp)
    command = [weed, f"-logdir={logs.absolute()}", "mini", f"-dir={s.data.absolute()}"]
    command += [f"-ip={HOST}", f"-ip.bind={HOST}", f"-s3.port.grpc={grpc['s3']}"]
    command += [f"-bucket={s.bucket}", f"-s3.port={s.port}", "-master.telemetry=false"]
    command += ["-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    command += ["-admin.port.legacy=0", "-s3.autoCreateBucket=false"]
    for name, port in ports.items():
        command += [f"-{name}.port={port}", f"-{name}.port.grpc={grpc[name]}"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    with s.log.open("ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=s.dir,
            env=env,
            start_new_session=True,
        )
    s.pid_file.write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    while not _serves(s):
        code = process.poll()
        if code is not None:
            s.pid_file.unlink(missing_ok=True)
            raise ObjectStoreError(
                f"the object store exited during start-up (exit code {code}): {_failure(s)} "
                f"(log: {s.log})"
            )
        if time.monotonic() > deadline:
            stop_group(process.pid, 10)
            s.pid_file.unlink(missing_ok=True)
            raise ObjectStoreError(
                f"the object store did not serve its bucket within {timeout_s:g} s (log: {s.log})"
            )
        time.sleep(0.3)
    return process.pid, True


def stop(s: Store, timeout_s: float = 30) -> Stop:
    """Stop the store (SIGTERM, SIGKILL after ``timeout_s``); a pid file naming another
    process stops nothing, is removed, and what it named is said."""
    return s.process.stop(timeout_s)


def status_lines(s: Store) -> list[str]:
    """What ``lakehouse objectstore status`` prints."""
    pid = s.pid()
    if pid is None:
        return [f"objectstore: not running (folder {s.dir})"]
    try:
        count = f"{len(s.client().keys())} objects"
    except S3Error as exc:
        count = f"its bucket does not answer: {exc}"
    return [
        f"objectstore: running (pid {pid}) at {s.endpoint}, bucket {s.uri} ({count}), "
        f"data and log in {s.dir}"
    ]
