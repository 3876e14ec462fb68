"""``lakehouse run --full-refresh TABLE``: rebuild tables from their inputs on a new checkpoint.

The flows that write the tables run once more, from the start of their inputs, on staging
checkpoints into staging tables (``<root>/refresh/<id>/``), in available-now mode, while
readers keep reading the tables as they are. Then each table switches in one Delta commit,
an overwrite with the staging rows (in a table several flows write, such as the quarantine
tables, only the flow's own rows are replaced: ``Output.shared_by``), and the staging
checkpoint becomes the flow's checkpoint. A reader sees the old table until that commit, and
the new one from it; the tables of one flow switch one after the other. A rebuild that would
leave a table with fewer rows than it has (inputs pruned, past retention) is refused before
anything switches, unless ``allow_shrink`` (``--allow-shrink``) is given.

The switch, its marker and the finishing of a switch a kill cut short are in
:mod:`lakehouse.runner.switch`. While it runs, the refresh holds the lock of every flow that
writes one of its tables: none of them may append meanwhile.

Tables read from the rebuilt ones keep what they were built from: the refresh names them, to
be refreshed in turn when they should follow the new rows.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from lakehouse.flows import Flow
from lakehouse.locks import flow_locks
from lakehouse.runner.declarations import pipeline
from lakehouse.runner.switch import (
    RefreshError,
    check_shrink,
    finish_pending,
    staged_settings,
    switch,
    write_marker,
)
from lakehouse.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse.runner.books import FlowReport

log = logging.getLogger(__name__)


def flows_writing(tables: Sequence[str]) -> list[Flow]:
    """The flows that write any of ``tables`` (all of a flow's tables are rebuilt with it)."""
    graph = pipeline()
    written = set(graph.tables)
    unknown = sorted(set(tables) - written)
    if unknown:
        raise RefreshError(
            f"no flow writes {', '.join(unknown)}: a full refresh rebuilds a table a flow "
            f"writes, one of {', '.join(sorted(written))}"
        )
    return [f for f in graph.flows if any(o.table in tables for o in f.outputs)]


def downstream(flows: Sequence[Flow]) -> list[str]:
    """The tables built, directly or not, from what ``flows`` write, but not by them."""
    return pipeline().downstream([o.table for f in flows for o in f.outputs])


def with_downstream(flows: Sequence[Flow]) -> list[list[Flow]]:
    """``flows`` and the flows that read, directly or not, what they write, grouped by layer
    in pipeline order: a layer's refresh reads what the one before rebuilt."""
    graph = pipeline()
    rebuilt = [o.table for f in flows for o in f.outputs]
    read = [*rebuilt, *graph.downstream(rebuilt)]
    chosen = {f.name for f in flows} | {r.name for t in read for r in graph.readers(t)}
    return [
        [f for f in graph.layer(layer) if f.name in chosen]
        for layer in graph.layers
        if any(f.name in chosen for f in graph.layer(layer))
    ]


def refresh(
    spark: SparkSession,
    settings: Settings,
    flows: Sequence[Flow],
    *,
    out: TextIO,
    allow_shrink: bool = False,
    quiet_downstream: bool = False,
) -> list[FlowReport]:
    """Rebuild what ``flows`` write (see the module docstring); their reports. Unless
    ``allow_shrink``, refuse (before anything is switched) a rebuild that would leave a table
    with fewer rows than it has (:func:`check_shrink`). ``quiet_downstream``: the tables built
    from the rebuilt ones are being refreshed too (not named)."""
    from lakehouse.runner.run import run_flows
    from lakehouse.storage import table_store

    if settings.trigger.mode != "available-now":
        raise RefreshError(
            "a full refresh runs once, in available-now mode: run it without --trigger "
            "continuous, then run the flows continuously"
        )
    tables = {o.table for f in flows for o in f.outputs}
    writers = {w.name: w for t in sorted(tables) for w in pipeline().writers(t)}
    sharing = [f for f in writers.values() if f not in flows]
    locked = [(f.name, settings.checkpoint_path(f.layer, f.flow)) for f in [*flows, *sharing]]
    with flow_locks(locked):
        store = table_store(spark, settings)
        for flow in flows:
            finish_pending(spark, store, settings, flow, out)
        base = settings.root / "refresh" / str(uuid.uuid4())
        staged = staged_settings(settings, base, flows)
        print(
            f"full refresh of {', '.join(f.name for f in flows)}: rebuilding "
            f"{', '.join(sorted(tables))} from their inputs on new checkpoints; the tables "
            "stay as they are for readers until each is switched",
            file=out,
        )
        try:
            reports = run_flows(spark, staged, flows, out=out)
            if not allow_shrink:
                check_shrink(store, settings, base, flows)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)  # nothing switched: the old tables stay
            raise
        write_marker(base, {"id": base.name, "flows": [f.name for f in flows]})
        switch(store, settings, base, out)
    later = downstream(flows)
    if later and not quiet_downstream:
        print(
            "tables built from the rebuilt ones keep what they were built from (their flows "
            "skip the rewrite and go on with what comes after it); refresh them too for them "
            f"to follow, or give --with-downstream: {', '.join(later)}",
            file=out,
        )
    return reports
