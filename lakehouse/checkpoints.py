"""What a streaming checkpoint's files say of its query, read without Spark: its id and the
micro-batches it committed, and a copy of it in which one committed batch is pending again.

Spark's layout (``checkpoints/<layer>/<flow>/``): ``metadata`` holds the query id (the same
for every run on the checkpoint), ``offsets/<n>`` what batch ``n`` reads, ``commits/<n>`` that
it finished (written after its sink committed), ``state/`` the stateful operators' versions
and ``sources/`` the file sources' logs. Files named ``.<n>.crc`` are Hadoop's checksums.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from lakehouse.errors import LakehouseError


class CheckpointError(LakehouseError, ValueError):
    """A checkpoint file that cannot be read: the checkpoint is broken."""


def _json(path: Path, line: int) -> dict:
    """Line ``line`` of a checkpoint log file as JSON; one clear line when it is not."""
    try:
        return json.loads(path.read_text().split("\n")[line])
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        flow = path.parent.parent
        raise CheckpointError(
            f"the checkpoint of {flow.parent.name}.{flow.name} is broken: {path} is not a "
            f"log entry Spark wrote ({type(exc).__name__}); rebuild the flow's tables on a new "
            "checkpoint with `lakehouse run --full-refresh <one of its tables>`"
        ) from None


def query_id(checkpoint: Path) -> str | None:
    """The id of the query that runs on ``checkpoint``; None before its first start."""
    try:
        return json.loads((Path(checkpoint) / "metadata").read_text().splitlines()[0])["id"]
    except FileNotFoundError:
        return None
    except (IndexError, KeyError, ValueError):
        raise CheckpointError(
            f"the checkpoint at {checkpoint} is broken: its metadata file holds no query id; "
            "rebuild the flow's tables on a new checkpoint with `lakehouse run --full-refresh "
            "<one of its tables>`"
        ) from None


def app_id(checkpoint: Path) -> str:
    """The Delta app id of the streaming query on ``checkpoint``, which its table commits
    record with the batch id: ``lakehouse-<query id>``. The query id survives restarts on the
    checkpoint and is new for a new checkpoint, even at the same path, so a stream restarted
    from scratch is not mistaken for a replay of the old one."""
    found = query_id(checkpoint)
    if found is None:
        raise RuntimeError(f"{checkpoint} is not the checkpoint of a started query")
    return f"lakehouse-{found}"


def _batch_files(folder: Path) -> dict[int, list[Path]]:
    """The log files of ``folder`` (``offsets`` or ``commits``) by batch id, checksums with
    their batch."""
    files: dict[int, list[Path]] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            name = path.name
            if name.startswith(".") and name.endswith(".crc"):
                name = name[1:-4]
            if name.isdigit():
                files.setdefault(int(name), []).append(path)
    return files


def remove_unfinished_writes(checkpoint: Path) -> list[Path]:
    """Delete the temporary files a job killed while writing an offset or commit log entry
    left (Hadoop writes ``.<n>.<uuid>.tmp`` and renames it into place; only the writing
    process could have finished that). Spark takes a log with no entry yet for a new query
    and then refuses to start: an ``offsets`` folder holding such a file is 'not empty on
    batch 0' (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). The files deleted."""
    removed = []
    for folder in ("offsets", "commits"):
        if (checkpoint / folder).is_dir():
            for path in (checkpoint / folder).iterdir():
                if path.name.startswith(".") and path.name.endswith((".tmp", ".tmp.crc")):
                    path.unlink(missing_ok=True)
                    removed.append(path)
    return removed


_SCHEMA_FILE = re.compile(r"/(state/\d+/_stateSchema/[^/]+/[^/]+)$")


