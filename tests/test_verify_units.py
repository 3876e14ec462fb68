"""lakehouse.proof.verify's pieces without Spark: the reference parse of landing lines (one case per
generator corruption) and the comparison that reports missing, unexpected and differing rows."""

from __future__ import annotations

import io
import json
from collections import Counter

import pandas as pd

from lakehouse.proof.verify import (
    _file_lines,
    all_equal_line,
    compare,
    parse_line,
    print_checks,
    row_books,
    run_verify,
)
from lakehouse.runner.monitoring import Drops

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
    found = pd.DataFrame({"k": [1, 2, 3, 4, 5], "v": [1.0 + 1e-12, 2.5, 3.0, 4.0, 5.0]})
    check = compare("t", expected, found, ["k", "v"], ["k"])
    assert (check.expected, check.found) == (5, 5)
    assert check.missing == [(4, 4.0)]  # a second copy of key 4
    assert check.unexpected == [(5, 5.0)]
    assert check.differing == [((2, 2.0), (2, 2.5))]
    assert not check.ok
    assert compare("t", expected, expected.iloc[::-1], ["k", "v"], ["k"]).ok


def test_a_table_empty_on_both_sides_is_reported_empty_not_ok():
    """An empty table equals an empty reference and proves nothing: verify says so in its
    line and its last line, which names it (the tests' proof then fails on it)."""
    full = compare("t.full", pd.DataFrame({"k": [1]}), pd.DataFrame({"k": [1]}), ["k"], ["k"])
    empty = compare("t.empty", pd.DataFrame({"k": []}), pd.DataFrame(), ["k"], ["k"])
    assert (full.status, empty.status) == ("ok", "empty")
    assert empty.ok and empty.same  # nothing differs: verify still exits 0
    out = io.StringIO()
    print_checks([full, empty], out)
    assert [line.split()[:7] for line in out.getvalue().splitlines()[1:3]] == [
        ["t.full", "1", "1", "0", "0", "0", "ok"],
        ["t.empty", "0", "0", "0", "0", "0", "empty"],
    ]
    assert all_equal_line([full, empty]) == (
        "verify: all 2 tables equal the reference; 1 of them empty on both sides, nothing "
        "compared: t.empty"
    )
    assert all_equal_line([full]) == "verify: all 1 tables equal the reference"


def test_landing_lines_end_and_are_too_long_as_hadoop_reads_them():
    """The reference's own line splitting: lines end at \\r\\n, \\r or \\n; a line whose
    bytes with its end reach the limit is unread (a byte-order mark starting the file not
    counted), and so is a last line without an end that reaches it."""
    data = b"\xef\xbb\xbfabc\r\nabcde\rab\n\nabcdef"
    lines = [(line.text, line.size, line.unread) for line in _file_lines("f", data, 6)]
    assert lines == [
        ("abc", 3, False),  # 3 bytes and 2 of line end: 5, under 6
        (None, 5, True),  # 5 and 1: 6
        ("ab", 2, False),
        ("", 0, False),
        (None, 6, True),
    ]


def test_the_reference_reads_landing_files_as_bronze_does_with_code_of_its_own(tmp_path):
    """verify's line splitting agrees with bronze's (lakehouse.landing) on random bytes cut
    into random blocks, and its decompression finds the same files unreadable: two codes, so a
    bug in either shows as a difference."""
    import bz2
    import gzip
    import random
    import zlib

    from lakehouse import landing
    from lakehouse.proof.verify import _decompressed, _Unreadable

    rng = random.Random(7)
    for _ in range(3000):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 30)))
        data = b"\xef\xbb\xbf" + data if rng.random() < 0.3 else data
        limit = rng.randint(1, 8)
        cuts = sorted(rng.sample(range(len(data) + 1), min(3, len(data) + 1)))
        blocks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        mine = {
            n: line.size for n, line in enumerate(_file_lines("f", data, limit), 1) if line.unread
        }
        theirs = {line.number: line.size for line in landing.long_lines(iter(blocks), limit)}
        assert mine == theirs, (data, limit)
    text = b"".join(b'{"event_id":"e%d"}\n' % i for i in range(200))
    files = {
        "whole.json.gz": gzip.compress(text),
        "cut.json.gz": gzip.compress(text)[:-8],
        "two.json.gz": gzip.compress(text) + gzip.compress(text),
        "junk.json.gz": gzip.compress(text) + b"junk",
        "whole.json.bz2": bz2.compress(text),
        "cut.json.bz2": bz2.compress(text)[:-20],
        "whole.json.deflate": zlib.compress(text),
        "cut.json.deflate": zlib.compress(text)[:-6],
        "plain.json": text,
    }
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        try:
            read = _decompressed(path)
        except _Unreadable:
            read = None
        try:
            expected = landing.read(path)
        except landing.UnreadableFile:
            expected = None
        assert read == expected, name
        assert (read is None) == name.startswith(("cut", "junk")), name


