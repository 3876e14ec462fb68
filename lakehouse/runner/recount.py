"""Recounting micro-batches a checkpoint committed but ops.stream_progress never recorded (a job
killed between the two): each is replayed on a copy of the checkpoint into the noop sink."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from lakehouse import checkpoints
from lakehouse.flows import Flow
from lakehouse.redaction import redact
from lakehouse.runner.books import RECOUNT, drops, first_line
from lakehouse.runner.declarations import completeness_columns
from lakehouse.runner.errors import FlowFailed
from lakehouse.runner.monitoring import ProgressRecorder, recorded_batches
from lakehouse.runner.queries import flow_frame
from lakehouse.runner.stopping import POLL_S, StopRequest
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse.storage.store import TableStore

log = logging.getLogger(__name__)


MAX_RECOUNT = 10  # per flow and start; a crash leaves one or two batches unrecorded


def recorded_batches_of(settings: Settings, flows: Sequence[Flow]) -> dict[str, set[int]] | None:
    """The batches ops.stream_progress holds of what the flows' checkpoints still log (see
    :func:`recorded_batches`); None when it cannot be read (then nothing is recounted)."""
    since = {}
    try:
        for flow in flows:
            checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
            committed = checkpoints.committed_batches(checkpoint)
            if committed:
                since[checkpoints.query_id(checkpoint)] = committed[0]
        return recorded_batches(settings, since)
    except Exception as exc:  # monitoring must never stop a flow
        log.warning("could not read ops.stream_progress, no batch is recounted: %s", exc)
        return None


def recount_unrecorded(
    spark: SparkSession,
    store: TableStore,
    settings: Settings,
    flow: Flow,
    recorded: dict[str, set[int]],
    out: TextIO,
    stop: StopRequest | None = None,
) -> list[int]:
    """Record in ops.stream_progress the micro-batches of ``flow`` that its checkpoint committed
    but that have no progress there (``recorded``): a job killed between the two. Each is run
    again on a copy of the checkpoint into Spark's noop sink, which gives the same progress
    (same offsets, same state before it: the same rows dropped); the tables are not touched.
    Returns the batches recounted."""
    checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
    query = checkpoints.query_id(checkpoint)
    if query is None:
        return []
    # (a checkpoint moved: its copy must find the state schema files too)
    checkpoints.relocate_state_schemas(checkpoint)
    lost = [
        b for b in checkpoints.committed_batches(checkpoint) if b not in recorded.get(query, ())
    ]
    if len(lost) > MAX_RECOUNT:
        print(
            f"flow {flow.name}: {len(lost) - MAX_RECOUNT} micro-batches ({lost[0]} to "
            f"{lost[-MAX_RECOUNT - 1]}) have no progress in ops.stream_progress and are not "
            f"recounted (only the last {MAX_RECOUNT} are): their drops stay missing from the "
            "books",
            file=out,
            flush=True,
        )
    recorder = ProgressRecorder(settings, completeness_columns())
    done = []
    for batch in lost[-MAX_RECOUNT:]:
        if stop is not None and stop.requested:
            break
        try:
            progress = _replay(spark, store, settings, flow, batch, stop)
            recorder.record({**progress, "name": flow.name})
        except Exception as exc:  # the flow itself still runs: its books stay short
            print(
                f"flow {flow.name}: could not recount micro-batch {batch} ({redact(str(exc))}); "
                "its drops stay missing from ops.stream_progress",
                file=out,
                flush=True,
            )
            continue
        done.append(batch)
        late, duplicates = drops([progress])
        print(
            f"flow {flow.name}: micro-batch {batch} committed, but its job stopped before "
            f"recording its progress; recounted: {progress['numInputRows']:,} input rows, "
            f"late rows dropped {late:,}, duplicates dropped {duplicates:,}",
            file=out,
            flush=True,
        )
    return done


def _replay(
    spark: SparkSession,
    store: TableStore,
    settings: Settings,
    flow: Flow,
    batch: int,
    stop: StopRequest | None,
) -> dict:
    """The progress (``StreamingQueryProgress.json`` as a dict) of committed micro-batch
    ``batch`` of ``flow``, run again on a copy of its checkpoint into the noop sink (removed
    after)."""
    checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
    copy = settings.root / "checkpoints" / "_recount" / f"{flow.name}-{batch}"
    try:
        checkpoints.copy_with_batch_pending(checkpoint, batch, copy)
        replay = (
            flow_frame(spark, store, settings, flow, copy)
            .writeStream.format("noop")
            .outputMode(flow.output_mode)
            .option("checkpointLocation", str(copy.absolute()))
            .queryName(flow.name + RECOUNT)
            .trigger(once=True)  # a restart with a batch pending runs that batch alone
            .start()
        )
        while not replay.awaitTermination(POLL_S):
            if stop is not None and stop.at_once:
                replay.stop()
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last copy
            copy.parent.rmdir()
    if replay.exception() is not None:
        raise FlowFailed(first_line(replay.exception()))
    progress = [p for p in replay.recentProgress if p["batchId"] == batch]
    if not progress:
        raise FlowFailed(f"the replay ran no micro-batch {batch}")
    return json.loads(progress[-1].json)
