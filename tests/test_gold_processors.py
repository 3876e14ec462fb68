"""The gold stateful processors unit-tested with TwsTester: no stream, exact rows.

TwsTester does not advance the watermark by itself: each test sets it, as Spark would at the
end of a micro-batch.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

# the class a query pickles: its handlers come from gold.sessions_custom at its first call
from gold.processors import SessionProcessor
from gold.sessions_custom import pack_frame, state_columns

PROJECT = Path(__file__).resolve().parents[1]

T = pd.Timestamp("2026-01-05 10:00")
MINUTE = 60_000
GAP = 15 * MINUTE


def _ms(minute: float) -> int:
    return int((T + pd.Timedelta(minutes=minute)).value // 1_000_000)


def _events(*rows, users=None):
    """(minute, event_type, page, amount) tuples as the processor's input: one packed row
    (all of user 7 unless ``users`` says whose each row is)."""
    return pack_frame(
        pd.DataFrame(
            {
                "user_id": users or [7] * len(rows),
                "event_time": [T + pd.Timedelta(minutes=m) for m, *_ in rows],
                "event_type": [r[1] for r in rows],
                "page": [r[2] for r in rows],
                "amount": [r[3] if len(r) > 3 else None for r in rows],
            }
        )
    )


def _tester(max_pages=50, **kwargs):
    # a packed row has no event time: Spark filters none of them as late, and neither does
    # the tester (the processor drops late events itself)
    return TwsTester(
        SessionProcessor(GAP, max_pages),
        timeMode="EventTime",
        eventTimeExtractor=lambda row: np.iinfo(np.int64).max,
        **kwargs,
    )


def _timers(tester, key=7):
    tester.handle.setGroupingKey(key)
    return list(tester.handle.listTimers())


def _session(start, end, events, purchases, revenue, landing, exit_, pages, counts, user=7):
    return {
        "user_id": user,
        "session_start": pd.Timestamp(T + pd.Timedelta(minutes=start), tz="UTC"),
        "session_end": pd.Timestamp(T + pd.Timedelta(minutes=end), tz="UTC"),
        "events": events,
        "purchases": purchases,
        "revenue": revenue,
        "landing_page": landing,
        "exit_page": exit_,
        "pages": pages,
        "event_counts": counts,
    }


def _pages(tester, key=7):
    """The ListState of page runs, decoded: [(users, times, pages)] per element."""
    return [tuple(state_columns(run[0]).values()) for run in tester.peekListState("pages", key)]


def _open(tester, column, key=7):
    """One column of the open sessions in the ValueState."""
    value = tester.peekValueState("session", key)
    return None if value is None or value[0] is None else state_columns(value[0])[column]


def _rows(frame):
    return frame.to_dict("records")


def test_the_processors_spark_unpickles_on_the_driver_import_no_numpy_pandas_or_flow():
    """At every query start Spark's driver unpickles the processor in a Python process of its
    own, only to run ``init``: the module of the processors' classes imports none of what
    their handlers need (numpy, pandas, pyarrow) nor the flows' modules."""
    heavy = ("numpy", "pandas", "pyarrow", "gold.sessions_custom", "gold.purchase_alerts")
    code = f"import sys, gold.processors; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT
    )
    assert found.stdout.strip() == "[]"


def test_a_session_across_batches_closes_when_the_watermark_reaches_its_end():
    tester = _tester()
    out = tester.testInPandas(7, _events((0, "page_view", "/"), (4, "search", "/search")))
    assert out.empty  # nothing comes out before the watermark passes the end
    assert _timers(tester) == [_ms(4) + GAP]
    out = tester.testInPandas(
        7, _events((10, "add_to_cart", "/product/3"), (12, "purchase", "/checkout", 19.5))
    )
    assert out.empty
    assert _timers(tester) == [_ms(12) + GAP]  # the one timer moved, not one per row
    assert _pages(tester) == [  # one run of visits per micro-batch
        ([7, 7], [_ms(0), _ms(4)], ["/", "/search"]),
        ([7, 7], [_ms(10), _ms(12)], ["/product/3", "/checkout"]),
    ]
    assert tester.setWatermark(_ms(26)).empty  # 10:26 < end 10:27
    assert _rows(tester.setWatermark(_ms(27))) == [
        _session(
            0,
            27,
            4,
            1,
            19.5,
            "/",
            "/checkout",
            ["/", "/search", "/product/3", "/checkout"],
            {"page_view": 1, "search": 1, "add_to_cart": 1, "purchase": 1},
        )
    ]
    # closed: only the watermark of the last call stays, for the late rows of the next one
    assert tester.peekValueState("session", 7) == (None, None, _ms(27))
    assert _pages(tester) == []
    assert tester.peekMapState("counts", 7) == {}
    assert _timers(tester) == []


