"""``lakehouse state <flow>``: the health of a flow's state, read from its checkpoint with
Spark's state data source (``state-metadata`` and ``statestore`` formats).

Per stateful operator and state store (or state variable of a transformWithState processor):
rows per partition, the skew (largest partition over the smallest), and for processors the
event-time or processing-time timers still registered. A skew above SKEW_WARNING is flagged:
one partition then does most of the operator's work and holds most of its state.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from lakehouse.errors import LakehouseError
from lakehouse.settings import Settings, split_table_name
from lakehouse.text import aligned

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SKEW_WARNING = 10.0
_PROCESSORS = ("transformWithStateExec", "transformWithStateInPandasExec")


class NoState(LakehouseError, ValueError):
    """A flow that has no checkpoint or no stateful operator."""


@dataclass
class StoreHealth:
    operator_id: int
    operator: str
    store: str  # state store name, join side or state variable
    partitions: int
    rows: int
    min_rows: int
    max_rows: int
    timers: int | None = None  # processors only

    @property
    def skew(self) -> float:
        return self.max_rows / max(self.min_rows, 1) if self.rows else 1.0


def _per_partition(frame: DataFrame, partitions: int) -> tuple[int, int, int]:
    counts = {
        r["partition_id"]: r["count"] for r in frame.groupBy("partition_id").count().collect()
    }
    values = [counts.get(p, 0) for p in range(partitions)]
    return sum(values), min(values), max(values)


def _read_state(spark: SparkSession, path: str, operator_id: int, **options) -> DataFrame:
    reader = spark.read.format("statestore").option("operatorId", operator_id)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def state_health(spark: SparkSession, settings: Settings, flow: str) -> list[StoreHealth]:
    """The state of ``flow`` (``layer.flow``) per operator and store, from its checkpoint."""
    layer, name = split_table_name(flow)
    checkpoint = settings.checkpoint_path(layer, name)
    if not (checkpoint / "commits").is_dir():
        raise NoState(f"flow {flow} has no checkpoint at {checkpoint}: it has not run yet")
    path = str(checkpoint.absolute())
    # the RocksDB store reports each snapshot it loads to the driver's state store
    # coordinator, which Spark only creates with the session's streaming query manager: a
    # session that never ran a stream has none, and every state read fails
    spark.streams.active  # noqa: B018
    metadata = spark.read.format("state-metadata").load(path).collect()
    if not metadata:
        raise NoState(f"flow {flow} has no stateful operator (checkpoint {checkpoint})")
    health = []
    for meta in sorted(metadata, key=lambda m: (m["operatorId"], m["stateStoreName"])):
        op_id, operator, partitions = (
            meta["operatorId"],
            meta["operatorName"],
            meta["numPartitions"],
        )
        read = functools.partial(_read_state, spark, path, op_id)

        if operator in _PROCESSORS:
            properties = json.loads(meta["operatorProperties"] or "{}")
            timers = read(readRegisteredTimers="true").count()
            for variable in properties.get("stateVariables", []):
                var = variable["stateName"]
                if var.startswith("$"):  # Spark's own: timers, TTL indexes
                    continue
                rows, low, high = _per_partition(read(stateVarName=var), partitions)
                health.append(
                    StoreHealth(op_id, operator, var, partitions, rows, low, high, timers)
                )
        elif operator == "symmetricHashJoin":
            # Spark's join state format 2 lists its four stores (one entry per side is read
            # whole); format 3 one store of the default name
            if meta["stateStoreName"] not in ("left-keyToNumValues", "default"):
                continue
            for side in ("left", "right"):
                rows, low, high = _per_partition(read(joinSide=side), partitions)
                health.append(
                    StoreHealth(op_id, operator, f"{side} side", partitions, rows, low, high)
                )
        else:
            store = meta["stateStoreName"]
            rows, low, high = _per_partition(read(storeName=store), partitions)
            health.append(StoreHealth(op_id, operator, store, partitions, rows, low, high))
    return health


def print_health(flow: str, health: list[StoreHealth], out: TextIO | None = None) -> bool:
    """Print the health table; True when no store's skew is above SKEW_WARNING."""
    out = out or sys.stdout
    print(f"state of {flow}", file=out)
    header = ["op", "operator", "store", "partitions", "rows", "min/partition", "max/partition"]
    header += ["skew", "timers"]
    rows = [
        [
            str(h.operator_id),
            h.operator,
            h.store,
            str(h.partitions),
            f"{h.rows:,}",
            f"{h.min_rows:,}",
            f"{h.max_rows:,}",
            f"{h.skew:.1f}",
            "-" if h.timers is None else f"{h.timers:,}",
        ]
        for h in health
    ]
    print("\n".join(aligned(header, rows, right={0, 3, 4, 5, 6, 7, 8})), file=out)
    skewed = [h for h in health if h.skew > SKEW_WARNING]
    for h in skewed:
        print(
            f"warning: {h.operator} {h.store}: the largest partition holds {h.skew:.0f} times "
            f"the rows of the smallest (above {SKEW_WARNING:g}): a few keys carry most of the "
            "state; consider a finer key or more shuffle partitions on a new checkpoint",
            file=out,
        )
    return not skewed
