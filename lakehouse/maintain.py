"""``lakehouse maintain``: compact small files, checkpoint the log, vacuum old files.

Safe beside running streams: compaction commits with ``dataChange=false`` (stream readers skip
it), and vacuum only deletes files unreferenced for longer than the retention, far longer than a
micro-batch between writing its files and committing them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lakehouse.settings import LAYERS, Settings
from lakehouse.storage import deltafiles as dfiles


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    files_compacted: int
    files_vacuumed: int


def lake_tables(settings: Settings) -> Iterator[tuple[str, Path]]:
    """Every Delta table under the lake root, as (``layer.table``, path), in name order."""
    base = settings.root / "tables"
    for layer in LAYERS:
        folder = base / layer
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if dfiles.is_delta_table(path):
                yield f"{layer}.{path.name}", path


def maintain_table(name: str, path: Path, settings: Settings) -> MaintenanceReport:
    table = dfiles.open_table(path)
    before_version = table.version()
    before_files = len(table.file_uris())
    target = settings.maintenance.target_file_size_mb * 1024 * 1024
    compacted = table.optimize.compact(target_size=target)
    table = dfiles.open_table(path)
    table.create_checkpoint()
    retention = settings.maintenance.vacuum_retention_hours
    vacuumed = table.vacuum(
        retention_hours=retention,
        dry_run=False,
        # a retention under delta's 7-day floor is an explicit choice in the settings
        enforce_retention_duration=retention >= 168,
        # also files no commit ever referenced: a write that crashed before its commit
        full=True,
    )
    _remove_empty_folders(path)
    table = dfiles.open_table(path)
    return MaintenanceReport(
        table=name,
        version_before=before_version,
        version_after=table.version(),
        files_before=before_files,
        files_after=len(table.file_uris()),
        files_compacted=int(compacted.get("numFilesRemoved", 0)),
        files_vacuumed=len(vacuumed),
    )


def _remove_empty_folders(root: Path) -> None:
    """Folders emptied by the vacuum (a crashed write's staging folder, an old partition)."""
    for folder, _dirs, _files in os.walk(root, topdown=False):
        if Path(folder) != Path(root) and "_delta_log" not in Path(folder).parts:
            with contextlib.suppress(OSError):  # not empty: keep it
                os.rmdir(folder)


def maintain(settings: Settings, tables: list[str] | None = None) -> list[MaintenanceReport]:
    found = dict(lake_tables(settings))
    if tables:
        missing = [t for t in tables if t not in found]
        if missing:
            raise ValueError(
                f"no such table(s) {', '.join(missing)} under {settings.root}; "
                f"found: {', '.join(found) or 'none'}"
            )
        found = {t: found[t] for t in tables}
    return [maintain_table(name, path, settings) for name, path in found.items()]
