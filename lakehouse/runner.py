"""The flow runner: turns flow declarations into streaming queries and runs a layer.

All I/O of a flow happens here: reading landing files or tables as streams, creating output
tables, checkpoints, triggers, waiting and reporting. Layer code only declares flows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lakehouse import checkpoints
from lakehouse.errors import LakehouseError
from lakehouse.flows import Flow, Input, LandingInput, TableInput
from lakehouse.locks import flow_locks
from lakehouse.monitoring import Drops, ProgressRecorder, record_runs, recorded_batches
from lakehouse.settings import Settings, split_table_name
from lakehouse.storage import table_store, trigger_kwargs
from lakehouse.storage.store import Route

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakehouse.storage.store import TableStore

log = logging.getLogger(__name__)
PIPELINE = ("bronze", "silver", "gold")


class FlowFailed(LakehouseError, RuntimeError):
    """A streaming query of a flow stopped with an error: exit code 1, as a scheduler expects
    of a run that failed."""

    exit_code = 1


class UnknownLayer(LakehouseError, ValueError):
    """A layer that does not exist or declares no flows."""


class MissingInput(LakehouseError, FileNotFoundError):
    """A flow's input (landing folder or table) does not exist."""


class RunStopped(RuntimeError):
    """SIGINT or SIGTERM cut an available-now run short: a flow was stopped before it was
    done, or a flow or layer was not started. ``reports`` has the flows that ran."""

    def __init__(self, reports: list[FlowReport]):
        super().__init__("stopped before every flow was done")
        self.reports = reports


def layer_flows(layer: str) -> tuple[Flow, ...]:
    """The flows a layer declares (module ``<layer>.flows``, attribute ``FLOWS``)."""
    if layer not in PIPELINE:
        raise UnknownLayer(f"unknown layer {layer!r}: use one of {', '.join(PIPELINE)} or all")
    try:
        module = importlib.import_module(f"{layer}.flows")
    except ModuleNotFoundError as exc:
        if exc.name != f"{layer}.flows":
            raise
        raise UnknownLayer(f"the {layer} layer declares no flows yet") from None
    return tuple(module.FLOWS)


def declared_layers() -> list[str]:
    """The layers of the pipeline that declare flows, in pipeline order."""
    found = []
    for layer in PIPELINE:
        try:
            layer_flows(layer)
        except UnknownLayer:
            continue
        found.append(layer)
    return found


@dataclass
class FlowReport:
    """What one flow did in a run."""

    flow: str
    batches: int = 0
    input_rows: int = 0  # rows read by the query's sources (a source read twice counts twice)
    seconds: float = 0.0
    error: str | None = None
    late_rows: int = 0  # dropped by a stateful operator for being behind the watermark
    duplicates: int = 0  # dropped by a deduplication operator
    stopped: bool = False  # by SIGINT or SIGTERM while it ran


def _progress_listener(spark: SparkSession, out: TextIO, recorder: ProgressRecorder):
    """Register (once per session) a listener that records every micro-batch in
    ops.stream_progress and prints one line per micro-batch that read rows. It stays
    registered: removing it while Spark still delivers the last events races with the
    delivery; the session's stop drains them."""
    from pyspark.sql.streaming import StreamingQueryListener

    registered = getattr(spark, "_lakehouse_progress", None)
    if registered is not None:
        registered.out, registered.recorder = out, recorder
        return registered

    class Printer(StreamingQueryListener):
        def __init__(self):
            self.out = out
            self.recorder = recorder
            self.ended: set[str] = set()  # run ids of the queries that terminated
            self.lock = threading.Condition()

        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            if p.name and p.name.endswith(RECOUNT):  # recorded by the recount itself
                return
            self.recorder.on_progress(p.json)
            if p.numInputRows:
                print(
                    f"{p.name} batch {p.batchId}: {p.numInputRows:,} rows in "
                    f"{p.batchDuration / 1000:.1f} s ({p.processedRowsPerSecond:,.0f} rows/s)",
                    file=self.out,
                    flush=True,
                )

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            with self.lock:
                self.ended.add(str(event.runId))
                self.lock.notify_all()

        def wait_for(self, run_id: str, timeout: float = 30.0) -> bool:
            """Wait until the query's termination reached the listener: its events come in
            order, so every progress of that run has been recorded by then."""
            with self.lock:
                return self.lock.wait_for(lambda: run_id in self.ended, timeout)

    printer = Printer()
    spark.streams.addListener(printer)
    spark._lakehouse_progress = printer
    return printer


