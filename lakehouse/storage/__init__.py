"""Table storage: one small interface, two Delta backends (ARCHITECTURE.md 4).

``table_store(spark, settings)`` returns the backend the settings choose. Tables are addressed as
``layer.table``; their locations and checkpoints come from the settings.
"""

from lakehouse.storage.deltafiles import SchemaMismatch, TableNotFound, UnsupportedChange
from lakehouse.storage.store import (
    EmbeddedStore,
    NativeStore,
    NativeUnavailable,
    TableStore,
    table_store,
    trigger_kwargs,
)

__all__ = [
    "EmbeddedStore",
    "NativeStore",
    "NativeUnavailable",
    "SchemaMismatch",
    "TableNotFound",
    "TableStore",
    "UnsupportedChange",
    "table_store",
    "trigger_kwargs",
]
