"""Gold flows on crafted silver rows with known answers."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import time
from functools import partial

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from lakehouse.runner import layer_flows, run_flows
from silver.attribution import SCHEMA as ATTRIBUTION_SCHEMA
from silver.events import SCHEMA as EVENTS_SCHEMA

FLOWS = layer_flows("gold")

UTC = dt.UTC
T = dt.datetime(2026, 1, 5, 10, 0)  # naive: how Spark returns timestamps (session time zone UTC)
_ids = itertools.count()


def _event(user_id, minute, *, event_type="page_view", amount=None, page="/", country="US"):
    return (
        f"e{next(_ids)}",
        user_id,
        event_type,
        page,
        amount,
        (T + dt.timedelta(minutes=minute)).replace(tzinfo=UTC),
        "web",
        country,
        "f",
    )


def _deliver(spark, store, settings, flows, *versions):
    """Each list of rows becomes one silver.events version (one micro-batch), then the flow(s)
    run in available-now mode."""
    store.create("silver.events", EVENTS_SCHEMA)
    for rows in versions:
        store.write(spark.createDataFrame(rows, EVENTS_SCHEMA).coalesce(1), "silver.events")
    one = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    flows = flows if isinstance(flows, list) else [flows]
    return run_flows(spark, one, flows, out=io.StringIO())


def _flow(name):
    return next(f for f in FLOWS if f.name == name)


def _at(minute):
    return T + dt.timedelta(minutes=minute)


def test_sessions_span_batches_keep_a_15_minute_gap_and_come_out_once_closed(
    spark, settings, store
):
    """Watermark 10 minutes. u1's session spans three micro-batches; u2's events are exactly
    15 minutes apart (one session); u4's second event is 6 minutes older than its first
    (out of order, within the lateness); u3 has two sessions in one batch. Nothing comes out
    while the watermark is before a session's end; u9's session is still open at the end."""
    flow = next(f for f in FLOWS if f.name == "gold.sessions")
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 0), _event(2, 0), _event(4, 8)],  # watermark -> 09:58
        [_event(1, 10), _event(2, 15), _event(4, 2)],  # watermark -> 10:05
    )
    assert store.read("gold.sessions").count() == 0  # every session may still grow
    _deliver(
        spark,
        store,
        settings,
        flow,
        [
            _event(1, 20),
            _event(3, 10),
            _event(3, 12, event_type="purchase", amount=12.5),
            _event(3, 40),
        ],
        [_event(9, 120)],  # watermark -> 11:50: every session above is closed
    )
    assertDataFrameEqual(
        store.read("gold.sessions"),
        [
            Row(
                user_id=1,
                session_start=_at(0),
                session_end=_at(35),
                events=3,
                purchases=0,
                revenue=0.0,
            ),
            Row(
                user_id=2,
                session_start=_at(0),
                session_end=_at(30),
                events=2,
                purchases=0,
                revenue=0.0,
            ),
            Row(
                user_id=3,
                session_start=_at(10),
                session_end=_at(27),
                events=2,
                purchases=1,
                revenue=12.5,
            ),
            Row(
                user_id=3,
                session_start=_at(40),
                session_end=_at(55),
                events=1,
                purchases=0,
                revenue=0.0,
            ),
            Row(
                user_id=4,
                session_start=_at(2),
                session_end=_at(23),
                events=2,
                purchases=0,
                revenue=0.0,
            ),
        ],
    )


def test_hourly_activity_chains_5_minute_windows_into_hours(spark, settings, store):
    """u1: 3 events in 10:00-10:05, 1 in 10:05-10:10, 2 in 10:55-11:00 (hour 10), 1 at 11:20
    (hour 11); u2: 1 event at 10:30. The hour 10 rows come out once the watermark passes
    11:00 (an event at 12:30), hour 11 of u1 once it passes 12:00; u3's hour 12 stays open."""
    flow = next(f for f in FLOWS if f.name == "gold.user_activity_hourly")
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 0), _event(1, 1), _event(1, 4), _event(1, 7), _event(2, 30)],
        [_event(1, 55), _event(1, 59)],
    )
    assert store.read("gold.user_activity_hourly").count() == 0  # no hour is closed yet
    _deliver(spark, store, settings, flow, [_event(1, 80)], [_event(3, 150)])
    hour = dt.timedelta(hours=1)
    assertDataFrameEqual(
        store.read("gold.user_activity_hourly"),
        [
            Row(
                user_id=1,
                hour_start=_at(0),
                hour_end=_at(0) + hour,
                events=6,
                active_5m_windows=3,
                mean_events_per_5m=2.0,
                max_events_per_5m=3,
            ),
            Row(
                user_id=2,
                hour_start=_at(0),
                hour_end=_at(0) + hour,
                events=1,
                active_5m_windows=1,
                mean_events_per_5m=1.0,
                max_events_per_5m=1,
            ),
            Row(
                user_id=1,
                hour_start=_at(60),
                hour_end=_at(60) + hour,
                events=1,
                active_5m_windows=1,
                mean_events_per_5m=1.0,
                max_events_per_5m=1,
            ),
        ],
    )