def read_input(
    spark: SparkSession, store: TableStore, settings: Settings, source: Input, max_files: int
) -> DataFrame:
    """A flow input as a streaming DataFrame."""
    from pyspark.sql import functions as F

    if isinstance(source, LandingInput):
        path = settings.landing_path(source.source)
        if not path.is_dir():
            raise MissingInput(
                f"landing folder {path} does not exist; check --root or run `lakehouse generate`"
            )
        # every file counts however old its modification time (a backfill copied with its
        # original times would otherwise be skipped past the default age of 7 days)
        reader = spark.readStream.format("text").option("maxFileAge", "36500d")
        if max_files:
            reader = reader.option("maxFilesPerTrigger", max_files)
        return reader.load(str(path.absolute())).select(
            "value", F.col("_metadata.file_path").alias("_source_file")
        )
    if isinstance(source, TableInput):
        if not store.exists(source.table):
            raise MissingInput(
                f"input table {source.table} does not exist at {store.path(source.table)}; "
                "run the layer that writes it first"
            )
        return store.read_stream(source.table, max_files_per_trigger=max_files or None)
    raise TypeError(f"unknown flow input {source!r}")


def flow_frame(
    spark: SparkSession, store: TableStore, settings: Settings, flow: Flow, checkpoint: Path
) -> DataFrame:
    """The flow's streaming result over its inputs, for a query on ``checkpoint``: a checkpoint
    with no committed micro-batch gets the flow's seed table as initial state."""
    max_files = settings.trigger.max_files_per_trigger
    frames = [read_input(spark, store, settings, source, max_files) for source in flow.inputs]
    params = flow.params(settings) if flow.params else {}
    seed = flow.seed_table(settings) if flow.seed_table else ""
    if seed and not checkpoints.committed_batches(checkpoint):
        if not store.exists(seed):
            raise MissingInput(
                f"flow {flow.name}: its seed table {seed} does not exist at {store.path(seed)}"
            )
        params["initial_state"] = store.read(seed)
    return flow.transform(*frames, **params)


def start_flow(
    spark: SparkSession, store: TableStore, settings: Settings, flow: Flow
) -> StreamingQuery:
    """Create the flow's output tables and start its streaming query."""
    for output in flow.outputs:
        if output.schema is not None:
            store.create(output.table, output.schema, output.partition_by)
    checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
    for path in checkpoints.remove_unfinished_writes(checkpoint):
        log.info("flow %s: removed %s, left by a job killed while writing it", flow.name, path)
    planned = checkpoints.plan_lost_no_data_batch(checkpoint, int(time.time() * 1000))
    if planned is not None:
        log.info(
            "flow %s: runs no-data batch %s first, which its last run stopped before",
            flow.name,
            planned,
        )
    result = flow_frame(spark, store, settings, flow, checkpoint)
    trigger = trigger_kwargs(settings.trigger)
    if len(flow.outputs) == 1 and flow.outputs[0].rows is None:
        out = flow.outputs[0]
        options = {"partitionBy": ",".join(out.partition_by)} if out.partition_by else None
        return store.write_stream(
            result,
            out.table,
            checkpoint,
            output_mode=flow.output_mode,
            keys=flow.keys,
            trigger=trigger,
            query_name=flow.name,
            options=options,
        )
    routes = [
        Route(o.table, o.rows or (lambda df: df), o.partition_by, o.event_time)
        for o in flow.outputs
    ]
    return store.write_stream_routed(
        result,
        routes,
        checkpoint,
        trigger=trigger,
        query_name=flow.name,
        before_write=flow.before_write,
    )