def test_row_books_find_each_bronze_row_one_place():
    """e1 kept, its resent copy (f2) a duplicate; e2 quarantined; e3 late; e4 in no place (its
    id was never kept, so not a duplicate); e5 both kept and late: in two places."""
    bronze = Counter({("e1", "f1"): 1, ("e1", "f2"): 1, ("e2", "f1"): 1, ("e3", "f1"): 1})
    bronze += Counter({("e4", "f2"): 1, ("e5", "f2"): 1})
    kept = Counter({("e1", "f1"): 1, ("e5", "f2"): 1})
    books = row_books(
        bronze,
        kept,
        Counter({("e2", "f1"): 1}),
        Counter({("e3", "f1"): 1, ("e5", "f2"): 1}),
        Drops(late=2, duplicates=1),
    )
    assert (books.bronze, books.kept, books.quarantined, books.late) == (6, 2, 1, 2)
    assert (books.duplicates, books.lost, books.twice) == (1, [("e4", "f2")], [("e5", "f2")])
    assert not books.ok
    assert books.lines() == [
        "6 bronze rows = 2 kept + 1 quarantined + 2 late (silver.late_events) + 1 duplicates of "
        "kept rows, row by row: DOES NOT BALANCE",
        "1 bronze row(s) in no place, e.g. ('e4', 'f2')",
        "1 bronze row(s) in two places, e.g. ('e5', 'f2')",
    ]
    # the same lake without e4 and e5's late row balances, but not against other counts
    bronze -= Counter({("e4", "f2"): 1})
    late = Counter({("e3", "f1"): 1})
    assert row_books(bronze, kept, Counter({("e2", "f1"): 1}), late, Drops(1, 1)).ok
    off = row_books(bronze, kept, Counter({("e2", "f1"): 1}), late, Drops(late=2, duplicates=1))
    assert not off.ok
    assert off.lines()[1] == (
        "the stateful operator counted 1 duplicates and 2 late rows: DIFFERENT"
    )


def test_the_session_tables_compare_revenue_as_verify_does(tmp_path):
    """The two session tables sum a session's revenue in different orders: 134.58 against
    134.58000000000001 is the same session (the demo's exact comparison called it different);
    a session in one table only, or a revenue off by a cent, is not."""
    from deltalake import write_deltalake

    from lakehouse.proof.verify import session_tables
    from lakehouse.settings import load_settings

    settings = load_settings("local", overrides={"root": str(tmp_path)})
    start = pd.Timestamp("2026-01-05 21:59:04.836", tz="UTC")
    sessions = pd.DataFrame(
        {
            "user_id": [3290, 7],
            "session_start": [start, start],
            "session_end": [start + pd.Timedelta(minutes=9)] * 2,
            "events": [12, 3],
            "purchases": [2, 0],
            "revenue": [134.58, 0.0],
        }
    )

    def check(custom: pd.DataFrame) -> int:
        write_deltalake(str(settings.table_path("gold.sessions")), sessions, mode="overwrite")
        path = str(settings.table_path("gold.sessions_custom"))
        write_deltalake(path, custom, mode="overwrite", schema_mode="overwrite")
        return session_tables(settings).apart

    ulp = sessions.assign(revenue=[134.58000000000001 + 1e-13, 0.0])
    assert ulp["revenue"][0] != 134.58
    assert check(ulp) == 0
    assert check(sessions.assign(revenue=[134.59, 0.0])) == 1
    assert check(sessions.iloc[:1]) == 1


STATS_COLUMNS = [
    "hour_start",
    "hour_end",
    "sessions",
    "mean_duration_s",
    "mean_events",
    "purchasing_sessions",
]


def _stats(mean_duration: float) -> pd.DataFrame:
    hour = pd.Timestamp("2026-01-05 21:00", tz="UTC")
    return pd.DataFrame(
        {
            "hour_start": [hour],
            "hour_end": [hour + pd.Timedelta(hours=1)],
            "sessions": [16],
            "mean_duration_s": [mean_duration],
            "mean_events": [13.0],
            "purchasing_sessions": [0],
        }
    )


def test_doubles_a_few_ulps_apart_across_a_rounding_boundary_are_equal():
    """The issue's false alarm on gold.session_stats_hourly: a mean merged batch by batch came
    out a few ulps from the reference's, on the other side of a 6-decimal rounding boundary
    (printed 1399.732937 and 1399.732938): verify must call them equal (1e-9 relative)."""
    below, above = 1399.7329374999997, 1399.7329375000002  # 2 ulps apart
    assert (round(below, 6), round(above, 6)) == (1399.732937, 1399.732938)
    check = compare(
        "gold.session_stats_hourly", _stats(below), _stats(above), STATS_COLUMNS, ["hour_start"]
    )
    assert (check.missing, check.unexpected, check.differing) == ([], [], [])
    assert check.same