def test_sessions_custom_match_session_window_and_add_pages_counts_and_hourly_stats(
    spark, settings, store
):
    """The deliveries of the session_window test, with pages and event types, through
    gold.sessions and gold.sessions_custom side by side: the same sessions, plus landing and
    exit pages, pages in order, counts per type; and per hour of session end in
    gold.session_stats_hourly. After each delivery both tables hold the same sessions: a
    session is written when the watermark closes it, in both, and its hour's statistics
    are merged then (the hour 10:00-11:00 has 4 sessions, then 5)."""
    flows = [_flow("gold.sessions"), _flow("gold.sessions_custom")]

    def same_sessions():
        common = list(store.read("gold.sessions").columns)
        found = store.read("gold.sessions_custom").select(common)
        assertDataFrameEqual(found, store.read("gold.sessions"))
        return found.count()

    _deliver(
        spark,
        store,
        settings,
        flows,
        [_event(1, 0, page="/a"), _event(2, 0), _event(4, 8, page="/late")],
        [_event(1, 10, event_type="search", page="/s"), _event(2, 15), _event(4, 2, page="/x")],
    )
    assert same_sessions() == 0  # the watermark (10:05) closes none yet
    _deliver(
        spark,
        store,
        settings,
        flows,
        [
            _event(1, 20, event_type="add_to_cart", page="/p"),
            _event(3, 10),
            _event(3, 12, event_type="purchase", amount=12.5, page="/pay"),
            _event(3, 40, page="/again"),
        ],
        [_event(9, 50)],
    )
    # the watermark (10:40) closes the sessions of u1, u2, u4 and u3's first: not their hour
    assert same_sessions() == 4
    # 4 sessions of 35, 30, 17 and 21 minutes; 3+2+2+2 events
    hour_10 = Row(
        hour_start=_at(0),
        hour_end=_at(60),
        sessions=4,
        mean_duration_s=(35 + 30 + 17 + 21) * 60 / 4,
        mean_events=9 / 4,
        purchasing_sessions=1,
    )
    assertDataFrameEqual(store.read("gold.session_stats_hourly"), [hour_10])
    _deliver(spark, store, settings, flows, [_event(9, 120)])
    assert same_sessions() == 6  # (10:110) u3's second, u9's first; u9's second is open
    custom = store.read("gold.sessions_custom")
    extra = ("user_id", "session_start", "landing_page", "exit_page", "pages", "event_counts")
    assertDataFrameEqual(
        custom.select(*extra),
        [
            Row(*extra)(
                1,
                _at(0),
                "/a",
                "/p",
                ["/a", "/s", "/p"],
                {"page_view": 1, "search": 1, "add_to_cart": 1},
            ),
            Row(*extra)(2, _at(0), "/", "/", ["/", "/"], {"page_view": 2}),
            Row(*extra)(3, _at(10), "/", "/pay", ["/", "/pay"], {"page_view": 1, "purchase": 1}),
            Row(*extra)(3, _at(40), "/again", "/again", ["/again"], {"page_view": 1}),
            Row(*extra)(4, _at(2), "/x", "/late", ["/x", "/late"], {"page_view": 2}),
            Row(*extra)(9, _at(50), "/", "/", ["/"], {"page_view": 1}),
        ],
    )
    # hour 10 takes u3's second session (15 minutes, 1 event) into its figures; u9's session
    # ends at 11:05, in hour 11
    assertDataFrameEqual(
        store.read("gold.session_stats_hourly"),
        [
            Row(
                **hour_10.asDict()
                | {
                    "sessions": 5,
                    "mean_duration_s": (35 + 30 + 17 + 15 + 21) * 60 / 5,
                    "mean_events": 10 / 5,
                }
            ),
            Row(
                hour_start=_at(60),
                hour_end=_at(120),
                sessions=1,
                mean_duration_s=15 * 60.0,
                mean_events=1.0,
                purchasing_sessions=0,
            ),
        ],
    )


