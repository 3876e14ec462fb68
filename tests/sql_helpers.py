"""Crafted gold tables with known answers to the example BI queries of queries/*.sql (for
``lakehouse sql`` and the JDBC server), and beeline, the JDBC client pyspark ships."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path

from gold.ad_performance_hourly import SCHEMA as ADS_SCHEMA
from gold.sessions import SCHEMA as SESSIONS_SCHEMA
from lakehouse.runner.monitoring import COMPLETENESS_SCHEMA, COMPLETENESS_TABLE
from lakehouse.storage.deltafiles import append_rows

QUERIES = Path(__file__).resolve().parents[1] / "queries"
UTC = dt.UTC
# the answers of the example queries on the crafted tables, as beeline's csv2 prints them
TOP_ADS = [
    "hour_start,ad_id,impressions,clicks,ctr,rank",
    "2026-01-05 10:00:00.0,2,4,1,0.25,1",
    "2026-01-05 10:00:00.0,5,8,2,0.25,2",
    "2026-01-05 10:00:00.0,1,10,2,0.2,3",
]
SESSIONS_PER_HOUR = [
    "hour_start,sessions,mean_minutes,buying_share,revenue,final",
    "2026-01-05 10:00:00.0,2,22.5,0.5,12.5,true",
    "2026-01-05 11:00:00.0,1,30.0,0.0,0.0,false",
]


def at(hour, minute=0):
    return dt.datetime(2026, 1, 5, hour, minute, tzinfo=UTC)


def write_gold(spark, store, settings) -> None:
    """gold.ad_performance_hourly, gold.sessions (3 rows) and their complete-through marks in
    ops.completeness."""
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
            [(a, at(h), at(h + 1), i, c, c / i) for a, h, i, c in ads], ADS_SCHEMA
        ),
        "gold.ad_performance_hourly",
    )
    sessions = [
        (1, at(10, 5), at(10, 35), 2, 1, 12.5),
        (2, at(10, 40), at(10, 55), 1, 0, 0.0),
        (1, at(11, 10), at(11, 40), 3, 0, 0.0),
    ]
    store.write(spark.createDataFrame(sessions, SESSIONS_SCHEMA), "gold.sessions")
    # the ad hours before 11:30 and the sessions before 11:00 are final
    marks = [("gold.ad_performance_hourly", "hour_end", at(11, 30))]
    marks += [("gold.sessions", "session_end", at(11))]
    append_rows(
        str(settings.table_path(COMPLETENESS_TABLE)),
        COMPLETENESS_SCHEMA,
        [
            {"table": t, "flow": t, "complete_through": when, "column": c, "batch_id": 3}
            for t, c, when in marks
        ],
    )


def beeline_path() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "bin" / "beeline"


def beeline(url: str, *args: str, user: str | None = None, password_file: Path | None = None):
    """Run beeline (its output as csv2, quiet) against ``url``; the finished process, with the
    rows it printed in ``.rows``."""
    command = [str(beeline_path()), "-u", url, "--silent=true", "--outputformat=csv2"]
    if user:
        command += ["-n", user]
    if password_file:
        command += ["-w", str(password_file)]
    done = subprocess.run(
        [*command, *args], capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=180
    )
    rows = []
    for line in done.stdout.splitlines():
        # without a terminal, beeline's line editor redraws a prompt of "null" with carriage
        # returns in front of the first line it prints (none of our rows starts with null)
        # (and with -e, the prompt of the connection, "0: jdbc:hive2://host:port/> ")
        line = re.sub(r"^(?:null)+|^\d+: jdbc:\S*> ", "", line.split("\r")[-1])
        if line.strip():
            rows.append(line)
    done.rows = rows
    return done