def test_a_gap_of_exactly_15_minutes_stays_in_one_session_and_16_does_not():
    tester = _tester()
    tester.testInPandas(
        7, _events((0, "page_view", "/a"), (15, "page_view", "/b"), (31, "page_view", "/c"))
    )
    assert (_open(tester, "start"), _open(tester, "last")) == (
        [_ms(0), _ms(31)],
        [_ms(15), _ms(31)],
    )
    assert _timers(tester) == [_ms(15) + GAP]  # the earliest open end only
    first = tester.setWatermark(_ms(30))
    assert _rows(first) == [_session(0, 30, 2, 0, 0.0, "/a", "/b", ["/a", "/b"], {"page_view": 2})]
    assert _timers(tester) == [_ms(31) + GAP]  # the next open session's end
    assert _pages(tester) == [([7], [_ms(31)], ["/c"])]
    counts = tester.peekMapState("counts", 7)
    assert {k: np.frombuffer(v[0], dtype=np.int64).tolist() for k, v in counts.items()} == {
        ("page_view",): [1]
    }
    assert _rows(tester.setWatermark(_ms(46))) == [
        _session(31, 46, 1, 0, 0.0, "/c", "/c", ["/c"], {"page_view": 1})
    ]


def test_an_out_of_order_event_joins_two_open_sessions():
    """Two sessions of one user in one batch stay open; an older event arriving next, still
    above the watermark, falls between them and makes them one."""
    tester = _tester()
    tester.testInPandas(7, _events((30, "search", "/s"), (0, "page_view", "/a")))
    assert _open(tester, "start") == [_ms(0), _ms(30)]
    tester.setWatermark(_ms(3))
    tester.testInPandas(7, _events((15, "page_view", "/b")))
    assert _open(tester, "start") == [_ms(0)]
    assert _timers(tester) == [_ms(30) + GAP]
    assert tester.testInPandas(7, _events((4, "page_view", "/late"))).empty
    assert _rows(tester.setWatermark(_ms(50))) == [
        _session(
            0,
            45,
            4,
            0,
            0.0,
            "/a",
            "/s",
            ["/a", "/late", "/b", "/s"],
            {"page_view": 3, "search": 1},
        )
    ]


def test_an_event_behind_the_watermark_of_the_batch_before_is_dropped():
    """Spark's rule for late rows: at or behind the watermark of the micro-batch before. The
    watermark moves to 10:10 after the first batch: in the second batch an event at 10:09 is
    still on time (the batch before ran with no watermark); in the third it is late."""
    tester = _tester()
    tester.testInPandas(7, _events((20, "page_view", "/a")))
    tester.setWatermark(_ms(10))
    tester.testInPandas(7, _events((9, "page_view", "/b")))  # 10:09 > watermark before: none
    tester.testInPandas(7, _events((10, "page_view", "/late")))  # 10:10 <= watermark 10:10
    assert _rows(tester.setWatermark(_ms(35))) == [
        _session(9, 35, 2, 0, 0.0, "/b", "/a", ["/b", "/a"], {"page_view": 2})
    ]


def test_pages_are_bounded_and_the_exit_page_is_the_last_even_beyond_the_bound():
    tester = _tester(max_pages=2)
    tester.testInPandas(
        7, _events((3, "page_view", "/c"), (1, "page_view", "/b"), (0, "page_view", "/a"))
    )
    tester.testInPandas(7, _events((2, "purchase", "/pay", 5.0)))
    assert _rows(tester.setWatermark(_ms(18))) == [
        _session(
            0,
            18,
            4,
            1,
            5.0,
            "/a",
            "/c",
            ["/a", "/b"],
            {"page_view": 3, "purchase": 1},
        )
    ]


