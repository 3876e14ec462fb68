"""The three layers submitted with spark-submit to a real Spark standalone cluster on loopback
(``lakehouse cluster``), the project's code shipped as a zip with ``--py-files``: every gold
table equals the one of a local run on the same landing files."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lakehouse.progress import Progress
from lakehouse.runner import layer_flows, run_layers
from lakehouse.settings import load_settings
from lakehouse.storage import table_store
from lakehouse.tools import cluster
from lakehouse.tools import generate as gen

FLOWS = layer_flows("gold")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _comparable(value):
    """Array and map values as text (pandas compares and sorts scalars only)."""
    if isinstance(value, dict):
        return repr(sorted(value.items()))
    if isinstance(value, list | tuple | np.ndarray):
        return repr([_comparable(v) for v in value])
    return value


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.apply(lambda c: c.map(_comparable) if c.dtype == object else c)
    return frame.sort_values(list(frame.columns), ignore_index=True)


@pytest.mark.e2e
def test_the_layers_on_a_standalone_cluster_equal_a_local_run(spark, tmp_path):
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
    local = load_settings("test", overrides={"root": str(tmp_path / "local-lake")})
    params = gen.params_from_settings(
        local, events=1500, hours=7.0, file_minutes=30.0, late_fraction=0.0, users=40
    )
    gen.generate(spark, on_cluster.root, params, progress=lambda s: Progress(s, io.StringIO()))
    shutil.copytree(on_cluster.landing_path(), local.landing_path())
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

    run_layers(spark, local, ["bronze", "silver", "gold"], out=io.StringIO())
    cluster_store, local_store = table_store(spark, on_cluster), table_store(spark, local)
    for table in [o.table for flow in FLOWS for o in flow.outputs]:
        expected = _sorted(local_store.read(table).toPandas())
        found = _sorted(cluster_store.read(table).toPandas())
        if table != "gold.purchase_alerts":  # generated data may hold no alert
            assert len(expected) > 0, table
        pd.testing.assert_frame_equal(found, expected, check_exact=False, atol=1e-9, obj=table)
