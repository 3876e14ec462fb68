"""Correct whatever the micro-batch sizes (docs/architecture.md 8, invariant 2): on a dataset with no
late line, every admission per layer (everything at once, one file, a few files per micro-batch,
for bronze, silver and gold), with gold stopped in the middle and restarted where it has more
than one micro-batch to run, ends with
``lakehouse verify`` reporting every table equal and no row dropped by a watermark in silver or
gold. Before the writers kept their files in event-time order (lakehouse.storage.timeorder), a
reader admitting a few files of a micro-batch that spanned hours met the latest hour first, and
its watermark then dropped the earlier ones.

The lakes are built as a tree: one bronze lake per bronze admission, copied into one silver lake
per silver admission, each copied for every gold admission. The lake ends with a closing
delivery hours later, so that every gold table has rows to compare (verify's proof is void on an
empty one). CI runs 3 combinations (marker ``slow``, :data:`IN_CI`), in which each layer meets
all three admissions, twice a layer admitting everything and the next a part of it (the case
the event-time order was written for); tests/test_gold_batch.py reads everything at once. The
other 24 run in ``make test-all`` (marker ``full``), everything at once among them.

A writer commits a micro-batch of an event-time table in one file (lakehouse.storage.timeorder),
so a layer after one that admitted everything at once finds one file per table, and gold is
stopped only when no layer admitted everything: otherwise it runs one micro-batch per flow,
which ends before a stop lands, and a second run finds nothing left.
"""

from __future__ import annotations

import io
import itertools
import shutil
from pathlib import Path

import pytest
from verify_helpers import generate_closed, verify_all_equal

from lakehouse import checkpoints
from lakehouse.proof.verify import _drops, _gold_flows
from lakehouse.runner import StopRequest, layer_flows, run_flows, run_layers
from lakehouse.settings import Settings, load_settings

ADMISSIONS = {"all": 0, "one": 1, "few": 2}
ROWS_PER_FILE = 300  # a table written by delta-spark: several files per micro-batch here
# gold micro-batches committed (over all its flows) before the stop; a gold admitting every
# file reads it in one micro-batch per flow and is not stopped (it ends before a stop lands)
STOP_AFTER = 3


IN_CI = {("all", "one", "few"), ("one", "few", "one"), ("few", "all", "few")}

COMBINATIONS = [
    pytest.param(
        b,
        s,
        g,
        marks=[pytest.mark.slow if (b, s, g) in IN_CI else pytest.mark.full],
        id=f"bronze_{b}-silver_{s}-gold_{g}",
    )
    for b, s, g in itertools.product(ADMISSIONS, repeat=3)
]


class _StopAfter(StopRequest):
    """Asks the flows to stop, as a SIGTERM would, once the gold checkpoints under ``root``
    hold ``batches`` committed micro-batches."""

    def __init__(self, settings: Settings, batches: int):
        super().__init__()
        self.settings = settings
        self.batches = batches

    @property
    def requested(self) -> bool:
        if self.signals:
            return True
        folder = self.settings.root / "checkpoints" / "gold"
        done = sum(len(checkpoints.committed_batches(cp)) for cp in folder.glob("*") if cp.is_dir())
        if done >= self.batches:
            self.signals = 1
        return self.signals > 0


@pytest.fixture(scope="module")
def lakes(spark, tmp_path_factory):
    """``lake(b, s)``: the silver lake of that branch of the tree (built once)."""
    base = tmp_path_factory.mktemp("order")
    built: dict[tuple, Path] = {}
    template = load_settings("test")

    def settings_for(root: Path, admission: str) -> Settings:
        return template.with_overrides(
            {
                "root": str(root),
                "write.rows_per_file": ROWS_PER_FILE,
                "trigger.max_files_per_trigger": ADMISSIONS[admission],
            }
        )

    def landing() -> Path:
        if "landing" not in built:
            root = base / "landing"
            generate_closed(
                spark,
                settings_for(root, "all"),
                events=700,
                hours=1.0,
                file_minutes=15.0,
                users=25,
                duplicate_fraction=0.05,
                malformed_fraction=0.02,
                disorder_fraction=0.2,
                late_fraction=0.0,
                seed=24,
            )
            built["landing"] = root
        return built["landing"]

    def layer(key: tuple, source: Path, admission: str, name: str) -> Path:
        if key not in built:
            root = base / "-".join(key)
            shutil.copytree(source, root)
            run_layers(spark, settings_for(root, admission), [name], out=io.StringIO())
            built[key] = root
        return built[key]

    def lake(b: str, s: str) -> tuple[Path, object]:
        bronze = layer((b,), landing(), b, "bronze")
        return layer((b, s), bronze, s, "silver"), settings_for

    return lake


@pytest.mark.parametrize(("b", "s", "g"), COMBINATIONS)
def test_no_on_time_row_is_dropped_whatever_each_layer_admits(spark, lakes, tmp_path, b, s, g):
    silver_lake, settings_for = lakes(b, s)
    root = tmp_path / "lake"
    shutil.copytree(silver_lake, root)
    settings = settings_for(root, g)

    if "all" in (b, s, g):  # one micro-batch per gold flow: nothing to stop in the middle of
        run_layers(spark, settings, ["gold"], out=io.StringIO())
        # nothing was left: a second run has no micro-batch to run
        assert [r.batches for r in run_layers(spark, settings, ["gold"], out=io.StringIO())] == [
            0
        ] * len(layer_flows("gold"))
    else:
        stop = _StopAfter(settings, STOP_AFTER)
        reports = run_flows(spark, settings, layer_flows("gold"), out=io.StringIO(), stop=stop)
        assert stop.signals == 1
        assert sum(r.batches for r in reports) >= STOP_AFTER
        # the restart finishes: it has micro-batches left to run
        restart = run_layers(spark, settings, ["gold"], out=io.StringIO())
        assert sum(r.batches for r in restart) > 0

    # no line is late: silver.late_events is the one table with no rows
    verify_all_equal(settings, empty=("silver.late_events",))
    dropped = {
        flow: _drops(settings, flow).late
        for flow in ["silver.events", "silver.ad_attribution", *_gold_flows()]
    }
    assert dropped == dict.fromkeys(dropped, 0)