RECOUNT = " (recount)"  # the name of a query that replays a flow's batch: not recorded
MAX_RECOUNT = 10  # per flow and start; a crash leaves one or two batches unrecorded


def _recorded(settings: Settings, flows: Sequence[Flow]) -> dict[str, set[int]] | None:
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
    recorder = ProgressRecorder(settings)
    done = []
    for batch in lost[-MAX_RECOUNT:]:
        if stop is not None and stop.requested:
            break
        try:
            progress = _replay(spark, store, settings, flow, batch, stop)
            recorder.record({**progress, "name": flow.name})
        except Exception as exc:  # the flow itself still runs: its books stay short
            print(
                f"flow {flow.name}: could not recount micro-batch {batch} ({exc}); its drops "
                "stay missing from ops.stream_progress",
                file=out,
                flush=True,
            )
            continue
        done.append(batch)
        late, duplicates = _drops([progress])
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
        raise FlowFailed(_first_line(replay.exception()))
    progress = [p for p in replay.recentProgress if p["batchId"] == batch]
    if not progress:
        raise FlowFailed(f"the replay ran no micro-batch {batch}")
    return json.loads(progress[-1].json)


def _drops(progress: list[dict]) -> Drops:
    """The rows the stateful operators dropped over micro-batches' progress."""
    operators = [op for p in progress for op in (p["stateOperators"] or [])]
    return Drops(
        late=sum(op.get("numRowsDroppedByWatermark") or 0 for op in operators),
        duplicates=sum(
            (op.get("customMetrics") or {}).get("numDroppedDuplicateRows") or 0 for op in operators
        ),
    )


# Spark's errors for a checkpoint whose state does not fit the query restarted on it: a stateful
# operator added, removed or changed, or its state schema changed.
INCOMPATIBLE_STATE = (
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
    "STATE_STORE_INVALID_CONFIG_AFTER_RESTART",
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    "StateSchemaNotCompatible",
)


# Spark's error when a Python process it starts in the driver for a Python data source (the
# embedded Delta source's planner, the sink's commit) does not connect back within its fixed 10
# seconds: the machine was too busy, the flow is not wrong. Such a flow is started again.
TRANSIENT_ERRORS = ("Python worker failed to connect back",)
TRANSIENT_RESTARTS = 2  # per flow and run


def transient(error: str) -> bool:
    """Whether a query's error is one that a restart from the checkpoint can get past."""
    return any(cause in error for cause in TRANSIENT_ERRORS)


def incompatible_state(flow: str, checkpoint: Path, error: str) -> str | None:
    """The error to show for a restart whose checkpoint holds state of another shape, naming
    the flow and the way out; None for any other error."""
    cause = next((c for c in INCOMPATIBLE_STATE if c in error), None)
    if cause is None:
        return None
    return (
        f"the state in the checkpoint of {flow} ({checkpoint}) does not fit this version of the "
        f"flow ({cause}): a stateful operator or its state schema changed. Start the flow on a "
        f"new checkpoint: move {checkpoint} aside, and its output tables if they must not get "
        "the input again; the flow then rebuilds its state from its whole input"
    )


_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*: \S.*$")


def _first_line(exc: BaseException) -> str:
    """The line of a query's error that says what went wrong. A failure inside foreachBatch
    arrives as a Python traceback (followed by the plan): the exception is its last
    ``package.Class: message`` line."""
    text = (getattr(exc, "desc", None) or str(exc)).split("=== Streaming Query ===")[0].strip()
    if not text:
        return type(exc).__name__
    lines = text.splitlines()
    if "Traceback (most recent call last)" in text:
        raised = [line.strip() for line in lines if _RAISED.match(line.strip())]
        if raised:
            return raised[-1]
    return lines[0]


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