def test_a_full_list_still_takes_an_older_out_of_order_page_and_skips_newer_ones():
    tester = _tester(max_pages=2)
    tester.testInPandas(7, _events((0, "page_view", "/a"), (5, "page_view", "/c")))
    tester.testInPandas(7, _events((9, "page_view", "/d"), (3, "page_view", "/b")))
    # /d is past the listed pages of a full list: not kept; /b is older: kept
    assert _pages(tester) == [
        ([7, 7], [_ms(0), _ms(5)], ["/a", "/c"]),
        ([7], [_ms(3)], ["/b"]),
    ]
    assert _rows(tester.setWatermark(_ms(24))) == [
        _session(0, 24, 4, 0, 0.0, "/a", "/d", ["/a", "/b"], {"page_view": 4})
    ]


def test_initial_state_seeds_open_sessions_that_new_events_extend():
    seed = pd.DataFrame(
        {
            "user_id": [7],
            "session_start": [T],
            "last_event_time": [T + pd.Timedelta(minutes=5)],
            "events": [2],
            "purchases": [1],
            "revenue": [10.0],
            "landing_page": ["/home"],
            "exit_page": ["/pay"],
            "pages": [["/home", "/pay"]],
            "event_counts": [[("page_view", 1), ("purchase", 1)]],
        }
    )
    tester = _tester(initialStatePandas=[(7, seed)])
    assert _timers(tester) == [_ms(5) + GAP]
    tester.testInPandas(7, _events((12, "search", "/find")))
    assert _rows(tester.setWatermark(_ms(27))) == [
        _session(
            0,
            27,
            3,
            1,
            10.0,
            "/home",
            "/find",
            ["/home", "/pay", "/find"],
            {"page_view": 1, "search": 1, "purchase": 1},
        )
    ]


@pytest.mark.parametrize("minutes", [[0, 1, 2], [0, 20, 40]])
def test_one_timer_per_user_whatever_the_rows(minutes):
    tester = _tester()
    for m in minutes:
        tester.testInPandas(7, _events((m, "page_view", "/")))
    assert _timers(tester) == [
        _ms(minutes[0] if minutes[1] - minutes[0] > 15 else minutes[-1]) + GAP
    ]


def test_session_end_is_a_utc_timestamp():
    tester = _tester()
    tester.testInPandas(7, _events((0, "page_view", "/")))
    out = tester.setWatermark(_ms(15))
    assert out["session_end"].iloc[0].to_pydatetime() == dt.datetime(
        2026, 1, 5, 10, 15, tzinfo=dt.UTC
    )


def test_users_of_one_bucket_keep_their_own_sessions():
    """The state key is a bucket of users: interleaved events of users 3 and 8 in bucket 7
    make sessions per user, one timer for the bucket at the earliest end, and each user's
    pages and counts stay apart."""
    tester = _tester()
    tester.testInPandas(
        7,
        _events(
            (0, "page_view", "/3a"),
            (1, "search", "/8a"),
            (10, "page_view", "/3b"),
            (20, "purchase", "/8b", 4.0),
            users=[3, 8, 3, 8],
        ),
    )
    # user 8: 1 -> 20 is 19 minutes: two sessions; user 3: one session 0..10
    assert _timers(tester) == [_ms(1) + GAP]
    assert _rows(tester.setWatermark(_ms(25))) == [
        _session(0, 25, 2, 0, 0.0, "/3a", "/3b", ["/3a", "/3b"], {"page_view": 2}, user=3),
        _session(1, 16, 1, 0, 0.0, "/8a", "/8a", ["/8a"], {"search": 1}, user=8),
    ]
    assert _pages(tester) == [([8], [_ms(20)], ["/8b"])]
    tester.testInPandas(7, _events((30, "page_view", "/3c"), users=[3]))
    assert _timers(tester) == [_ms(20) + GAP]
    assert _rows(tester.setWatermark(_ms(46))) == [
        _session(30, 45, 1, 0, 0.0, "/3c", "/3c", ["/3c"], {"page_view": 1}, user=3),
        _session(20, 35, 1, 1, 4.0, "/8b", "/8b", ["/8b"], {"purchase": 1}, user=8),
    ]


def _purchases(*rows):
    """(event_id, minute, amount) as purchase rows of user 7."""
    return pd.DataFrame(
        {
            "user_id": [7] * len(rows),
            "event_id": [r[0] for r in rows],
            "event_time": [T + pd.Timedelta(minutes=r[1]) for r in rows],
            "amount": [r[2] for r in rows],
        }
    )