def relocate_state_schemas(checkpoint: Path) -> list[Path]:
    """Point the operator metadata of a checkpoint that was moved at its own state schema
    files. A transformWithState operator's metadata (``state/<op>/_metadata/v2/<n>``) names
    its state schema files by absolute path: a checkpoint renamed into place (a full refresh's
    switch) or a lake root moved or copied would look for them where the checkpoint was, and
    its query fail on "File ... does not exist" at every start once that place is gone. Each
    such path that is not the checkpoint's own copy of the file, while the checkpoint holds
    one, is rewritten to it (and the entry's Hadoop checksum removed: it checked the old
    text). The files rewritten."""
    rewritten = []
    for entry in sorted(checkpoint.glob("state/*/_metadata/v2/*")):
        if not entry.name.isdigit():
            continue
        lines = entry.read_text(encoding="utf-8").split("\n")
        changed = False
        for index, line in enumerate(lines[1:], start=1):
            if "stateSchemaFilePaths" not in line:
                continue
            record = json.loads(line)
            for store in record.get("stateStoreInfo", []):
                paths = store.get("stateSchemaFilePaths", [])
                for position, path in enumerate(paths):
                    moved = _moved_schema_file(checkpoint, path)
                    if moved is not None:
                        paths[position] = moved
                        changed = True
            lines[index] = json.dumps(record, separators=(",", ":"))
        if changed:
            # (beside the checkpoint's folders, not in the metadata's: Spark reads every name
            # there as a batch number)
            temporary = checkpoint / f".{entry.parent.parent.parent.name}-{entry.name}.tmp"
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
            (entry.parent / f".{entry.name}.crc").unlink(missing_ok=True)
            temporary.replace(entry)
            rewritten.append(entry)
    return rewritten


def _moved_schema_file(checkpoint: Path, path: str) -> str | None:
    """The path of the checkpoint's own copy of state schema file ``path`` (a ``file:`` URI
    Spark wrote) when ``path`` names another file and the checkpoint holds that copy; else
    None."""
    match = _SCHEMA_FILE.search(path)
    if not path.startswith("file:") or match is None:
        return None
    own = checkpoint.resolve() / match.group(1)
    if not own.is_file() or Path(path.removeprefix("file:")).resolve() == own:
        return None
    return f"file:{own}"


def committed_batches(checkpoint: Path) -> list[int]:
    """The ids of the micro-batches the checkpoint's commit log still holds (Spark keeps the
    last ``min_batches_to_retain``), ascending."""
    return sorted(_batch_files(checkpoint / "commits"))


def planned_batches(checkpoint: Path) -> list[int]:
    """The ids of the micro-batches the checkpoint's offset log holds (planned, committed or
    not), ascending."""
    return sorted(_batch_files(checkpoint / "offsets"))


def committed_offsets(checkpoint: Path) -> list | None:
    """What the last committed micro-batch read up to, per source (the offset log's source
    lines, parsed: a Kafka source's is ``{topic: {partition: next offset}}``); None before
    the first commit."""
    committed = committed_batches(checkpoint)
    if not committed:
        return None
    lines = (checkpoint / "offsets" / str(committed[-1])).read_text().split("\n")
    # "v1", the batch's metadata, then a line per source ("-" for a source with no offset yet)
    return [json.loads(line) if line.strip() not in ("", "-") else None for line in lines[2:]]


def source_files(checkpoint: Path, batch: int, source: int = 0) -> list[str]:
    """The files (URIs) file source ``source`` read in micro-batch ``batch``, from its log:
    ``sources/<source>/<batch>``, or the compacted file that holds the batch (Spark compacts
    the log every 10 batches into ``<batch>.compact``, with every batch before it)."""
    folder = checkpoint / "sources" / str(source)
    for path in (folder / str(batch), folder / f"{batch}.compact"):
        if path.is_file():
            entries = path.read_text().split("\n")[1:]  # after the version line
            # (a compacted log holds every batch so far: only the batch's lines are parsed)
            mark = f'"batchId":{batch}'
            found = [json.loads(line) for line in entries if mark in line]
            return [e["path"] for e in found if e.get("batchId") == batch]
    raise CheckpointError(
        f"the checkpoint at {checkpoint} is broken: its file source log has no entry for "
        f"micro-batch {batch}; rebuild the flow's tables on a new checkpoint with "
        "`lakehouse run --full-refresh <one of its tables>`"
    )


def is_no_data_batch(checkpoint: Path, batch: int) -> bool | None:
    """Whether micro-batch ``batch`` reads nothing: its source offsets are those of the batch
    before it (a batch run only to apply a new watermark). None while it is not planned yet."""
    here = checkpoint / "offsets" / str(batch)
    before = checkpoint / "offsets" / str(batch - 1)
    try:
        planned = here.read_text().split("\n")[2:]
    except FileNotFoundError:
        return None
    try:
        return batch > 0 and planned == before.read_text().split("\n")[2:]
    except FileNotFoundError:
        return False