def run_flows(
    spark: SparkSession,
    settings: Settings,
    flows: Sequence[Flow],
    *,
    out: TextIO | None = None,
    stop: StopRequest | None = None,
) -> list[FlowReport]:
    """Start ``flows`` together and wait: until they are done (available-now), or until one
    fails or the user interrupts (continuous). A failure stops the other flows and raises
    :class:`FlowFailed` naming the flow. SIGINT and SIGTERM stop the flows after their
    current micro-batch (see :class:`StopRequest`; ``stop`` when the caller counts them).
    A flow another run is running is refused before any query starts (:mod:`lakehouse.locks`)."""
    checkpoint_of = {f.name: settings.checkpoint_path(f.layer, f.flow) for f in flows}
    with flow_locks(list(checkpoint_of.items())):
        if stop is None:
            with stop_on_signals() as own:
                return _run_flows(spark, settings, flows, checkpoint_of, out, own)
        return _run_flows(spark, settings, flows, checkpoint_of, out, stop)


def _run_flows(
    spark: SparkSession,
    settings: Settings,
    flows: Sequence[Flow],
    checkpoint_of: dict[str, Path],
    out: TextIO | None,
    stop: StopRequest,
) -> list[FlowReport]:
    out = out or sys.stderr
    store = table_store(spark, settings)
    listener = _progress_listener(spark, out, ProgressRecorder(settings))
    queries: dict[str, StreamingQuery] = {}
    earlier: dict[str, list[StreamingQuery]] = {}  # attempts that failed on a transient error
    by_name = {flow.name: flow for flow in flows}
    started = time.monotonic()
    run = _RunBook(settings)

    def restart(name: str) -> bool:
        """Start the flow again from its checkpoint if its query failed on a transient error
        and has restarts left; the checkpoint and the idempotent sinks make the repeat of its
        last micro-batch harmless."""
        error = queries[name].exception()
        attempts = earlier.setdefault(name, [])
        if error is None or not transient(str(error)) or len(attempts) >= TRANSIENT_RESTARTS:
            return False
        print(
            f"flow {name}: {_first_line(error)} (the machine was too busy); restarting it "
            f"from its checkpoint ({len(attempts) + 1} of {TRANSIENT_RESTARTS})",
            file=out,
            flush=True,
        )
        query = start_flow(spark, store, settings, by_name[name])
        attempts.append(queries[name])
        queries[name] = query
        _wait_initialized(query)
        return True

    recorded = _recorded(settings, flows)
    quiet = False  # Spark's log is off while the flows stop (see _quiet_spark)
    try:
        for flow in flows:
            if stop.requested:  # the flows not started yet stay so
                break
            try:
                if recorded is not None:
                    recount_unrecorded(spark, store, settings, flow, recorded, out, stop)
                queries[flow.name] = start_flow(spark, store, settings, flow)
            except Exception as exc:  # e.g. a missing input: in ops.runs, then raised
                run.failed_to_start(flow.name, exc)
                raise
            if len(flows) > 1:
                _wait_initialized(queries[flow.name])
        endless = {flow.name for flow in flows if not flow.stops_itself}
        _wait(
            spark,
            queries,
            continuous=settings.trigger.mode == "continuous",
            endless=endless,
            restart=restart,
            stop=stop,
        )
        if stop.requested:
            print(
                "interrupted: stopping the flows after their current micro-batch "
                "(again to stop at once)",
                file=out,
                flush=True,
            )
            quiet = quiet or _quiet_spark(spark)
            run.stopped = _stop_between_batches(queries, stop, checkpoint_of)
    except KeyboardInterrupt:  # outside the main thread no handler counts the signal
        stop.signals += 1
        print("interrupted: stopping the flows", file=out)
    finally:
        if stop.requested:
            quiet = quiet or _quiet_spark(spark)
        for name, query in queries.items():
            if query.isActive:
                if stop.requested:
                    run.stopped.add(name)
                query.stop()
        attempts = {name: [*earlier.get(name, []), query] for name, query in queries.items()}
        for query in (q for tries in attempts.values() for q in tries):
            # ops.stream_progress is complete when the run returns
            if not listener.wait_for(str(query.runId)):
                log.warning("the progress of %s may not all be recorded yet", query.name)
        reports = _reports(settings, attempts, started)
        if quiet:
            spark.sparkContext.setLogLevel(settings.log_level)
        for report in (r for r in reports if r.flow in run.stopped):
            report.stopped = True
            report.error = None  # the stop cut a micro-batch that had just begun: not a failure
            print(_where_stopped(report.flow, checkpoint_of[report.flow]), file=out)
        run.record(queries, reports)
    failed = [r for r in reports if r.error]
    if failed:
        raise FlowFailed(f"flow {failed[0].flow} failed: {failed[0].error}")
    return reports


