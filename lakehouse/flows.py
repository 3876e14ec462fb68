"""Flow declarations: what a streaming flow reads, how it transforms, where its rows go.

A flow is declared once (docs/architecture.md 3) and :mod:`lakehouse.runner` turns it into one
streaming query. Layer modules hold nothing but declarations and pure transforms.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from lakehouse.settings import LAYERS, Settings, split_table_name

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


T = TypeVar("T")
# the engines that write a table (Output.engine): each table is written by one, through its
# public API (lakehouse.storage.rs_writes, lakehouse.storage.spark_writes)
ENGINES = ("delta-rs", "delta-spark")
# rows for other tables: a DataFrame, or Arrow rows (small: appended with delta-rs)
SideOutputs = dict[str, "DataFrame | pa.Table | Future[DataFrame | pa.Table | None]"]


def in_background(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` in a thread that inherits the caller's Spark job properties; its result as a
    future. A ``before_write`` uses it for work whose result is only needed after the batch's
    tables are written (great-expectations' results): that work then overlaps with the writes
    instead of adding its latency, mostly on the driver, to every micro-batch."""
    from pyspark import InheritableThread

    future: Future[T] = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    InheritableThread(target=run, name="lakehouse-background", daemon=True).start()
    return future


@dataclass(frozen=True)
class LandingInput:
    """The JSON-lines files of ``landing/<source>/``, read as a stream of text lines with the
    file each line came from (``value``, ``_source_file``)."""

    source: str


@dataclass(frozen=True)
class TableInput:
    """A table read as a stream of its appended rows."""

    table: str


Input = LandingInput | TableInput


@dataclass(frozen=True)
class Reference:
    """How the proof (``lakehouse verify``, the streaming-equals-batch tests) computes a table
    without Spark: ``rows``, a function of :mod:`lakehouse.proof.oracle` over the reference silver
    tables (:class:`lakehouse.proof.oracle.Silver`), compared with the table row for row by ``keys``
    on the reference's columns, or on ``columns`` alone (figures that depend on the batches
    left out; ``note`` says what is compared then)."""

    rows: Callable[[Any], Any]  # lakehouse.proof.oracle.Silver -> pandas.DataFrame
    keys: tuple[str, ...]
    columns: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Upsert:
    """How a table of a flow with several outputs is written instead of appended: each
    micro-batch's rows (one per ``keys``) are MERGEd into it, a row with a new key inserted, a
    row with a known key setting each column of ``updates`` to its SQL expression over the
    table's row ``t`` and the batch's row ``s`` (the others unchanged); exactly once per
    micro-batch, as appends are."""

    keys: tuple[str, ...]
    updates: dict[str, str]


@dataclass(frozen=True)
class Output:
    """A table a flow writes. ``rows`` picks this table's rows out of the flow's result (None:
    the result as it is). A ``schema`` creates the table before the flow starts, so downstream
    flows can start reading even before the first row arrives."""

    table: str
    rows: Callable[[DataFrame], DataFrame] | None = None
    schema: StructType | None = None
    partition_by: tuple[str, ...] = ()
    # the event-time column of a table that streams read: each micro-batch's rows for it are
    # written in files in this column's order (lakehouse.storage.timeorder), so a reader
    # admitting a few files at a time does not see later hours first
    event_time: str | None = None
    # columns `lakehouse maintain` Z-orders the table's files by (what
    # BI queries filter on), so file statistics let a reader skip most files
    zorder_by: tuple[str, ...] = ()
    # how the proof computes the table independently (gold tables; bronze and silver are
    # computed by lakehouse.proof.verify from the landing files)
    reference: Reference | None = None
    # MERGEd instead of appended (only beside other outputs of an append-mode flow)
    upsert: Upsert | None = None
    # in a table several flows write, the rows of this flow: (column, value); a full refresh
    # of the flow replaces only those
    shared_by: tuple[str, str] | None = None
    # the event-time column of a gold table's rows that its flow's watermark closes (a
    # window's or session's end): rows before the flow's watermark are final, and
    # ops.completeness records that mark (see lakehouse.runner.monitoring)
    complete_by: str | None = None
    # the engine that writes the table (one of ENGINES): delta-rs, whose small commits cost a
    # tenth of delta-spark's, unless a table needs delta-spark
    engine: str = "delta-rs"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(
                f"table {self.table}: engine must be one of {', '.join(ENGINES)}; "
                f"got {self.engine!r}"
            )


@dataclass(frozen=True)
class Flow:
    """One streaming query: ``transform(*inputs)`` written to one or more ``outputs``.

    ``name`` is ``layer.flow``; the checkpoint lives at ``checkpoints/<layer>/<flow>``. With
    several outputs the flow writes all of them from each micro-batch, each table exactly once.
    """

    name: str
    inputs: tuple[Input, ...]
    transform: Callable[..., DataFrame]
    outputs: tuple[Output, ...]
    output_mode: str = "append"
    keys: tuple[str, ...] = ()
    description: str = ""
    # settings the transform needs (e.g. a watermark), as keyword arguments
    params: Callable[[Settings], dict[str, Any]] | None = None
    # called with each micro-batch, its id and its number of rows before anything is written:
    # it may raise (fail rules) and may return side rows for other tables, e.g.
    # {"ops.quality_results": df}, or futures of them (see in_background), written once the
    # main outputs are
    before_write: Callable[[DataFrame, int, int], SideOutputs | None] | None = None
    # the name of a table (or "") whose rows seed the flow's state on its first run: the
    # runner reads it as a batch and passes it as ``initial_state=`` while the checkpoint
    # has no committed micro-batch (Spark only applies initial state to a new query)
    seed_table: Callable[[Settings], str] | None = None
    # False for a query that never ends an available-now run by itself: a
    # transformWithState processor in the ProcessingTime mode (needed for TTL) asks for
    # another no-data micro-batch forever. The runner stops it once all input is processed;
    # in continuous mode it runs no no-data micro-batch (runner.queries._no_data_batches), so
    # its processor must not wait on timers.
    stops_itself: bool = True

    def __post_init__(self) -> None:
        layer, _ = split_table_name(self.name)
        if layer not in LAYERS:
            raise ValueError(f"flow {self.name}: layer must be one of {', '.join(LAYERS)}")
        if not self.outputs:
            raise ValueError(f"flow {self.name} declares no output table")
        if len(self.outputs) > 1 and self.output_mode != "append":
            raise ValueError(f"flow {self.name}: several outputs need append mode")
        if len(self.outputs) == 1 and self.outputs[0].upsert is not None:
            raise ValueError(
                f"flow {self.name}: a single output is upserted by the flow's update mode and "
                "keys, not by Output.upsert"
            )

    @property
    def modes(self) -> str:
        """How the flow writes, for people: its output mode (and keys), and the tables it
        merges into, e.g. ``append; gold.session_stats_hourly merged by hour_start``."""
        mode = self.output_mode + (f", upserted by {', '.join(self.keys)}" if self.keys else "")
        merged = [
            f"{o.table} merged by {', '.join(o.upsert.keys)}" for o in self.outputs if o.upsert
        ]
        return "; ".join([mode, *merged])

    @property
    def layer(self) -> str:
        return split_table_name(self.name)[0]

    @property
    def flow(self) -> str:
        return split_table_name(self.name)[1]
