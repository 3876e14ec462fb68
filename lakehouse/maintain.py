"""``lakehouse maintain``: compact small files, checkpoint the log, vacuum old files.

With delta-spark: ``OPTIMIZE`` (Z-ordered by the columns a table declares in
``Output.zorder_by``), a log checkpoint, ``VACUUM``. Safe beside running streams: compaction commits with ``dataChange=false`` (stream
readers skip it) and does not conflict with appends, and vacuum only deletes files unreferenced
for longer than the retention, far longer than a micro-batch between writing its files and
committing them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.settings import LAYERS, Settings
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.deltafiles import TableNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def _remove_empty_folders(root: Path) -> None:
    """Folders emptied by the vacuum (a crashed write's staging folder, an old partition)."""
    for folder, _dirs, _files in os.walk(root, topdown=False):
        if Path(folder) != Path(root) and "_delta_log" not in Path(folder).parts:
            with contextlib.suppress(OSError):  # not empty: keep it
                os.rmdir(folder)


def zorder_columns() -> dict[str, tuple[str, ...]]:
    """Per table, the columns its declaration asks maintenance to Z-order its files by."""
    from lakehouse.runner import declared_layers, layer_flows

    return {
        o.table: o.zorder_by
        for layer in declared_layers()
        for flow in layer_flows(layer)
        for o in flow.outputs
        if o.zorder_by
    }


def maintain_table(
    spark: SparkSession, name: str, path: Path, settings: Settings, zorder_by: tuple[str, ...]
) -> MaintenanceReport:
    """OPTIMIZE (Z-ORDER BY ``zorder_by`` when given), a log checkpoint and VACUUM, with
    delta-spark."""
    from delta.tables import DeltaTable

    before_version = dfiles.latest_version(path)
    before_files = len(dfiles.open_table(path).file_uris())
    table = DeltaTable.forPath(spark, str(path))
    target = settings.maintenance.target_file_size_mb * 1024 * 1024
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target))
    optimize = table.optimize()
    result = optimize.executeZOrderBy(*zorder_by) if zorder_by else optimize.executeCompaction()
    metrics = result.collect()[0].metrics
    compacted = metrics.numFilesRemoved if metrics.numFilesAdded else 0
    _checkpoint(spark, path)
    retention = settings.maintenance.vacuum_retention_hours
    # a retention under delta's 7-day floor is an explicit choice in the settings; without
    # the second conf delta-spark 4.4 ignores a retention other than 0 and uses the table's
    spark.conf.set(
        "spark.databricks.delta.retentionDurationCheck.enabled", str(retention >= 168).lower()
    )
    spark.conf.set("spark.databricks.delta.vacuum.retentionWindowIgnore.enabled", "false")
    # VACUUM lists the table's folders in as many tasks as this says (default 10,000: 45 s of
    # empty tasks for a small table on a laptop); the shuffle partitions are the lake's scale
    spark.conf.set(
        "spark.sql.sources.parallelPartitionDiscovery.parallelism",
        str(max(2, settings.shuffle_partitions)),
    )
    on_disk = _data_files_on_disk(path)
    table.vacuum(float(retention))  # FULL: also files no commit ever referenced
    _remove_empty_folders(path)
    return MaintenanceReport(
        table=name,
        version_before=before_version,
        version_after=dfiles.latest_version(path),
        files_before=before_files,
        files_after=len(dfiles.open_table(path).file_uris()),
        files_compacted=int(compacted),
        files_vacuumed=len(on_disk - _data_files_on_disk(path)),
    )


def _checkpoint(spark: SparkSession, path: Path) -> None:
    """Write a Delta log checkpoint of the table's latest version (delta-spark has no public
    API for it; it checkpoints every 10 commits by itself). Scala's default arguments do not
    exist through py4j: every one is passed."""
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
    log.checkpoint(log.update(False, none, none), none)


def _data_files_on_disk(root: Path) -> set[str]:
    return {
        os.path.join(folder, f)
        for folder, _dirs, files in os.walk(root)
        if "_delta_log" not in Path(folder).parts
        for f in files
        if f.endswith(".parquet")
    }


def maintain(
    settings: Settings, tables: list[str] | None, spark: SparkSession
) -> list[MaintenanceReport]:
    """Maintain every table of the lake (or ``tables``)."""
    found = dict(lake_tables(settings))
    if tables:
        missing = [t for t in tables if t not in found]
        if missing:
            raise TableNotFound(
                f"no such table(s) {', '.join(missing)} under {settings.root}; "
                f"found: {', '.join(found) or 'none'}"
            )
        found = {t: found[t] for t in tables}
    zorder = zorder_columns()
    return [
        maintain_table(spark, name, path, settings, zorder.get(name, ()))
        for name, path in found.items()
    ]
