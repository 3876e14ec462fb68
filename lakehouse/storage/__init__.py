"""Table storage: Delta tables written by each table's engine (delta-rs or delta-spark) through
its public API, read through delta-spark (docs/architecture.md 5).

``table_store(spark, settings)`` gives the lake's tables on a session. Tables are addressed as
``layer.table``; their locations and checkpoints come from the settings. The modules by job:
:mod:`.store` (locations, reads, writes by engine), :mod:`.rs_writes` and :mod:`.spark_writes`
(each engine's writes), :mod:`.streams` (streaming writes, exactly once), :mod:`.catalog`,
:mod:`.timeorder`, :mod:`.faults`. Reading a table without Spark (status, verify, the report,
the ops tables) goes through delta-rs (:mod:`.deltafiles`).
"""

from lakehouse.storage.deltafiles import SchemaMismatch, TableNotFound
from lakehouse.storage.store import DeltaUnavailable, TableStore, table_store, trigger_kwargs

__all__ = [
    "DeltaUnavailable",
    "SchemaMismatch",
    "TableNotFound",
    "TableStore",
    "table_store",
    "trigger_kwargs",
]
