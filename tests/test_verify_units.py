"""lakehouse.verify's pieces without Spark: the reference parse of landing lines (one case per
generator corruption) and the comparison that reports missing, unexpected and differing rows."""

from __future__ import annotations

import pandas as pd

from lakehouse.verify import compare, parse_line

GOOD = (
    '{"event_id":"e1","user_id":7,"event_type":"purchase","page":"/checkout",'
    '"amount":12.5,"event_time":"2026-01-05T09:17:47.899Z","device":"mobile","country":"IN"}'
)


def test_a_good_line_is_typed():
    row, reason = parse_line("events", GOOD)
    assert reason is None
    assert row == {
        "event_id": "e1",
        "user_id": 7,
        "event_type": "purchase",
        "page": "/checkout",
        "amount": 12.5,
        "event_time": pd.Timestamp("2026-01-05T09:17:47.899Z"),
        "device": "mobile",
        "country": "IN",
        "_rescued": False,
    }


def test_each_corruption_has_its_reason():
    cases = {
        "": "empty_line",
        "   ": "empty_line",
        GOOD[:40]: "malformed_json",
        "[1, 2]": "malformed_json",
        GOOD.replace('"event_id":"e1",', ""): "missing_field",
        GOOD.replace('"e1"', "null"): "missing_field",
        GOOD.replace('"user_id":7', '"user_id":"n/a"'): "wrong_type",
        GOOD.replace('"user_id":7', '"user_id":"12abc"'): "wrong_type",
        GOOD.replace("2026-01-05T09:17:47.899Z", "31/12/2025 10:00"): "wrong_type",
        GOOD.replace("2026-01-05T09:17:47.899Z", "2026-13-45T99:00:00Z"): "wrong_type",
    }
    for line, reason in cases.items():
        assert parse_line("events", line) == (None, reason), line


def test_unknown_fields_and_numbers_sent_as_text_are_kept():
    row, _ = parse_line("events", GOOD.replace("}", ',"coupon_code":"SAVE10"}'))
    assert row["_rescued"] is True
    row, _ = parse_line("events", GOOD.replace('"user_id":7', '"user_id":"7"'))
    assert (row["user_id"], row["_rescued"]) == (7, False)
    row, _ = parse_line("events", GOOD.replace('"amount":12.5', '"amount":"lots"'))
    assert (row["amount"], row["_rescued"]) == (None, True)  # not required: kept, rescued


def test_compare_reports_missing_unexpected_and_differing_rows():
    expected = pd.DataFrame({"k": [1, 2, 3, 4, 4], "v": [1.0, 2.0, 3.0, 4.0, 4.0]})
    found = pd.DataFrame({"k": [1, 2, 3, 4, 5], "v": [1.0 + 1e-9, 2.5, 3.0, 4.0, 5.0]})
    check = compare("t", expected, found, ["k", "v"], ["k"])
    assert (check.expected, check.found) == (5, 5)
    assert check.missing == [(4, 4.0)]  # a second copy of key 4
    assert check.unexpected == [(5, 5.0)]
    assert check.differing == [((2, 2.0), (2, 2.5))]
    assert not check.ok
    assert compare("t", expected, expected.iloc[::-1], ["k", "v"], ["k"]).ok
