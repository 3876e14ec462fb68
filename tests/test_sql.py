"""``lakehouse sql``: the lake's tables under their layer.table names, and the example BI
queries of queries/*.sql on crafted gold tables with known answers."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gold.ads import SCHEMA as ADS_SCHEMA
from gold.sessions import SCHEMA as SESSIONS_SCHEMA
from lakehouse.cli import main
from lakehouse.monitoring import COMPLETENESS_SCHEMA, COMPLETENESS_TABLE
from lakehouse.storage.deltafiles import append_rows

QUERIES = Path(__file__).resolve().parents[1] / "queries"
UTC = dt.UTC


def _at(hour, minute=0):
    return dt.datetime(2026, 1, 5, hour, minute, tzinfo=UTC)


@pytest.fixture
def gold(spark, store, settings):
    ads = [  # (ad, hour, impressions, clicks)
        (1, 10, 10, 2),
        (2, 10, 4, 1),
        (3, 10, 5, 0),
        (4, 10, 1, 1),  # one impression: left out of the ranking
        (5, 10, 8, 2),  # ties ad 2 at 0.25: the lower ad id ranks first
        (1, 11, 3, 1),
    ]
    store.write(
        spark.createDataFrame(
            [(a, _at(h), _at(h + 1), i, c, c / i) for a, h, i, c in ads], ADS_SCHEMA
        ),
        "gold.ad_performance_hourly",
    )
    sessions = [
        (1, _at(10, 5), _at(10, 35), 2, 1, 12.5),
        (2, _at(10, 40), _at(10, 55), 1, 0, 0.0),
        (1, _at(11, 10), _at(11, 40), 3, 0, 0.0),
    ]
    store.write(spark.createDataFrame(sessions, SESSIONS_SCHEMA), "gold.sessions")
    # the ad hours before 11:30 and the sessions before 11:00 are final
    marks = [("gold.ad_performance_hourly", "hour_end", _at(11, 30))]
    marks += [("gold.sessions", "session_end", _at(11))]
    append_rows(
        str(settings.table_path(COMPLETENESS_TABLE)),
        COMPLETENESS_SCHEMA,
        [
            {"table": t, "flow": t, "complete_through": at, "column": c, "batch_id": 3}
            for t, c, at in marks
        ],
    )


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _beeline(url: str, query_file: Path) -> list[str]:
    from pyspark.find_spark_home import _find_spark_home

    beeline = Path(_find_spark_home()) / "bin" / "beeline"
    done = subprocess.run(
        [str(beeline), "-u", url, "--silent=true", "--outputformat=csv2", "-f", str(query_file)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = []
    for line in done.stdout.splitlines():
        # without a terminal, beeline's line editor redraws a prompt of "null" with carriage
        # returns in front of the first line it prints (none of our rows starts with null)
        line = re.sub(r"^(null)+", "", line.split("\r")[-1])
        if line.strip():
            rows.append(line)
    return rows


@pytest.mark.e2e
def test_serve_sql_answers_beeline_over_jdbc(gold, settings, tmp_path):
    """``lakehouse serve-sql`` in its own process; beeline (shipped with pyspark) connects
    over JDBC and runs the example BI queries on the crafted gold tables."""
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "lakehouse.cli", "serve-sql", "--root", str(settings.root),
         "--profile", "test", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:  # until the server accepts connections
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the server did not listen within 3 minutes"
            time.sleep(1)
        url = f"jdbc:hive2://127.0.0.1:{port}/"
        assert _beeline(url, QUERIES / "top_ads_by_ctr_per_hour.sql") == [
            "hour_start,ad_id,impressions,clicks,ctr,rank",
            "2026-01-05 10:00:00.0,2,4,1,0.25,1",
            "2026-01-05 10:00:00.0,5,8,2,0.25,2",
            "2026-01-05 10:00:00.0,1,10,2,0.2,3",
        ]
        assert _beeline(url, QUERIES / "sessions_per_hour.sql") == [
            "hour_start,sessions,mean_minutes,buying_share,revenue,final",
            "2026-01-05 10:00:00.0,2,22.5,0.5,12.5,true",
            "2026-01-05 11:00:00.0,1,30.0,0.0,0.0,false",
        ]
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0
        log.close()
    # 3 tables, and the views of the two gold tables' final rows
    assert "serving 5 tables and views" in (tmp_path / "server.log").read_text()
