"""Building a flow's streaming query from its declaration: its inputs read as streams, its
transform, its output tables created and its sink started on its checkpoint."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse import checkpoints, landing
from lakehouse.flows import Flow, Input, LandingInput, TableInput
from lakehouse.runner.errors import MissingInput
from lakehouse.runner.switch import finish_pending
from lakehouse.settings import BronzeSettings, Settings
from lakehouse.storage import deltafiles as dfiles
from lakehouse.storage import trigger_kwargs
from lakehouse.storage.streams import Route

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakehouse.storage.store import TableStore

log = logging.getLogger(__name__)


def read_input(
    spark: SparkSession,
    store: TableStore,
    settings: Settings,
    source: Input,
    max_files: int,
    starting_version: int | None = None,
) -> DataFrame:
    """A flow input as a streaming DataFrame (a table from ``starting_version`` on, when one
    is given: see :func:`input_starts`)."""
    from pyspark.sql import functions as F

    if isinstance(source, LandingInput) and settings.bronze.source == "kafka":
        return read_topic(spark, settings, source.source)
    if isinstance(source, LandingInput):
        path = settings.landing_path(source.source)
        if not path.is_dir():
            raise MissingInput(
                f"landing folder {path} does not exist; check --root or run `lakehouse generate`"
            )
        # every file counts however old its modification time (a backfill copied with its
        # original times would otherwise be skipped past the default age of 7 days); what
        # Spark does not read, each batch quarantines (_landing_quarantined): the rest of a
        # compressed file that does not decompress to its end, and a line too long to hold,
        # which Hadoop's line reader skips in constant memory
        max_line = str(settings.bronze.max_line_bytes)
        reader = (
            spark.readStream.format("text")
            .option("maxFileAge", "36500d")
            .option("ignoreCorruptFiles", "true")
            .option("mapreduce.input.linerecordreader.line.maxlength", max_line)
        )
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
        return store.read_stream(
            source.table, max_files_per_trigger=max_files or None, starting_version=starting_version
        )
    raise TypeError(f"unknown flow input {source!r}")


def read_topic(spark: SparkSession, settings: Settings, source: str) -> DataFrame:
    """The records of the Kafka topic of landing source ``source`` as landing lines: ``value`` (the record's bytes as
    a string; null for a null value) and ``_source_file``, the record's place and time,
    ``kafka:<topic>/<partition>/<offset>@<timestamp>``. Offsets live in the checkpoint; a
    first run starts at ``kafka.<source>.starting_offsets`` or else ``kafka.starting_offsets``,
    and a micro-batch reads at most ``kafka.<source>.max_offsets_per_trigger`` or else
    ``kafka.max_offsets_per_trigger`` records. failOnDataLoss stays on unless
    ``kafka.fail_on_data_loss`` says otherwise: records deleted before bronze read them
    (retention) fail the flow instead of going missing. The client options of
    ``kafka.options`` (security.protocol, SASL, TLS, ...) go to the source as
    ``kafka.<key>``, over the timeouts set here."""
    from pyspark.sql import functions as F

    kafka = settings.kafka
    topic = settings.topic(source)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", kafka.starting_offsets_of(source, topic))
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
        # (a request may not take longer than the call that makes it)
        .option("kafka.default.api.timeout.ms", kafka.api_timeout_s * 1000)
        .option("kafka.request.timeout.ms", min(30, kafka.api_timeout_s) * 1000)
        .options(**kafka.spark_options())
    )
    if kafka.max_offsets_of(source):
        reader = reader.option("maxOffsetsPerTrigger", kafka.max_offsets_of(source))
    place = F.format_string(
        "kafka:%s/%d/%d@%s",
        "topic",
        "partition",
        "offset",
        F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
    )
    return reader.load().select(
        F.col("value").cast("string").alias("value"), place.alias("_source_file")
    )


def flow_frame(
    spark: SparkSession, store: TableStore, settings: Settings, flow: Flow, checkpoint: Path
) -> DataFrame:
    """The flow's streaming result over its inputs, for a query on ``checkpoint``: a checkpoint
    with no committed micro-batch gets the flow's seed table as initial state."""
    max_files = settings.trigger.max_files_per_trigger
    starts = input_starts(store, flow, checkpoint)
    frames = [
        read_input(spark, store, settings, source, max_files, starts.get(_table_of(source)))
        for source in flow.inputs
    ]
    params = flow.params(settings) if flow.params else {}
    seed = flow.seed_table(settings) if flow.seed_table else ""
    if seed and not checkpoints.committed_batches(checkpoint):
        if not store.exists(seed):
            raise MissingInput(
                f"flow {flow.name}: its seed table {seed} does not exist at {store.path(seed)}"
            )
        params["initial_state"] = store.read(seed)
    return flow.transform(*frames, **params)