class _RunBook:
    """One run's rows of ops.runs: a row per flow, written when the run ends."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.run_id = str(uuid.uuid4())
        self.started_at = dt.datetime.now(dt.UTC)
        self.interrupted = False  # a flow failed to start: the others were stopped
        self.stopped: set[str] = set()  # the flows a signal stopped while they ran
        self.rows: list[dict] = []

    def _row(self, flow: str, status: str, **values) -> dict:
        return {
            "run_id": self.run_id,
            "flow": flow,
            "started_at": self.started_at,
            "ended_at": dt.datetime.now(dt.UTC),
            "status": status,
            **values,
        }

    def failed_to_start(self, flow: str, exc: BaseException) -> None:
        """A flow that could not start: the flows started before it are stopped."""
        self.rows.append(self._row(flow, "failed", batches=0, input_rows=0, error=str(exc)))
        self.interrupted = True

    def record(self, queries: dict[str, StreamingQuery], reports: list[FlowReport]) -> None:
        for report in reports:
            cut = report.stopped or self.interrupted
            status = "failed" if report.error else "stopped" if cut else "succeeded"
            self.rows.append(
                self._row(
                    report.flow,
                    status,
                    query_id=str(queries[report.flow].id),
                    batches=report.batches,
                    input_rows=report.input_rows,
                    late_rows=report.late_rows,
                    duplicates=report.duplicates,
                    error=report.error,
                )
            )
        if self.rows:
            record_runs(self.settings, self.rows)


def _reports(
    settings: Settings, attempts: dict[str, list[StreamingQuery]], started: float
) -> list[FlowReport]:
    """A report per flow over all its attempts in the run; the error is the last attempt's."""
    reports = []
    for name, tries in attempts.items():
        query = tries[-1]
        progress = [p for attempt in tries for p in attempt.recentProgress]
        batches = [p for p in progress if p["numInputRows"]]
        late, duplicates = _drops(progress)
        report = FlowReport(
            name,
            len(batches),
            sum(p["numInputRows"] for p in batches),
            time.monotonic() - started,
            late_rows=late,
            duplicates=duplicates,
        )
        error = query.exception()
        if error is not None:
            layer, flow = split_table_name(name)
            report.error = incompatible_state(
                name, settings.checkpoint_path(layer, flow), str(error)
            ) or _first_line(error)
        reports.append(report)
    return reports


def _wait(
    spark: SparkSession,
    queries: dict[str, StreamingQuery],
    continuous: bool,
    endless: set[str] = frozenset(),
    restart: Callable[[str], bool] = lambda name: False,
    stop: StopRequest | None = None,
) -> None:
    """Until the flows are done (available-now) or one of them ends (continuous), or a stop is
    requested. A flow whose query failed is handed to ``restart``; one it started again is
    waited for again."""
    stop = stop or StopRequest()
    if not continuous:
        # flows are independent: one failing does not cut the others' work short
        for name in queries:
            while not stop.requested:
                query = queries[name]
                with contextlib.suppress(Exception):  # reported from query.exception()
                    if name in endless:
                        _stop_when_caught_up(query, stop)
                    else:
                        while not query.awaitTermination(POLL_S) and not stop.requested:
                            pass
                if stop.requested or not restart(name):
                    break
        return
    while not stop.requested:
        with contextlib.suppress(Exception):  # a failed flow: reported from query.exception()
            if not spark.streams.awaitAnyTermination(POLL_S):
                continue
        # reset first: a flow ending from here on wakes the next wait, one ended before is seen
        # below (a query of an earlier run in this session woke this one: wait again)
        spark.streams.resetTerminated()
        ended = [name for name, query in queries.items() if not query.isActive]
        if ended and not all([restart(name) for name in ended]):
            return


