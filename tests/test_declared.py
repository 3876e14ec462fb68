"""lakehouse/declared_tables.json: the tables each layer's flows write, for code that cannot
import the declarations (the Airflow DAG file, in an environment without pyspark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse import declared

PROJECT = Path(__file__).resolve().parents[1]


def test_the_declared_tables_file_equals_the_declarations():
    """lakehouse/declared_tables.json, which the Airflow DAGs read (the declarations import
    pyspark), is the declarations' own list."""
    expected = declared.from_declarations()
    assert json.loads((PROJECT / "lakehouse" / declared.FILE).read_text()) == expected, (
        "lakehouse/declared_tables.json differs from the declarations: "
        "run `python -m lakehouse.declared`"
    )
    assert declared.layer_tables("gold") == expected["gold"]
    assert "gold.sessions" in declared.layer_tables("gold")
    with pytest.raises(ValueError, match="no layer 'ops'"):
        declared.layer_tables("ops")
