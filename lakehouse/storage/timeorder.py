"""Files in event-time order, for the tables streams read (bronze and silver).

A stream reading a Delta table a few files at a time (``maxFilesPerTrigger``) admits them in the
order both Delta sources share: the table's initial snapshot by (modification time, path), each
later version in the order its commit lists the files. Its watermark follows the latest event
time it has seen, so a file admitted early that holds the latest hours of a micro-batch makes
the earlier hours of the files after it "late", and the watermark drops on-time rows.

So the flows write a micro-batch's rows for such a table clustered by event time: one file when
the batch is small, else files that each hold one range of event times. At commit the files are
listed by their first event time (from their statistics), and their modification times are set
one millisecond apart in that order, so the snapshot order and the commit order are both event
time order. A reader then sees the rows of every micro-batch in time order, whatever its file
limit; across versions it sees them in the order the writer committed them.

What can still come out of order, and is then dropped and counted like any late row: rows a
writer committed after later event times (late input, truly late), and files not written by the
flows, such as those ``lakehouse maintain`` compacts, for a stream that starts from a snapshot
of them (compaction is skipped by streams already reading the table).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

F = TypeVar("F")


def clustered(df: DataFrame, column: str, rows: int, rows_per_file: int) -> DataFrame:
    """``df`` (about ``rows`` rows) in as many partitions as files to write: one partition when
    it fits in one file, else one range of ``column`` per partition."""
    from pyspark.sql import functions as fn

    files = max(1, math.ceil(rows / rows_per_file))
    if files == 1:
        return df.coalesce(1)
    return df.repartitionByRange(files, fn.col(column))


def first_time(stats: str | None, column: str) -> dt.datetime | None:
    """The smallest value of timestamp ``column`` in a file's Delta statistics (None: no
    statistics, or only nulls)."""
    if not stats:
        return None
    try:
        value = json.loads(stats).get("minValues", {}).get(column)
        if not isinstance(value, str):
            return None
        found = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=dt.UTC)


_NONE_FIRST = dt.datetime.min.replace(tzinfo=dt.UTC)


def in_time_order(files: Sequence[F], column: str, stats: Callable[[F], str | None]) -> list[F]:
    """``files`` by their first value of ``column``; files without one first, in their order."""
    keyed = [(first_time(stats(f), column) or _NONE_FIRST, i) for i, f in enumerate(files)]
    return [files[i] for _t, i in sorted(keyed)]


def commit_times(times: Sequence[int]) -> list[int]:
    """Modification times (ms) for files committed in this order: one millisecond apart from
    the latest of their own, so (modification time, path) keeps the order."""
    base = max(times, default=0)
    return [base + i for i in range(len(times))]
