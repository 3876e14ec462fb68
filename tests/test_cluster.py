"""The three layers submitted with spark-submit to a real Spark standalone cluster on loopback
(``lakehouse cluster``), the project's code shipped as a zip with ``--py-files``: every table
equals its batch computation from the landing files (``lakehouse verify``), as a local run's
does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from verify_helpers import generate_closed, verify_all_equal

from lakehouse.settings import load_settings
from lakehouse.tools import cluster


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("events", "hours"),
    # (CI: 800 events, every table non-empty; make test-all: the 1,500 over 7 hours of before)
    [pytest.param(800, 2.0, id="800"), pytest.param(1500, 7.0, marks=pytest.mark.full, id="1500")],
)
def test_the_layers_on_a_standalone_cluster_equal_their_batch_computation(
    spark, tmp_path, events, hours
):
    port, master_ui, worker_ui = _free_ports(3)
    on_cluster = load_settings(
        "cluster",
        overrides={
            "root": str(tmp_path / "cluster-lake"),
            "master": f"spark://127.0.0.1:{port}",
            "shuffle_partitions": 2,
            "ui_enabled": False,
        },
    )
    generate_closed(
        spark, on_cluster, events=events, hours=hours, file_minutes=30.0, late_fraction=0.0,
        users=40,
    )  # fmt: skip
    # the code zip, the layers' entry points and delta-spark's jars (for every JVM), packed
    dist, jars = cluster.package_dist(on_cluster, tmp_path / "dist" / "lakehouse-code.zip")
    assert any(j.name.startswith("delta-spark_4.2_2.13-") for j in jars)

    ep = cluster.start(on_cluster, cores=2, memory="2g", master_ui=master_ui, worker_ui=worker_ui)
    try:
        submit = Path(sys.executable).with_name("spark-submit")
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        for layer in ("bronze", "silver", "gold"):
            done = subprocess.run(
                [str(submit), "--master", ep.url, "--py-files", str(dist.code),
                 "--jars", ",".join(str(j) for j in jars),
                 "--conf", "spark.executor.memory=1g", str(dist.job(layer)),
                 "--root", str(on_cluster.root), "--profile", "cluster",
                 "--conf", f"master={ep.url}", "--conf", "shuffle_partitions=2"],
                capture_output=True, text=True, timeout=900, env=env,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{master_ui}/json/") as r:
            apps = sorted(a["name"] for a in json.load(r)["completedapps"])
        assert apps == ["lakehouse-bronze", "lakehouse-gold", "lakehouse-silver"]
    finally:
        assert set(cluster.stop(on_cluster).names) == {"master", "worker"}

    # every table (bronze, silver, the nine of gold) equals its batch computation from the
    # landing files, as `lakehouse verify` makes it, and holds rows (but silver.late_events: no
    # line is late)
    verify_all_equal(on_cluster, empty=("silver.late_events",))
