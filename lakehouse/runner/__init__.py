"""The flow runner: turns flow declarations into streaming queries and runs a layer.

All I/O of a flow happens here: reading landing files or tables as streams, creating output
tables, checkpoints, triggers, waiting and reporting. Layer code only declares flows. Each
module holds one job:

- :mod:`~lakehouse.runner.declarations`: the layers and the flows they declare, and the
  pipeline graph (:func:`pipeline`: flows in run order, writers, readers, downstream);
- :mod:`~lakehouse.runner.queries`: a flow's streaming query built from its declaration;
- :mod:`~lakehouse.runner.run`: running flows and layers, waiting, restarting after a
  transient error;
- :mod:`~lakehouse.runner.stopping`: signals, and stopping queries between micro-batches;
- :mod:`~lakehouse.runner.books`: progress and runs recorded (ops.stream_progress, ops.runs),
  the report per flow;
- :mod:`~lakehouse.runner.monitoring`: the books' tables (ops.stream_progress, ops.runs,
  ops.completeness), their schemas and their writers, through delta-rs;
- :mod:`~lakehouse.runner.recount`: micro-batches committed but never recorded, replayed;
- :mod:`~lakehouse.runner.refresh`: ``lakehouse run --full-refresh``, rebuilding tables on
  new checkpoints (its switch in :mod:`~lakehouse.runner.switch`);
- :mod:`~lakehouse.runner.errors`: what the runner raises.
"""

from lakehouse.runner.books import FlowReport
from lakehouse.runner.declarations import (
    PIPELINE,
    PipelineGraph,
    completeness_columns,
    declared_layers,
    declared_tables,
    layer_flows,
    pipeline,
)
from lakehouse.runner.errors import FlowFailed, MissingInput, RunStopped, UnknownLayer
from lakehouse.runner.queries import flow_frame, read_input, start_flow
from lakehouse.runner.recount import recount_unrecorded
from lakehouse.runner.run import run_flows, run_layers
from lakehouse.runner.stopping import StopRequest, stop_on_signals

__all__ = [
    "PIPELINE",
    "PipelineGraph",
    "FlowFailed",
    "FlowReport",
    "MissingInput",
    "RunStopped",
    "StopRequest",
    "UnknownLayer",
    "declared_layers",
    "completeness_columns",
    "declared_tables",
    "flow_frame",
    "layer_flows",
    "pipeline",
    "read_input",
    "recount_unrecorded",
    "run_flows",
    "run_layers",
    "start_flow",
    "stop_on_signals",
]
