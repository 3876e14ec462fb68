"""Running flows: started together, waited for until done (available-now) or until stopped
(continuous, where a failed flow is started again alone while the others run on), restarted
after a transient error, stopped on request, recorded."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lakehouse.flows import Flow
from lakehouse.locks import flow_locks
from lakehouse.redaction import redact
from lakehouse.runner.books import (
    RunBook,
    failure_text,
    first_line,
    flow_reports,
    progress_listener,
)
from lakehouse.runner.declarations import PIPELINE, completeness_columns, layer_flows
from lakehouse.runner.errors import FlowFailed, RunStopped
from lakehouse.runner.monitoring import ProgressRecorder
from lakehouse.runner.queries import start_flow
from lakehouse.runner.recount import recorded_batches_of, recount_unrecorded
from lakehouse.runner.stopping import (
    POLL_S,
    CaughtUp,
    StopRequest,
    quiet_spark,
    stop_between_batches,
    stop_caught_up,
    stop_on_signals,
    where_stopped,
)
from lakehouse.settings import Settings, duration_seconds
from lakehouse.storage import table_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakehouse.runner.books import FlowReport
    from lakehouse.storage.store import TableStore

log = logging.getLogger(__name__)


# Spark's error when a Python process it starts in the driver (transformWithStateInPandas'
# driver-side worker) does not connect back within its fixed 10 seconds: the machine was too
# busy, the flow is not wrong. Such a flow is started again.
TRANSIENT_ERRORS = ("Python worker failed to connect back",)
TRANSIENT_RESTARTS = 2  # per flow and run
MAX_RESTART_DELAY_S = 600  # the longest a failed flow waits for its next start (continuous)
WATCH_S = 0.1  # how often an available-now run looks at its flows


def transient(error: str) -> bool:
    """Whether a query's error is one that a restart from the checkpoint can get past."""
    return any(cause in error for cause in TRANSIENT_ERRORS)


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


class _Queries:
    """The streaming queries of one run's flows: each flow's current query, and the attempts
    before it that failed on a transient error (their progress counts in the flow's report)."""

    def __init__(
        self,
        spark: SparkSession,
        store: TableStore,
        settings: Settings,
        flows: Sequence[Flow],
        out: TextIO,
    ):
        self.spark, self.store, self.settings, self.out = spark, store, settings, out
        self.flows = {flow.name: flow for flow in flows}
        self.current: dict[str, StreamingQuery] = {}
        self.failed: dict[str, list[StreamingQuery]] = {}
        # continuous mode: when each failed flow starts again (time.monotonic())
        self.due: dict[str, float] = {}
        self.later_restarts: dict[str, int] = {}

    def start(self, flow: Flow) -> StreamingQuery:
        self.current[flow.name] = start_flow(self.spark, self.store, self.settings, flow)
        return self.current[flow.name]

    def restart(self, name: str) -> bool:
        """Start the flow again from its checkpoint if its query failed on a transient error
        and has restarts left; in continuous mode, after any error, plan its start after
        ``trigger.restart_delay`` (doubled at each restart, at most ``trigger.restarts``
        times). The checkpoint and the idempotent sinks make the repeat of its last
        micro-batch harmless. False: the flow stays ended."""
        error = self.current[name].exception()
        failed = self.failed.setdefault(name, [])
        if error is None:
            return False
        if transient(str(error)) and len(failed) < TRANSIENT_RESTARTS:
            print(
                f"flow {name}: {redact(first_line(error))} (the machine was too busy); "
                f"restarting it from its checkpoint ({len(failed) + 1} of {TRANSIENT_RESTARTS})",
                file=self.out,
                flush=True,
            )
            self._replace(name)
            return True
        if self.settings.trigger.mode != "continuous":
            return False
        trigger = self.settings.trigger
        done = self.later_restarts.get(name, 0)
        if done >= trigger.restarts:
            # what it ran into, with the way out (a Kafka broker's, say)
            line = failure_text(self.settings, name, error)
            print(
                f"flow {name} failed for good after {done} restart(s): {line}; the other flows "
                "run on",
                file=self.out,
                flush=True,
            )
            return False
        delay = min(duration_seconds(trigger.restart_delay) * 2**done, MAX_RESTART_DELAY_S)
        self.later_restarts[name] = done + 1
        self.due[name] = time.monotonic() + delay
        line = failure_text(self.settings, name, error, advice=False)  # the runner's way out
        print(
            f"flow {name} failed: {line}; starting it again alone in {delay:g} s "
            f"({done + 1} of {trigger.restarts}), the other flows run on",
            file=self.out,
            flush=True,
        )
        return True

    def start_due(self) -> None:
        """Start the failed flows whose time has come (continuous mode)."""
        now = time.monotonic()
        for name in [n for n, at in self.due.items() if at <= now]:
            del self.due[name]
            try:
                self._replace(name)
            except Exception as exc:  # its input gone, say: it stays ended
                print(
                    f"flow {name} could not start again: {redact(first_line(exc))}; the other "
                    "flows run on",
                    file=self.out,
                    flush=True,
                )

    def _replace(self, name: str) -> None:
        query = start_flow(self.spark, self.store, self.settings, self.flows[name])
        self.failed.setdefault(name, []).append(self.current[name])
        self.current[name] = query

    def attempts(self) -> dict[str, list[StreamingQuery]]:
        """Every query of each flow in the run, the current one last."""
        return {name: [*self.failed.get(name, []), q] for name, q in self.current.items()}


