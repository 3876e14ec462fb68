"""``lakehouse run --full-refresh``: a table rebuilt from its inputs on a new checkpoint, switched
in one commit; a switch cut short finished by the next run; a broken checkpoint mended."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import shutil

import pytest

from bronze.sources import table_schema
from lakehouse.checkpoints import CheckpointError, app_id
from lakehouse.cli import main
from lakehouse.ops.status import read_table
from lakehouse.progress import Progress
from lakehouse.runner import FlowFailed, layer_flows, run_flows, run_layers
from lakehouse.runner.refresh import downstream, flows_writing, refresh, with_downstream
from lakehouse.settings import load_settings
from lakehouse.storage import table_store
from lakehouse.storage.deltafiles import open_table
from lakehouse.storage.faults import FAILPOINT_ENV
from lakehouse.tools import generate as gen
from silver.events import SCHEMA as EVENTS_SCHEMA

# (in make test-slow: its rebuilds run every layer of a lake, three minutes together; the
# default suite stays within its budget)
pytestmark = pytest.mark.slow


def _rows(settings, table: str) -> list[tuple]:
    """A table's rows without its lineage and load-time columns, sorted, as text."""
    frame = read_table(settings, table)
    frame = frame[[c for c in frame.columns if not c.startswith("_")]]
    return sorted(tuple(str(v) for v in row) for row in frame.itertuples(index=False))


def _run(settings, capsys, *args) -> tuple[int, list[str]]:
    code = main(["run", *args, "--root", str(settings.root), "--profile", "test"])
    captured = capsys.readouterr()
    return code, captured.out.splitlines() + captured.err.splitlines()


