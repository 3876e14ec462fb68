"""``lakehouse maintain``: compact small files, vacuum old files, checkpoint the log.

With delta-spark: ``OPTIMIZE`` (Z-ordered by the columns a table declares in
``Output.zorder_by``), ``VACUUM``, a log checkpoint, each only when it has something to do
(:func:`maintain_table`). Safe beside streams that read a table:
compaction commits with ``dataChange=false`` (stream readers skip it), and vacuum only deletes
files unreferenced for longer than the retention. A table is maintained holding the run locks
of the flows that write it (:mod:`lakehouse.locks`; every flow's for an ops table): on a local
file system a Delta commit is only safe against writers of the same JVM, so a table whose
writer is running in another process is reported as failed, naming that run, and left alone.

The retention a table is vacuumed with is never shorter than its readers need: each streaming
checkpoint of the lake (``checkpoints/``, a refresh's staging ones) whose offsets read the
table (a Delta source's offset names the table's id and the ``reservoirVersion`` it has read
up to) keeps every file of the oldest version it has not read yet: the retention is at least
that version's age (from its commit's timestamp), rounded up to hours, plus
``READER_MARGIN_HOURS``. A retention under Delta's own floor (168 hours) is refused unless
``force``: Delta's ``retentionDurationCheck`` stays on otherwise; what no checkpoint records
(a reader from another lake root or a copied checkpoint, a write in progress in another
process) is then only protected by the retention.

One table that fails is reported in one line and the others are still maintained; then
:class:`MaintainFailed` names the tables that failed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import unquote

from lakehouse.errors import LakehouseError
from lakehouse.locks import flow_locks
from lakehouse.settings import LAYERS, Settings
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage.deltafiles import TableNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DELTA_RETENTION_FLOOR_HOURS = 168  # Delta's default deletedFileRetentionDuration, 7 days
READER_MARGIN_HOURS = 1  # added to the age of the oldest version a reader has not read


class RetentionTooShort(LakehouseError, ValueError):
    """A vacuum retention under Delta's floor without ``--force``."""


class MaintainFailed(LakehouseError, RuntimeError):
    """Some tables failed (each reported when it did); the others were maintained."""

    exit_code = 1

    def __init__(self, reports: list[MaintenanceReport], failed: list[str]):
        super().__init__(
            f"maintain failed for {len(failed)} table(s): {', '.join(failed)} (each reported "
            "above); the other tables were maintained"
        )
        self.reports = reports
        self.failed = failed


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    files_compacted: int
    files_vacuumed: int
    retention_hours: float = 0.0
    # why the retention is longer than the settings' (a lagging reader), or ""
    retention_note: str = ""


@dataclass(frozen=True)
class UnreadVersion:
    """The oldest version of a table a streaming checkpoint has not read yet."""

    checkpoint: Path
    version: int

    @property
    def reader(self) -> str:
        """The checkpoint as ``layer.flow`` (its folder's last two names)."""
        return f"{self.checkpoint.parent.name}.{self.checkpoint.name}"


def lake_checkpoints(settings: Settings) -> list[Path]:
    """Every streaming checkpoint of the lake: the flows' (wherever the settings put them),
    any other under ``<root>/checkpoints/<layer>/``, and a full refresh's staging ones."""
    from lakehouse.runner import pipeline

    found = {settings.checkpoint_path(f.layer, f.flow) for f in pipeline().flows}
    for base in (settings.root / "checkpoints", *(settings.root / "refresh").glob("*/checkpoints")):
        found.update(p for p in base.glob("*/*") if p.is_dir() and not p.name.endswith(".replaced"))
    return sorted(p for p in found if (p / "offsets").is_dir())


