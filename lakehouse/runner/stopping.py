"""Stopping flows: SIGINT and SIGTERM counted into a stop request, queries stopped between
micro-batches (or once caught up), and a line per flow saying where it stopped."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse import checkpoints
from lakehouse.session import spark_log_at
from lakehouse.storage.streams import BATCH_ENDED, BATCH_STEPS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


POLL_S = 0.5  # how often a wait looks for a stop request


class StopRequest:
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler, ``docker stop``) while flows run: the first
    asks each flow to stop once the micro-batch it is in has committed, a second to stop at
    once. The handler only counts; the waits look at the count, so no signal lands inside a
    call to the JVM (PySpark's own SIGINT handler cancels every running Spark job from there)."""

    def __init__(self) -> None:
        self.signals = 0

    @property
    def requested(self) -> bool:
        return self.signals > 0

    @property
    def at_once(self) -> bool:
        return self.signals > 1

    def handle(self, signum: int, frame) -> None:
        self.signals += 1


@contextlib.contextmanager
def stop_on_signals(request: StopRequest | None = None):
    """A :class:`StopRequest` (``request``, or a new one) counting SIGINT and SIGTERM for the
    block (the handlers before it come back after: PySpark's own SIGINT handler, set when its
    context starts, cancels every job). Outside the main thread, where Python cannot set
    handlers, it counts nothing and the signals act as before."""
    request = request or StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {sig: signal.signal(sig, request.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def caught_up(progress: dict | None, first_batch: int | None = None) -> bool:
    """Whether a micro-batch's progress shows every available row read and committed: it read
    no rows and each source's end offset is its latest one. (A batch can read no rows while
    data waits: the no-data batch a restarted query may run first, or an empty file.)

    delta-spark's source reports no latest offset: for it a no-data batch (same start and end
    offsets; Spark plans one only when no source has new data) after ``first_batch``, the
    first batch of this run of the query, shows it caught up."""
    if progress is None or progress["numInputRows"]:
        return False

    def offset(value):
        return json.loads(value) if isinstance(value, str) else value

    def done(source: dict) -> bool:
        end, latest = offset(source["endOffset"]), offset(source.get("latestOffset"))
        if latest is not None:
            return end == latest
        later = first_batch is not None and progress["batchId"] > first_batch
        return later and offset(source.get("startOffset")) == end

    return all(done(source) for source in progress["sources"])


class CaughtUp:
    """Tells when an available-now query that does not stop by itself (a transformWithState
    processor in the ProcessingTime mode asks for no-data micro-batches forever) has read
    everything: its last micro-batch shows it caught up (:func:`caught_up`), counting from
    the first batch of this run of the query. (``processAllAvailable`` never returns for such
    a query: each no-data batch counts as progress.)"""

    def __init__(self, query: StreamingQuery):
        self.query = query
        self.first_batch: int | None = None

    def __call__(self) -> bool:
        progress = self.query.lastProgress
        if self.first_batch is None and progress is not None:
            self.first_batch = progress["batchId"]
        return caught_up(progress, self.first_batch)


def stop_caught_up(
    query: StreamingQuery, spark: SparkSession | None = None, ended_wait_s: float = 30.0
) -> None:
    """Stop a query that :class:`CaughtUp` found caught up. Such a query begins its next
    no-data micro-batch at once, and the stop cuts it. So that the next run need not repeat
    it, the stop waits for its foreachBatch function to return (:data:`BATCH_ENDED`, at most
    ``ended_wait_s``) and stops the query while it commits or plans the next batch. With
    ``spark``, Spark's log is off while it stops, or the interrupted file writes log warnings
    and errors with stack traces although nothing failed."""
    # (a query whose sink is not a foreachBatch function, Delta's own, has no Python in the
    # driver to cut, and reports no batch)
    ended = BATCH_ENDED[query.name] if query.name else None
    if ended is not None and BATCH_STEPS.get(query.name):
        ended.clear()
        ended.wait(ended_wait_s)
    with spark_log_at(spark, "OFF") if spark else contextlib.nullcontext():
        query.stop()


def batch_id(query: StreamingQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else progress["batchId"]


def quiet_spark(spark: SparkSession) -> bool:
    """Turn Spark's log off while flows stop on request: a query stopped in the first moments
    of its next micro-batch has its tasks killed and its offset write interrupted, and Spark
    logs each as a warning or error with a stack trace, although nothing failed (the next run
    repeats that batch). The runner prints one line per flow instead (:func:`where_stopped`);
    a query that did fail still reports its error. True, to be restored."""
    spark.sparkContext.setLogLevel("OFF")
    return True


def where_stopped(flow: str, checkpoint: Path) -> str:
    """One line: up to which micro-batch a stopped flow committed, and what its next run does."""
    committed = checkpoints.committed_batches(checkpoint)
    planned = checkpoints.planned_batches(checkpoint)
    done = f"micro-batch {committed[-1]}" if committed else "no micro-batch"
    pending = [n for n in planned if not committed or n > committed[-1]]
    if pending:
        return (
            f"flow {flow}: stopped with {done} committed; micro-batch {pending[-1]} had "
            "begun, and its next run repeats it"
        )
    return f"flow {flow}: stopped with {done} committed; its next run goes on from there"


def stop_between_batches(
    queries: dict[str, StreamingQuery],
    stop: StopRequest,
    checkpoints_of: dict[str, Path],
    poll_s: float = 0.05,
    no_data_wait_s: float = 60.0,
) -> set[str]:
    """Stop each active query once the micro-batch it was in when asked has committed: when
    no trigger is active, or its last progress is of a later batch than then. A stateful query
    often begins a no-data micro-batch at once after a batch that moved its watermark: that
    one (it takes seconds) is let finish too, for up to ``no_data_wait_s``. A query whose next
    micro-batch with data began meanwhile is stopped in that batch's first moments, which its
    restart repeats from the checkpoint (Spark has no way to stop a query between two
    micro-batches that follow each other at once; one cut inside its foreachBatch function
    ends with :class:`lakehouse.storage.streams.BatchInterrupted`). Returns the flows it stopped; one that ended by itself meanwhile is not among
    them. The rest at once on a second signal."""
    running = {name: batch_id(query) for name, query in queries.items() if query.isActive}
    committed: dict[str, int] = {}  # the batch each was in when asked, once it committed
    stopped: set[str] = set()
    deadline = time.monotonic() + no_data_wait_s
    while running and not stop.at_once:
        for name in list(running):
            query = queries[name]
            with contextlib.suppress(Exception):  # a query that ended meanwhile
                if query.isActive:
                    active = query.status["isTriggerActive"]
                    last = batch_id(query)
                    if active and last == running[name]:
                        continue
                    committed.setdefault(name, last)
                    if (
                        active
                        and last == committed[name]
                        and time.monotonic() < deadline
                        # (None: being planned, in the moment between the two batches)
                        and checkpoints.is_no_data_batch(checkpoints_of[name], last + 1)
                        is not False
                    ):
                        continue
                    stopped.add(name)
                    query.stop()
            del running[name]
        time.sleep(poll_s)
    return stopped
