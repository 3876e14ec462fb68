"""Data files for the embedded backend written by Spark's own Parquet writer.

Sending every row through a Python worker to write Parquet with pyarrow costs about as much as
the rest of a bronze ingest. For batch writes (and so for every ``foreachBatch`` sink) the
executors write the files with Spark's JVM writer instead, into a fresh folder under the table
root; the driver reads the footers for the Delta statistics and commits the files with delta-rs
in one transaction, exactly as the Python writer's files are committed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakehouse.settings import SettingsError
from lakehouse.storage import deltafiles as dfiles

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Folders Spark writes a batch into, under the table root; a folder whose files never made it
# into the log (a crash before the commit) is removed by ``lakehouse maintain``.
STAGING_PREFIX = "spark-"


def write_parquet(
    df: DataFrame, root: str, partition_by: Sequence[str] = ()
) -> list[dfiles.AddedFile]:
    """Write ``df`` as Parquet files in a new folder under ``root``; return them ready to commit
    (relative paths, partition values, statistics from the footers). Empty files are dropped."""
    # time first, so path order is write order too
    folder = f"{STAGING_PREFIX}{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:12]}"
    target = os.path.join(os.path.abspath(root), folder)
    writer = df.write.mode("errorifexists").format("parquet")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    try:
        # an explicit file: URI, so a cluster's default file system cannot take the files
        writer.save(Path(target).as_uri())
        if not os.path.exists(os.path.join(target, "_SUCCESS")):
            raise SettingsError(
                f"Spark reported writing {target} but the driver does not see it: the lake root "
                "must be a file system shared by the driver and the executors"
            )
        return _collect(root, target, partition_by)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _collect(root: str, target: str, partition_by: Sequence[str]) -> list[dfiles.AddedFile]:
    files: list[dfiles.AddedFile] = []
    for dirpath, dirs, names in os.walk(target):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for name in sorted(names):
            full = os.path.join(dirpath, name)
            if name.startswith((".", "_")) or not name.endswith(".parquet"):
                os.remove(full)  # _SUCCESS and checksum files: not data
                continue
            meta = pq.read_metadata(full)
            if meta.num_rows == 0:
                os.remove(full)
                continue
            rel = os.path.relpath(full, root)
            stat = os.stat(full)
            files.append(
                dfiles.AddedFile(
                    path=rel,
                    size=stat.st_size,
                    partition_values=_partition_values(
                        os.path.relpath(dirpath, target), partition_by
                    ),
                    stats=footer_stats(meta),
                    modification_time=int(stat.st_mtime * 1000),
                )
            )
    with contextlib.suppress(OSError):
        if not files:
            shutil.rmtree(target)
    return files


def _partition_values(rel_dir: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    if not partition_by:
        return {}
    values: dict[str, str | None] = {}
    for part in rel_dir.split(os.sep):
        key, _, value = part.partition("=")
        value = urllib.parse.unquote(value)
        values[urllib.parse.unquote(key)] = None if value == dfiles.HIVE_NULL else value
    return {name: values.get(name) for name in partition_by}


def footer_stats(meta: pq.FileMetaData) -> str:
    """Delta statistics of a file from its Parquet footer (no data is read).

    Bounds are kept for integers, strings, dates and timestamps; not for floating point (a NaN
    may be left out of the footer's bounds) nor for decimals; null counts for every column."""
    import json

    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    schema = meta.schema.to_arrow_schema()
    for col in range(meta.num_columns):
        path = meta.row_group(0).column(col).path_in_schema if meta.num_row_groups else None
        if path is None:
            continue
        parts = path.split(".")
        arrow_type = _leaf_type(schema, parts)
        if arrow_type is None:
            continue  # inside a list or map: Delta keeps no statistics there
        null_count, lo, hi, bounded = 0, None, None, _bounded(arrow_type)
        for rg in range(meta.num_row_groups):
            stats = meta.row_group(rg).column(col).statistics
            if stats is None or not stats.has_null_count:
                null_count, bounded = None, False
                break
            null_count += stats.null_count
            if not bounded:
                continue
            if not stats.has_min_max:
                if stats.null_count < meta.row_group(rg).num_rows:
                    bounded = False  # values without bounds: no bound for the file
                continue
            try:
                low_value, high_value = stats.min, stats.max
            except (OverflowError, ValueError, UnicodeDecodeError):
                bounded = False  # a bound Python cannot hold (year past 9999, not UTF-8)
                continue
            lo = low_value if lo is None else min(lo, low_value)
            hi = high_value if hi is None else max(hi, high_value)
        if null_count is not None:
            _put(nulls, parts, null_count)
        if bounded and lo is not None:
            low = _bound(lo, arrow_type, "min")
            high = _bound(hi, arrow_type, "max")
            if low is not None:
                _put(mins, parts, low)
            if high is not None:
                _put(maxs, parts, high)
    return json.dumps(
        {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def _leaf_type(schema: pa.Schema, parts: list[str]) -> pa.DataType | None:
    try:
        typ = schema.field(parts[0]).type
    except KeyError:
        return None
    for name in parts[1:]:
        if not pa.types.is_struct(typ):
            return None
        idx = typ.get_field_index(name)
        if idx < 0:
            return None
        typ = typ.field(idx).type
    return None if pa.types.is_nested(typ) else typ


def _bounded(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


def _bound(value: Any, t: pa.DataType, kind: str) -> Any:
    """A footer bound as a Delta statistic, or None when it cannot be one exactly."""
    if isinstance(value, bytes):
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            return None
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return dfiles._stat_value(value, kind)
    except (OverflowError, ValueError):
        return None


def _put(target: dict, parts: list[str], value: Any) -> None:
    for name in parts[:-1]:
        target = target.setdefault(name, {})
    target[parts[-1]] = value