def unread_versions(checkpoint: Path) -> dict[str, int]:
    """Per Delta table id (``reservoirId``) the checkpoint reads: the oldest version it has
    not read yet. From the offsets of its last committed micro-batch (where its next batch
    starts) and of any batch planned after it (or, before a first commit, every planned
    one): an offset ``(v, -1)`` has read up to version v-1; ``(v, i)`` has read part of v
    (or, ``isStartingVersion``, part of the snapshot of v): v is unread either way."""
    from lakehouse.checkpoints import _batch_files, committed_batches

    planned = _batch_files(checkpoint / "offsets")
    committed = committed_batches(checkpoint)
    start = committed[-1] if committed else min(planned, default=0)
    versions: dict[str, int] = {}
    for batch in sorted(b for b in planned if b >= start):
        path = checkpoint / "offsets" / str(batch)
        try:
            lines = path.read_text().split("\n")[2:]
        except OSError:
            continue
        for line in lines:
            try:
                offset = json.loads(line)
            except ValueError:
                continue  # "-" (a source without an offset yet), another source's format
            if isinstance(offset, dict) and "reservoirId" in offset:
                table_id, version = offset["reservoirId"], int(offset["reservoirVersion"])
                versions[table_id] = min(version, versions.get(table_id, version))
    return versions


def _table_id(path: Path) -> str:
    return dfiles.open_table(path).metadata().id


def commit_timestamp_ms(path: Path, version: int) -> int:
    """When ``version`` of the table at ``path`` was committed: its commit's in-commit or
    commitInfo timestamp, else the log file's modification time; the oldest commit still in
    the log when that version's file is gone."""
    log = dfiles.log_dir(path)
    entry = log / f"{version:020d}.json"
    if not entry.is_file():
        kept = sorted(log.glob("[0-9]*.json"))
        if not kept:
            return 0
        entry = kept[0]
    info = _commit_info(entry)
    stamp = info.get("inCommitTimestamp") or info.get("timestamp")
    return int(stamp) if stamp else int(entry.stat().st_mtime * 1000)


def reader_retention(
    path: Path, readers: list[UnreadVersion], now_ms: int
) -> tuple[float, UnreadVersion | None]:
    """(hours of retention the table's readers need, the reader that needs them most) for
    the table at ``path``: the age of the oldest version one of ``readers`` has not read,
    rounded up to hours, plus READER_MARGIN_HOURS; (0, None) when every reader has read its
    latest version. Every file that version and later ones need was removed (if at all) by a
    commit no older than it, so a vacuum keeping tombstones that young keeps them."""
    latest = dfiles.latest_version(path)
    lagging = [r for r in readers if r.version <= latest]
    if not lagging:
        return 0.0, None
    oldest = min(lagging, key=lambda r: r.version)
    age_hours = max(0, now_ms - commit_timestamp_ms(path, oldest.version)) / 3_600_000
    return float(math.ceil(age_hours) + READER_MARGIN_HOURS), oldest


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


def writer_locks(settings: Settings, table: str) -> list[tuple[str, Path]]:
    """The run locks (flow, checkpoint) of the flows that write ``table``: of every flow for
    an ops table, which every run writes; none for a table no flow declares."""
    from lakehouse.runner import pipeline

    graph = pipeline()
    writers = graph.flows if table.startswith("ops.") else graph.writers(table)
    return [(f.name, settings.checkpoint_path(f.layer, f.flow)) for f in writers]


def zorder_columns() -> dict[str, tuple[str, ...]]:
    """Per table, the columns its declaration asks maintenance to Z-order its files by."""
    from lakehouse.runner import pipeline

    return {o.table: o.zorder_by for f in pipeline().flows for o in f.outputs if o.zorder_by}


