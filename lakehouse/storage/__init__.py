"""Table storage: Delta tables through delta-spark (docs/architecture.md 5).

``table_store(spark, settings)`` gives the lake's tables on a session. Tables are addressed as
``layer.table``; their locations and checkpoints come from the settings. Reading a table without
Spark (status, verify, the report, the ops tables) goes through delta-rs (:mod:`.deltafiles`).
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