@pytest.fixture(scope="module")
def _built_lake(spark, tmp_path_factory):
    """A lake through bronze, silver, gold.sessions and gold.sessions_custom, built once for
    the module; its root, and a copy of it as built."""
    place = tmp_path_factory.mktemp("refresh")
    settings = load_settings("test", overrides={"root": str(place / "lake")})
    params = gen.params_from_settings(
        settings, events=800, hours=2.0, users=30, seed=5, late_fraction=0.0
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
    run_flows(spark, settings, [_gold("gold.sessions"), _gold("gold.sessions_custom")])
    shutil.copytree(settings.root, place / "as-built")
    return settings, place / "as-built"


@pytest.fixture
def lake(spark, _built_lake):
    """The module's lake as built, for one test to change: the copy put back at the same root
    (a checkpoint holds its input files' absolute paths), and the session's cached Delta logs
    forgotten (they would hold the versions of the test before)."""
    settings, as_built = _built_lake
    shutil.rmtree(settings.root)
    shutil.copytree(as_built, settings.root)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    return settings


def _gold(name: str):
    return next(f for f in layer_flows("gold") if f.name == name)


def test_a_refreshed_table_is_what_it_was_and_a_broken_checkpoint_is_mended(spark, lake, capsys):
    settings = lake
    before = _rows(settings, "gold.sessions")
    assert len(before) == 47  # (the seed fixes it: not an empty comparison)
    checkpoint = settings.checkpoint_path("gold", "sessions")
    old_query = app_id(checkpoint)
    table = settings.table_path("gold.sessions")
    version = open_table(table).version()

    code, out = _run(settings, capsys, "--full-refresh", "gold.sessions")
    assert code == 0, out
    assert "  gold.sessions: switched to 47 rebuilt rows; it had 47" in out
    assert "  gold.sessions: its checkpoint is the rebuilt one; its next run goes on from it" in out
    assert not any(line.startswith("tables built from the rebuilt ones") for line in out)
    assert _rows(settings, "gold.sessions") == before
    assert app_id(checkpoint) != old_query  # a new checkpoint, in its place
    # the table switched in one commit: a reader saw the old rows until then
    assert open_table(table).version() == version + 1
    assert not any((settings.root / "refresh").iterdir())

    # a checkpoint whose offset log is broken: the flow fails; refreshed, it comes back and runs
    last = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    (checkpoint / "offsets" / str(last)).write_text("v1\nnot json\n")
    flow = next(f for f in layer_flows("gold") if f.name == "gold.sessions")
    with pytest.raises(
        CheckpointError,
        match=r"the checkpoint of gold.sessions is broken: .*"
        r"rebuild the flow's tables on a new checkpoint with `lakehouse run "
        r"--full-refresh <one of its tables>`",
    ):
        run_flows(spark, settings, [flow], out=io.StringIO())
    code, out = _run(settings, capsys, "--full-refresh", "gold.sessions")
    assert code == 0, out
    assert _rows(settings, "gold.sessions") == before
    run_flows(spark, settings, [flow], out=io.StringIO())
    assert _rows(settings, "gold.sessions") == before


def test_a_shared_table_keeps_the_other_flows_rows_and_downstream_is_named(spark, lake, capsys):
    """silver.events shares silver.quarantine and silver.late_events with
    silver.ad_attribution: a refresh of silver.quarantine rebuilds both flows, each replacing
    only its own rows there, and names the gold tables built from what they rebuilt."""
    settings = lake
    store = table_store(spark, settings)
    t = dt.datetime(2026, 1, 5, 9, 30, tzinfo=dt.UTC)
    bad_events = [  # an unknown event type (4 rows), quarantined by silver.events
        (f"x{i}", 1, "bogus", "/", None, t, "web", "US", None, "file:/x.json", t) for i in range(4)
    ]
    old = dt.datetime(1999, 1, 1, tzinfo=dt.UTC)
    bad_impressions = [(f"i{i}", 7, 2, 1, old, None, "file:/y.json", t) for i in range(3)]
    for name, rows in (("events", bad_events), ("impressions", bad_impressions)):
        store.write(spark.createDataFrame(rows, table_schema(name)), f"bronze.{name}")
    run_layers(spark, settings, ["silver"], out=io.StringIO())
    tables = ("silver.events", "silver.quarantine", "silver.ad_attribution")
    before = {t: _rows(settings, t) for t in tables}
    quarantined = read_table(settings, "silver.quarantine")["table"].value_counts().to_dict()
    assert quarantined == {"silver.events": 4, "silver.ad_attribution": 3}

    code, out = _run(settings, capsys, "--full-refresh", "silver.quarantine")
    assert code == 0, out
    # both silver flows write silver.quarantine: both are rebuilt, and their rows switched
    flows = "silver.ad_attribution, silver.events"
    assert (
        f"  the rows of {flows} in silver.quarantine: switched to 7 rebuilt rows; they were 7"
        in out
    )
    assert (
        f"  the rows of {flows} in silver.late_events: switched to 0 rebuilt rows; they were 0"
        in out
    )
    assert "  silver.events: switched to 796 rebuilt rows; it had 796" in out
    gold = [o.table for f in layer_flows("gold") for o in f.outputs]
    assert (
        "tables built from the rebuilt ones keep what they were built from (their flows skip "
        "the rewrite and go on with what comes after it); refresh them too for them to follow, "
        f"or give --with-downstream: {', '.join(sorted(gold))}"
    ) in out
    assert {t: _rows(settings, t) for t in tables} == before

    assert [f.name for f in flows_writing(["silver.late_events"])] == [
        "silver.ad_attribution",
        "silver.events",
    ]
    assert downstream(flows_writing(["gold.sessions"])) == []


def _refresh_cut_before_its_second_switch(spark, settings, capsys, monkeypatch):
    """A refresh of gold.sessions_custom killed (by a failpoint) after switching its first
    table: the two tables' rows before it, and the marker it left."""
    before = {t: _rows(settings, t) for t in ("gold.sessions_custom", "gold.session_stats_hourly")}
    monkeypatch.setenv(FAILPOINT_ENV, "before-switch:gold.session_stats_hourly")
    with pytest.raises(Exception, match="failpoint before-switch:gold.session_stats_hourly"):
        refresh(spark, settings, flows_writing(["gold.sessions_custom"]), out=io.StringIO())
    monkeypatch.delenv(FAILPOINT_ENV)
    capsys.readouterr()
    (marker,) = (settings.root / "refresh").glob("*/refresh.json")
    return before, marker


def test_a_switch_cut_short_is_finished_by_the_next_run(spark, lake, capsys, monkeypatch):
    """gold.sessions_custom writes two tables: killed after switching the first, the refresh
    leaves its staging and marker; the flow's next run finishes the switch before it starts,
    and goes on with new input from the rebuilt checkpoint."""
    settings = lake
    before, pending = _refresh_cut_before_its_second_switch(spark, settings, capsys, monkeypatch)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # (what the flow's start prints of the switch)
        run_flows(spark, settings, [_gold("gold.sessions_custom")], out=io.StringIO())
    assert "  gold.session_stats_hourly: switched to 3 rebuilt rows; it had 3" in out.getvalue()
    assert {t: _rows(settings, t) for t in before} == before
    assert not pending.exists()

    # its state goes on from the rebuilt checkpoint, which names its state schema files where
    # it was built (the refresh's staging folder, removed): it reads them where it is now
    latest = read_table(settings, "silver.events")["event_time"].max().to_pydatetime()
    new = [
        (f"n{i}", 1 + i, "page_view", "/", None, latest + dt.timedelta(minutes=i), "web", "US", "f")
        for i in range(5)
    ]
    store = table_store(spark, settings)
    store.write(spark.createDataFrame(new, EVENTS_SCHEMA), "silver.events")
    reports = run_flows(spark, settings, [_gold("gold.sessions_custom")], out=io.StringIO())
    assert [(r.flow, r.error, r.input_rows) for r in reports] == [
        ("gold.sessions_custom", None, len(new))
    ]


def test_a_damaged_marker_fails_every_run_with_one_line_and_its_way_out(
    spark, lake, capsys, monkeypatch
):
    """A marker left empty (a kill or a full disk while it was written) or corrupt: every
    run, of any layer, fails with one line naming the file and the way out; followed, the
    lake is what it was. The marker a refresh writes leaves no temporary file beside it."""
    settings = lake
    before, marker = _refresh_cut_before_its_second_switch(spark, settings, capsys, monkeypatch)
    base = marker.parent
    assert [p.name for p in base.iterdir() if p.is_file()] == ["refresh.json"]
    way_out = (
        f"so no flow can tell whether that refresh must still switch its tables: remove the "
        f"folder {base} (that refresh's staging copy), then run `lakehouse run --full-refresh "
        "gold.session_stats_hourly --full-refresh gold.sessions_custom` again"
    )
    for damage, reason in (
        ("", "empty"),
        ('{"id": "x", "flo', "Unterminated string starting at: line 1 column 13 (char 12)"),
        ("[]", "not the marker of a refresh"),
    ):
        marker.write_text(damage)
        for layer in ("bronze", "silver"):
            code, out = _run(settings, capsys, "--layer", layer)
            assert code == 2
            assert out == [
                f"lakehouse: error: the full refresh marker {marker} is unreadable ({reason}), "
                + way_out
            ]
    code, out = _run(settings, capsys, "--full-refresh", "gold.sessions")
    assert (code, len(out)) == (2, 1) and way_out in out[0]

    shutil.rmtree(base)
    code, out = _run(
        settings,
        capsys,
        "--full-refresh",
        "gold.session_stats_hourly",
        "--full-refresh",
        "gold.sessions_custom",
    )
    assert code == 0, out
    assert {t: _rows(settings, t) for t in before} == before
    code, out = _run(settings, capsys, "--layer", "gold")
    assert code == 0, out
    assert {t: _rows(settings, t) for t in before} == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--full-refresh", "gold.nope"], "no flow writes gold.nope: a full refresh rebuilds"),
        (["--full-refresh-all"], "--full-refresh-all rebuilds the tables of --layer: give it"),
        (
            ["--full-refresh", "gold.sessions", "--full-refresh-all", "--layer", "gold"],
            "give --full-refresh TABLE or --full-refresh-all, not both",
        ),
        ([], "give --layer (bronze, silver, gold or all), or --full-refresh TABLE"),
        (
            ["--full-refresh", "gold.sessions", "--trigger", "continuous"],
            "a full refresh runs once, in available-now mode",
        ),
        (
            ["--layer", "bronze", "--allow-shrink"],
            "lakehouse: error: --allow-shrink goes with --full-refresh or --full-refresh-all",
        ),
    ],
)
def test_a_refresh_asked_wrongly_gets_one_line(settings, capsys, args, message):
    code, out = _run(settings, capsys, *args)
    assert code == 2
    assert len(out) == 1 and message in out[0], out