def maintain_table(
    spark: SparkSession,
    name: str,
    path: Path,
    settings: Settings,
    zorder_by: tuple[str, ...],
    readers: list[UnreadVersion] | None = None,
) -> MaintenanceReport:
    """OPTIMIZE (Z-ORDER BY ``zorder_by`` when given), VACUUM and a log checkpoint, with
    delta-spark, in the session :func:`maintenance_confs` set up; the vacuum's retention the
    settings' or, when longer, what ``readers`` (the checkpoints reading the table, see
    :func:`reader_retention`) need. Each step is left out when it has nothing to do (see
    :func:`compacted_since_written`, :func:`vacuum_has_work`, :func:`checkpointed`): a
    table nothing wrote to since it was last maintained costs a listing and a few log reads."""
    # before the compaction: a reader's unread versions are those before it
    needed, reader = reader_retention(path, readers or [], int(time.time() * 1000))
    before_version = dfiles.latest_version(path)
    referenced = dfiles.open_table(path).file_uris()
    before_files = len(referenced)
    compacted = 0
    if not compacted_since_written(path, zorder_by, before_files):
        from delta.tables import DeltaTable

        optimize = DeltaTable.forPath(spark, str(path)).optimize()
        result = optimize.executeZOrderBy(*zorder_by) if zorder_by else optimize.executeCompaction()
        metrics = result.collect()[0].metrics
        compacted = metrics.numFilesRemoved if metrics.numFilesAdded else 0
        if compacted:
            referenced = dfiles.open_table(path).file_uris()
    configured = settings.maintenance.vacuum_retention_hours
    retention = max(float(configured), needed)
    note = ""
    if reader is not None and needed > configured:
        note = (
            f"vacuum retention {retention:g} hours, not {configured:g}: {reader.reader} "
            f"({reader.checkpoint}) has not read version {reader.version} yet"
        )
    on_disk = _files_on_disk(path)
    vacuumed = 0
    if vacuum_has_work(path, unreferenced_files(on_disk, referenced), retention):
        from delta.tables import DeltaTable

        # FULL: also the files no commit ever referenced
        DeltaTable.forPath(spark, str(path)).vacuum(retention)
        vacuumed = sum(f.name.endswith(".parquet") for f in on_disk - _files_on_disk(path))
    _remove_empty_folders(path)
    after_version = dfiles.latest_version(path)
    if not checkpointed(path, after_version):  # after the vacuum: its commits too
        _checkpoint(path)
    return MaintenanceReport(
        table=name,
        version_before=before_version,
        version_after=after_version,
        files_before=before_files,
        files_after=len(referenced),
        files_compacted=int(compacted),
        files_vacuumed=vacuumed,
        retention_hours=retention,
        retention_note=note,
    )


MAINTENANCE_OPERATIONS = frozenset({"VACUUM START", "VACUUM END"})


def compacted_since_written(path: Path, zorder_by: tuple[str, ...], files: int) -> bool:
    """Whether OPTIMIZE has nothing to do: a table of at most one file and no Z-order, or one
    whose commits since its last full OPTIMIZE (Z-ordered by ``zorder_by``, or by nothing)
    are only vacuums: no data came since, so the same OPTIMIZE would find what it left, but
    for the files its rewrite left smaller than their inputs, which a second bin-packing
    could merge a little further (the table's next write brings OPTIMIZE back). A table
    OPTIMIZE found nothing to compact in leaves no commit: it is tried again."""
    if files == 0 or (files == 1 and not zorder_by):
        return True
    log = dfiles.log_dir(path)
    for version in range(dfiles.latest_version(path), -1, -1):
        info = _commit_info(log / f"{version:020d}.json")
        operation = info.get("operation")
        if operation == "OPTIMIZE":
            parameters = info.get("operationParameters") or {}
            try:
                ordered = json.loads(parameters.get("zOrderBy") or "[]")
                whole = json.loads(parameters.get("predicate") or "[]") == []
                clustered = json.loads(parameters.get("clusterBy") or "[]") != []
            except ValueError:
                return False
            # an auto-compaction (``auto``) has sizes of its own: not the OPTIMIZE maintain runs
            auto = parameters.get("auto") not in (None, False, "false")
            return whole and not clustered and not auto and ordered == list(zorder_by)
        if operation not in MAINTENANCE_OPERATIONS:
            return False  # data, a schema change, or a commit no longer in the log
    return False


def _actions(entry: Path, kinds: frozenset[str]) -> Iterator[tuple[str, dict]]:
    """(kind, action) for each action of commit file ``entry`` of one of ``kinds`` (an action
    is a one-key object on a line: ``{"remove":{...}}``); only those lines are parsed. Raises
    OSError when the file is gone."""
    with open(entry, encoding="utf-8") as handle:
        for line in handle:
            kind = line[2 : line.find('"', 2)]
            if kind in kinds:
                yield kind, json.loads(line)[kind]


