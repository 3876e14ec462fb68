"""Delta tables on a real S3 store (SeaweedFS on loopback, started by the test): delta-spark
through Hadoop's S3A (the jars of jars/pom.xml, without the AWS SDK's bundle) and delta-rs
through its own client, each through its public API only, reading each other's commits."""

from __future__ import annotations

import os

import pytest

from lakehouse.s3client import Bucket
from lakehouse.s3conf import storage_options
from lakehouse.settings import load_settings
from lakehouse.tools import objectstore
from lakehouse.tools.processes import free_port

# a service of its own (the object store) and, in the race, two more JVMs: make test-e2e
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A store with bucket ``lake-s3a``; its keys in this process's AWS variables."""
    folder = tmp_path_factory.mktemp("store")
    store = objectstore.Store(folder, free_port(), "lake-s3a")
    objectstore.start(store)
    access, secret = store.keys()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update({"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret})
    yield store
    objectstore.stop(store)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _s3a(spark, store) -> None:
    """The shared session's S3A options for the store (its context started before the store:
    Hadoop's options of the session, which every read and write of it takes)."""
    access, secret = store.keys()
    for key, value in {
        "fs.s3a.endpoint": store.endpoint,
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.cross.region.access.enabled": "false",
        "fs.s3a.access.key": access,
        "fs.s3a.secret.key": secret,
    }.items():
        spark.conf.set(key, value)


def test_delta_spark_and_delta_rs_share_a_table_on_the_bucket(spark, bucket, tmp_path):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    _s3a(spark, bucket)
    uri = f"s3a://{bucket.bucket}/tables/bronze/t"
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    for _ in range(2):  # the second is the same app version: Delta skips it
        (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", "test-s3a")
            .option("txnVersion", 1)
            .save(uri)
        )
    found = sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())
    assert found == [(1, "a"), (2, "b")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").select("version").collect()
    assert [r.version for r in history] == [0]

    settings = load_settings(
        "test",
        overrides={"root": str(tmp_path), "s3.endpoint": bucket.endpoint, "s3.path_style": "true"},
    )
    options = storage_options(settings)
    table = DeltaTable(uri.replace("s3a://", "s3://"), storage_options=options)
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "b"},
    ]
    # delta-rs appends version 1, delta-spark reads it
    more = pa.table({"id": pa.array([3], pa.int64()), "v": pa.array(["c"])})
    write_deltalake(uri.replace("s3a://", "s3://"), more, mode="append", storage_options=options)
    found = sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())
    assert found == [(1, "a"), (2, "b"), (3, "c")]

    access, secret = bucket.keys()
    keys = Bucket(bucket.endpoint, bucket.bucket, access, secret).keys(
        "tables/bronze/t/_delta_log/"
    )
    commits = [k.rsplit("/", 1)[1] for k in keys if k.endswith(".json")]
    assert commits == ["00000000000000000000.json", "00000000000000000001.json"]
    assert not (tmp_path / "s3a:").exists() and not os.path.exists("s3a:")


def test_two_processes_racing_on_one_table_of_the_bucket_lose_no_commit(spark, bucket):
    """Two jobs (two JVMs) append to one table at once: every commit of each is there, once,
    in versions without a gap. A commit both try at one version is the store's to decide
    (put-if-absent): the loser sees Delta's conflict and commits again at the next version."""
    import subprocess
    import sys
    from pathlib import Path

    _s3a(spark, bucket)
    uri = f"s3a://{bucket.bucket}/tables/silver/raced"
    spark.createDataFrame([("seed", 0)], "writer string, n long").write.format("delta").save(uri)
    env = {
        **os.environ,
        "S3_ENDPOINT": bucket.endpoint,
        "PYTHONPATH": str(Path(__file__).parents[1]),
    }
    racer = str(Path(__file__).with_name("s3_racer.py"))
    count = 12
    writers = [
        subprocess.Popen(
            [sys.executable, racer, uri, name, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("a", "b")
    ]
    for w in writers:
        assert w.stdout.readline() == "ready\n", w.stderr.read()[-3000:]
    for w in writers:
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in writers:
        out, err = w.communicate(timeout=600)
        assert (w.returncode, out) == (0, "done\n"), err[-3000:]

    found = sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())
    assert found == sorted([("seed", 0)] + [(w, i) for w in ("a", "b") for i in range(count)])
    versions = sorted(
        r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").select("version").collect()
    )
    assert versions == list(range(2 * count + 1))


def test_the_log_store_refuses_a_commit_another_writer_made_and_takes_its_own(spark, bucket):
    """The project's log store, called as Delta calls it: a commit file that exists with other
    bytes is Delta's conflict (java.nio's FileAlreadyExistsException, from the store's 412); one
    that holds this write's own bytes (a PUT retried after its answer was lost) is a success."""
    from py4j.protocol import Py4JJavaError

    _s3a(spark, bucket)
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    store = jvm.lakehouse.delta.S3ConditionalLogStore(conf)
    base = f"s3a://{bucket.bucket}/tables/gold/logstore/_delta_log"

    def write(version: int, lines: list[str]) -> None:
        actions = jvm.java.util.ArrayList()
        for line in lines:
            actions.add(line)
        path = jvm.org.apache.hadoop.fs.Path(f"{base}/{version:020d}.json")
        store.write(path, actions.iterator(), False, conf)

    access, secret = bucket.keys()
    client = Bucket(bucket.endpoint, bucket.bucket, access, secret)
    key = "tables/gold/logstore/_delta_log/00000000000000000000.json"
    write(0, ['{"commitInfo":{"writer":"first"}}', '{"add":{}}'])
    assert client.get(key) == b'{"commitInfo":{"writer":"first"}}\n{"add":{}}\n'
    with pytest.raises(Py4JJavaError) as conflict:
        write(0, ['{"commitInfo":{"writer":"second"}}'])
    assert conflict.value.java_exception.getClass().getName() == (
        "java.nio.file.FileAlreadyExistsException"
    )
    assert client.get(key) == b'{"commitInfo":{"writer":"first"}}\n{"add":{}}\n'
    # the same bytes there already: this write's own first attempt
    write(0, ['{"commitInfo":{"writer":"first"}}', '{"add":{}}'])
    assert client.keys("tables/gold/logstore/") == [key]