def late_watermark_ms(checkpoint: Path, batch: int) -> int:
    """The watermark micro-batch ``batch`` drops late rows against: the one in force for the
    batch before it (Spark plans a batch with the previous batch's offset metadata for late
    rows, and with its own for eviction), 0 for the first batch or when that entry is gone."""
    before = checkpoint / "offsets" / str(batch - 1)
    if batch <= 0 or not before.is_file():
        return 0
    return int(_json(before, 1).get("batchWatermarkMs") or 0)


# the versions the checkpoint's Delta inputs started at ({table: version or null}), decided at
# its first start (lakehouse.runner.queries.input_starts)
STARTS = "lakehouse-starts.json"


def input_starts(checkpoint: Path) -> dict[str, int | None] | None:
    """The starting versions recorded for the checkpoint's Delta inputs; None when none are
    (a checkpoint made before they were, or not started yet)."""
    try:
        return json.loads((Path(checkpoint) / STARTS).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise CheckpointError(
            f"the checkpoint {checkpoint} is broken: {STARTS} is not JSON; rebuild the flow's "
            "tables on a new checkpoint with `lakehouse run --full-refresh <one of its tables>`"
        ) from None


def record_input_starts(checkpoint: Path, starts: dict[str, int | None]) -> None:
    """Keep ``starts`` in the checkpoint (written whole, then renamed into place)."""
    checkpoint = Path(checkpoint)
    checkpoint.mkdir(parents=True, exist_ok=True)
    partial = checkpoint / f".{STARTS}.partial"
    partial.write_text(json.dumps(starts, sort_keys=True))
    partial.replace(checkpoint / STARTS)


def copy_with_batch_pending(checkpoint: Path, batch: int, target: Path) -> None:
    """Copy ``checkpoint`` to ``target`` and drop the copy's log from ``batch`` on: its offsets
    after ``batch`` and its commits from ``batch`` on. A query started on the copy then runs
    ``batch`` again, with the offsets it had and the state as it was before it. The state of
    later versions stays in the copy: a stateful operator loads the version it asks for."""
    if not (checkpoint / "offsets" / str(batch)).is_file():
        raise FileNotFoundError(
            f"micro-batch {batch} is no longer in the offset log of {checkpoint}"
        )
    shutil.rmtree(target, ignore_errors=True)  # a copy left by a job killed while it replayed
    shutil.copytree(checkpoint, target)
    for folder, keep in (("offsets", lambda n: n <= batch), ("commits", lambda n: n < batch)):
        for n, paths in _batch_files(target / folder).items():
            if not keep(n):
                for path in paths:
                    path.unlink()


def plan_lost_no_data_batch(checkpoint: Path, now_ms: int) -> int | None:
    """Plan again the no-data micro-batch a stop took away; return its id (None: none lost).

    A stateful query whose committed batch moved the watermark runs one more micro-batch
    without data, in which the new watermark closes windows, fires timers and emits unmatched
    outer-join rows. Spark decides on it from the previous batch's execution, which a new run
    of the query does not have: stopped between the two, the query restarts without it, and
    those rows wait for the next new data. The watermark that batch needed is in the last
    commit (``nextBatchWatermarkMs``); when it is ahead of the watermark of the last offsets,
    this writes the offsets of the next batch: the same source offsets with that watermark,
    which Spark then runs first, as it runs any batch planned and not committed."""
    offsets = _batch_files(checkpoint / "offsets")
    if not offsets:
        return None
    last = max(offsets)
    commit = checkpoint / "commits" / str(last)
    if not commit.is_file():
        return None  # Spark runs the planned batch again itself
    committed = _log_entry(commit)
    lines = (checkpoint / "offsets" / str(last)).read_text().split("\n")
    metadata = _json(checkpoint / "offsets" / str(last), 1)
    watermark = int(committed.get("nextBatchWatermarkMs") or 0)
    if watermark <= int(metadata.get("batchWatermarkMs") or 0):
        return None
    metadata.update(
        batchWatermarkMs=watermark,
        batchTimestampMs=max(now_ms, metadata.get("batchTimestampMs", 0)),
    )
    lines[1] = json.dumps(metadata, separators=(",", ":"))
    target = checkpoint / "offsets" / str(last + 1)
    staging = checkpoint / "offsets" / f".{last + 1}.planned.tmp"
    staging.write_text("\n".join(lines))
    staging.rename(target)
    return last + 1


def _log_entry(path: Path) -> dict:
    """The JSON of a commit log entry (``v1`` then one JSON line)."""
    lines = path.read_text().split("\n")
    return _json(path, 1) if len(lines) > 1 and lines[1].strip() else {}