def _table_of(source: Input) -> str | None:
    return source.table if isinstance(source, TableInput) else None


def input_starts(store: TableStore, flow: Flow, checkpoint: Path) -> dict[str, int | None]:
    """Where each Delta input of the flow's query on ``checkpoint`` starts: version 0 when the
    table's whole history is appends (its commits are read one by one, in the order they came:
    no snapshot of the table to rebuild and list, which Spark does again at each restart for
    a query whose last batch read it, 5 to 9 s for gold's queries); else (None) Delta's
    default, its snapshot first. Decided at the checkpoint's first start and kept in it: a
    restart must plan and replay its first batch as it was planned."""
    if checkpoints.planned_batches(checkpoint):
        # as its batches were planned (none recorded: it started from the snapshots)
        return checkpoints.input_starts(checkpoint) or {}
    starts = {
        table: (0 if dfiles.appends_only(store.path(table)) else None)
        for table in (_table_of(source) for source in flow.inputs)
        if table is not None and store.exists(table)
    }
    checkpoints.record_input_starts(checkpoint, starts)
    return starts


def start_flow(
    spark: SparkSession, store: TableStore, settings: Settings, flow: Flow
) -> StreamingQuery:
    """Finish a full refresh of the flow killed while it switched its tables, create the
    flow's output tables and start its streaming query."""
    import sys

    if finish_pending(spark, store, settings, flow, sys.stdout):
        log.info("flow %s: finished the switch of a full refresh killed before its end", flow.name)
    for output in flow.outputs:
        if output.schema is not None:
            store.create(output.table, output.schema, output.partition_by, engine=output.engine)
    checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
    for path in checkpoints.remove_unfinished_writes(checkpoint):
        log.info("flow %s: removed %s, left by a job killed while writing it", flow.name, path)
    for path in checkpoints.relocate_state_schemas(checkpoint):
        log.info("flow %s: %s points at the checkpoint's own state schemas", flow.name, path)
    planned = checkpoints.plan_lost_no_data_batch(checkpoint, int(time.time() * 1000))
    if planned is not None:
        log.info(
            "flow %s: runs no-data batch %s first, which its last run stopped before",
            flow.name,
            planned,
        )
    result = flow_frame(spark, store, settings, flow, checkpoint)
    trigger = trigger_kwargs(settings.trigger, flow.layer)
    # the layer's pool of Spark's fair scheduler (lakehouse/fairscheduler.xml): in continuous
    # mode gold's jobs get their share of the cores while bronze and silver are busy (the
    # query's thread takes the pool of the thread that starts it)
    context = spark.sparkContext
    before = context.getLocalProperty("spark.scheduler.pool")
    context.setLocalProperty("spark.scheduler.pool", flow.layer)
    try:
        with _no_data_batches(spark, flow.stops_itself or settings.trigger.mode != "continuous"):
            return _start_sink(store, settings, flow, result, checkpoint, trigger)
    finally:
        context.setLocalProperty("spark.scheduler.pool", before)


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


