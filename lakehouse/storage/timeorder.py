"""Files in event-time order, for the tables streams read (bronze and silver).

A stream reading a Delta table a few files at a time (``maxFilesPerTrigger``) admits them in the
order both Delta sources share: the table's initial snapshot by (modification time, path), each
later version in the order its commit lists the files. Its watermark follows the latest event
time it has seen, so a file admitted early that holds the latest hours of a micro-batch makes
the earlier hours of the files after it "late", and the watermark drops on-time rows.

So the flows write a micro-batch's rows for such a table (an output with an ``event_time``) so
that no file of a commit holds later hours than a file after it:

- by delta-rs (the default engine), in one file per micro-batch, however large: delta-rs writes
  a large micro-batch in parallel and lists its files in no time order, so it is not split;
- by delta-spark, clustered by event time (:func:`clustered`): one file when the batch is small,
  else one range of event times per partition, which delta-spark's commit lists in partition
  order.

The runner starts a new reader of a table whose log is appends since version 0 at version 0
(lakehouse.runner.queries.input_starts), so it reads the commits in the order they came, each
in its files' order. What can still come out of order, and is then dropped and counted like any
late row: rows a writer committed after later event times (late input, truly late), and a
stream that starts from a snapshot (a table compacted by ``lakehouse maintain``, or rewritten
by a full refresh), whose files come by modification time, which no public API of either
engine sets.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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
