"""The synthetic data generator: determinism, an exact manifest, realistic shape, clear errors."""

from __future__ import annotations

import collections
import datetime as dt
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from lakehouse.cli import main
from lakehouse.progress import Progress
from lakehouse.tools import generate as gen

SMALL = {
    "events": 5000,
    "hours": 8.0,
    "file_minutes": 2.0,
    "malformed_fraction": 0.03,
    "late_fraction": 0.01,
}
KNOWN = {
    "events": {
        "event_id",
        "user_id",
        "event_type",
        "page",
        "amount",
        "event_time",
        "device",
        "country",
    },
    "impressions": {"impression_id", "ad_id", "campaign_id", "user_id", "impression_time"},
    "clicks": {"click_id", "impression_id", "ad_id", "user_id", "click_time"},
}


def _params(**kwargs) -> gen.GenerateParams:
    return gen.GenerateParams(**{**SMALL, **kwargs}).validate()


@pytest.fixture(scope="module")
def small_lake(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gen")
    gen.generate(spark, root, _params(), progress=lambda label: Progress(label, io.StringIO()))
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / "landing").rglob("*"))
        if p.is_file()
    }


def _time(text) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else None


def _classify(source: str, line: str) -> str | None:
    """An independent reading of one line: the malformed kind it shows, or None."""
    if not line.strip():
        return "empty_line"
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return "malformed_json"
    if not isinstance(record, dict):
        return "malformed_json"
    if any(record.get(name) is None for name in gen.REQUIRED[source]):
        return "missing_field"
    for name in gen.TYPED_REQUIRED[source]:
        value = record[name]
        ok = _time(value) is not None if name.endswith("_time") else type(value) is int
        if not ok:
            return "wrong_type"
    if set(record) - KNOWN[source]:
        return "unknown_field"
    return None


def _lines(root: Path, source: str) -> list[tuple[str, str]]:
    out = []
    for path in sorted((root / "landing" / source).glob("*.json")):
        text = path.read_text()
        assert text.endswith("\n")
        out += [(path.name, line) for line in text[:-1].split("\n")]
    return out


def test_same_seed_gives_byte_identical_files(spark, small_lake, tmp_path):
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    gen.generate(spark, tmp_path / "again", _params(), progress=quiet)
    assert _files(tmp_path / "again") == _files(small_lake)
    gen.generate(spark, tmp_path / "other", _params(seed=7), progress=quiet)
    assert _files(tmp_path / "other") != _files(small_lake)

    def draws(root):  # the random draws themselves change with the seed, not only the ids
        return [
            (r["user_id"], r["event_type"], r.get("page"))
            for r in (
                json.loads(line)
                for _, line in _lines(root, "events")[:200]
                if _classify("events", line) is None
            )
        ]

    assert draws(tmp_path / "other") != draws(small_lake)


def test_manifest_counts_every_line_and_fault(small_lake):
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    assert [r["run"] for r in manifest["runs"]] == [0]
    assert manifest["runs"][0]["params"]["seed"] == 42
    for source in gen.SOURCES:
        lines = _lines(small_lake, source)
        totals = manifest["totals"][source]
        assert totals["lines"] == len(lines)
        assert totals["files"] == len({name for name, _ in lines})
        kinds = collections.Counter(_classify(source, line) for _, line in lines)
        for kind in gen.MALFORMED:
            assert kinds[kind] == totals["faults"][kind], (source, kind)
        # resent copies: a well-formed line seen before, byte for byte
        seen: set[str] = set()
        resent = 0
        for _, line in lines:
            if _classify(source, line) is None:
                resent += line in seen
                seen.add(line)
        assert resent == totals["faults"]["duplicate"]
        quarantined = sum(kinds[k] for k in gen.QUARANTINED)
        assert totals["bronze_rows"] == len(lines) - quarantined
        assert totals["quarantine"] == {k: kinds[k] for k in gen.QUARANTINED}
    events = manifest["totals"]["events"]["faults"]
    # rounded shares of 5,000 records: 3% malformed, 1% late, 5% disorder, 2% resent
    assert sum(events[k] for k in gen.MALFORMED) == 150
    assert (events["late"], events["disorder"], events["duplicate"]) == (50, 250, 100)


