"""Small helpers the storage test modules share."""

from __future__ import annotations

KV = "k long, v string"


def append_versions(store, name, chunks):
    """One table version (and one data file) per chunk of (k, v) rows."""
    for chunk in chunks:
        store.write(store.spark.createDataFrame(chunk, KV).coalesce(1), name)


def rows(n0, n1):
    return [(n, f"v{n}") for n in range(n0, n1)]