@contextlib.contextmanager
def _no_data_batches(spark: SparkSession, enabled: bool):
    """A query started in this block runs no no-data micro-batch unless ``enabled`` (the
    query's own session copies Spark's setting at its start; the session's is put back
    after). A flow that never ends by itself (gold.purchase_alerts: its ProcessingTime-mode
    processor, for its TTL) asks for one at every trigger, and in continuous mode it has
    nothing to do there: that processor registers no timer, so it emits only with input rows,
    and its expired state is cleaned in its data batches too. Without them its watermark
    (ops.completeness) moves when input comes. In available-now mode the last no-data batch
    is kept: the runner stops the query once caught up."""
    if enabled:
        yield
        return
    before = spark.conf.get(NO_DATA_BATCHES, None)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(NO_DATA_BATCHES)
        else:
            spark.conf.set(NO_DATA_BATCHES, before)


def _start_sink(
    store: TableStore,
    settings: Settings,
    flow: Flow,
    result: DataFrame,
    checkpoint: Path,
    trigger: dict,
) -> StreamingQuery:
    """The flow's sink: its one table, or a table per output (routed)."""
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
            engine=out.engine,
        )
    routes = [
        Route(o.table, o.rows or (lambda df: df), o.partition_by, o.event_time, o.upsert, o.engine)
        for o in flow.outputs
    ]
    return store.write_stream_routed(
        result,
        routes,
        checkpoint,
        trigger=trigger,
        query_name=flow.name,
        before_write=flow.before_write,
        prepare=_landing_check(settings, flow, checkpoint),
    )


def _landing_check(settings: Settings, flow: Flow, checkpoint: Path):
    """For a flow reading landing files: the step that quarantines what its batches' files
    hold that Spark does not read (None for the other flows)."""
    if settings.bronze.source == "kafka" or not any(
        isinstance(source, LandingInput) for source in flow.inputs
    ):
        return None
    return partial(_landing_quarantined, checkpoint, settings.bronze)


def _landing_quarantined(
    checkpoint: Path, bronze: BronzeSettings, batch: DataFrame, batch_id: int
) -> DataFrame:
    """The parsed micro-batch ``batch_id`` of a landing flow on ``checkpoint`` with a
    quarantine row for what Spark does not read of its files (lakehouse.landing.check): a
    compressed file that does not decompress to its end is one row, ``unreadable_file`` with
    the decoder's error, in place of the lines Spark read before the damage (the source skips
    the rest: ``ignoreCorruptFiles``); a line of ``bronze.max_line_bytes`` or more, which the
    source skips, is a ``too_large`` row without its text. A landing flow's transform gives
    every line ``_source_file``, ``_ingested_at``, ``_reason``, ``_detail``."""
    from pyspark.sql import functions as F

    checks = {
        landing.spark_name(uri): landing.check(landing.local_path(uri), bronze.max_line_bytes)
        for uri in checkpoints.source_files(checkpoint, batch_id)
        if uri.startswith("file:")
    }
    unreadable = {uri: c.unreadable for uri, c in checks.items() if c.unreadable}
    found = [(uri, landing.UNREADABLE, why) for uri, why in unreadable.items()] + [
        (uri, "too_large", _unread_line(line, bronze.max_record_bytes))
        for uri, c in checks.items()
        for line in c.long
    ]
    if not found:
        return batch
    log.warning("micro-batch %s quarantines what it cannot read: %s", batch_id, found)
    now = dt.datetime.now(dt.UTC)
    rows = [
        {
            **dict.fromkeys(batch.columns),
            "_ingested_at": now,
            "_source_file": uri,
            "_reason": reason,
            "_detail": detail,
        }
        for uri, reason, detail in sorted(found)
    ]
    if unreadable:
        batch = batch.where(~F.col("_source_file").isin(list(unreadable)))
    return batch.unionByName(batch.sparkSession.createDataFrame(rows, batch.schema))


def _unread_line(line: landing.LongLine, max_bytes: int) -> str:
    """The detail of a line too long to read (bronze.max_line_bytes)."""
    return (
        f"{line.size:,} bytes, over the limit of {max_bytes:,}; line {line.number:,} of the "
        "landing file, left there unread"
    )
