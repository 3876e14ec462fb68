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
    reports = maintain(settings.with_overrides({"maintenance.vacuum_retention_hours": 0}))
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


def test_maintain_unknown_table(settings, capsys):
    import pytest

    with pytest.raises(ValueError, match=r"no such table\(s\) gold.nope"):
        maintain(settings, ["gold.nope"])


def test_maintain_removes_the_files_of_a_write_that_never_committed(spark, store, settings):
    from lakehouse.storage.sparkfiles import write_parquet

    df = spark.createDataFrame([(1, "a")], KV)
    store.write(df, "bronze.crashy")
    root = store.path("bronze.crashy")
    orphans = write_parquet(df, str(root))  # files written, then the job died: no commit
    assert (root / orphans[0].path).exists()
    maintain(settings.with_overrides({"maintenance.vacuum_retention_hours": 0}))
    assert not (root / orphans[0].path).exists()
    assert not (root / orphans[0].path.split("/")[0]).exists()  # its folder too
    assertDataFrameEqual(store.read("bronze.crashy"), df)