def test_doubles_further_apart_than_the_tolerance_differ_and_other_types_are_exact():
    hour = pd.Timestamp("2026-01-05 21:00", tz="UTC")
    check = compare(
        "gold.session_stats_hourly",
        _stats(1399.732937),
        _stats(1399.732937 * (1 + 1e-8)),
        STATS_COLUMNS,
        ["hour_start"],
    )
    assert [(want[3], have[3]) for want, have in check.differing] == [
        (1399.732937, 1399.732937 * (1 + 1e-8))
    ]
    # an integer column is exact: 16 sessions against 17 differ whatever the doubles
    check = compare(
        "gold.session_stats_hourly",
        _stats(1399.7329374999997),
        _stats(1399.7329375000002).assign(sessions=[17]),
        STATS_COLUMNS,
        ["hour_start"],
    )
    assert len(check.differing) == 1 and check.differing[0][1][2] == 17
    # near 0, a sum that cancels is 0 within the absolute tolerance
    zero = pd.DataFrame({"hour_start": [hour], "v": [0.0]})
    cancelled = pd.DataFrame({"hour_start": [hour], "v": [0.1 + 0.2 - 0.3]})
    assert compare("t", zero, cancelled, ["hour_start", "v"], ["hour_start"]).same


def test_rows_sharing_a_key_pair_with_their_close_counterparts():
    """Two rows with one key: each pairs with the found row close to it, not the other one."""
    expected = pd.DataFrame({"k": [1, 1], "v": [1.0, 2.0]})
    found = pd.DataFrame({"k": [1, 1], "v": [2.0 + 4e-16, 1.0 + 2e-16]})
    assert compare("t", expected, found, ["k", "v"], ["k"]).same


def test_a_data_file_missing_from_a_table_is_one_line_naming_it(tmp_path):
    """A table whose log lists a data file deleted by hand: reading it (verify, report) fails in
    one line naming the file and the way out, not in pyarrow's traceback."""
    import pyarrow as pa
    import pytest
    from deltalake import write_deltalake

    from lakehouse.errors import LakehouseError
    from lakehouse.storage.deltafiles import read_arrow

    root = tmp_path / "tables" / "gold" / "t"
    write_deltalake(str(root), pa.table({"id": [1, 2]}))
    write_deltalake(str(root), pa.table({"id": [3]}), mode="append")
    assert sorted(read_arrow(root)["id"].to_pylist()) == [1, 2, 3]
    gone = sorted(root.glob("*.parquet"))[0]
    gone.unlink()
    with pytest.raises(LakehouseError) as error:
        read_arrow(root)
    assert str(error.value) == (
        f"the Delta table at {root} lists a data file that is not there: {gone}; restore the "
        "file (or the table) from a backup, or rebuild the table with lakehouse run "
        "--full-refresh"
    )


def test_verify_before_any_layer_ran_reports_the_missing_rows_not_a_traceback(tmp_path, settings):
    """A lake with landing files, one of them late by the manifest's books, where no layer has
    run: verify shows every table and fails on those that should hold rows (gold, computed
    over the silver tables found, expects none). It used to end in a KeyError, and then to
    pass silver.ad_attribution empty: with late data it compared only the pairs found."""
    landing = settings.root / "landing"
    lines = {
        "events": GOOD,
        "impressions": '{"impression_id":"i1","ad_id":1,"campaign_id":1,"user_id":7,'
        '"impression_time":"2026-01-05T09:10:00.000Z"}',
        "clicks": '{"click_id":"c1","impression_id":"i1","ad_id":1,"user_id":7,'
        '"click_time":"2026-01-05T09:20:00.000Z"}',
    }
    for source, line in lines.items():
        (landing / source).mkdir(parents=True)
        (landing / source / f"{source}-000000.json").write_text(line + "\n")
    books = {"sources": {"events": {"faults": {"late": 1}}}}  # late data: silver by its books
    (landing / "_manifest.json").write_text(json.dumps({"format": 1, "runs": [books]}))

    out = io.StringIO()
    assert run_verify(settings, out) == 1
    report = out.getvalue().splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in report[1:18]}
    assert rows["bronze.events"][:6] == ["1", "0", "1", "0", "0", "DIFFERENT"]
    # (the pair i1-c1 is missing and neither side is a late row kept: not the late data's)
    assert rows["silver.ad_attribution"][:6] == ["1", "0", "1", "0", "0", "DIFFERENT"]
    assert rows["gold.sessions"][:6] == ["0", "0", "0", "0", "0", "empty"]
    assert report[-1] == (
        "verify: 5 table(s) differ from the reference: bronze.events, bronze.impressions, "
        "bronze.clicks, silver.events, silver.ad_attribution"
    )