def test_invalid_records_break_a_rule_of_silver_and_leave_the_other_faults_as_they_were():
    """--invalid-fraction: that share of each source's records parses, but breaks a drop rule
    of silver's (by its rules file, read here as data); every other fault of the seed is the
    same as without it."""
    import tomllib
    from importlib import resources

    base = {"event_id": "e", "user_id": 7, "event_type": "page_view", "page": "/", "amount": None,
            "event_time": "2026-01-05T08:00:00.000Z", "device": "web", "country": "US"}  # fmt: skip
    ad = {"impression_id": "i", "ad_id": 1, "campaign_id": 2, "user_id": 7,
          "impression_time": "2026-01-05T08:00:00.000Z"}  # fmt: skip
    click = {"click_id": "c", "impression_id": "i", "ad_id": 1, "user_id": 7,
             "click_time": "2026-01-05T08:00:00.000Z"}  # fmt: skip
    for source, record in (("events", base), ("impressions", ad), ("clicks", click)):
        lines = [json.dumps({**record, next(iter(record)): f"x{i}"}) for i in range(400)]
        times = np.arange(400, dtype=np.int64) * 1000

        def faults(fraction, source=source, lines=lines, times=times):
            params = _params(invalid_fraction=fraction, late_fraction=0.02)
            return gen.inject_faults(source, times, lines, params, np.random.default_rng(3))

        plain, broken = faults(0.0), faults(0.05)
        invalid = broken.kinds == gen._KIND["invalid"]
        assert int(invalid.sum()) == 20, source
        assert (plain.arrival == broken.arrival).all()
        assert (plain.kinds[~invalid] == broken.kinds[~invalid]).all()
        assert (plain.lines[~invalid] == broken.lines[~invalid]).all()
        assert set(plain.kinds[invalid]) == {0}  # records that were clean
        rules = tomllib.loads(
            resources.files("silver").joinpath(f"rules/{source}.toml").read_text()
        )
        for line in broken.lines[invalid]:
            row = json.loads(line)
            assert any(_breaks(rule, row) for rule in rules["rule"]), (source, row)


def _breaks(rule: dict, row: dict) -> bool:
    """Whether ``row`` breaks a drop rule of the kinds break_rule uses."""
    if rule["action"] != "drop":
        return False
    if rule.get("when") == "event_type = 'purchase'" and row.get("event_type") != "purchase":
        return False
    value = row.get(rule["column"])
    if rule["check"] == "not_null":
        return value is None
    if rule["check"] == "in_set":
        return value not in rule["values"]
    if rule["check"] == "between" and "min" in rule:
        low = rule["min"]
        if isinstance(low, dt.datetime):
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) < low
        return value is not None and value < low
    return False


def test_a_manifest_of_runs_before_a_fault_kind_existed_adds_up(small_lake, tmp_path):
    """A lake generated before the invalid kind: its runs count none of it, and the next run's
    totals add up (it was a KeyError)."""
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    (old,) = manifest["runs"]
    for source in old["sources"].values():
        del source["faults"]["invalid"]
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / gen.MANIFEST).write_text(json.dumps(manifest))
    landing = gen.Landing(tmp_path)
    new = {**old, "run": 1, "sources": {s: {**t, "faults": {**t["faults"], "invalid": 2}}
                                        for s, t in old["sources"].items()}}  # fmt: skip
    landing.record_run(new)
    totals = json.loads((tmp_path / "landing" / gen.MANIFEST).read_text())["totals"]
    for source, tally in old["sources"].items():
        assert totals[source]["faults"]["invalid"] == 2
        assert totals[source]["lines"] == 2 * tally["lines"]


def test_late_events_arrive_after_the_watermark_and_disordered_ones_before(small_lake):
    """A line is behind the watermark when an earlier file already held an event more than the
    allowed lateness (10 minutes) newer than it: the injected late events are."""
    newest = None
    behind = 0
    for _name, group in _by_file(_lines(small_lake, "events")):
        times = [t for t in (_event_time(line) for line in group) if t is not None]
        if newest is not None:
            behind += sum(t < newest - dt.timedelta(minutes=10) for t in times)
        newest = max([*times, newest] if newest else times)
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    late = manifest["totals"]["events"]["faults"]["late"]
    # (a late line can find no newer event before it where traffic is thin: 1 of 50 here)
    assert 0.95 * late <= behind <= late