def _alerts_tester():
    from gold.purchase_alerts import PurchaseAlertProcessor

    return TwsTester(PurchaseAlertProcessor(3_600_000, 10 * MINUTE), timeMode="ProcessingTime")


def _alert(event_id, minute, count, amount):
    return {
        "user_id": 7,
        "event_id": event_id,
        "purchase_time": pd.Timestamp(T + pd.Timedelta(minutes=minute), tz="UTC"),
        "purchases_in_minute": count,
        "amount_in_minute": amount,
    }


def test_the_third_purchase_within_a_minute_alerts_and_each_purchase_alerts_once():
    tester = _alerts_tester()
    assert tester.testInPandas(7, _purchases(("p1", 0, 1.0), ("p2", 0.5, 2.0))).empty
    # p3 is 50 s after p2 but 80 s after p1: two in its minute, no alert yet
    assert tester.testInPandas(7, _purchases(("p3", 1.33, 4.0))).empty
    assert _rows(tester.testInPandas(7, _purchases(("p4", 1.4, 8.0), ("p2", 0.5, 2.0)))) == [
        _alert("p4", 1.4, 3, 14.0)  # p2, p3, p4; p2 again is a resent copy: ignored
    ]
    assert tester.testInPandas(7, _purchases(("p4", 1.4, 8.0))).empty  # alerted once


def test_a_late_purchase_makes_the_later_ones_of_its_minute_alert():
    tester = _alerts_tester()
    assert tester.testInPandas(7, _purchases(("a", 0, 1.0), ("c", 0.9, 3.0))).empty
    assert _rows(tester.testInPandas(7, _purchases(("b", 0.5, 2.0)))) == [
        _alert("c", 0.9, 3, 6.0)  # b arrived last but falls between: c is the 3rd in its minute
    ]
    state = tester.peekListState("recent", 7)
    assert [(e, alerted) for _, e, _, alerted in state] == [("a", False), ("b", False), ("c", True)]


def test_purchases_that_cannot_matter_any_more_leave_the_state():
    tester = _alerts_tester()
    tester.testInPandas(7, _purchases(("old", 0, 1.0)))
    tester.testInPandas(7, _purchases(("new", 12, 1.0)))  # 12 min > lateness 10 + 1 minute
    assert [e for _, e, _, _ in tester.peekListState("recent", 7)] == ["new"]


def test_the_spans_of_a_bucket_of_users_merge_across_calls():
    """gold.user_activity_spans keeps one bucket's open spans, many users' at once: a call's
    rows become spans per user (a gap of more than 30 minutes starts another), and the spans
    of two calls merge per user when at most 30 minutes apart; per event type, first and last
    event and count."""
    from gold.user_activity_spans import merge, new_spans

    idle = 30 * MINUTE

    def rows(*events):
        return pd.DataFrame(
            {
                "user_id": [u for u, _, _ in events],
                "event_type": [t for _, _, t in events],
                "event_time": [T + pd.Timedelta(minutes=m) for _, m, _ in events],
            }
        )

    first = new_spans(rows((1, 0, "page_view"), (2, 0, "search"), (1, 5, "page_view")), idle)
    second = new_spans(
        rows((1, 35, "search"), (2, 31, "search"), (2, 90, "page_view"), (3, 1, "search")), idle
    )
    spans = merge(pd.concat([first, second], ignore_index=True), idle)
    found = sorted(
        (r.user, r.span_first, r.span_last, r.event_type, r.first, r.last, r.events)
        for r in spans.itertuples()
    )
    assert found == [
        (1, _ms(0), _ms(35), "page_view", _ms(0), _ms(5), 2),  # 5 to 35: 30 minutes, one span
        (1, _ms(0), _ms(35), "search", _ms(35), _ms(35), 1),
        (2, _ms(0), _ms(0), "search", _ms(0), _ms(0), 1),  # 31 minutes: two spans
        (2, _ms(31), _ms(31), "search", _ms(31), _ms(31), 1),
        (2, _ms(90), _ms(90), "page_view", _ms(90), _ms(90), 1),
        (3, _ms(1), _ms(1), "search", _ms(1), _ms(1), 1),
    ]
