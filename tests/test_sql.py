"""``lakehouse sql``: the lake's tables under their layer.table names, and the example BI
queries of queries/*.sql on crafted gold tables with known answers (the JDBC server's tests,
with beeline: tests/test_sql_server.py)."""

from __future__ import annotations

import json

import pytest
from sql_helpers import QUERIES, write_gold

from lakehouse.cli import main


@pytest.fixture
def gold(spark, store, settings):
    write_gold(spark, store, settings)


def _sql(settings, capsys, *args):
    code = main(["sql", *args, "--root", str(settings.root), "--profile", "test"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_top_ads_by_click_through_rate_per_hour(gold, settings, capsys):
    """From the final rows only: hour 11 ends after the table's mark (11:30)."""
    query = str(QUERIES / "top_ads_by_ctr_per_hour.sql")
    code, out, _ = _sql(settings, capsys, "--file", query, "--format", "csv")
    assert code == 0
    assert out.splitlines() == [
        "hour_start,ad_id,impressions,clicks,ctr,rank",
        "2026-01-05 10:00:00,2,4,1,0.25,1",
        "2026-01-05 10:00:00,5,8,2,0.25,2",
        "2026-01-05 10:00:00,1,10,2,0.2,3",
    ]
    code, out, _ = _sql(
        settings, capsys, "SELECT count(*) FROM gold.ad_performance_hourly_final", "--format", "csv"
    )
    assert out.splitlines() == ["count(1)", "5"]


def test_sessions_per_hour_as_a_table_and_as_json_lines(gold, settings, capsys):
    query = str(QUERIES / "sessions_per_hour.sql")
    code, out, _ = _sql(settings, capsys, "--file", query)
    assert code == 0
    assert out.splitlines() == [
        "hour_start          | sessions | mean_minutes | buying_share | revenue | final",
        "--------------------+----------+--------------+--------------+---------+------",
        "2026-01-05 10:00:00 |        2 |         22.5 |          0.5 |    12.5 |  True",
        "2026-01-05 11:00:00 |        1 |           30 |            0 |       0 | False",
        "(2 rows)",
    ]
    code, out, _ = _sql(settings, capsys, "--file", query, "--format", "json")
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "hour_start": "2026-01-05T10:00:00",
            "sessions": 2,
            "mean_minutes": 22.5,
            "buying_share": 0.5,
            "revenue": 12.5,
            "final": True,
        },
        {
            "hour_start": "2026-01-05T11:00:00",
            "sessions": 1,
            "mean_minutes": 30.0,
            "buying_share": 0.0,
            "revenue": 0.0,
            "final": False,
        },
    ]


def test_more_rows_than_max_rows_are_cut_with_a_note(gold, settings, capsys):
    code, out, err = _sql(
        settings, capsys, "SELECT ad_id FROM gold.ad_performance_hourly ORDER BY ad_id",
        "--format", "csv", "--max-rows", "2",
    )  # fmt: skip
    assert (code, out.splitlines()) == (0, ["ad_id", "1", "1"])
    assert "only the first 2 rows (raise --max-rows)" in err


def test_a_bad_statement_gets_one_line_and_exit_code_2(gold, settings, capsys):
    code, out, err = _sql(settings, capsys, "SELECT * FROM gold.nope")
    assert (code, out) == (2, "")
    assert err.startswith("lakehouse: error: [TABLE_OR_VIEW_NOT_FOUND] The table or view")
    assert len(err.strip().splitlines()) == 1
    code, _, err = _sql(settings, capsys)
    assert (code, err) == (2, "lakehouse: error: give a statement or --file, one of the two\n")


def test_registering_a_registered_lake_writes_nothing(gold, spark, settings, tmp_path):
    """What the JDBC server's restart and lakehouse sql on the persistent catalog do: a lookup
    per table and view, no table or view written again; the same names in another lake are
    registered anew, at its location."""
    from lakehouse.storage import table_store
    from lakehouse.storage.catalog import registered_location
    from lakehouse.tools.sql import LakeCatalog

    tables = ["gold.ad_performance_hourly", "gold.sessions", "ops.completeness"]
    LakeCatalog(spark, settings).refresh()
    again = LakeCatalog(spark, settings)
    assert again.refresh() == tables
    assert again.written == []
    assert sorted(again.views) == ["gold.ad_performance_hourly_final", "gold.sessions_final"]
    other = settings.with_overrides({"root": str(tmp_path / "other")})
    write_gold(spark, table_store(spark, other), other)
    moved = LakeCatalog(spark, other)
    assert moved.refresh() == tables
    assert moved.written == tables  # the views name the tables: they stay as they are
    assert registered_location(spark, "gold", "sessions") == other.table_path("gold.sessions")
    assert spark.sql("SELECT count(*) FROM gold.sessions_final").first()[0] == 2


def test_the_final_views_follow_the_completeness_table(spark, store, settings):
    """A refresh registers only the tables written since the last one, and writes a final
    view again when its query changes: no rows are final before ops.completeness exists."""
    from sql_helpers import at

    from gold.sessions import SCHEMA as SESSIONS_SCHEMA
    from lakehouse.runner.monitoring import COMPLETENESS_SCHEMA, COMPLETENESS_TABLE
    from lakehouse.storage.deltafiles import append_rows
    from lakehouse.tools.sql import LakeCatalog

    sessions = [(1, at(10, 5), at(10, 35), 2, 1, 12.5), (2, at(11, 5), at(11, 35), 1, 0, 0.0)]
    store.write(spark.createDataFrame(sessions, SESSIONS_SCHEMA), "gold.sessions")
    lake = LakeCatalog(spark, settings)
    assert lake.refresh() == ["gold.sessions"]
    assert lake.views == ["gold.sessions_final"]
    assert spark.sql("SELECT count(*) FROM gold.sessions_final").first()[0] == 0
    assert lake.refresh() == []  # nothing new: no lookup at all
    append_rows(
        str(settings.table_path(COMPLETENESS_TABLE)),
        COMPLETENESS_SCHEMA,
        [{"table": "gold.sessions", "flow": "gold.sessions", "complete_through": at(11),
          "column": "session_end", "batch_id": 1}],
    )  # fmt: skip
    lake.written.clear()
    assert lake.refresh() == ["ops.completeness"]
    assert lake.written == ["ops.completeness", "gold.sessions_final"]
    assert spark.sql("SELECT count(*) FROM gold.sessions_final").first()[0] == 1