def test_activity_5m_is_upserted_with_each_windows_latest_value(spark, settings, store):
    """Update mode: u1's window 10:00-10:05 is written after the first micro-batch and
    updated (not appended again) by the second; a row behind the watermark changes nothing;
    the table holds one row per (user, window) with its latest counts. Spark drops a row as
    late against the watermark of the micro-batch before (here: 10:20, set by 10:30)."""
    flow = _flow("gold.user_activity_5m")
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 0), _event(1, 1, event_type="purchase", amount=3.5), _event(2, 7)],
    )
    five = dt.timedelta(minutes=5)
    assertDataFrameEqual(
        store.read("gold.user_activity_5m"),
        [Row(1, _at(0), _at(0) + five, 2, 1, 3.5), Row(2, _at(5), _at(5) + five, 1, 0, 0.0)],
    )
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 4, event_type="purchase", amount=1.5), _event(1, 30)],  # watermark -> 10:20
        [_event(3, 40)],  # watermark -> 10:30
        [_event(1, 2)],  # 10:02 is behind 10:20: dropped, the window stays as it was
    )
    assertDataFrameEqual(
        store.read("gold.user_activity_5m"),
        [
            Row(1, _at(0), _at(0) + five, 3, 2, 5.0),
            Row(2, _at(5), _at(5) + five, 1, 0, 0.0),
            Row(1, _at(30), _at(30) + five, 1, 0, 0.0),
            Row(3, _at(40), _at(40) + five, 1, 0, 0.0),
        ],
    )


def _attributed(impression, ad_id, minute, click=None, click_minute=None):
    return (
        impression,
        ad_id,
        100 + ad_id,
        5,
        _at(minute).replace(tzinfo=UTC),
        click,
        _at(click_minute).replace(tzinfo=UTC) if click else None,
    )


def test_ad_performance_counts_each_impression_once_whatever_its_clicks(spark, settings, store):
    """Ad 1, hour 10: i1 clicked twice (two attribution rows, the second a batch later), i2
    never (its row reaches silver hours later, as an unmatched impression does); hour 11: i3
    clicked once. Ad 2, hour 10: i4 never clicked. Watermark 5 hours on impression_time: the
    hours come out once impressions 5 hours later arrive."""
    store.create("silver.ad_attribution", ATTRIBUTION_SCHEMA)
    versions = [
        [_attributed("i1", 1, 5, "c1", 10), _attributed("i3", 1, 70, "c3", 75)],
        [_attributed("i1", 1, 5, "c2", 50)],
        [_attributed("i2", 1, 30), _attributed("i4", 2, 50)],
        [_attributed("i9", 9, 7 * 60)],  # watermark -> 12:00: hours 10 and 11 close
        [_attributed("i10", 9, 7 * 60 + 5)],
        [_attributed("i11", 9, 7 * 60 + 10)],
    ]
    for rows in versions:
        store.write(
            spark.createDataFrame(rows, ATTRIBUTION_SCHEMA).coalesce(1), "silver.ad_attribution"
        )
    one = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    run_flows(spark, one, [_flow("gold.ad_performance_hourly")], out=io.StringIO())
    assertDataFrameEqual(
        store.read("gold.ad_performance_hourly"),
        [
            Row(1, _at(0), _at(60), 2, 2, 1.0),
            Row(2, _at(0), _at(60), 1, 0, 0.0),
            Row(1, _at(60), _at(120), 1, 1, 1.0),
        ],
    )


