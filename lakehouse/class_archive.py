"""Build the driver JVM's class archive (Java's class data sharing), ``classes.jsa`` in the jars
folder: ``python -m lakehouse.class_archive``, or ``make class-archive`` (again when the project's
packages or jars change). It is not part of ``make setup``: recording takes about 3 minutes, and
it pays back where many short drivers start (scheduled runs, the CLI: 0.7 of their time), while
CI's test steps took as long with it as without (within the machine's swing).

A Spark driver loads and verifies about 17,000 classes from jars at every start, a large part of
what a short command or job costs. Java can keep the classes one run loaded, already parsed and
verified, in a file that later JVMs map instead (``-XX:ArchiveClassesAtExit``, then
``-XX:SharedArchiveFile``). The archive is recorded here by the demo on a few thousand events (one
session that runs every layer), so it holds what the project's commands and jobs load. Every
driver the project starts maps it when it is there (``lakehouse.jars.java_options``); a JVM that
cannot use it (another Java, another classpath) loads its classes as before. Delete the file to
stop using it.

The archive is written under a temporary name by the recording JVM as it exits, and renamed only
once that JVM has ended well: Java crashes on a cut-short archive, so no driver may ever see one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lakehouse.jars import CLASS_ARCHIVE, DEFAULT_JARS_DIR

# the demo's events: every layer runs on them (3 minutes here, nearly all of it fixed costs)
EVENTS = 3000
EXIT_WAIT_S = 600  # the JVM writes the archive after Python has exited (about 20 s here)


def _wait_for_writer(partial: Path, timeout_s: float) -> bool:
    """True once no process is left whose command line names ``partial`` (the recording JVM,
    which lives on after its Python has exited while it writes the archive)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", str(partial)], capture_output=True)
        if found.returncode == 1:  # no process matched
            return True
        time.sleep(0.5)
    return False


def build(target: Path, command: list[str] | None = None) -> None:
    """Record the archive at ``target`` (replacing any) with the demo, or with ``command`` (a
    ``lakehouse`` command line whose driver maps the jars folder of ``target``); raises
    RuntimeError on failure."""
    target.unlink(missing_ok=True)  # a JVM may not write an archive while it maps another
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="lakehouse-class-archive-") as work:
        log = Path(work) / "record.log"
        env = {
            **os.environ,
            "LAKEHOUSE_DRIVER_JAVA_OPTIONS": f"-XX:ArchiveClassesAtExit={partial}",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        }
        if command is None:
            command = [sys.executable, "-m", "lakehouse", "demo", "--profile", "local"]
            command += ["--root", str(Path(work) / "lake"), "--events", str(EVENTS)]
        with open(log, "w") as out:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        ended = _wait_for_writer(partial, EXIT_WAIT_S)
        try:
            if code != 0 or not ended or not partial.is_file():
                what = (
                    f"the recording command failed (exit code {code})"
                    if code != 0
                    else "its JVM did not end"
                    if not ended
                    else "its JVM wrote no archive"
                )
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{what}; its last lines:\n{tail}")
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)


def main() -> int:
    target = DEFAULT_JARS_DIR / CLASS_ARCHIVE
    if not DEFAULT_JARS_DIR.is_dir():
        print(f"warning: no {DEFAULT_JARS_DIR}: the JVM's class archive is not built")
        return 0
    print(
        f"recording the driver JVM's class archive into {target} (once; the demo on "
        f"{EVENTS:,} events, about 3 minutes)",
        flush=True,
    )
    started = time.monotonic()
    try:
        build(target)
    except (RuntimeError, OSError) as exc:  # (OSError: no pgrep, say)
        print(f"error: the class archive could not be recorded: {exc}", file=sys.stderr)
        return 1
    size = target.stat().st_size / 2**20
    print(f"class archive recorded: {size:,.0f} MiB in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