def test_a_table_whose_columns_changed_is_rebuilt_with_its_new_schema(
    spark, store, settings, capsys
):
    """gold.user_activity_spans gained span_end: a lake written before has the old columns;
    the next run says to refresh, and the refresh rebuilds it with the new ones."""
    from gold.user_activity_spans import FLOW as SPANS
    from silver.events import SCHEMA as EVENTS

    t = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)

    def events(*minutes):
        return spark.createDataFrame(
            [(f"e{m}", 1, "page_view", "/", None, t + dt.timedelta(minutes=m), "web", "US", "f")
             for m in minutes],
            EVENTS,
        )  # fmt: skip

    store.create("silver.events", EVENTS)
    store.write(events(0, 5, 50, 100), "silver.events")
    run_flows(spark, settings, [SPANS], out=io.StringIO())
    expected = _rows(settings, "gold.user_activity_spans")
    assert len(expected) == 2  # the spans 10:00-10:05 and 10:50, closed by 10:100 - 10 min
    old = store.read("gold.user_activity_spans").drop("span_end")
    store.replace(old.localCheckpoint(), "gold.user_activity_spans")  # the table of before
    store.write(events(160), "silver.events")
    with pytest.raises(
        FlowFailed,
        match=r"unexpected column\(s\) span_end .*"
        r"rebuild the table with `lakehouse run --full-refresh <table>`",
    ):
        run_flows(spark, settings, [SPANS], out=io.StringIO())
    code, out = _run(settings, capsys, "--full-refresh", "gold.user_activity_spans")
    assert code == 0, out
    assert "span_end" in store.read("gold.user_activity_spans").columns
    assert len(_rows(settings, "gold.user_activity_spans")) == 3  # and 10:100 closed by 10:160