def test_purchase_alerts_stream_with_ttl_on_the_state(spark, settings, store):
    """Alerts from a stream of purchases across micro-batches, each purchase at most once;
    every element of the state carries its TTL expiry (processing time: batch time + ttl),
    read back with the state data source reader."""
    flow = _flow("gold.purchase_alerts")
    buy = {"event_type": "purchase", "amount": 2.0}
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 0, **buy), _event(1, 0.25, **buy), _event(2, 0, **buy), _event(1, 3)],
        [_event(1, 0.5, **buy), _event(2, 5, **buy)],
        [_event(1, 0.75, **buy)],
    )
    alerts = store.read("gold.purchase_alerts").select(
        "user_id", "purchase_time", "purchases_in_minute", "amount_in_minute"
    )
    assertDataFrameEqual(alerts, [Row(1, _at(0.5), 3, 6.0), Row(1, _at(0.75), 4, 8.0)])
    state = (
        spark.read.format("statestore")
        .option("path", str(settings.checkpoint_path("gold", "purchase_alerts")))
        .option("stateVarName", "recent")
        .load()
    )
    ttl_ms = 6 * 3600 * 1000  # gold.state_ttl
    rows = state.select(
        "key.user_id", "list_element.value.event_id", "list_element.ttlExpirationMs"
    ).collect()
    assert (
        sorted((r.user_id, r.event_id is not None) for r in rows)
        == [(1, True)] * 4 + [(2, True)] * 2
    )
    # each expiry is the processing time of a micro-batch that ran (its offsets log's batch
    # timestamp) plus the TTL
    offsets = settings.checkpoint_path("gold", "purchase_alerts") / "offsets"
    batch_times = {
        json.loads(path.read_text().splitlines()[1])["batchTimestampMs"]
        for path in offsets.glob("[0-9]*")
    }
    assert {r.ttlExpirationMs - ttl_ms for r in rows} <= batch_times, (rows, batch_times)


