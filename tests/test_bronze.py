"""Bronze: every landing line lands in exactly one of bronze.<source> or bronze.quarantine."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from bronze.sources import QUARANTINE_TABLE, SOURCES
from lakehouse.jars import spark_submit_args
from lakehouse.progress import Progress
from lakehouse.runner import FlowFailed, layer_flows, run_flows, run_layers
from lakehouse.settings import load_settings
from lakehouse.storage import table_store
from lakehouse.storage.deltafiles import latest_version
from lakehouse.storage.faults import FAILPOINT_ENV
from lakehouse.tools import generate as gen

REPO = Path(__file__).resolve().parents[1]
T0 = "2026-01-05T08:00:00.000Z"


def _generate(spark, settings, **kwargs) -> dict:
    params = gen.params_from_settings(
        settings,
        **{
            "events": 1500,
            "hours": 1.0,
            "file_minutes": 10.0,
            "malformed_fraction": 0.03,
            **kwargs,
        },
    )
    gen.generate(
        spark, settings.root, params, progress=lambda label: Progress(label, io.StringIO())
    )
    return json.loads((settings.landing_path() / gen.MANIFEST).read_text())


@pytest.fixture(scope="module")
def landing_600(spark, tmp_path_factory):
    """The landing files of 600 generated events, made once for the tests that start from them
    (each copies them into its own lake)."""
    settings = load_settings("test", overrides={"root": str(tmp_path_factory.mktemp("landing"))})
    _generate(spark, settings, events=600)
    return settings.landing_path()


def _copy_landing(landing: Path, settings) -> dict:
    """``landing`` into the test's lake (the files' times, which order them, kept); its
    manifest."""
    shutil.copytree(landing, settings.landing_path())
    return json.loads((settings.landing_path() / gen.MANIFEST).read_text())


def _bronze(spark, settings, max_files: int = 0, only_events: bool = False):
    """The bronze layer (``only_events``: its bronze.events flow alone, for a test whose
    landing has events only) with at most ``max_files`` files per micro-batch (0: all)."""
    settings = settings.with_overrides({"trigger.max_files_per_trigger": max_files})
    if only_events:
        flows = [f for f in layer_flows("bronze") if f.name == "bronze.events"]
        return run_flows(spark, settings, flows, out=io.StringIO())
    return run_layers(spark, settings, ["bronze"], out=io.StringIO())


def _assert_books_balance(store, manifest: dict) -> None:
    """bronze rows + quarantine rows = landing lines, per source and per reason, exactly."""
    quarantine = store.read(QUARANTINE_TABLE)
    for source in SOURCES:
        totals = manifest["totals"][source]
        assert store.read(f"bronze.{source}").count() == totals["bronze_rows"], source
        found = {
            r["reason"]: r["count"]
            for r in quarantine.where(F.col("source") == source).groupBy("reason").count().collect()
        }
        assert found == {k: v for k, v in totals["quarantine"].items() if v}, source
        assert totals["bronze_rows"] + sum(totals["quarantine"].values()) == totals["lines"]
    rescued = store.read("bronze.events").where(F.col("_rescued_data").isNotNull()).count()
    assert rescued == manifest["totals"]["events"]["faults"]["unknown_field"]


@pytest.fixture(scope="module")
def bronze_600(spark, landing_600, tmp_path_factory):
    """A lake of the 600 generated events, bronze run once on it, 3 files per micro-batch:
    (its settings, its manifest, the run's reports), read by the tests that check what one
    bronze run wrote."""
    settings = load_settings("test", overrides={"root": str(tmp_path_factory.mktemp("bronze"))})
    manifest = _copy_landing(landing_600, settings)
    return settings, manifest, _bronze(spark, settings, max_files=3)


def test_generated_lines_are_all_accounted_for(spark, bronze_600):
    settings, manifest, reports = bronze_600
    store = table_store(spark, settings)
    _assert_books_balance(store, manifest)
    lines = {r.flow: r.input_rows for r in reports}
    assert lines == {f"bronze.{s}": manifest["totals"][s]["lines"] for s in SOURCES}
    # (more than one micro-batch: files were admitted a few at a time)
    assert next(r for r in reports if r.flow == "bronze.events").batches > 1, reports
    files = {
        r["_source_file"].rsplit("/", 1)[1]
        for name in [*(f"bronze.{s}" for s in SOURCES), QUARANTINE_TABLE]
        for r in store.read(name).select("_source_file").distinct().collect()
    }
    landed = {p.name for s in SOURCES for p in settings.landing_path(s).glob("*.json")}
    assert landed and files == landed


def test_bronze_rows_equal_the_well_formed_landing_lines(spark, bronze_600):
    """Every kept line, typed: the rows of bronze.events are exactly the well-formed landing
    lines read independently with the json module (resent copies included)."""
    settings = bronze_600[0]
    store = table_store(spark, settings)
    expected = []
    for path in sorted(settings.landing_path("events").glob("*.json")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                time_ = dt.datetime.fromisoformat(record["event_time"].replace("Z", "+00:00"))
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
                continue
            if record.get("event_id") is None or type(record.get("user_id")) is not int:
                continue
            expected.append(
                Row(
                    event_id=record["event_id"],
                    user_id=record["user_id"],
                    event_type=record.get("event_type"),
                    page=record.get("page"),
                    amount=record.get("amount"),
                    event_time=time_.replace(tzinfo=None),
                    device=record.get("device"),
                    country=record.get("country"),
                    _source_file=path.name,
                )
            )
    got = store.read("bronze.events").select(
        *[c for c in expected[0].asDict() if c != "_source_file"],
        F.element_at(F.split("_source_file", "/"), -1).alias("_source_file"),
    )
    assertDataFrameEqual(got, expected)


def _write_landing(settings, source: str, name: str, lines: list[str]) -> None:
    folder = settings.landing_path(source)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(lines) + "\n")


def _event(event_id: str, **fields) -> dict:
    return {
        "event_id": event_id,
        "user_id": 1,
        "event_type": "page_view",
        "page": "/",
        "event_time": T0,
        **fields,
    }


def test_a_compressed_file_that_does_not_decompress_is_quarantined_whole(spark, settings, store):
    """Truncated, corrupted or mislabelled compressed landing files: each is one quarantine row
    naming the decoder's error (none of the lines Spark read before the damage reaches
    bronze), the other files are read, the flow goes on across runs, and verify's reference
    says the same. One file per micro-batch, over the source log's compaction (batch 9)."""
    import bz2
    import gzip
    import zlib

    from lakehouse.proof import verify

    def lines(prefix: str, n: int) -> bytes:
        return b"".join(json.dumps(_event(f"{prefix}{i}")).encode() + b"\n" for i in range(n))

    many = gzip.compress(lines("cut", 3000))  # Spark reads some of it before the cut
    first = {
        "events-000000.json": lines("a", 2),
        "events-000001.json.gz": many[: len(many) // 2],
        "events-000002.json.gz": b"not gzip at all\n",
        "events-000003.json.bz2": bz2.compress(lines("bz", 50))[:-20],
        "events-000004.json.deflate": zlib.compress(lines("d", 2)),
    }
    then = {f"events-{i:06d}.json": lines(f"f{i}-", 1) for i in range(5, 12)}
    then["events-000009.json.gz"] = gzip.compress(lines("z", 2))[:-8]  # no trailer: batch 9
    del then["events-000009.json"]
    folder = settings.landing_path("events")
    folder.mkdir(parents=True)
    for files in (first, then):  # the second run on the first one's checkpoint
        for name, data in sorted(files.items()):
            (folder / name).write_bytes(data)
            # (the source takes files in the order of their times: one a second, by name)
            stamp = 1_700_000_000 + int(name[7:13])
            os.utime(folder / name, (stamp, stamp))
        _bronze(spark, settings, max_files=1, only_events=True)

    kept = sorted(r.event_id for r in store.read("bronze.events").collect())
    assert kept == sorted(["a0", "a1", "d0", "d1", *(f"f{i}-0" for i in (5, 6, 7, 8, 10, 11))])
    found = store.read(QUARANTINE_TABLE).collect()
    assert sorted((r.source, r.raw, r.reason, Path(r._source_file).name) for r in found) == [
        ("events", None, "unreadable_file", name)
        for name in (
            "events-000001.json.gz",
            "events-000002.json.gz",
            "events-000003.json.bz2",
            "events-000009.json.gz",
        )
    ]
    details = {Path(r._source_file).name: r.detail for r in found}
    assert details["events-000002.json.gz"] == (
        "gz data that does not decompress to its end (BadGzipFile: Not a gzipped file "
        "(b'no')); 16 bytes, kept in the landing file"
    )
    assert details["events-000003.json.bz2"].startswith("bz2 data that does not decompress")
    # verify's reference from the same files: the same rows and the same quarantine
    rows, bad = verify.bronze_reference(settings, "events")
    assert sorted(rows["event_id"]) == kept
    assert sorted(zip(bad["raw"], bad["reason"], bad["_source_file"], strict=True)) == sorted(
        (None, "unreadable_file", Path(r._source_file).name) for r in found
    )


def test_a_line_too_long_to_read_is_quarantined_without_its_text(spark, settings, store):
    """bronze.max_record_bytes 400, bronze.max_line_bytes 1,000: a line over 400 bytes goes
    to quarantine whole; one whose bytes with its line end reach 1,000 is skipped by Spark's
    line reader (constant memory) and is a too_large row without its text, at the same
    boundary in verify's reference; plain and gzip files alike."""
    import gzip

    from lakehouse.proof import verify

    def line(event_id: str, size: int) -> bytes:
        short = json.dumps(_event(event_id, page="/")).encode()
        out = json.dumps(_event(event_id, page="/" + "p" * (size - len(short)))).encode()
        assert len(out) == size
        return out

    settings = settings.with_overrides(
        {"bronze.max_record_bytes": 400, "bronze.max_line_bytes": 1000}
    )
    plain = [line("ok1", 200), line("whole", 600), line("edge", 998), line("cut", 999)]
    plain += [line("huge", 5000), line("ok2", 300)]
    folder = settings.landing_path("events")
    folder.mkdir(parents=True)
    (folder / "events-000000.json").write_bytes(b"\n".join(plain) + b"\n")
    gz = gzip.compress(line("gzhuge", 3000) + b"\r\n" + line("ok3", 150))  # 200-odd bytes
    (folder / "events-000001.json.gz").write_bytes(gz)
    _bronze(spark, settings, only_events=True)

    kept = sorted(r.event_id for r in store.read("bronze.events").collect())
    assert kept == ["ok1", "ok2", "ok3"]
    found = sorted(
        (Path(r._source_file).name, r.raw is None, r.reason, r.detail)
        for r in store.read(QUARANTINE_TABLE).collect()
    )
    unread = "left there unread"
    assert found == [
        ("events-000000.json", False, "too_large", "600 bytes, over the limit of 400"),
        ("events-000000.json", False, "too_large", "998 bytes, over the limit of 400"),
        (
            "events-000000.json",
            True,
            "too_large",
            f"5,000 bytes, over the limit of 400; line 5 of the landing file, {unread}",
        ),
        (
            "events-000000.json",
            True,
            "too_large",
            f"999 bytes, over the limit of 400; line 4 of the landing file, {unread}",
        ),
        (
            "events-000001.json.gz",
            True,
            "too_large",
            f"3,000 bytes, over the limit of 400; line 1 of the landing file, {unread}",
        ),
    ]
    rows, bad = verify.bronze_reference(settings, "events")
    assert sorted(rows["event_id"]) == kept
    assert sorted(zip(bad["_source_file"], bad["raw"].isna(), bad["reason"], strict=True)) == [
        f[:3] for f in found
    ]


def test_each_malformed_kind_gives_a_quarantine_row(spark, settings, store):
    good = json.dumps(_event("e1"))
    lines = {
        "empty": "",
        "blank": "   ",
        "cut": good[:30],
        "array": "[1, 2, 3]",
        "no_id": json.dumps({k: v for k, v in _event("x").items() if k != "event_id"}),
        "null_user": json.dumps(_event("e5", user_id=None)),
        "text_user": json.dumps(_event("e6", user_id="abc")),
        "bad_time": json.dumps(_event("e7", event_time="not-a-time")),
        "float_user": json.dumps(_event("e8", user_id=3.7)),
        "tab": "\t",
        "trailing": json.dumps(_event("e9")) + " junk",
        "two_objects": json.dumps(_event("e10")) + json.dumps(_event("e11")),
        "stray_brace": json.dumps(_event("e13")) + "}",
        "comma_objects": json.dumps(_event("e14")) + ", " + json.dumps(_event("e15")),
        "single_quotes": json.dumps(_event("e16")).replace('"', "'"),
    }
    braces = json.dumps(_event("e12", page="/search?q=}{"))
    _write_landing(settings, "events", "events-000000.json", [good, *lines.values(), braces])
    _bronze(spark, settings, only_events=True)
    got = store.read(QUARANTINE_TABLE).select("source", "raw", "reason", "detail")
    expected = [
        ("events", lines["empty"], "empty_line", "blank line"),
        ("events", lines["blank"], "empty_line", "blank line"),
        ("events", lines["cut"], "malformed_json", "not a JSON object"),
        ("events", lines["array"], "malformed_json", "not a JSON object"),
        ("events", lines["no_id"], "missing_field", "missing: event_id"),
        ("events", lines["null_user"], "missing_field", "missing: user_id"),
        ("events", lines["text_user"], "wrong_type", "wrong type: user_id"),
        ("events", lines["bad_time"], "wrong_type", "wrong type: event_time"),
        ("events", lines["float_user"], "wrong_type", "wrong type: user_id"),
        ("events", lines["tab"], "empty_line", "blank line"),
        ("events", lines["trailing"], "malformed_json", "text after the JSON object"),
        ("events", lines["two_objects"], "malformed_json", "text after the JSON object"),
        ("events", lines["stray_brace"], "malformed_json", "text after the JSON object"),
        ("events", lines["comma_objects"], "malformed_json", "text after the JSON object"),
        ("events", lines["single_quotes"], "malformed_json", "not a JSON object"),
    ]
    assertDataFrameEqual(got, [Row(source=a, raw=b, reason=c, detail=d) for a, b, c, d in expected])
    assertDataFrameEqual(
        store.read("bronze.events").select("event_id", "user_id", "_rescued_data"),
        [
            Row(event_id="e1", user_id=1, _rescued_data=None),
            Row(event_id="e12", user_id=1, _rescued_data=None),
        ],
    )


def test_unknown_and_mistyped_fields_are_rescued_and_the_row_kept(spark, settings, store):
    lines = [
        json.dumps(_event("e1", coupon_code="SAVE10")),
        json.dumps(_event("e2", event_type="purchase", amount="12.x")),
        json.dumps(_event("e3", experiment={"id": 7, "arm": "B"}, amount=4.5)),
        '{"event_id":"e4","user_id":4,"event_time":"2026-01-05T08:00:00Z","user_id":5}',
    ]
    _write_landing(settings, "events", "events-000000.json", lines)
    _bronze(spark, settings, only_events=True)
    got = store.read("bronze.events").select("event_id", "user_id", "amount", "_rescued_data")
    assertDataFrameEqual(
        got,
        [
            Row(event_id="e1", user_id=1, amount=None, _rescued_data='{"coupon_code":"SAVE10"}'),
            Row(event_id="e2", user_id=1, amount=None, _rescued_data='{"amount":"12.x"}'),
            Row(
                event_id="e3",
                user_id=1,
                amount=4.5,
                _rescued_data='{"experiment":"{\\"id\\":7,\\"arm\\":\\"B\\"}"}',
            ),
        ],
    )
    row = store.read("bronze.events").where("event_id = 'e1'").first()
    assert row["_source_file"].endswith("/landing/events/events-000000.json")
    assert row["_ingested_at"] is not None
    # a repeated key is ambiguous (Spark's parser would use the first value, Python's the last)
    assertDataFrameEqual(
        store.read(QUARANTINE_TABLE).select("raw", "reason", "detail"),
        [Row(raw=lines[3], reason="repeated_key", detail="repeated key: user_id")],
    )


def test_odd_input_has_the_same_outcome_in_bronze_silver_and_verify(spark, settings, store):
    """Each kind of odd line the data contract names (docs/architecture.md, "Odd input"),
    through bronze and silver, and through verify's reference: both give the same rows."""
    import base64
    import gzip

    from lakehouse.proof import verify

    def line(event_id: str, **fields) -> bytes:
        return json.dumps(_event(event_id, **fields)).encode()

    settings = settings.with_overrides({"bronze.max_record_bytes": 400})
    not_utf8 = line("u8", page="/caf\u00e9").replace(b"\\u00e9", b"\xe9\xff")
    huge = line("huge", page="/" + "p" * 400)
    plain = [
        b'{"event_id":"rk","user_id":1,"event_time":"2026-01-05T08:00:00Z","user_id":2}',
        line("big", user_id=99999999999999999999999),
        line("y1", event_time="0001-01-01T00:00:00Z"),
        line("y9999", event_time="9999-12-31T23:59:59Z"),
        not_utf8,
        huge,
        b'{"event_id":"inf","user_id":1,"event_type":"purchase","amount":1e400,'
        b'"event_time":"2026-01-05T08:00:00Z"}',
        line("ok"),
    ]
    folder = settings.landing_path("events")
    folder.mkdir(parents=True)
    (folder / "events-000000.json").write_bytes(b"\n".join(plain) + b"\n")
    (folder / "events-000001.json").write_bytes(b"\xef\xbb\xbf" + line("bom") + b"\n")
    (folder / "events-000002.json.gz").write_bytes(gzip.compress(line("gz") + b"\n"))
    # (the flows of events alone, a layer after the other: the landing has no ads)
    for layer in ("bronze", "silver"):
        flows = [f for f in layer_flows(layer) if f.name == f"{layer}.events"]
        run_flows(spark, settings, flows, out=io.StringIO())

    # (as text: PySpark cannot collect a time in year 1 to a Python datetime)
    kept = store.read("bronze.events").select(
        "event_id", "user_id", "amount", F.col("event_time").cast("string").alias("time")
    )
    t0 = "2026-01-05 08:00:00"
    assertDataFrameEqual(
        kept,
        [
            Row(event_id="y1", user_id=1, amount=None, time="0001-01-01 00:00:00"),
            Row(event_id="y9999", user_id=1, amount=None, time="9999-12-31 23:59:59"),
            Row(event_id="inf", user_id=1, amount=None, time=t0),
            Row(event_id="ok", user_id=1, amount=None, time=t0),
            Row(event_id="bom", user_id=1, amount=None, time=t0),
            Row(event_id="gz", user_id=1, amount=None, time=t0),
        ],
    )
    rescued = store.read("bronze.events").where("event_id = 'inf'").first()["_rescued_data"]
    assert rescued == '{"amount":"\\"Infinity\\""}'
    quarantined = [
        Row(
            raw=plain[0].decode(),
            reason="repeated_key",
            detail="repeated key: user_id",
        ),
        Row(raw=plain[1].decode(), reason="wrong_type", detail="wrong type: user_id"),
        Row(
            raw=not_utf8.decode("utf-8", "replace"),
            reason="invalid_utf8",
            detail="not UTF-8; its bytes in base64: " + base64.b64encode(not_utf8).decode(),
        ),
        Row(
            raw=huge.decode(),
            reason="too_large",
            detail=f"{len(huge)} bytes, over the limit of 400",
        ),
    ]
    assert 400 < len(huge) < 1000
    assertDataFrameEqual(
        store.read(QUARANTINE_TABLE).select("raw", "reason", "detail"), quarantined
    )
    # silver: the times no event has go to quarantine, by name, not to "late"
    assertDataFrameEqual(
        store.read("silver.quarantine").select(
            F.get_json_object("record", "$.event_id").alias("event_id"), "rules"
        ),
        [
            Row(event_id="y1", rules=["event_time_not_before_2000"]),
            Row(event_id="y9999", rules=["event_time_not_in_future"]),
            Row(event_id="inf", rules=["purchase_has_amount"]),
        ],
    )
    assert sorted(r.event_id for r in store.read("silver.events").collect()) == ["bom", "gz", "ok"]

    # verify's reference, from the same files: the same rows
    rows, bad = verify.bronze_reference(settings, "events")
    assert list(rows[["event_id", "user_id", "_rescued"]].itertuples(index=False, name=None)) == [
        ("y1", 1, False),
        ("y9999", 1, False),
        ("inf", 1, True),
        ("ok", 1, False),
        ("bom", 1, False),
        ("gz", 1, False),
    ]
    assert [str(t.tz_localize(None)) for t in rows["event_time"]] == [
        "0001-01-01 00:00:00",
        "9999-12-31 23:59:59",
        *[t0] * 4,
    ]
    assert [(r.raw, r.reason) for r in bad.itertuples()] == [(q.raw, q.reason) for q in quarantined]


def test_rerun_adds_only_the_new_lines(spark, settings, store, landing_600):
    """A second run with nothing new reads and commits nothing; one after new landing files
    reads those alone. The first starts where a job was killed while Spark wrote a flow's
    first offset log entry: only Hadoop's temporary file is in ``offsets/``, which Spark would
    take for a new query's checkpoint and refuse as not empty; the runner removes such
    leftovers before it starts the flow."""
    first = _copy_landing(landing_600, settings)
    offsets = settings.checkpoint_path("bronze", "events") / "offsets"
    offsets.mkdir(parents=True)
    leftovers = [offsets / ".0.85b50abc-8924-455c-87c8-f9794542f665.tmp"]
    leftovers.append(offsets / f".{leftovers[0].name}.crc")
    for path in leftovers:
        path.write_text("")
    _bronze(spark, settings)
    assert not any(path.exists() for path in leftovers)
    _assert_books_balance(store, first)
    versions = {s: latest_version(store.path(f"bronze.{s}")) for s in SOURCES}
    again = _bronze(spark, settings)
    assert [r.input_rows for r in again] == [0, 0, 0]  # nothing new: nothing read or committed
    assert {s: latest_version(store.path(f"bronze.{s}")) for s in SOURCES} == versions

    second = _generate(spark, settings, events=600, start="2026-01-05T10:00:00Z")
    reports = _bronze(spark, settings)
    _assert_books_balance(store, second)
    new_lines = {s: second["runs"][1]["sources"][s]["lines"] for s in SOURCES}
    assert {r.flow: r.input_rows for r in reports} == {
        f"bronze.{s}": n for s, n in new_lines.items()
    }


@pytest.mark.parametrize(
    "point",
    [
        "after-write:bronze.events",  # bronze.events has the batch, the quarantine does not
        "before-commit:bronze.events",  # nothing committed yet
        # (the quarantine's commit cut, after bronze.events': the state after-write leaves, at
        # the same failpoint as the one above)
        pytest.param("before-commit:bronze.quarantine", marks=pytest.mark.full),
    ],
)
def test_crash_inside_a_micro_batch_then_rerun_writes_each_row_once(
    spark, settings, store, monkeypatch, point, landing_600
):
    """The job dies inside a micro-batch; the rerun replays it: a table that has the batch
    skips it (its app transaction is recorded), the others get it, and the books balance."""
    manifest = _copy_landing(landing_600, settings)
    monkeypatch.setenv(FAILPOINT_ENV, point)
    with pytest.raises(FlowFailed, match=f"flow bronze.events failed: .*failpoint {point}"):
        _bronze(spark, settings, max_files=2)
    events_written = store.read("bronze.events").count()
    assert (events_written > 0) == (point != "before-commit:bronze.events")
    assert store.read(QUARANTINE_TABLE).where("source = 'events'").count() == 0
    monkeypatch.delenv(FAILPOINT_ENV)
    _bronze(spark, settings, max_files=2)
    _assert_books_balance(store, manifest)


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ("bronze", "landing folder {root}/landing/events does not exist; check --root"),
        # (the same shim for every layer: in CI, test_dist submits gold's, packed)
        # the first silver flow by module name: silver.ad_attribution
        pytest.param(
            "silver",
            "input table bronze.impressions does not exist at {root}/tables/bronze/impressions",
            marks=pytest.mark.full,
        ),
        pytest.param(
            "gold",
            "input table silver.ad_attribution does not exist at "
            "{root}/tables/silver/ad_attribution",
            marks=pytest.mark.full,
        ),
    ],
)
def test_spark_submit_job_runs_the_layer(settings, tmp_path, layer, message):
    """The shims under spark-submit, with a one-line error and exit code 2 on a missing input."""
    submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(
        [
            str(submit),
            *spark_submit_args(settings),
            str(REPO / "jobs" / f"{layer}.py"),
            "--root",
            str(tmp_path / "nowhere"),
            "--profile",
            "test",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # spark-submit hands the Python driver's stderr to its own stdout
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-2000:]
    assert f"lakehouse: error: {message.format(root=tmp_path / 'nowhere')}" in output
    # the driver starts with the project's log4j2 file, not Spark's INFO default
    assert [line for line in output.splitlines() if " INFO " in line] == []


def test_run_a_layer_before_its_input_exists_gets_one_line(tmp_path, capsys):
    from lakehouse.cli import main

    args = ["run", "--layer", "gold", "--root", str(tmp_path), "--profile", "test"]
    assert main(args) == 2
    table = tmp_path / "tables" / "silver" / "ad_attribution"
    assert capsys.readouterr().err == (
        f"lakehouse: error: input table silver.ad_attribution does not exist at {table}; "
        "run the layer that writes it first\n"
    )