def test_a_refresh_that_would_shrink_a_table_is_refused_unless_allowed(spark, lake, capsys):
    """Two landing files pruned: a refresh of bronze.events would switch to fewer rows. It is
    refused with the rows before and after, nothing switched, unless --allow-shrink."""
    settings = lake
    before = _rows(settings, "bronze.events")
    events = read_table(settings, "bronze.events")
    quarantine = read_table(settings, "bronze.quarantine")
    mine = quarantine[quarantine["source"] == "events"]
    landing = settings.landing_path("events")
    files = sorted(p for p in landing.iterdir() if not p.name.startswith(("_", ".")))
    # a file with a quarantined line, and the first other one
    bad_file = next(p for p in files if (mine["_source_file"].str.endswith("/" + p.name)).any())
    pruned = [bad_file, next(p for p in files if p != bad_file)]
    names = {p.name for p in pruned}

    def gone(frame) -> int:
        return int(frame["_source_file"].map(lambda f: f.rsplit("/", 1)[-1] in names).sum())

    kept, dropped = len(events), gone(events)
    bad, bad_dropped = len(mine), gone(mine)
    assert dropped > 0 and bad_dropped > 0  # both tables shrink
    for path in pruned:
        path.unlink()

    code, out = _run(settings, capsys, "--full-refresh", "bronze.events")
    assert code == 2
    assert out[-1] == (
        "lakehouse: error: full refresh refused: it would shrink "
        f"bronze.events from {kept:,} rows to {kept - dropped:,}; the rows of bronze.events in "
        f"bronze.quarantine from {bad:,} rows to {bad - bad_dropped:,} (its inputs hold fewer "
        "rows than were loaded: files removed, records past retention?); nothing was switched, "
        "the tables are as they were; to switch to fewer rows anyway, run it again with "
        "--allow-shrink"
    )
    assert _rows(settings, "bronze.events") == before
    assert not any((settings.root / "refresh").iterdir())

    code, out = _run(settings, capsys, "--full-refresh", "bronze.events", "--allow-shrink")
    assert code == 0, out
    assert f"  bronze.events: switched to {kept - dropped:,} rebuilt rows; it had {kept:,}" in out
    assert len(_rows(settings, "bronze.events")) == kept - dropped


