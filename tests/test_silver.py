"""silver.events: quality split, watermark and deduplication, streaming equal to batch."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from bronze.sources import table_schema
from lakehouse.ops.state import state_health
from lakehouse.progress import Progress
from lakehouse.quality import Rule, RuleError, enforce_fail_rules, load_rules
from lakehouse.runner import FlowFailed, layer_flows, run_flows
from lakehouse.storage.deltafiles import latest_version, open_table
from lakehouse.tools import generate as gen
from silver import events

FLOWS = layer_flows("silver")
JOIN_STORES = ("keyToNumValues", "keyWithIndexToValue")

UTC = dt.UTC
T = dt.datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
EVENTS_FLOW = next(f for f in FLOWS if f.name == "silver.events")
BRONZE_EVENTS = next(f for f in layer_flows("bronze") if f.name == "bronze.events")


def _bronze_row(
    event_id, minute, *, event_type="page_view", amount=None, page="/", user_id=1, second=0
):
    return (
        event_id,
        user_id,
        event_type,
        page,
        amount,
        T + dt.timedelta(minutes=minute, seconds=second),
        "mobile",
        "US",
        None,
        "file:/landing/events/x.json",
        T,
    )


def _append_versions(spark, store, versions):
    """Each list of rows becomes one bronze.events version (one file: one micro-batch)."""
    store.create("bronze.events", table_schema("events"))
    for rows in versions:
        df = spark.createDataFrame(rows, table_schema("events")).coalesce(1)
        store.write(df, "bronze.events")


def _silver(spark, settings, flow=EVENTS_FLOW, max_files=1):
    return run_flows(
        spark,
        settings.with_overrides({"trigger.max_files_per_trigger": max_files}),
        [flow],
        out=io.StringIO(),
    )


def _ids(store):
    return sorted(
        (r.event_id, r.event_time.minute)
        for r in store.read("silver.events").select("event_id", "event_time").collect()
    )


def test_duplicates_within_the_watermark_are_dropped_and_state_expires(spark, settings, store):
    """Watermark 10 minutes, one bronze version per micro-batch.

    e1's copy in the second batch arrives while e1 is remembered: dropped. The third batch
    (e5 at 10:25) moves the watermark to 10:15, past e1's 10:00 + 10 minutes; Spark evicts the
    expired key at the end of the next batch that runs with that watermark (the fourth). From
    then on e1 is forgotten: a copy carrying a time still inside the watermark (10:20) is a new
    row to Spark and is kept, while a copy with the original time (10:00) is now behind the
    watermark and is dropped as late, not as a duplicate.

    Then the batches with the duplicate, the late row and the last one lose their records in
    ops.stream_progress, as a kill between commit and record leaves them: the next start
    recounts them."""
    _append_versions(
        spark,
        store,
        [
            [_bronze_row("e1", 0), _bronze_row("e2", 5)],
            [_bronze_row("e1", 0), _bronze_row("e3", 8)],  # resent copy of e1: dropped
            [_bronze_row("e5", 25)],  # watermark -> 10:15
            [_bronze_row("e6", 21)],  # runs with 10:15: e1 (expires 10:10) evicted after it
            [_bronze_row("e1", 20), _bronze_row("e1", 0), _bronze_row("e7", 22)],
        ],
    )
    (report,) = _silver(spark, settings)
    assert _ids(store) == [
        ("e1", 0),
        ("e1", 20),
        ("e2", 5),
        ("e3", 8),
        ("e5", 25),
        ("e6", 21),
        ("e7", 22),
    ]
    assert report.batches == 5
    # the books: 9 bronze rows = 7 in silver + 1 duplicate dropped + 1 late row dropped
    assert (report.duplicates, report.late_rows) == (1, 1)
    # and ops.stream_progress holds every micro-batch with the same figures
    progress = store.read("ops.stream_progress").where("flow = 'silver.events'").collect()
    assert sorted(r.batch_id for r in progress) == list(range(len(progress)))
    assert {r.operator for r in progress} == {"dedupeWithinWatermark"}
    assert sum(r.duplicates_dropped for r in progress) == 1
    assert sum(r.rows_dropped_by_watermark for r in progress) == 1
    last = max(progress, key=lambda r: r.batch_id)
    assert last.watermark == dt.datetime(2026, 1, 5, 10, 15)  # 10:25 minus 10 minutes
    assert sum(r.input_rows for r in progress) == 9  # each bronze row read, and counted, once
    # the late row is kept in silver.late_events, with the batch and watermark that dropped it
    (late,) = store.read("silver.late_events").collect()
    assert (late.flow, late.input, json.loads(late.record)["event_id"]) == (
        "silver.events",
        "bronze.events",
        "e1",
    )
    assert (late.event_time, late.batch_id, late.watermark) == (
        dt.datetime(2026, 1, 5, 10, 0),
        4,
        dt.datetime(2026, 1, 5, 10, 15),
    )
    assert late._source_file == "file:/landing/events/x.json"

    # A job killed after a micro-batch committed but before its progress reached
    # ops.stream_progress leaves the books short of that batch's drops. The next start replays
    # each such batch on a copy of the checkpoint and records the same figures; the table is
    # not written again.
    columns = ["batch_id", "input_rows", "operator", "state_rows", "watermark"]
    columns += ["rows_dropped_by_watermark", "duplicates_dropped"]

    def recorded():
        progress = store.read("ops.stream_progress").where("flow = 'silver.events'")
        return sorted(tuple(r) for r in progress.select(*columns).collect())

    before = recorded()
    last = before[-1][0]
    assert [(r[0], r[5], r[6]) for r in before if r[5] or r[6]] == [(1, 0, 1), (4, 1, 0)]
    # what a kill leaves: the batch with the duplicate, the one with the late row and the
    # last one committed (checkpoint and table), their progress never recorded
    lost = sorted({1, 4, last})
    path = settings.table_path("ops.stream_progress")
    open_table(path).delete(f"flow = 'silver.events' AND batch_id IN ({', '.join(map(str, lost))})")
    assert [r[0] for r in recorded()] == [b for b in range(last + 1) if b not in lost]
    silver_version = latest_version(settings.table_path("silver.events"))

    out = io.StringIO()
    (report,) = run_flows(spark, settings, [EVENTS_FLOW], out=out)
    assert report.batches == 0  # nothing new to read
    by_batch = {r[0]: r for r in before}
    assert [line for line in out.getvalue().splitlines() if "recount" in line] == [
        f"flow silver.events: micro-batch {b} committed, but its job stopped before recording "
        f"its progress; recounted: {by_batch[b][1]} input rows, late rows dropped "
        f"{by_batch[b][5]}, duplicates dropped {by_batch[b][6]}"
        for b in lost
    ]
    after = recorded()
    assert [r for r in after if r[0] <= last] == before
    assert latest_version(settings.table_path("silver.events")) == silver_version
    assert not (settings.root / "checkpoints" / "_recount").exists()
    # a start with nothing lost recounts nothing
    out = io.StringIO()
    run_flows(spark, settings, [EVENTS_FLOW], out=out)
    assert "recount" not in out.getvalue()


def test_drop_rules_send_rows_to_quarantine_with_their_names(spark, settings, store):
    _append_versions(
        spark,
        store,
        [
            [
                _bronze_row("ok", 0),
                _bronze_row("buy", 1, event_type="purchase", amount=12.5),
                _bronze_row("bogus", 2, event_type="bogus"),
                _bronze_row("free", 3, event_type="purchase"),
                _bronze_row("refund", 4, event_type="purchase", amount=-3.0),
                _bronze_row("priced_view", 5, amount=1.0),
                _bronze_row("future", 60 * 24 * 365 * 10),
                _bronze_row("home", 6, page="home"),  # warn: kept
                _bronze_row("nouser", 7, user_id=None),
            ]
        ],
    )
    _silver(spark, settings)
    assert sorted(r.event_id for r in store.read("silver.events").collect()) == [
        "buy",
        "home",
        "ok",
    ]
    got = store.read("silver.quarantine").select(
        "table", "rules", F.get_json_object("record", "$.event_id").alias("event_id")
    )
    assertDataFrameEqual(
        got,
        [
            Row(table="silver.events", rules=["event_type_known"], event_id="bogus"),
            Row(table="silver.events", rules=["purchase_has_amount"], event_id="free"),
            Row(table="silver.events", rules=["purchase_amount_not_negative"], event_id="refund"),
            Row(table="silver.events", rules=["amount_only_on_purchases"], event_id="priced_view"),
            Row(table="silver.events", rules=["event_time_not_in_future"], event_id="future"),
            Row(table="silver.events", rules=["user_id_present"], event_id="nouser"),
        ],
    )
    # great-expectations saw the whole micro-batch; warn rules are recorded, the row kept
    results = store.read("ops.quality_results").select(
        "table", "batch_id", "rule", "action", "success", "element_count", "unexpected_count"
    )
    counts = {
        "event_id_present": (9, 0),
        "user_id_present": (9, 1),
        "event_time_present": (9, 0),
        "event_time_not_in_future": (9, 1),
        "event_time_not_before_2000": (9, 0),
        "event_type_known": (9, 1),
        "user_id_positive": (9, 0),
        "purchase_has_amount": (3, 1),
        "purchase_amount_not_negative": (3, 1),
        "amount_only_on_purchases": (6, 1),
        "page_is_a_path": (9, 1),
        "country_code": (9, 0),
    }
    actions = {r.name: r.action for r in events.rules()}
    assertDataFrameEqual(
        results,
        [
            Row(
                table="silver.events",
                batch_id=0,
                rule=name,
                action=actions[name],
                success=bad == 0,
                element_count=n,
                unexpected_count=bad,
            )
            for name, (n, bad) in counts.items()
        ],
    )


def test_great_expectations_gives_the_same_results_on_pandas_and_on_spark(spark):
    """Micro-batches of up to 100,000 rows are validated by great-expectations' pandas engine,
    larger ones by its Spark engine: both give the same result rows (the rules' ``when``
    conditions evaluated by Spark in both, a column only checked for presence sent to pandas
    as its presence, times compared in UTC). A batch of no rows has no results."""
    from lakehouse import quality

    rows = [
        ("ok", 1, "page_view", "/", None, T, "ios", "US", "f"),
        ("buy", 2, "purchase", "/b", 12.5, T, "ios", "DE", "f"),
        ("free", 3, "purchase", "/b", None, T, "web", "US", "f"),
        ("refund", 4, "purchase", "/b", -3.0, T, "web", "usa", "f"),
        ("priced", 5, "page_view", "home", 1.0, T, "web", None, "f"),
        ("future", 0, "bogus", "/", None, T + dt.timedelta(days=3650), "ios", "US", "f"),
        # (a time pandas' nanoseconds cannot hold: the pandas engine gets it in microseconds)
        (
            "ancient",
            6,
            "page_view",
            "/",
            None,
            dt.datetime(1, 1, 1, tzinfo=dt.UTC),
            "ios",
            "US",
            "f",
        ),
        (None, None, None, None, None, None, None, None, "f"),
    ]
    batch = spark.createDataFrame(
        rows,
        "event_id string, user_id long, event_type string, page string, amount double, "
        "event_time timestamp, device string, country string, _source_file string",
    ).select(*events.COLUMNS)
    rules = events.rules()

    def results(table: str, pandas_max_rows: int, at_most: int | None = None) -> list[tuple]:
        found = quality.validate(batch, rules, table, 7, pandas_max_rows, at_most)
        return sorted(tuple(r.values()) for r in found.drop(["validated_at"]).to_pylist())

    on_pandas = results("t.small", quality.PANDAS_MAX_ROWS)
    on_spark = results("t.large", len(rows) - 1)  # one row too many for pandas
    assert "pandas:t.small" in quality._GX and "pandas:t.large" not in quality._GX
    assert "spark:t.large" in quality._GX
    assert [r[1:] for r in on_pandas] == [r[1:] for r in on_spark]
    # a bound the caller knows (the micro-batch's rows): the same results
    assert [r[1:] for r in results("t.bound", quality.PANDAS_MAX_ROWS, len(rows))] == [
        r[1:] for r in on_pandas
    ]
    assert [r[1:] for r in results("t.bound_large", len(rows) - 1, len(rows))] == [
        r[1:] for r in on_spark
    ]
    assert "spark:t.bound_large" in quality._GX
    assert quality.validate(batch.limit(0), rules, "t.none", 8) is None
    assert quality.validate(batch.limit(0), rules, "t.none", 8, at_most=len(rows)) is None
    counts = {r[2]: (r[6], r[7], r[8]) for r in on_pandas}  # rule: success, elements, unexpected
    assert counts == {
        "event_id_present": (False, 8, 1),
        "user_id_present": (False, 8, 1),
        "event_time_present": (False, 8, 1),
        "event_time_not_in_future": (False, 8, 1),
        "event_time_not_before_2000": (False, 8, 1),
        "event_type_known": (False, 8, 1),
        "user_id_positive": (False, 8, 1),
        "purchase_has_amount": (False, 3, 1),
        "purchase_amount_not_negative": (False, 3, 1),
        "amount_only_on_purchases": (False, 4, 1),
        "page_is_a_path": (False, 8, 1),
        "country_code": (False, 8, 1),
    }


def test_a_fail_rule_stops_the_flow_naming_rule_table_and_count(spark, settings, store):
    strict = (
        *events.rules(),
        Rule(
            name="no_tablets",
            check="in_set",
            column="device",
            values=("mobile", "desktop"),
            action="fail",
        ),
    )
    _append_versions(spark, store, [[_bronze_row("a", 0), _bronze_row("b", 1)]])
    store.write(
        spark.createDataFrame(
            [("c", 1, "page_view", "/", None, T, "tablet", "US", None, "f", T)],
            table_schema("events"),
        ),
        "bronze.events",
    )
    flow = dataclasses.replace(
        EVENTS_FLOW,
        transform=partial(events.silver_events, quality=strict),
        before_write=lambda batch, _id, _rows: enforce_fail_rules(
            batch.where("_route = 'silver.events'"), strict, "silver.events"
        ),
    )
    with pytest.raises(
        FlowFailed, match=r"quality rule no_tablets \(action fail\) on silver.events: 1 row"
    ):
        _silver(spark, settings, flow, max_files=0)
    assert store.read("silver.events").count() == 0  # nothing of the failing batch is written


def test_rules_file_mistakes_name_the_rule(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nname = "x"\ncheck = "in_set"\ncolumn = "c"\naction = "drop"\n')
    with pytest.raises(RuleError, match="r.toml rule x: check in_set needs 'values'"):
        load_rules(path)
    path.write_text(
        '[[rule]]\nname = "x"\ncheck = "regex"\ncolumn = "c"\npattern = "\\\\p{Lu}"\n'
        'action = "warn"\n'
    )
    with pytest.raises(RuleError, match=r"r.toml rule x: pattern is not a regex Python can read"):
        load_rules(path)
    path.write_text('[[rule]]\nname = "x"\ncheck = "nope"\ncolumn = "c"\naction = "drop"\n')
    with pytest.raises(RuleError, match="r.toml rule x: check must be one of"):
        load_rules(path)
    assert len(events.rules()) == 12


# (one file per silver micro-batch: marker full, in `make test-all` beside the event-order
# matrix, whose CI case bronze_all-silver_one-gold_few reads silver.events one file at a time
# and checks it against verify's reference)
@pytest.mark.parametrize("max_files", [0, pytest.param(1, marks=pytest.mark.full)])
def test_silver_events_equals_a_batch_dedup_of_the_valid_rows(spark, settings, store, max_files):
    """Generated data without late events: whether bronze is read in one micro-batch or a few
    files at a time, and across a restart between two deliveries, silver.events is
    bronze.events deduplicated by event_id. (Read a file at a time, bronze reads one landing
    file per micro-batch and files cover 3 minutes, so its versions keep the arrival order
    within the lateness. Read at once, the order of bronze's versions does not matter: bronze
    reads each delivery at once too. Silver reading many bronze versions in one micro-batch:
    test_event_order's cases bronze_one-silver_all and bronze_few-silver_all, in CI.)"""
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    bronze = settings.with_overrides({"trigger.max_files_per_trigger": 1 if max_files else 0})
    reports = []
    for _delivery in range(2):  # the second delivery restarts both flows from their checkpoints
        params = gen.params_from_settings(
            settings, events=500, hours=0.5, file_minutes=3.0, late_fraction=0.0
        )
        gen.generate(spark, settings.root, params, progress=quiet)
        run_flows(spark, bronze, [BRONZE_EVENTS], out=io.StringIO())  # all silver.events reads
        reports.append(_silver(spark, settings, max_files=max_files)[0])
    columns = [c for c in events.COLUMNS if c != "_source_file"]
    expected = store.read("bronze.events").dropDuplicates(["event_id"]).select(*columns)
    assert store.read("silver.events").count() == expected.count()
    # the books: bronze rows = silver rows + duplicates dropped (+ no quarantine, no late rows)
    assert sum(r.late_rows for r in reports) == 0
    assert store.read("silver.quarantine").count() == 0
    assert store.read("bronze.events").count() == expected.count() + sum(
        r.duplicates for r in reports
    )
    assertDataFrameEqual(store.read("silver.events").select(*columns), expected)


def _imp(impression_id, minute):
    return (impression_id, 7, 2, 1, T + dt.timedelta(minutes=minute), None, "f", T)


def _clk(click_id, impression_id, minute, second=0):
    return (
        click_id,
        impression_id,
        7,
        1,
        T + dt.timedelta(minutes=minute, seconds=second),
        None,
        "f",
        T,
    )


def _join_state(checkpoint: Path) -> tuple[str, list[str]]:
    """The join state format a checkpoint's last batch ran with, and the named state stores
    in its operators' first partition (a store of the default name keeps its files in the
    partition's own folder, beside RocksDB's ``SSTs`` and ``_metadata``)."""
    offsets = max(checkpoint.glob("offsets/[0-9]*"), key=lambda p: int(p.name))
    conf = json.loads(offsets.read_text().split("\n")[1])["conf"]
    stores = sorted(
        p.name
        for p in checkpoint.glob("state/*/0/*")
        if p.is_dir() and p.name not in ("SSTs", "_metadata")
    )
    return conf["spark.sql.streaming.join.stateFormatVersion"], stores


@pytest.mark.parametrize("first_format", [None, "2"], ids=["fresh", "checkpoint_of_version_2"])
def test_ad_attribution_joins_within_the_hour_and_emits_unmatched_once(
    spark, settings, store, spark_conf, first_format
):
    """Impressions at 10:00; a click at exactly 11:00 joins, one at 11:00:01 never does. The
    unclicked impressions come out with null click columns only once both watermarks (2 h and
    3 h behind the latest times) are past 11:00: not in the first run, once in the second.
    A fresh query keeps the join's state in one store per partition (Spark's format 3); a
    checkpoint whose first run had the four stores of format 2 (an upgrade of the project)
    goes on with them, to the same rows."""
    flow = next(f for f in FLOWS if f.name == "silver.ad_attribution")
    for source in ("impressions", "clicks"):
        store.create(f"bronze.{source}", table_schema(source))
    key = "spark.sql.streaming.join.stateFormatVersion"
    assert spark.conf.get(key) == "3"

    def deliver(impressions, clicks, join_format=None):
        for source, rows in (("impressions", impressions), ("clicks", clicks)):
            df = spark.createDataFrame(rows, table_schema(source)).coalesce(1)
            store.write(df, f"bronze.{source}")
        with spark_conf(key, join_format) if join_format else contextlib.nullcontext():
            return _silver(spark, settings, flow)

    def attributed():
        return sorted(
            (r.impression_id, r.click_id) for r in store.read("silver.ad_attribution").collect()
        )

    deliver(
        [
            _imp("i1", 0),
            _imp("i2", 0),
            _imp("i3", 0),
            _imp("i1", 0),
            ("no_ad", None, 2, 1, T, None, "f", T),
        ],
        [_clk("c1", "i1", 60), _clk("c2", "i2", 60, second=1), _clk("c1", "i1", 60)],
        join_format=first_format,  # (the first run: the checkpoint's format)
    )
    assert attributed() == [("i1", "c1")]  # i2 and i3 may still be clicked: not emitted yet
    deliver([_imp("i9", 300)], [_clk("c9", "i9", 300)])  # watermarks: 13:00 and 12:00
    expected = [("i1", "c1"), ("i2", None), ("i3", None), ("i9", "c9")]
    assert attributed() == expected
    deliver([], [])
    assert attributed() == expected  # emitted once
    quarantined = store.read("silver.quarantine").select(
        "table", "rules", F.get_json_object("record", "$.impression_id").alias("id")
    )
    assertDataFrameEqual(
        quarantined, [Row(table="silver.ad_attribution", rules=["ad_id_present"], id="no_ad")]
    )
    row = store.read("silver.ad_attribution").where("impression_id = 'i1'").first()
    assert row.click_time == (T + dt.timedelta(hours=1)).replace(tzinfo=None)
    # great-expectations saw every input row of each side, kept, duplicate or quarantined
    results = store.read("ops.quality_results").where(F.col("table") == "silver.ad_attribution")
    got = {
        (r.batch_id, r.rule): (r.element_count, r.unexpected_count, r.success)
        for r in results.collect()
    }
    impressions = [r.name for r in load_rules("silver/rules/impressions.toml")]
    clicks = [r.name for r in load_rules("silver/rules/clicks.toml")]
    expected_results = {
        **{
            (0, name): (5, int(name == "ad_id_present"), name != "ad_id_present")
            for name in impressions
        },
        **{(0, name): (3, 0, True) for name in clicks},
        **{(2, name): (1, 0, True) for name in impressions + clicks},  # 1: no data
    }
    assert got == expected_results
    # the join's state, as `lakehouse state` shows it: the impression and the click of 15:00
    # (those of 10:00 and 11:00 are behind the watermarks), whatever the format
    health = state_health(spark, settings, "silver.ad_attribution")
    assert [(h.store, h.rows) for h in health if h.operator == "symmetricHashJoin"] == [
        ("left side", 1),
        ("right side", 1),
    ]
    recorded, stores = _join_state(settings.checkpoint_path("silver", "ad_attribution"))
    if first_format is None:
        assert (recorded, stores) == ("3", [])
    else:
        four = [f"{side}-{kind}" for side in ("left", "right") for kind in JOIN_STORES]
        assert (recorded, stores) == ("2", sorted(four))
