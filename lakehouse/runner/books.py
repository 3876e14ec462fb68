"""Recording what flows did: every micro-batch's progress in ops.stream_progress (and a line
per batch that read rows), a report per flow, and a row per flow in ops.runs."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lakehouse.redaction import redact
from lakehouse.runner.monitoring import Drops, ProgressRecorder, record_runs
from lakehouse.settings import Settings, split_table_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


RECOUNT = " (recount)"  # the name of a query that replays a flow's batch: not recorded


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
    # the first line of the error of each earlier attempt in the run, which was restarted
    restarts: list[str] = field(default_factory=list)


def progress_listener(spark: SparkSession, out: TextIO, recorder: ProgressRecorder):
    """Register (once per session) a listener that records every micro-batch in
    ops.stream_progress and prints one line per micro-batch that read rows. It stays
    registered: removing it while Spark still delivers the last events races with the
    delivery; the session's stop drains them."""
    registered = getattr(spark, "_lakehouse_progress", None)
    if registered is not None:
        registered.out, registered.recorder = out, recorder
        return registered

    class Printer:
        """Spark's streaming query listener interface, implemented through py4j. Not
        PySpark's ``StreamingQueryListener``, whose wrapper turns each progress into Python
        objects call by call through py4j (a hundred calls and more for a stateful query, on
        the listener's thread, every micro-batch of every query): a progress comes here as
        its JSON, one call."""

        def __init__(self):
            self.out = out
            self.recorder = recorder
            self.ended: set[str] = set()  # run ids of the queries that terminated
            self.lock = threading.Condition()

        @property
        def _jlistener(self):
            """What ``StreamingQueryManager.addListener`` registers with Spark."""
            from pyspark import SparkContext

            if not hasattr(self, "_jlistenerobj"):
                jvm = SparkContext._jvm
                self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(self)
            return self._jlistenerobj

        def onQueryStarted(self, jevent):
            pass

        def onQueryProgress(self, jevent):
            p = json.loads(jevent.progress().json())
            name = p.get("name") or ""
            if name.endswith(RECOUNT):  # recorded by the recount itself
                return
            self.recorder.record_progress(p)
            if p.get("numInputRows"):
                # (Spark's JSON leaves a NaN or infinite rate out)
                rate = p.get("processedRowsPerSecond", float("nan"))
                print(
                    f"{name} batch {p['batchId']}: {p['numInputRows']:,} rows in "
                    f"{p['batchDuration'] / 1000:.1f} s ({rate:,.0f} rows/s)",
                    file=self.out,
                    flush=True,
                )

        def onQueryIdle(self, jevent):
            pass

        def onQueryTerminated(self, jevent):
            with self.lock:
                self.ended.add(jevent.runId().toString())
                self.lock.notify_all()

        def wait_for(self, run_id: str, timeout: float = 30.0) -> bool:
            """Wait until the query's termination reached the listener: its events come in
            order, so every progress of that run has been recorded by then."""
            with self.lock:
                return self.lock.wait_for(lambda: run_id in self.ended, timeout)

        class Java:
            implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

    printer = Printer()
    spark.streams.addListener(printer)
    spark._lakehouse_progress = printer
    return printer


def drops(progress: list[dict]) -> Drops:
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


_LOST = re.compile(r"Could not read records in offset \[(\d+), (\d+)\) for topic partition (\S+)")
# Kafka's client refusing a login (SASL, TLS) or the broker refusing access (ACLs)
_REFUSED = re.compile(
    r"org\.apache\.kafka\.common\.errors\.(\w*(?:Authentication|Authorization)Exception): ?([^\n]*)"
)