def test_downstream_flows_go_on_after_a_refresh(spark, lake, capsys):
    """After a full refresh of silver.events, the gold flows that read it skip its rewrite and
    go on (before, they failed on 'Detected a data update'). --with-downstream of a table no
    flow reads rebuilds it alone, without the advice to refresh what reads it."""
    settings = lake
    before = {t: _rows(settings, t) for t in ("gold.sessions", "gold.sessions_custom")}
    code, out = _run(settings, capsys, "--full-refresh", "silver.events")
    assert code == 0, out
    gold = [_gold("gold.sessions"), _gold("gold.sessions_custom")]
    reports = run_flows(spark, settings, gold, out=io.StringIO())
    assert [(r.flow, r.error, r.input_rows) for r in reports] == [
        ("gold.sessions", None, 0),
        ("gold.sessions_custom", None, 0),
    ]
    assert {t: _rows(settings, t) for t in before} == before

    # what --with-downstream rebuilds after silver.events: silver, then gold's readers
    readers = [f.name for f in layer_flows("gold") if f.name not in ("gold.ad_performance_hourly",)]
    silver_events = flows_writing(["silver.events"])
    assert [[f.name for f in group] for group in with_downstream(silver_events)] == [
        ["silver.events"],
        readers,
    ]
    # two layers: silver.ad_attribution, then the one gold flow that reads it, from the
    # rebuilt rows, to the same rows
    ads = ("silver.ad_attribution", "gold.ad_performance_hourly")
    run_flows(spark, settings, [_gold("gold.ad_performance_hourly")], out=io.StringIO())
    built = {t: _rows(settings, t) for t in ads}
    assert built["silver.ad_attribution"]
    args = ("--full-refresh", "silver.ad_attribution", "--with-downstream")
    code, out = _run(settings, capsys, *args)
    assert code == 0, out
    assert out[0] == (
        "full refresh with downstream: silver.ad_attribution; then gold.ad_performance_hourly"
    )
    for table in ads:
        rows = len(built[table])
        assert f"  {table}: switched to {rows:,} rebuilt rows; it had {rows:,}" in out, out
    assert not any(line.startswith("tables built from the rebuilt ones") for line in out)
    assert {t: _rows(settings, t) for t in ads} == built
    code, out = _run(settings, capsys, "--layer", "gold", "--with-downstream")
    assert code == 2
    assert out[-1] == (
        "lakehouse: error: --with-downstream goes with --full-refresh or --full-refresh-all"
    )


@pytest.mark.full  # (the downstream groups and the CLI's branch are in CI: the test above)
def test_with_downstream_rebuilds_the_readers_layer_by_layer_to_the_same_rows(spark, lake, capsys):
    """--with-downstream after a full refresh of silver.events rebuilds every gold flow that
    reads it too, layer by layer, to the same rows."""
    settings = lake
    before = {t: _rows(settings, t) for t in ("gold.sessions", "gold.sessions_custom")}
    code, out = _run(settings, capsys, "--full-refresh", "silver.events", "--with-downstream")
    assert code == 0, out
    readers = [f.name for f in layer_flows("gold") if f.name not in ("gold.ad_performance_hourly",)]
    assert out[0] == (f"full refresh with downstream: silver.events; then {', '.join(readers)}")
    assert "  gold.sessions: switched to 47 rebuilt rows; it had 47" in out
    assert not any(line.startswith("tables built from the rebuilt ones") for line in out)
    assert {t: _rows(settings, t) for t in before} == before