class _Run:
    """One run of flows: their queries, the stop request, and the books of the run."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        flows: Sequence[Flow],
        checkpoint_of: dict[str, Path],
        out: TextIO,
        stop: StopRequest,
    ):
        self.spark = spark
        self.settings = settings
        self.flows = flows
        self.checkpoint_of = checkpoint_of
        self.out = out
        self.stop = stop
        self.store = table_store(spark, settings)
        self.listener = progress_listener(
            spark, out, ProgressRecorder(settings, completeness_columns())
        )
        self.queries = _Queries(spark, self.store, settings, flows, out)
        self.book = RunBook(settings)
        self.started = time.monotonic()
        self.quiet = False  # Spark's log is off while the flows stop (see quiet_spark)

    def start(self) -> None:
        """Start the flows (each recounts its unrecorded batches first), without waiting for
        one to initialize before the next; those not started when a stop is requested stay
        so."""
        recorded = recorded_batches_of(self.settings, self.flows)
        for flow in self.flows:
            if self.stop.requested:
                break
            try:
                if recorded is not None:
                    recount_unrecorded(
                        self.spark, self.store, self.settings, flow, recorded, self.out, self.stop
                    )
                self.queries.start(flow)
            except Exception as exc:  # e.g. a missing input: in ops.runs, then raised
                self.book.failed_to_start(flow.name, exc)
                raise

    def wait(self) -> None:
        """Until the flows are done (available-now), or every flow ended for good
        (continuous), or a stop was requested: then each is stopped once its current
        micro-batch committed."""
        _wait(
            self.spark,
            self.queries.current,
            continuous=self.settings.trigger.mode == "continuous",
            endless={flow.name for flow in self.flows if not flow.stops_itself},
            restart=self.queries.restart,
            stop=self.stop,
            restarts_due=self.queries.due,
            start_due=self.queries.start_due,
        )
        if self.stop.requested:
            print(
                "interrupted: stopping the flows after their current micro-batch "
                "(again to stop at once)",
                file=self.out,
                flush=True,
            )
            self._quiet()
            self.book.stopped = stop_between_batches(
                self.queries.current, self.stop, self.checkpoint_of
            )

    def _quiet(self) -> None:
        if not self.quiet:
            self.quiet = quiet_spark(self.spark)

    def end(self) -> list[FlowReport]:
        """Stop what still runs, wait until every progress is recorded, and report and record
        each flow (a line for each a stop cut)."""
        if self.stop.requested:
            self._quiet()
        for name, query in self.queries.current.items():
            if query.isActive:
                if self.stop.requested:
                    self.book.stopped.add(name)
                query.stop()
        attempts = self.queries.attempts()
        for query in (q for tries in attempts.values() for q in tries):
            # ops.stream_progress is complete when the run returns
            if not self.listener.wait_for(str(query.runId)):
                log.warning("the progress of %s may not all be recorded yet", query.name)
        reports = flow_reports(self.settings, attempts, self.started)
        if self.quiet:
            self.spark.sparkContext.setLogLevel(self.settings.log_level)
        for report in (r for r in reports if r.flow in self.book.stopped):
            report.stopped = True
            report.error = None  # the stop cut a micro-batch that had just begun: not a failure
            print(where_stopped(report.flow, self.checkpoint_of[report.flow]), file=self.out)
        self.book.record(self.queries.current, reports)
        return reports


def _run_flows(
    spark: SparkSession,
    settings: Settings,
    flows: Sequence[Flow],
    checkpoint_of: dict[str, Path],
    out: TextIO | None,
    stop: StopRequest,
) -> list[FlowReport]:
    run = _Run(spark, settings, flows, checkpoint_of, out or sys.stderr, stop)
    try:
        run.start()
        run.wait()
    except KeyboardInterrupt:  # outside the main thread no handler counts the signal
        stop.signals += 1
        print("interrupted: stopping the flows", file=run.out)
    finally:
        reports = run.end()
    failed = [r for r in reports if r.error]
    if failed:
        raise FlowFailed(f"flow {failed[0].flow} failed: {failed[0].error}")
    return reports


def _wait(
    spark: SparkSession,
    queries: dict[str, StreamingQuery],
    continuous: bool,
    endless: set[str] = frozenset(),
    restart: Callable[[str], bool] = lambda name: False,
    stop: StopRequest | None = None,
    restarts_due: dict[str, float] | None = None,
    start_due: Callable[[], None] = lambda: None,
) -> None:
    """Until the flows are done (available-now), or every flow has ended for good
    (continuous), or a stop is requested. A flow whose query ended is handed to ``restart``;
    one it started again, or planned to start later (``restarts_due``, started by
    ``start_due``), is waited for again."""
    restarts_due = {} if restarts_due is None else restarts_due
    stop = stop or StopRequest()
    if not continuous:
        # every flow is watched at once: a flow that does not end by itself is stopped as
        # soon as it has caught up, whatever the others do; flows are independent, so one
        # failing does not cut the others' work short
        watches = {name: CaughtUp(queries[name]) for name in endless}
        running = set(queries)
        while running and not stop.requested:
            for name in sorted(running):
                query = queries[name]
                with contextlib.suppress(Exception):  # reported from query.exception()
                    if name in watches and query.isActive and watches[name]():
                        stop_caught_up(query, spark)
                if query.isActive:
                    continue
                if restart(name):  # queries[name] is the flow's new query
                    if name in endless:
                        watches[name] = CaughtUp(queries[name])
                    continue
                running.discard(name)
            if running:
                time.sleep(WATCH_S)
        return
    handled: dict[str, StreamingQuery] = {}  # flows whose ended query was handed to restart
    while not stop.requested:
        start_due()
        with contextlib.suppress(Exception):  # a failed flow: reported from query.exception()
            if not spark.streams.awaitAnyTermination(POLL_S):
                continue
        # reset first: a flow ending from here on wakes the next wait, one ended before is seen
        # below (a query of an earlier run in this session woke this one: wait again)
        spark.streams.resetTerminated()
        for name, query in queries.items():
            if not query.isActive and handled.get(name) is not query:
                handled[name] = query
                restart(name)
        # ended for good: handed to restart (so inactive; a query ending after the loop above
        # is handed at the next turn), and no start planned
        if all(handled.get(n) is q and n not in restarts_due for n, q in queries.items()):
            return


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
