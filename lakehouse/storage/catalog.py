"""The session catalog's entries of the lake's tables (``layer.table`` at its location), read
through Spark's public catalog where it says enough, else the session's external catalog."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession, layer: str, table: str, path: Path, force: bool) -> bool:
    """Register ``layer.table`` as a Delta table at ``path``, unless the catalog has it there
    already (or ``force``: replaced anyway). Whether the catalog's entry was written."""
    if not spark.catalog.databaseExists(layer):  # (IF NOT EXISTS warns when it is)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{layer}`")
    written = force or registered_location(spark, layer, table) != Path(os.path.normpath(path))
    if written:
        location = str(path).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"DROP TABLE IF EXISTS `{layer}`.`{table}`")  # external: data stays
        spark.sql(f"CREATE TABLE `{layer}`.`{table}` USING delta LOCATION '{location}'")
    return written


def catalog_entry(spark: SparkSession, layer: str, name: str):
    """The catalog's entry (a JVM CatalogTable) of ``layer.name``, a table or a view; None when
    there is none. One lookup in the session's catalog, however large the table."""
    catalog = spark._jsparkSession.sessionState().catalog().externalCatalog()
    if not catalog.databaseExists(layer) or not catalog.tableExists(layer, name):
        return None
    return catalog.getTable(layer, name)


def registered_location(spark: SparkSession, layer: str, name: str) -> Path | None:
    """Where the catalog says table ``layer.name`` is (None: not registered, or no location)."""
    entry = catalog_entry(spark, layer, name)
    if entry is None or not entry.storage().locationUri().isDefined():
        return None
    return Path(os.path.normpath(entry.storage().locationUri().get().getPath()))