def test_purchase_alerts_run_no_empty_micro_batch_in_continuous_mode(
    spark, settings, store, spark_conf
):
    """In continuous mode gold.purchase_alerts, whose ProcessingTime-mode processor would ask
    for a no-data micro-batch at every trigger, runs micro-batches only for new input and
    alerts as in available-now mode; the session's own setting is left as it was."""
    from lakehouse.runner.queries import NO_DATA_BATCHES, start_flow

    buy = {"event_type": "purchase", "amount": 2.0}
    store.create("silver.events", EVENTS_SCHEMA)

    def deliver(*rows):
        store.write(spark.createDataFrame(rows, EVENTS_SCHEMA).coalesce(1), "silver.events")

    deliver(_event(1, 0, **buy), _event(1, 0.25, **buy), _event(1, 0.5, **buy))
    continuous = settings.with_overrides(
        {"trigger.mode": "continuous", "trigger.gold_interval": "1 second"}
    )
    checkpoint = settings.checkpoint_path("gold", "purchase_alerts")
    before = spark.conf.get(NO_DATA_BATCHES, None)
    # every trigger that finds no new input is then in the query's progress (Spark's default
    # reports one every 10 s)
    with spark_conf("spark.sql.streaming.noDataProgressEventInterval", "0"):
        query = start_flow(spark, store, continuous, _flow("gold.purchase_alerts"))

    def committed(batch: int) -> None:
        """Until micro-batch ``batch`` is committed, then two more triggers that found no new
        input: a no-data micro-batch would begin (and be logged in offsets) at the first."""
        deadline = time.monotonic() + 120
        while not (checkpoint / "commits" / str(batch)).exists():
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"micro-batch {batch} not committed in 2 min"
            query.awaitTermination(0.1)
        while True:
            progress = query.recentProgress
            mine = [
                i for i, p in enumerate(progress) if p["batchId"] == batch and p["numInputRows"]
            ]
            if mine and len(progress) - 1 - mine[-1] >= 2:
                return
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"no two idle triggers after batch {batch}"
            query.awaitTermination(0.1)

    try:
        assert spark.conf.get(NO_DATA_BATCHES, None) == before
        committed(0)
        deliver(_event(1, 0.75, **buy))
        committed(1)
    finally:
        query.stop()
    assert sorted(int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")) == [0, 1]
    alerts = store.read("gold.purchase_alerts").select(
        "user_id", "purchase_time", "purchases_in_minute", "amount_in_minute"
    )
    assertDataFrameEqual(alerts, [Row(1, _at(0.5), 3, 6.0), Row(1, _at(0.75), 4, 8.0)])


def test_activity_spans_come_out_per_event_type_once_the_user_is_idle_30_minutes(
    spark, settings, store
):
    """u1: page views at 10:00 and 10:20, a search at 10:05 (a later batch); u2: events 29
    minutes apart, one span; u3: events at 10:00, 10:30 and 11:01 in one batch, two spans (a
    gap of exactly 30 minutes stays in one, 31 minutes split them, whatever the batches). All
    come out when the watermark passes their last event plus 30 minutes (u9's event at
    12:00); u1's event at 10:10 arriving after that is late and dropped; u9's span is still
    open."""
    _deliver(
        spark,
        store,
        settings,
        _flow("gold.user_activity_spans"),
        [_event(1, 0), _event(2, 0), _event(3, 0), _event(3, 61)],
        [_event(1, 5, event_type="search"), _event(1, 20), _event(2, 29), _event(3, 30)],
        [_event(9, 120)],
        [_event(1, 10)],
    )
    assertDataFrameEqual(
        store.read("gold.user_activity_spans"),
        [
            Row(1, "page_view", _at(0), _at(20), 2),
            Row(1, "search", _at(5), _at(5), 1),
            Row(2, "page_view", _at(0), _at(29), 2),
            Row(3, "page_view", _at(0), _at(30), 2),
            Row(3, "page_view", _at(61), _at(61), 1),
        ],
    )


def test_an_endless_query_is_stopped_only_once_every_available_row_is_read():
    """The runner stops a ProcessingTime-mode query (gold.purchase_alerts) in available-now
    mode after a micro-batch that read no rows and left no data behind: not after the no-data
    batch a restarted query may run first, nor after a batch that read an empty file."""
    from lakehouse.runner.stopping import caught_up

    def progress(rows, start, end, latest, batch=7):
        offset = '{{"version": {}, "snapshot": false, "index": 0}}'.format
        return {
            "batchId": batch,
            "numInputRows": rows,
            "sources": [
                {"startOffset": offset(start), "endOffset": offset(end), "latestOffset": latest}
            ],
        }

    assert not caught_up(None)  # no batch yet
    assert not caught_up(progress(0, 4, 4, '{"version": 9, "snapshot": false, "index": 0}'))
    assert not caught_up(progress(0, 4, 5, '{"version": 9, "snapshot": false, "index": 0}'))
    assert not caught_up(progress(12, 4, 9, '{"version": 9, "snapshot": false, "index": 0}'))
    assert caught_up(progress(0, 9, 9, '{"version": 9, "snapshot": false, "index": 0}'))
    # delta-spark's source reports no latest offset (as the string "null"): a no-data batch
    # shows it caught up, but not the first one of the run (a restarted query's)
    assert not caught_up(progress(0, 4, 4, "null", batch=7), first_batch=7)
    assert not caught_up(progress(0, 4, 5, "null", batch=8), first_batch=7)
    assert caught_up(progress(0, 5, 5, "null", batch=8), first_batch=7)
    assert caught_up(progress(0, 9, 9, None, batch=8), first_batch=7)


def test_revenue_by_country_comes_out_per_closed_hour_with_unknown_countries_and_late_rows_dropped(
    spark, settings, store
):
    """Watermark 10 minutes. Hour 10: US 3 events (purchases of 20.0 and 5.5), DE a purchase
    without an amount, an event without a country. It comes out once an event at 11:15 moves
    the watermark past 11:00; a US purchase of 100.0 at 10:20 arriving after that is late and
    dropped. Hour 11 (DE, 1 event) once an event at 12:30 passes 12:00; hour 12 stays open."""
    flow = _flow("gold.revenue_by_country_hourly")
    buy = partial(_event, event_type="purchase")
    _deliver(
        spark,
        store,
        settings,
        flow,
        [_event(1, 0), buy(1, 10, amount=20.0), buy(2, 30, country="DE")],
        [_event(3, 40, country=None), buy(1, 50, amount=5.5)],
    )
    assert store.read("gold.revenue_by_country_hourly").count() == 0  # hour 10 is open
    (first,) = _deliver(spark, store, settings, flow, [_event(2, 75, country="DE")])
    hour = dt.timedelta(hours=1)
    ten = [
        Row(
            country="DE",
            hour_start=_at(0),
            hour_end=_at(0) + hour,
            events=1,
            purchases=1,
            revenue=0.0,
        ),
        Row(
            country="US",
            hour_start=_at(0),
            hour_end=_at(0) + hour,
            events=3,
            purchases=2,
            revenue=25.5,
        ),
        Row(
            country="unknown",
            hour_start=_at(0),
            hour_end=_at(0) + hour,
            events=1,
            purchases=0,
            revenue=0.0,
        ),
    ]
    assertDataFrameEqual(store.read("gold.revenue_by_country_hourly"), ten)
    (second,) = _deliver(spark, store, settings, flow, [buy(1, 20, amount=100.0), _event(1, 150)])
    assert (first.late_rows, second.late_rows) == (0, 1)
    eleven = Row(
        country="DE",
        hour_start=_at(60),
        hour_end=_at(60) + hour,
        events=1,
        purchases=0,
        revenue=0.0,
    )
    assertDataFrameEqual(store.read("gold.revenue_by_country_hourly"), [*ten, eleven])