def _commit_info(entry: Path) -> dict:
    """The commitInfo action of a commit file, or {} (gone, or none)."""
    try:
        for _, info in _actions(entry, frozenset({"commitInfo"})):
            return info
    except (OSError, ValueError):
        pass
    return {}


def unreferenced_files(on_disk: set[Path], referenced: list[str]) -> list[Path]:
    """The files VACUUM may have to delete: those of ``on_disk`` (the table's, outside its
    log: :func:`_files_on_disk`) that are not one of the ``referenced`` data files of its
    latest version (by name: the log and the disk spell partition folders differently).
    Hidden files (a checksum ``.part-*.crc``) are left out: VACUUM never deletes them;
    anything else it might delete (a tombstoned file, a dead write's, a deletion vector)
    makes it run."""
    names = {unquote(uri.rsplit("/", 1)[-1]) for uri in referenced}
    return [f for f in on_disk if not f.name.startswith(".") and f.name not in names]


def vacuum_has_work(path: Path, unreferenced: list[Path], retention_hours: float) -> bool:
    """Whether VACUUM with ``retention_hours`` would delete one of the ``unreferenced`` files
    (:func:`unreferenced_files`). delta-spark 4.4's VacuumCommand deletes a file only when its
    modification time is before the cutoff (now less the retention) and, if the table's state
    holds a tombstone of it (a ``remove`` action), that tombstone's ``deletionTimestamp`` is
    too: a file written weeks ago and compacted away today is kept for another retention."""
    cutoff = time.time() - retention_hours * 3600
    old = {f.name for f in unreferenced if _modified(f) <= cutoff}
    return bool(old) and not old <= recent_tombstones(path, old, int(cutoff * 1000))


def recent_tombstones(path: Path, names: set[str], cutoff_ms: int) -> set[str]:
    """Those of ``names`` (data files' names) whose latest tombstone in the table's log was
    made at or after ``cutoff_ms``. The commits are read newest first, down to the first one
    made before the cutoff (its tombstones and older ones are older: a tombstone is made
    before its commit); a commit no longer in the log ends the search, so what it might
    hold is not counted (VACUUM then runs: never left out for a tombstone not seen)."""
    log = dfiles.log_dir(path)
    seen: set[str] = set()
    recent: set[str] = set()
    kinds = frozenset({"remove", "commitInfo"})
    for version in range(dfiles.latest_version(path), -1, -1):
        made = None
        try:
            for kind, action in _actions(log / f"{version:020d}.json", kinds):
                if kind == "commitInfo":
                    made = action.get("timestamp")
                    continue
                name = unquote(action["path"].rsplit("/", 1)[-1])
                if name in names and name not in seen:  # the newest tombstone is the state's
                    seen.add(name)
                    if (action.get("deletionTimestamp") or 0) >= cutoff_ms:
                        recent.add(name)
        except OSError:
            break
        if seen == names or not isinstance(made, int) or made < cutoff_ms:
            break
    return recent


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return math.inf  # gone already: nothing to delete


def checkpointed(path: Path, version: int) -> bool:
    """Whether the table's last log checkpoint (``_delta_log/_last_checkpoint``) is of
    ``version``."""
    try:
        last = json.loads((dfiles.log_dir(path) / "_last_checkpoint").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(last, dict) and last.get("version") == version


def maintenance_confs(spark: SparkSession, settings: Settings, force: bool) -> None:
    """The session confs of :func:`maintain_table`, the same for every table of a run."""
    target = settings.maintenance.target_file_size_mb * 1024 * 1024
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target))
    # Delta's own check refuses a retention under the table's deletedFileRetentionDuration
    # (7 days by default): on unless --force; without the second conf delta-spark 4.4
    # ignores a retention other than 0 and uses the table's
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(not force).lower())
    spark.conf.set("spark.databricks.delta.vacuum.retentionWindowIgnore.enabled", "false")
    # VACUUM lists the table's folders in as many tasks as this says (default 10,000: 45 s of
    # empty tasks for a small table on a laptop); the shuffle partitions are the lake's scale
    spark.conf.set(
        "spark.sql.sources.parallelPartitionDiscovery.parallelism",
        str(max(2, settings.partitions)),
    )


