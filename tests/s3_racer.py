"""One writer of tests/test_s3a.py's race: a process of its own (its own JVM, as a second job
would be) appending ``COUNT`` commits of one row each to the Delta table at ``URI``, through
delta-spark's DataFrame writer. Reads the store from the AWS variables and ``S3_ENDPOINT``."""

from __future__ import annotations

import os
import sys
import tempfile

from lakehouse.session import build_session
from lakehouse.settings import load_settings


def main(uri: str, name: str, count: int) -> None:
    overrides = {
        "root": tempfile.mkdtemp(),
        "s3.endpoint": os.environ["S3_ENDPOINT"],
        "s3.path_style": "true",
    }
    spark = build_session(load_settings("test", overrides=overrides), app_name=f"racer-{name}")
    rows = [spark.createDataFrame([(name, i)], "writer string, n long") for i in range(count)]
    print("ready", flush=True)
    sys.stdin.readline()  # both started: go
    for frame in rows:
        frame.write.format("delta").mode("append").save(uri)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