def _wait_initialized(query: StreamingQuery, timeout_s: float = 120.0) -> None:
    """Until ``query`` has initialized its sources. Each streaming Python data source (the
    embedded Delta source) starts a Python process in the driver that must connect back within
    Spark's fixed 10 seconds; with many flows started at once (continuous mode: 12, gold: 7)
    on a small busy machine, some missed it. Started one after the other they seldom do, and a
    flow that still does is restarted (:data:`TRANSIENT_ERRORS`)."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        if query.status["message"] != "Initializing sources":
            return
        time.sleep(0.1)


def _caught_up(progress: dict | None, first_batch: int | None = None) -> bool:
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


def _stop_when_caught_up(
    query: StreamingQuery, stop: StopRequest | None = None, poll_s: float = 0.1
) -> None:
    """Stop an available-now query that does not stop by itself once a micro-batch shows it
    caught up (see :func:`_caught_up`), or return when a stop is requested.
    (``processAllAvailable`` never returns for such a query: each no-data batch counts as
    progress.)"""
    first_batch = None
    while query.isActive and not (stop and stop.requested):
        progress = query.lastProgress
        if first_batch is None and progress is not None:
            first_batch = progress["batchId"]
        if _caught_up(progress, first_batch):
            query.stop()
            return
        time.sleep(poll_s)


def _batch_id(query: StreamingQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else progress["batchId"]


def _quiet_spark(spark: SparkSession) -> bool:
    """Turn Spark's log off while flows stop on request: a query stopped in the first moments
    of its next micro-batch has its tasks killed and its offset write interrupted, and Spark
    logs each as a warning or error with a stack trace, although nothing failed (the next run
    repeats that batch). The runner prints one line per flow instead (:func:`_where_stopped`);
    a query that did fail still reports its error. True, to be restored."""
    spark.sparkContext.setLogLevel("OFF")
    return True


def _where_stopped(flow: str, checkpoint: Path) -> str:
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


def _stop_between_batches(
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
    micro-batches that follow each other at once; cutting one inside its foreachBatch can
    also make Spark's own check of the interruption overflow its stack on the long Python
    error). Returns the flows it stopped; one that ended by itself meanwhile is not among
    them. The rest at once on a second signal."""
    running = {name: _batch_id(query) for name, query in queries.items() if query.isActive}
    committed: dict[str, int] = {}  # the batch each was in when asked, once it committed
    stopped: set[str] = set()
    deadline = time.monotonic() + no_data_wait_s
    while running and not stop.at_once:
        for name in list(running):
            query = queries[name]
            with contextlib.suppress(Exception):  # a query that ended meanwhile
                if query.isActive:
                    active = query.status["isTriggerActive"]
                    last = _batch_id(query)
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


def run_layers(
    spark: SparkSession,
    settings: Settings,
    layers: Sequence[str],
    *,
    out: TextIO | None = None,
    stop: StopRequest | None = None,
) -> list[FlowReport]:
    """Run layers in pipeline order. In available-now mode each layer finishes before the next
    starts; in continuous mode all of their flows run together. SIGINT or SIGTERM ends
    continuous mode; in available-now mode it raises :class:`RunStopped` if it cut the run
    short (the next layers would read what this one did not finish). ``stop``: when the
    caller counts the signals."""
    ordered = [layer for layer in PIPELINE if layer in layers]
    flows = {layer: layer_flows(layer) for layer in ordered}
    with stop_on_signals(stop) as stop:
        if settings.trigger.mode == "continuous":
            every = [f for layer in ordered for f in flows[layer]]
            return run_flows(spark, settings, every, out=out, stop=stop)
        reports: list[FlowReport] = []
        for layer in ordered:
            if stop.requested:
                raise RunStopped(reports)
            done = run_flows(spark, settings, flows[layer], out=out, stop=stop)
            reports += done
            if any(r.stopped for r in done) or len(done) < len(flows[layer]):
                raise RunStopped(reports)
        return reports
