"""The switch of a full refresh (``lakehouse.runner.refresh``), apart from the command: its staging
folders and marker, the shrink guard, and the switch itself, which a killed run leaves for the
next start of one of its flows to finish (:func:`finish_pending`, called by the runner before a
flow starts).

The switch is recorded in ``<root>/refresh/<id>/refresh.json`` before it begins (written to a
temporary file in the same folder, then renamed over it: a kill or a full disk leaves the old
state or the whole marker, never half of one); a marker damaged anyway fails every run with
one line naming it and the way out (:func:`read_marker`). Each table's overwrite records the
refresh as its app transaction, and is skipped when done already.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse import checkpoints
from lakehouse.errors import LakehouseError
from lakehouse.flows import Flow
from lakehouse.runner.declarations import pipeline
from lakehouse.settings import Settings, checkpoint_key
from lakehouse.storage import deltafiles as dfiles

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MARKER = "refresh.json"


class RefreshError(LakehouseError, ValueError):
    """A full refresh that cannot be done as asked."""


def staging_dirs(settings: Settings) -> list[Path]:
    base = settings.root / "refresh"
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def staged_settings(settings: Settings, base: Path, flows: Sequence[Flow]) -> Settings:
    """Settings under which ``flows`` write staging tables on staging checkpoints under
    ``base`` (a table several of them write has one staging table)."""
    relocated = dict(settings.relocated)
    for flow in flows:
        relocated[checkpoint_key(flow.name)] = str(base / "checkpoints" / flow.layer / flow.flow)
        for output in flow.outputs:
            layer, table = output.table.split(".")
            relocated[output.table] = str(base / "tables" / layer / table)
    return dataclasses.replace(settings, relocated=relocated)


def write_marker(base: Path, marker: dict) -> None:
    """``base``/refresh.json, atomically: written and synced to a temporary file in the same
    folder, then renamed over it (a rename within a folder is atomic)."""
    temporary = base / f".{MARKER}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "w") as f:
            f.write(json.dumps(marker))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, base / MARKER)
    finally:
        temporary.unlink(missing_ok=True)


def read_marker(base: Path) -> dict:
    """The marker of the refresh staged in ``base``; a RefreshError of one line naming the
    file and the way out when it cannot be read (empty, not JSON, not a refresh's)."""
    path = base / MARKER
    try:
        marker = json.loads(path.read_text())
        if (
            not isinstance(marker, dict)
            or not isinstance(marker.get("id"), str)
            or not isinstance(marker.get("flows"), list)
        ):
            raise ValueError("not the marker of a refresh")
        return marker
    except (OSError, ValueError) as exc:
        reason = "empty" if isinstance(exc, ValueError) and not _size(path) else exc
        staged = sorted(
            f"{layer.name}.{table.name}"
            for layer in (base / "tables").glob("*")
            for table in layer.glob("*")
            if table.is_dir()  # (not a table's creation lock)
        )
        again = (
            f"lakehouse run --full-refresh {' --full-refresh '.join(staged)}"
            if staged
            else "the full refresh"
        )
        raise RefreshError(
            f"the full refresh marker {path} is unreadable ({reason}), so no flow can tell "
            f"whether that refresh must still switch its tables: remove the folder {base} "
            f"(that refresh's staging copy), then run `{again}` again"
        ) from None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def finish_pending(spark: SparkSession, store, settings: Settings, flow: Flow, out) -> bool:
    """Finish the switch of a refresh of ``flow`` that a killed run recorded and did not
    finish (see :func:`switch`); True when there was one. A staging run killed before its
    end left no marker: its folder is removed."""
    for base in staging_dirs(settings):
        marker = base / MARKER
        if not marker.is_file():
            if (base / "checkpoints" / flow.layer / flow.flow).is_dir():
                shutil.rmtree(base, ignore_errors=True)
            continue
        if flow.name in read_marker(base)["flows"]:
            switch(store, settings, base, out)
            return True
    return False


def _outputs(flows: Sequence[Flow]) -> dict[str, list]:
    """The tables ``flows`` write: table -> [(flow, output)]."""
    outputs: dict[str, list] = {}
    for flow in flows:
        for output in flow.outputs:
            outputs.setdefault(output.table, []).append((flow, output))
    return outputs


def _staged_rows(store, staged: Settings, table: str, owners: list):
    """(the rows ``table`` switches to, how many of them the refresh rebuilt, how many it
    replaces (None: no table yet), whose rows they are ("" or "the rows of ... in ")), or None
    when the refresh staged no such table. In a table other flows write too, only the rows of
    ``owners`` are counted and replaced."""
    staging = Path(staged.table_path(table))
    if not dfiles.is_delta_table(staging):
        return None
    rows = store.read_path(staging, table)
    new = rows.count()
    shared = [o.shared_by for _, o in owners if o.shared_by]
    whose = ""
    if shared and store.exists(table):
        column = shared[0][0]
        values = ", ".join(f"'{value}'" for _, value in shared)
        mine = f"`{column}` IN ({values})"
        old = store.read(table).where(mine).count()
        rows = store.read(table).where(f"NOT coalesce({mine}, false)").unionByName(rows)
        whose = f"the rows of {', '.join(f.name for f, _ in owners)} in "
    else:
        old = store.read(table).count() if store.exists(table) else None
    return rows, new, old, whose


def check_shrink(store, settings: Settings, base: Path, flows: Sequence[Flow]) -> None:
    """Refuse a refresh that would leave a table with fewer rows than it has (its inputs
    shrank: landing files pruned, Kafka records past retention, ``starting_offsets=latest``):
    a RefreshError naming each such table with its rows before and after."""
    staged = staged_settings(settings, base, flows)
    shrunk = []
    for table, owners in _outputs(flows).items():
        staged_rows = _staged_rows(store, staged, table, owners)
        if staged_rows is None:
            continue
        _, new, old, whose = staged_rows
        if old is not None and new < old:
            shrunk.append(f"{whose}{table} from {old:,} rows to {new:,}")
    if shrunk:
        raise RefreshError(
            f"full refresh refused: it would shrink {'; '.join(shrunk)} (its inputs hold fewer "
            "rows than were loaded: files removed, records past retention?); nothing was "
            "switched, the tables are as they were; to switch to fewer rows anyway, run it "
            "again with --allow-shrink"
        )


def switch(store, settings: Settings, base: Path, out) -> None:
    """Switch a staged refresh in: each table overwritten with its staging rows in one
    commit (where other flows write it too, their rows kept), recorded as the app
    transaction of the refresh, so that a switch repeated after a crash skips the tables done
    already; then each flow's checkpoint replaced by its staging one; then ``base`` removed."""
    marker = read_marker(base)
    flows = [f for f in pipeline().flows if f.name in marker["flows"]]
    staged = staged_settings(settings, base, flows)
    txn = (f"lakehouse-refresh-{marker['id']}", 0)
    for table, owners in _outputs(flows).items():
        staged_rows = _staged_rows(store, staged, table, owners)
        if staged_rows is None:
            continue
        rows, new, old, whose = staged_rows
        store.replace(rows, table, owners[0][1].partition_by, txn=txn, engine=owners[0][1].engine)
        store.register_again(table)
        had = "" if old is None else f"; {'they were' if whose else 'it had'} {old:,}"
        print(f"  {whose}{table}: switched to {new:,} rebuilt rows{had}", file=out)
    for flow in flows:
        checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
        staged_checkpoint = Path(staged.checkpoint_path(flow.layer, flow.flow))
        if staged_checkpoint.is_dir():
            replaced = checkpoint.with_name(checkpoint.name + ".replaced")
            shutil.rmtree(replaced, ignore_errors=True)
            if checkpoint.is_dir():
                checkpoint.rename(replaced)
            staged_checkpoint.rename(checkpoint)
            shutil.rmtree(replaced, ignore_errors=True)
        # (also when a kill came after the rename: the next switch mends it)
        checkpoints.relocate_state_schemas(checkpoint)
        print(
            f"  {flow.name}: its checkpoint is the rebuilt one; its next run goes on from it",
            file=out,
        )
    shutil.rmtree(base, ignore_errors=True)
