"""``lakehouse maintain``: compaction (Z-ordered where a table declares it), log checkpoint,
vacuum, beside streams that keep running."""

from __future__ import annotations

from pyspark.testing import assertDataFrameEqual

from lakehouse.cli import main
from lakehouse.maintain import maintain
from lakehouse.storage import deltafiles as dfiles

KV = "k long, v string"


def test_maintain_compacts_without_disturbing_a_stream(spark, store, settings, run_stream, capsys):
    rows = [[(n, f"v{n}")] for n in range(6)]
    for chunk in rows[:4]:
        store.write(spark.createDataFrame(chunk, KV).coalesce(1), "bronze.small")

    def follow():
        run_stream("bronze.small", "silver.small", settings.checkpoint_path("silver", "small"))

    follow()
    reports = maintain(
        settings.with_overrides({"maintenance.vacuum_retention_hours": 0}), None, spark
    )
    small = next(r for r in reports if r.table == "bronze.small")
    assert (small.files_before, small.files_after, small.files_compacted) == (4, 1, 4)
    assert small.files_vacuumed == 4  # the compacted-away files, unreferenced now
    assert dfiles.latest_version(store.path("bronze.small")) > small.version_before

    for chunk in rows[4:]:
        store.write(spark.createDataFrame(chunk, KV).coalesce(1), "bronze.small")
    follow()  # the compaction version carries no new data: the stream adds only rows 4 and 5
    expected = spark.createDataFrame([r for chunk in rows for r in chunk], KV)
    assertDataFrameEqual(store.read("bronze.small"), expected)
    assertDataFrameEqual(store.read("silver.small"), expected)

    assert main(["maintain", "--root", str(settings.root), "--profile", "test"]) == 0
    out = capsys.readouterr().out
    assert "bronze.small" in out and "silver.small" in out


def test_maintain_unknown_table(spark, settings, capsys):
    """A table the lake does not hold is bad input: one line on stderr, exit code 2."""
    root = ["--root", str(settings.root), "--profile", "test"]
    assert main(["maintain", *root, "--table", "gold.nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lakehouse: error: no such table(s) gold.nope under ")
    assert err.count("\n") == 1


def test_maintain_removes_the_files_of_a_write_that_never_committed(spark, store, settings):
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = spark.createDataFrame([(1, "a")], KV)
    store.write(df, "bronze.crashy")
    root = store.path("bronze.crashy")
    orphan = root / "staging-0" / "part-0.parquet"  # written, then the job died: no commit
    orphan.parent.mkdir()
    pq.write_table(pa.table({"k": [2], "v": ["b"]}), orphan)
    maintain(settings.with_overrides({"maintenance.vacuum_retention_hours": 0}), None, spark)
    assert not orphan.exists()
    assert not orphan.parent.exists()  # its folder too
    assertDataFrameEqual(store.read("bronze.crashy"), df)


def test_maintain_beside_a_running_stream(spark, store, settings):
    """Compaction and vacuum of a table a stream is reading and of the table it is writing,
    while the query runs: the query neither fails nor reads a row twice, and every row
    written before and after arrives once."""
    chunks = [[(n, f"v{n}")] for n in range(8)]
    for chunk in chunks[:4]:
        store.write(spark.createDataFrame(chunk, KV).coalesce(1), "bronze.live")
    query = store.write_stream(
        store.read_stream("bronze.live", max_files_per_trigger=1),
        "silver.live",
        settings.checkpoint_path("silver", "live"),
        trigger={"processingTime": "200 milliseconds"},
    )
    try:
        query.processAllAvailable()
        reports = maintain(settings, ["bronze.live", "silver.live"], spark)
        assert [(r.table, r.files_before, r.files_after) for r in reports] == [
            ("bronze.live", 4, 1),
            ("silver.live", 4, 1),
        ]
        for chunk in chunks[4:]:
            store.write(spark.createDataFrame(chunk, KV).coalesce(1), "bronze.live")
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    expected = spark.createDataFrame([r for chunk in chunks for r in chunk], KV)
    assertDataFrameEqual(store.read("silver.live"), expected)


def test_maintain_zorders_gold_tables_by_their_declared_columns(spark, store, settings):
    from lakehouse.maintain import zorder_columns

    assert zorder_columns()["gold.sessions"] == ("user_id",)
    schema = "user_id long, n long"
    for users in ([5, 1], [3, 2], [4, 6]):  # three files, each spanning users
        store.write(spark.createDataFrame([(u, u) for u in users], schema), "gold.sessions")
    maintain(settings, ["gold.sessions"], spark)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{store.path('gold.sessions')}`")
    (optimize,) = history.where("operation = 'OPTIMIZE'").collect()
    assert optimize.operationParameters["zOrderBy"] == '["user_id"]'
    assert optimize.operationMetrics["numAddedFiles"] == "1"
    assertDataFrameEqual(
        store.read("gold.sessions"), spark.createDataFrame([(u, u) for u in range(1, 7)], schema)
    )