def kafka_failure(settings: Settings, flow: str, text: str, advice: bool = True) -> str | None:
    """What a bronze flow reading Kafka ran into, and the way out (without it: ``advice``
    False, for a flow the runner starts again itself): a login or an access the broker refused,
    records gone before it read them, or a broker that does not answer; None for other
    errors."""
    if settings.bronze.source != "kafka" or not flow.startswith("bronze."):
        return None
    broker = settings.kafka.bootstrap_servers
    joint = "; "  # between what happened and the way out
    refused = _REFUSED.findall(text)
    if refused:
        kind, why = refused[-1]  # (the deepest cause)
        topic = settings.kafka.topic_of(flow.removeprefix("bronze."))
        if "Authorization" in kind:
            what = f"the Kafka broker at {broker} refused bronze access to topic {topic}"
            way_out = "check the user's ACLs on the topic and kafka.options"
        else:
            what = f"the Kafka broker at {broker} refused bronze's login for topic {topic}"
            way_out = "check the credentials and TLS settings in kafka.options"
        what += f" ({kind}: {why.strip()})"
    elif "Some data may have been lost because they are not available in Kafka" in text:
        found = _LOST.search(text)
        where = (
            f"records at offsets [{found[1]}, {found[2]}) of {found[3]} (topic-partition)"
            if found
            else "records it had not read yet"
        )
        what = (
            f"{where} are no longer on the broker (retention deleted them, or the topic was "
            "deleted)"
        )
        joint = ": "
        way_out = (
            "they are lost to the lake. To accept the loss and go on from the "
            "earliest record still there, run bronze once with kafka.fail_on_data_loss=false "
            "(--conf, or LAKEHOUSE_KAFKA__FAIL_ON_DATA_LOSS=false)"
        )
    elif "org.apache.kafka.common.errors.TimeoutException" in text:
        cause = text.split("org.apache.kafka.common.errors.TimeoutException: ")[-1].splitlines()[0]
        what = f"the Kafka broker at {broker} did not answer ({cause})"
        way_out = (
            "once it is back, run bronze again: it goes on from the offsets in its checkpoint, "
            "and nothing is lost"
        )
    else:
        return None
    if not advice:
        return what
    return f"{what}{joint}{way_out}"


def failure_text(settings: Settings, flow: str, error: BaseException, advice: bool = True) -> str:
    """One line for a flow's failed query, redacted (a secret of the settings, a JAAS config
    say, never reaches ops.runs or a log): a checkpoint whose state does not fit, or what a
    Kafka source ran into, in the user's words with the way out (unless ``advice`` is False,
    for a flow the runner starts again itself); else the line of the error that says what went
    wrong."""
    layer, name = split_table_name(flow)
    text = str(error)
    return redact(
        incompatible_state(flow, settings.checkpoint_path(layer, name), text)
        or kafka_failure(settings, flow, text, advice)
        or first_line(error)
    )


_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*: \S.*$")


def first_line(exc: BaseException) -> str:
    """The line of a query's error that says what went wrong. A failure inside foreachBatch
    arrives as a Python traceback (followed by the plan): the exception is its last
    ``package.Class: message`` line."""
    text = (getattr(exc, "desc", None) or str(exc)).split("=== Streaming Query ===")[0].strip()
    if not text:
        return type(exc).__name__
    lines = text.splitlines()
    if "Traceback (most recent call last)" in text:
        # (Spark ends a Python data source's error with a line of its own, " SQLSTATE: 38000")
        raised = [
            line.strip()
            for line in lines
            if _RAISED.match(line.strip()) and not line.strip().startswith("SQLSTATE:")
        ]
        if raised:
            return raised[-1]
    return lines[0]


class RunBook:
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
        error = redact(str(exc))
        self.rows.append(self._row(flow, "failed", batches=0, input_rows=0, error=error))
        self.interrupted = True

    def record(self, queries: dict[str, StreamingQuery], reports: list[FlowReport]) -> None:
        for report in reports:
            for line in report.restarts:  # an attempt that failed and was started again
                self.rows.append(
                    self._row(report.flow, "restarted", query_id=str(queries[report.flow].id),
                              error=line)
                )  # fmt: skip
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


def flow_reports(
    settings: Settings, attempts: dict[str, list[StreamingQuery]], started: float
) -> list[FlowReport]:
    """A report per flow over all its attempts in the run; the error is the last attempt's."""
    reports = []
    for name, tries in attempts.items():
        query = tries[-1]
        progress = [p for attempt in tries for p in attempt.recentProgress]
        batches = [p for p in progress if p["numInputRows"]]
        late, duplicates = drops(progress)
        report = FlowReport(
            name,
            len(batches),
            sum(p["numInputRows"] for p in batches),
            time.monotonic() - started,
            late_rows=late,
            duplicates=duplicates,
        )
        for attempt in tries[:-1]:
            failure = attempt.exception()
            report.restarts.append(
                failure_text(settings, name, failure, advice=False) if failure is not None else ""
            )
        error = query.exception()
        if error is not None:
            report.error = failure_text(settings, name, error)
        reports.append(report)
    return reports
