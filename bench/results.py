"""bench/RESULTS.md: the machine's description and the sections each bench writes."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def machine() -> str:
    """One line: cores, CPU, memory, OS, Python, Java and pyspark versions."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    import pyspark

    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_kb / 1024**2:.0f} GiB, {platform.system()} "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"{java.splitlines()[0] if java else 'java ?'}, pyspark {pyspark.__version__}"
    )


def log_stats(settings, table: str, column: str | None = None):
    """(rows, maximum of ``column``) of a table, from its Delta log's file statistics: no
    table scan. (0, None) for a table not written yet; the maximum is a naive UTC
    ``pandas.Timestamp`` for a timestamp column, None without ``column`` or statistics."""
    import pandas as pd
    import pyarrow as pa

    from lakehouse.storage import deltafiles as dfiles

    path = settings.table_path(table)
    if not dfiles.is_delta_table(path):
        return 0, None
    actions = pa.table(dfiles.open_table(path).get_add_actions(flatten=True)).to_pandas()
    if actions.empty:
        return 0, None
    rows = int(actions["num_records"].sum())
    maxima = actions.get(f"max.{column}") if column else None
    if maxima is None or maxima.isna().all():
        return rows, None
    latest = pd.Timestamp(maxima.max())
    return rows, latest.tz_convert(None) if latest.tzinfo else latest


def _parts(path: Path) -> list[str]:
    """The file's text before its first ``## `` section, then each section's text."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    return text.split("\n## ")


def write_head(path: Path, head: str) -> None:
    """Replace what comes before the first ``## `` section (bench/run.py's table); the
    sections stay as they are."""
    parts = _parts(path)
    parts[0] = head.rstrip("\n") + "\n"
    path.write_text("\n## ".join(parts))


def write_section(path: Path, heading: str, body: list[str]) -> None:
    """Put ``## heading`` with ``body`` into the Markdown file at ``path``: in place of the
    section of that heading, else at the end. The other sections stay as they are."""
    parts = _parts(path)
    section = "\n".join([heading, "", *body]).rstrip("\n") + "\n"
    for i, part in enumerate(parts[1:], start=1):
        if part.splitlines()[0].strip() == heading:
            parts[i] = section
            break
    else:
        parts[0] = parts[0].rstrip("\n") + "\n"
        parts.append(section)
    path.write_text("\n## ".join(parts))