def _by_file(lines):
    groups = collections.defaultdict(list)
    for name, line in lines:
        groups[name].append(line)
    return sorted(groups.items())


def _event_time(line: str) -> dt.datetime | None:
    try:
        return _time(json.loads(line).get("event_time"))
    except (json.JSONDecodeError, AttributeError):
        return None


def _sessions(events: list[dict]) -> list[list[dict]]:
    """Each user's events split where 15 minutes or more pass: sessions as gold.sessions sees
    them, in time order."""
    by_user = collections.defaultdict(list)
    for e in sorted(events, key=lambda e: (e["user_id"], _time(e["event_time"]), e["event_id"])):
        by_user[e["user_id"]].append(e)
    out = []
    for rows in by_user.values():
        out.append([rows[0]])
        for a, b in zip(rows, rows[1:], strict=False):
            if (_time(b["event_time"]) - _time(a["event_time"])).total_seconds() > 900:
                out.append([])
            out[-1].append(b)
    return out


def test_data_looks_like_a_shops_traffic(small_lake):
    """Sessions of a realistic length, hours apart for one user, a few heavy users, a funnel
    in which a few percent of sessions buy, a daily curve, ads shown on page views."""
    events = [
        json.loads(line)
        for _, line in _lines(small_lake, "events")
        if _classify("events", line) in (None, "unknown_field")
    ]
    events = list({e["event_id"]: e for e in events}.values())  # resent copies once
    sessions = _sessions(events)
    sizes = sorted(len(s) for s in sessions)
    minutes = sorted(
        (_time(s[-1]["event_time"]) - _time(s[0]["event_time"])).total_seconds() / 60
        for s in sessions
    )
    assert 5 <= sizes[len(sizes) // 2] <= 20 and sizes[-1] <= gen.SESSION_EVENTS_MAX
    assert 2 <= minutes[len(minutes) // 2] <= 20 and minutes[-1] < 5 * 60
    # one user's sessions are hours apart: at most one slot of 3 hours each
    starts = collections.defaultdict(list)
    for s in sessions:
        starts[s[0]["user_id"]].append(_time(s[0]["event_time"]))
    apart = [
        (b - a).total_seconds() / 3600
        for times in starts.values()
        for a, b in zip(sorted(times), sorted(times)[1:], strict=False)
    ]
    # (slots 3 hours apart, a start up to 45 minutes into its slot; a corrupted line can split
    # a session in two, closer)
    assert sorted(apart)[len(apart) // 2] >= 2.5 and sum(h < 2.25 for h in apart) <= 0.03 * len(
        apart
    )
    # a few heavy users, many light ones
    per_user = sorted(collections.Counter(e["user_id"] for e in events).values())
    assert per_user[-1] > 5 * len(events) / len(per_user)
    assert sum(n <= per_user[len(per_user) // 2] for n in per_user) >= len(per_user) // 2
    # the funnel: views > searches > carts > purchases; a few percent of sessions buy, each
    # buying session puts something in the cart right before its first purchase
    types = collections.Counter(e["event_type"] for e in events)
    assert types["page_view"] > types["search"] > types["add_to_cart"] > types["purchase"] > 0
    buying = [s for s in sessions if any(e["event_type"] == "purchase" for e in s)]
    assert 0.01 <= len(buying) / len(sessions) <= 0.08
    carted = 0
    for s in buying:
        first = next(i for i, e in enumerate(s) if e["event_type"] == "purchase")
        carted += first > 0 and s[first - 1]["event_type"] == "add_to_cart"
    assert carted >= 0.9 * len(buying)  # (the cart's line may be one of the corrupted ones)
    assert all((e.get("amount") is not None) == (e["event_type"] == "purchase") for e in events)
    assert all(e["amount"] > 0 for e in events if e["event_type"] == "purchase")
    # popular and rare products
    products = collections.Counter(e["page"] for e in events if e["page"].startswith("/product/"))
    assert products.most_common(1)[0][1] > 20 * sorted(products.values())[len(products) // 2]
    # the daily curve: 08:00 to 16:00 UTC climbs from the morning
    hours = collections.Counter(_time(e["event_time"]).hour for e in events)
    assert hours[8] < 0.8 * max(hours[h] for h in range(12, 16))

    impressions = {
        r["impression_id"]: r
        for r in (
            json.loads(line)
            for _, line in _lines(small_lake, "impressions")
            if _classify("impressions", line) is None
        )
    }
    # an impression is an ad on a page view of its user, shown within 3 seconds (but for the
    # page views whose line was corrupted: their events are not in `events`)
    views = {
        (e["user_id"], _time(e["event_time"])) for e in events if e["event_type"] == "page_view"
    }
    unmatched = [
        r
        for r in impressions.values()
        if not any(
            (r["user_id"], _time(r["impression_time"]) - dt.timedelta(milliseconds=ms)) in views
            for ms in range(200, 3001)
        )
    ]
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    corrupted = sum(manifest["totals"]["events"]["faults"][k] for k in gen.QUARANTINED)
    assert len(unmatched) <= corrupted * gen.AD_SHARE * 2, len(unmatched)
    clicks = [
        json.loads(line)
        for _, line in _lines(small_lake, "clicks")
        if _classify("clicks", line) is None
    ]
    assert 0.01 < len({c["click_id"] for c in clicks}) / len(impressions) < 0.07
    delays = [
        (
            _time(c["click_time"]) - _time(impressions[c["impression_id"]]["impression_time"])
        ).total_seconds()
        for c in clicks
        if c["impression_id"] in impressions
    ]
    assert all(0 < d <= 7200 for d in delays)
    # about 5 % of clicks come too late to join (none of the 63 here, by the luck of the seed)
    assert sum(d > 3600 for d in delays) < 0.15 * len(delays)
    assert len({r["campaign_id"] for r in impressions.values()}) > 1


def test_the_manifest_profiles_the_traffic(small_lake):
    """The manifest (and generate's output) carries the events' profile: computed here again
    from the landing lines, it gives the same figures."""
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    shape = manifest["runs"][0]["profile"]
    events = [
        json.loads(line)
        for _, line in _lines(small_lake, "events")
        if _classify("events", line) in (None, "unknown_field")
    ]
    faults = manifest["totals"]["events"]["faults"]
    corrupted = sum(faults[k] for k in gen.QUARANTINED)
    clean = {e["event_id"] for e in events}
    assert shape["events"] == 5000 == len(clean) + corrupted
    sessions = _sessions(events)  # a corrupted line can split a session, or empty one
    assert len(sessions) - corrupted <= shape["sessions"] <= len(sessions) + corrupted
    assert shape["users"] >= len({e["user_id"] for e in events})
    assert gen.profile_lines(shape)[0] == (
        f"5,000 events by {shape['users']:,} users in {shape['sessions']:,} sessions "
        "(a user's events at most 15 minutes apart)"
    )


def test_second_run_adds_files_after_the_first(spark, tmp_path):
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    gen.generate(spark, tmp_path, _params(events=500), progress=quiet)
    first = sorted(p.name for p in (tmp_path / "landing" / "events").iterdir())
    gen.generate(spark, tmp_path, _params(events=500), progress=quiet)  # no --start: after run 0
    both = sorted(p.name for p in (tmp_path / "landing" / "events").iterdir())
    assert both[: len(first)] == first and len(both) > len(first)
    manifest = json.loads((tmp_path / "landing" / gen.MANIFEST).read_text())
    assert [r["run"] for r in manifest["runs"]] == [0, 1]
    assert all(r["complete"] for r in manifest["runs"])
    first_end = max(s["last_arrival"] for s in manifest["runs"][0]["sources"].values())
    second_start = manifest["runs"][1]["params"]["start"]
    assert second_start > first_end and second_start.endswith(":00:00Z")
    assert manifest["totals"]["events"]["lines"] == sum(
        r["sources"]["events"]["lines"] for r in manifest["runs"]
    )
    ids = [
        json.loads(line)["event_id"]
        for _, line in _lines(tmp_path, "events")
        if _classify("events", line) in (None, "unknown_field")
    ]
    runs = manifest["runs"]
    assert len(set(ids)) == sum(
        r["sources"]["events"]["lines"]
        - r["sources"]["events"]["faults"]["duplicate"]
        - sum(r["sources"]["events"]["faults"][k] for k in gen.QUARANTINED)
        for r in runs
    )  # the second run's events are new events, not repeats of the first


class _Clock:
    """Time that passes only while a caller waits: a follow run's ticks then come at exactly
    their intervals, whatever the machine's pace."""

    def __init__(self, start: dt.datetime):
        self.now = start.timestamp()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_follow_writes_small_files_with_current_times(spark, tmp_path):
    before = dt.datetime(2026, 1, 5, 8, 0, tzinfo=dt.UTC)
    after = before + dt.timedelta(seconds=1)  # two ticks of half a second
    out = io.StringIO()
    gen.follow(
        spark, tmp_path, _params(), rate=40, interval_s=0.5, ticks=2, out=out, clock=_Clock(before)
    )
    manifest = json.loads((tmp_path / "landing" / gen.MANIFEST).read_text())
    assert manifest["runs"][0]["mode"] == "follow"
    lines = _lines(tmp_path, "events")
    assert manifest["totals"]["events"]["lines"] == len(lines)
    ticks = re.findall(r"^tick \d+: (\d+) events up to (\S+)$", out.getvalue(), re.MULTILINE)
    assert [t for _, t in ticks] == ["2026-01-05T08:00:00.500000Z", "2026-01-05T08:00:01Z"]
    # records are built a minute ahead (2,400 events here): only those whose time came are
    # written, the rest of the chunk (clicks to come included) is dropped at the stop
    clean = {
        json.loads(line)["event_id"]: _event_time(line)
        for _, line in lines
        if _classify("events", line) is None
    }
    faults = manifest["totals"]["events"]["faults"]
    events = sum(int(n) for n, _ in ticks)
    assert events == len(clean) + sum(faults[k] for k in gen.MALFORMED)
    assert 0 < events < 40 * 1.0 + 40  # about the rate, over one second
    # each event has its own time: no session of ~20 events at one instant
    assert len(set(clean.values())) >= len(clean) - 10
    assert all(before - dt.timedelta(seconds=1) <= t <= after for t in clean.values())
    kept = {"impressions": 0, "clicks": 0}
    for source, field in (("impressions", "impression_time"), ("clicks", "click_time")):
        for _, line in _lines(tmp_path, source):
            if _classify(source, line) is None:
                assert _time(json.loads(line)[field]) <= after, (source, line)
                kept[source] += 1
    assert kept["impressions"] > 0, kept


@pytest.mark.slow  # 2 hours of warm-up built: about 20 s, and the default suite is at its 15 minutes
def test_a_live_stream_runs_at_its_rate_from_its_start(spark):
    # 28 % of a session's events come more than 15 minutes after its start: the sessions that
    # began up to 2 hours before the start send their later events in the first minutes (with
    # the old warm-up of 15 minutes, the stream began at 73 % of its rate)
    rate, start = 100, 1_800_000_000_000
    stream = gen.FollowStream(spark, _params(), rate=rate, run=0, start_ms=start, chunk_ms=60_000)
    stream.build(start + 600_000)
    event_ms, lines = stream.take("events", start + 600_000)
    assert event_ms.min() >= start and len(lines) == len(event_ms)
    first = event_ms[event_ms < start + 600_000]
    per_2_minutes = np.bincount((first - start) // 120_000, minlength=5).tolist()
    assert all(0.95 * rate * 120 <= n <= 1.05 * rate * 120 for n in per_2_minutes), per_2_minutes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--events", "-5"], "argument --events: must be 0 or more; got -5"),
        (["--late-fraction", "1"], "argument --late-fraction: must be in [0, 1); got 1"),
        (["--duplicate-fraction", "x"], "expected a number in [0, 1); got 'x'"),
        (["--start", "yesterday"], "--start must be an ISO-8601 time"),
        (["--disorder-fraction", "0.6", "--late-fraction", "0.5"], "must stay below 1"),
        (["--seed", "-1"], "--seed must be 0 or more; got -1"),
        (["--hours", "inf"], "--hours must be a finite number"),
        (["--file-minutes", "0.00001"], "--file-minutes must cover at least a second"),
    ],
)
def test_bad_arguments_get_one_line(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["generate", "--root", str(tmp_path), *args])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_unwritable_root_gets_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["generate", "--root", str(blocker / "lake")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lakehouse: error: cannot write landing files under ")
    assert err.count("\n") == 1


def test_progress_is_one_line_when_not_on_a_terminal():
    out = io.StringIO()
    bar = Progress("writing", out)
    for i in range(5):
        bar.update(i + 1, 5)
    bar.done("5 files")
    assert out.getvalue() == "writing: 5 files\n"