def _checkpoint(path: Path) -> None:
    """Write a Delta log checkpoint of the table's latest version, by delta-rs's public API
    (delta-spark has none: it checkpoints every ``delta.checkpointInterval`` commits by
    itself)."""
    dfiles.open_table(path).create_checkpoint()


def _files_on_disk(root: Path) -> set[Path]:
    """Every file under the table's folder but its log's."""
    found: set[Path] = set()
    for folder, dirs, files in os.walk(root):
        if "_delta_log" in dirs:
            dirs.remove("_delta_log")
        found.update(Path(folder, f) for f in files)
    return found


def maintain(
    settings: Settings,
    tables: list[str] | None,
    spark: SparkSession,
    *,
    force: bool = False,
    err: TextIO | None = None,
) -> list[MaintenanceReport]:
    """Maintain every table of the lake (or ``tables``); a table that fails is reported in
    one line on ``err`` (stderr) and the others are still maintained, then
    :class:`MaintainFailed` names those that failed. A vacuum retention under Delta's floor
    is refused unless ``force`` (see the module docstring)."""
    from lakehouse.runner.books import first_line

    err = err or sys.stderr
    configured = settings.maintenance.vacuum_retention_hours
    if configured < DELTA_RETENTION_FLOOR_HOURS and not force:
        raise RetentionTooShort(
            f"maintenance.vacuum_retention_hours = {configured} is under Delta's floor of "
            f"{DELTA_RETENTION_FLOOR_HOURS} hours: give --force to vacuum with it (maintain "
            "still keeps what the lake's checkpoints have not read, but a write in progress "
            "in another process, or a reader whose checkpoint is elsewhere, can lose files "
            "and then fail until a full refresh)"
        )
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
    unread: dict[str, list[UnreadVersion]] = {}
    for checkpoint in lake_checkpoints(settings):
        for table_id, version in unread_versions(checkpoint).items():
            unread.setdefault(table_id, []).append(UnreadVersion(checkpoint, version))
    maintenance_confs(spark, settings, force)

    def one(name: str, locks: list[tuple[str, Path]]) -> MaintenanceReport:
        # never a commit beside another process's: a Delta commit on a local file system is
        # safe only against writers in the same JVM
        with flow_locks(locks):
            path = found[name]
            readers = unread.get(_table_id(path), [])
            return maintain_table(spark, name, path, settings, zorder.get(name, ()), readers)

    done: dict[str, MaintenanceReport] = {}
    locks = {name: writer_locks(settings, name) for name in found}
    for name, outcome in _in_turns(locks, one, settings.maintenance.parallel_tables):
        if isinstance(outcome, MaintenanceReport):
            done[name] = outcome
        else:
            print(f"maintain: {name} failed: {first_line(outcome)}", file=err, flush=True)
    reports = [done[name] for name in found if name in done]
    failed = [name for name in found if name not in done]
    if failed:
        raise MaintainFailed(reports, failed)
    return reports


def _in_turns(
    locks: dict[str, list[tuple[str, Path]]],
    work: Callable[[str, list[tuple[str, Path]]], MaintenanceReport],
    threads: int,
) -> Iterator[tuple[str, MaintenanceReport | Exception]]:
    """``work(table, its locks)`` for every table of ``locks``, ``threads`` tables at once,
    in their order; a table whose locks one under way holds waits for it (a second ``flock``
    of this process would be refused). Yields (table, report or exception) as each ends.
    (A small table's jobs leave cores idle between them: on 2 cores, a lake of 21 tables took
    88 s four at a time against 107 s one at a time; bench/maintain.py.)"""
    pending = list(locks)
    running: dict[Future, str] = {}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="maintain") as pool:
        while pending or running:
            held = {path for name in running.values() for _, path in locks[name]}
            for name in list(pending):
                mine = {path for _, path in locks[name]}
                if len(running) < threads and not mine & held:
                    pending.remove(name)
                    held |= mine
                    running[pool.submit(work, name, locks[name])] = name
            ended, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in ended:
                name = running.pop(future)
                error = future.exception()
                yield name, error if isinstance(error, Exception) else future.result()
