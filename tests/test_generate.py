"""The synthetic data generator: determinism, an exact manifest, realistic shape, clear errors."""

from __future__ import annotations

import collections
import datetime as dt
import io
import json
import re
from pathlib import Path

import pytest

from lakehouse import generate as gen
from lakehouse.cli import main
from lakehouse.progress import Progress

SMALL = {
    "events": 3000,
    "hours": 1.0,
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
    # rounded shares of 3,000 records: 3% malformed, 1% late, 5% disorder, 2% resent
    assert sum(events[k] for k in gen.MALFORMED) == 90
    assert (events["late"], events["disorder"], events["duplicate"]) == (30, 150, 60)


def test_late_events_arrive_after_the_watermark_and_disordered_ones_before(small_lake):
    """A line is behind the watermark when an earlier file already held an event more than the
    allowed lateness (10 minutes) newer than it: exactly the injected late events are."""
    newest = None
    behind = 0
    for _name, group in _by_file(_lines(small_lake, "events")):
        times = [t for t in (_event_time(line) for line in group) if t is not None]
        if newest is not None:
            behind += sum(t < newest - dt.timedelta(minutes=10) for t in times)
        newest = max([*times, newest] if newest else times)
    manifest = json.loads((small_lake / "landing" / gen.MANIFEST).read_text())
    assert behind == manifest["totals"]["events"]["faults"]["late"]


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


def test_data_has_the_shape_the_gold_tables_need(small_lake):
    events = [
        json.loads(line)
        for _, line in _lines(small_lake, "events")
        if _classify("events", line) in (None, "unknown_field")
    ]
    by_user = collections.defaultdict(list)
    for e in events:
        by_user[e["user_id"]].append(_time(e["event_time"]))
    heaviest = max(len(v) for v in by_user.values())
    assert heaviest > 5 * len(events) / len(by_user)  # a few heavy users
    gaps = [
        (b - a).total_seconds()
        for ts in by_user.values()
        for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)
    ]
    assert any(g > 900 for g in gaps) and any(60 < g <= 900 for g in gaps)  # sessions exist
    types = collections.Counter(e["event_type"] for e in events)
    assert types["page_view"] > types["search"] > types["add_to_cart"] > types["purchase"] > 0
    assert all((e.get("amount") is not None) == (e["event_type"] == "purchase") for e in events)
    assert all(e["amount"] > 0 for e in events if e["event_type"] == "purchase")

    impressions = {
        r["impression_id"]: r
        for r in (
            json.loads(line)
            for _, line in _lines(small_lake, "impressions")
            if _classify("impressions", line) is None
        )
    }
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
    assert 0 < sum(d > 3600 for d in delays) < 0.15 * len(delays)  # a few too late to join
    assert len({r["campaign_id"] for r in impressions.values()}) > 1


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


def test_follow_writes_small_files_with_current_times(spark, tmp_path):
    before = dt.datetime.now(dt.UTC)
    out = io.StringIO()
    gen.follow(spark, tmp_path, _params(), rate=40, interval_s=0.5, ticks=2, out=out)
    after = dt.datetime.now(dt.UTC)
    manifest = json.loads((tmp_path / "landing" / gen.MANIFEST).read_text())
    assert manifest["runs"][0]["mode"] == "follow"
    lines = _lines(tmp_path, "events")
    assert manifest["totals"]["events"]["lines"] == len(lines)
    ticks = re.findall(r"^tick \d+: (\d+) events up to ", out.getvalue(), re.MULTILINE)
    assert len(ticks) == 2
    # records are built a minute ahead (2,400 events here): only those whose time came are
    # written, the rest of the chunk (clicks to come included) is dropped at the stop
    clean = {
        json.loads(line)["event_id"]: _event_time(line)
        for _, line in lines
        if _classify("events", line) is None
    }
    faults = manifest["totals"]["events"]["faults"]
    assert sum(map(int, ticks)) == len(clean) + sum(faults[k] for k in gen.MALFORMED)
    assert sum(map(int, ticks)) < 40 * (after - before).total_seconds() + 40
    # each event has its own time: no session of ~20 events at one instant
    assert len(set(clean.values())) >= len(clean) - 10
    assert all(before - dt.timedelta(seconds=1) <= t <= after for t in clean.values())
    for source, field in (("impressions", "impression_time"), ("clicks", "click_time")):
        for _, line in _lines(tmp_path, source):
            if _classify(source, line) is None:
                assert _time(json.loads(line)[field]) <= after, (source, line)


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
