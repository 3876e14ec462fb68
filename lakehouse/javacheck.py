"""Fail early, in one line, when Java is missing or too old for Spark 4."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from lakehouse.errors import LakehouseError

MIN_JAVA = 17


class JavaError(LakehouseError, RuntimeError):
    """Java is missing or too old to run Spark."""


def java_major_version(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        raise JavaError(f"could not read the Java version from `{java} -version`: {text.strip()!r}")
    major = int(match.group(1))
    # Java 8 and older report themselves as 1.x
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java() -> str:
    """Return the java executable Spark will use; raise JavaError with what to install."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no `java` on PATH"
        raise JavaError(
            f"Java {MIN_JAVA} or newer is required by Spark 4 ({where}); "
            f"install it, e.g. `apt-get install openjdk-{MIN_JAVA}-jre-headless`"
        )
    major = java_major_version(java)
    if major < MIN_JAVA:
        raise JavaError(
            f"Java {MIN_JAVA} or newer is required by Spark 4, found Java {major} at {java}; "
            f"install it, e.g. `apt-get install openjdk-{MIN_JAVA}-jre-headless`, and set JAVA_HOME"
        )
    return java
