"""The kill -9 fault matrix (invariant 3): the three layers run as separate ``spark-submit``
processes, each killed with SIGKILL again and again, restarted from its checkpoint, and finally
let finish; ``lakehouse maintain`` is killed the same way during its compaction and vacuum of the
tables the gold job is reading. Then ``lakehouse verify`` must find every table equal to its
batch computation from the landing files, none of them empty: no row lost, none written twice,
nothing corrupted.

Each kill comes at a mark the job leaves on disk (seeded which one), not at a moment of the
clock, so that a run proves the same on a fast machine and a slow one. CI runs each kind of kill
point once on a small lake; ``make test-all`` runs each twice on a larger one."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from verify_helpers import generate_closed, verify_all_equal

from lakehouse import checkpoints
from lakehouse.jars import spark_submit_args
from lakehouse.ops.maintain import lake_tables
from lakehouse.ops.status import read_table
from lakehouse.progress import Progress
from lakehouse.runner import layer_flows, run_flows, run_layers
from lakehouse.runner.switch import MARKER
from lakehouse.settings import load_settings
from lakehouse.tools import generate as gen

pytestmark = pytest.mark.faults

PROJECT = Path(__file__).resolve().parents[1]
# The kinds of kill point of a layer's job, by what the kill cuts:
#   planned: right after the run's k-th new offsets file: a micro-batch planned, its tables
#     being computed and written
#   committed: right after the run's k-th new table version or checkpoint commit: a micro-batch
#     mid-commit (one table written, the others or the checkpoint not yet)
LAYER_KILLS = ("planned", "committed")
# ... and of `lakehouse maintain` beside gold: right after its first commit (an OPTIMIZE done,
# the next step under way), right after a later one (the k-th), and at the first data file it
# writes (a compaction being written: the layers' jobs are done with these tables, so a new
# data file is maintain's)
MAINTAIN_KILLS = ("first commit", "later commit", "first data file")
UPSTREAM = ("bronze", "silver")  # the layers whose tables maintain compacts beside gold
# landing files (bronze), table versions (silver, gold) per micro-batch of the runs killed:
# bronze and silver one, for many commits to be killed in; gold, whose eight flows share the
# machine, two (its 30-odd batches of one silver version took half of the test's 16 minutes)
FILES_PER_TRIGGER = {"bronze": 1, "silver": 1, "gold": 2}
SEED = 20261123
# the gold flows whose transformWithStateInPandas processor starts a driver-side Python worker
TWS_FLOWS = ("gold.purchase_alerts", "gold.sessions_custom")


def _submit(
    layer: str,
    root: Path,
    log,
    python: str = sys.executable,
    conf: tuple[str, ...] = (),
    files_per_trigger: int | None = None,
) -> subprocess.Popen:
    """spark-submit of the layer's job; ``conf``: settings as KEY=VALUE; ``files_per_trigger``:
    the micro-batch's bound (0: none), the layer's in FILES_PER_TRIGGER if not given."""
    # silver with one shuffle partition writes one file per version, which gold then reads in
    # arrival order
    settings = [*conf, "shuffle_partitions=1"] if layer == "silver" else list(conf)
    conf = [arg for item in settings for arg in ("--conf", item)]
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[2]",
        *spark_submit_args(load_settings("test")),
        str(PROJECT / "jobs" / f"{layer}.py"),
        "--root",
        str(root),
        "--profile",
        "test",
        "--trigger",
        "available-now",
        "--max-files-per-trigger",
        str(FILES_PER_TRIGGER[layer] if files_per_trigger is None else files_per_trigger),
        *conf,
    ]
    env = {**os.environ, "PYSPARK_PYTHON": python}
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT, env=env, start_new_session=True
    )


def _commits(root: Path, layer: str) -> int:
    """Table versions plus checkpoint commits of the layer so far."""
    tables = len(list((root / "tables" / layer).glob("*/_delta_log/*.json")))
    return tables + len(list((root / "checkpoints" / layer).glob("*/commits/[0-9]*")))


def _planned(root: Path, layer: str) -> int:
    """Micro-batches the layer's flows planned so far (their offsets files)."""
    return len(list((root / "checkpoints" / layer).glob("*/offsets/[0-9]*")))


# each kind's mark, and the bounds of the seeded k (the k-th new mark of the run)
MARKS = {"planned": (_planned, 1, 4), "committed": (_commits, 1, 6)}


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the job and everything it started (JVM, Python workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _run_killed(
    layer: str,
    root: Path,
    rng: np.random.Generator,
    log,
    kills: list,
    conf: tuple = (),
    moments: tuple[str, ...] = LAYER_KILLS,
) -> None:
    """Run ``layer``'s job once per kill of ``moments`` (kinds of MARKS), each killed with
    SIGKILL at its mark; then once more to its end."""
    for attempt, moment in enumerate(moments):
        log.flush()
        start = os.path.getsize(log.name)
        mark, low, high = MARKS[moment]
        target = mark(root, layer) + int(rng.integers(low, high))
        process = _submit(layer, root, log, conf=conf)
        deadline = time.monotonic() + 900
        while mark(root, layer) < target and process.poll() is None:
            assert time.monotonic() < deadline, f"{layer} reached no {moment} mark in 15 min"
            time.sleep(0.01)
        if process.poll() is not None:
            if process.returncode != 0:
                excerpt = _excerpt(Path(log.name), start)
                pytest.fail(
                    f"{layer} failed before kill {attempt + 1} {kills}; the log:\n{excerpt}"
                )
            pytest.fail(f"{layer} finished before kill {attempt + 1}: give it more input")
        _kill(process)
        kills.append((layer, moment, _commits(root, layer)))
    # The layer must then finish, in one run: the tables and checkpoints take any number of
    # kills. (A retry here covered one unexplained failure; 5 runs in a row, one beside a busy
    # core, never needed it.) It reads what is left at once: the micro-batch the last kill cut
    # is repeated as it was planned, then one reads the rest. (With the kills' bound, the
    # finishing runs did most of the test's 40-odd micro-batches per flow, in 480 of its 1,040
    # s, and were killed in none.)
    log.flush()
    start = os.path.getsize(log.name)
    unbounded = (*conf, "kafka.max_offsets_per_trigger=0")
    if _submit(layer, root, log, conf=unbounded, files_per_trigger=0).wait(timeout=900) != 0:
        excerpt = _excerpt(Path(log.name), start)
        pytest.fail(f"{layer} failed after its kills {kills}; the log:\n{excerpt}")


def _lakehouse(args: list[str], root: Path, log) -> subprocess.Popen:
    """``lakehouse ARGS`` on the lake at ``root`` (test profile) in a process of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "lakehouse", *args, "--root", str(root), "--profile", "test"],
        stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip


class _MaintainKilled(threading.Thread):
    """``lakehouse maintain`` (compaction, vacuum with 0 hours' retention, log checkpoint) of
    the bronze and silver tables, run beside the gold job that reads them: killed with
    SIGKILL at each of MAINTAIN_KILLS, then let finish; once gold is done, the whole lake once
    more (gold's own tables and the ops tables, which the job writes, are locked until then).
    It starts when every gold flow has read, so that no gold flow starts from a compacted
    snapshot, whose files are not in event-time order."""

    def __init__(self, settings, rng: np.random.Generator, log: Path):
        super().__init__(daemon=True)
        self.settings = settings
        self.root = settings.root
        self.checkpoints = [settings.checkpoint_path(f.layer, f.flow) for f in layer_flows("gold")]
        self.rng, self.log = rng, log
        self.kills: list[tuple[str, int]] = []
        self.finished: list[str] = []
        self.failure: str | None = None
        self.process: subprocess.Popen | None = None
        self.gold_done = threading.Event()

    def _commits(self) -> int:
        tables = self.root / "tables"
        return sum(len(list(tables.glob(f"{layer}/*/_delta_log/*.json"))) for layer in UPSTREAM)

    def _data_files(self) -> set[str]:
        tables = self.root / "tables"
        return {str(p) for layer in UPSTREAM for p in tables.glob(f"{layer}/**/*.parquet")}

    def stop(self) -> None:
        """Kill the maintain process still running, if any (the test failed or timed out)."""
        if self.process is not None and self.process.poll() is None:
            _kill(self.process)

    def _start(self, tables: list[str], handle) -> subprocess.Popen:
        tables = [arg for table in tables for arg in ("--table", table)]
        force = ["--force", "--conf", "maintenance.vacuum_retention_hours=0"]
        self.process = _lakehouse(["maintain", *force, *tables], self.root, handle)
        return self.process

    def _upstream(self) -> list[str]:
        return [name for name, _ in lake_tables(self.settings) if name.split(".")[0] in UPSTREAM]

    def run(self) -> None:
        try:
            while not all((c / "offsets" / "0").exists() for c in self.checkpoints):
                if self.gold_done.wait(0.2):
                    break
            with open(self.log, "w") as handle:
                for moment in MAINTAIN_KILLS:
                    start, files = self._commits(), self._data_files()
                    first = int(self.rng.integers(2, 8)) if moment == "later commit" else 1
                    process = self._start(self._upstream(), handle)
                    deadline = time.monotonic() + 900
                    while process.poll() is None:
                        if moment == "first data file" and self._data_files() - files:
                            break
                        if moment != "first data file" and self._commits() >= start + first:
                            break
                        assert time.monotonic() < deadline, f"maintain reached no {moment} mark"
                        time.sleep(0.01)
                    if process.poll() is not None:  # ended before its mark: the test fails
                        self._ended(process, "upstream tables")
                        self.kills.append((moment, None))
                        continue
                    _kill(process)
                    self.kills.append((moment, self._commits() - start))
                self._ended(self._start(self._upstream(), handle), "upstream tables")
                self.gold_done.wait()
                self._ended(self._start([], handle), "every table")
        except Exception as exc:  # reported by the test
            self.failure = repr(exc)

    def _ended(self, process: subprocess.Popen, what: str) -> None:
        if process.wait(timeout=900) != 0:
            raise AssertionError(f"maintain of {what} failed; see {self.log}")
        self.finished.append(what)


def _excerpt(log: Path, start: int, lines: int = 80) -> str:
    """The last lines a job wrote to ``log`` from offset ``start`` on, Spark's INFO left out."""
    with open(log, errors="replace") as handle:
        handle.seek(start)
        text = [line for line in handle.read().splitlines() if " INFO " not in line]
    return "\n".join(text[-lines:])


# CI: each kind of kill point once (bronze and silver one each, gold, the layer of most flows,
# both); make test-all: each layer at each kind twice, on a larger lake
ONCE = {"bronze": ("planned",), "silver": ("committed",), "gold": LAYER_KILLS}
TWICE = dict.fromkeys(("bronze", "silver", "gold"), LAYER_KILLS * 2)


@pytest.mark.parametrize(
    ("events", "hours", "moments"),
    [
        pytest.param(600, 1.5, ONCE, id="each-kind-once"),
        pytest.param(2000, 3.0, TWICE, id="each-kind-twice", marks=pytest.mark.full),
    ],
)
def test_killed_and_restarted_jobs_leave_every_table_exact(
    spark, settings, tmp_path, events, hours, moments
):
    """Each layer killed at each kill point of ``moments`` (kinds of LAYER_KILLS), maintain at
    each of MAINTAIN_KILLS beside gold; sessions starting over ``hours`` arrive in files of 5
    minutes."""
    generate_closed(
        spark, settings, events=events, hours=hours, file_minutes=5.0, late_fraction=0.0,
        users=30, seed=SEED,
    )  # fmt: skip
    rng = np.random.default_rng(SEED)
    kills: list[tuple[str, str, int]] = []
    # (its own generator: it draws beside the layers' kills)
    maintained = _MaintainKilled(settings, np.random.default_rng(SEED + 1), tmp_path / "maint.log")
    with open(tmp_path / "jobs.log", "w") as log:
        for layer in ("bronze", "silver"):
            _run_killed(layer, settings.root, rng, log, kills, moments=moments[layer])
        maintained.start()
        try:
            _run_killed("gold", settings.root, rng, log, kills, moments=moments["gold"])
        finally:
            maintained.gold_done.set()
            maintained.join(timeout=1800)
            maintained.stop()
    assert not maintained.is_alive(), "maintain did not end within 30 minutes of gold"
    assert [(layer, moment) for layer, moment, _ in kills] == [
        (layer, moment) for layer in ("bronze", "silver", "gold") for moment in moments[layer]
    ]
    assert maintained.failure is None, maintained.failure
    # killed at each of its marks (none ended before it), and finished: the upstream tables,
    # then all
    assert [moment for moment, made in maintained.kills if made is not None] == list(
        MAINTAIN_KILLS
    ), maintained.kills
    assert maintained.finished == ["upstream tables", "every table"], maintained.finished

    verify_all_equal(settings, empty=("silver.late_events",))  # (no line is late)
    _assert_every_batch_recorded_once(settings, tmp_path / "jobs.log")


def test_a_refresh_killed_while_it_switches_is_finished_and_exact(spark, settings, tmp_path):
    """``lakehouse run --full-refresh gold.sessions_custom`` (it writes two tables) killed with
    SIGKILL while it switches, beside a bronze job appending new landing files in another
    process: once right after its first table's switch commit, once right after its marker
    (the rebuild done, nothing switched yet). The next refresh finishes the first switch, the
    flow's next run the second: every table equals its reference, each micro-batch is
    recorded once, no staging copy or replaced checkpoint is left."""
    generate_closed(spark, settings, events=600, hours=1.0, late_fraction=0.0, users=20, seed=SEED)
    run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
    # (the other gold flows run once, at the end)
    custom = [f for f in layer_flows("gold") if f.name == "gold.sessions_custom"]
    run_flows(spark, settings, custom, out=io.StringIO())
    # new landing files, which bronze appends beside the refreshes
    params = gen.params_from_settings(
        settings, events=300, hours=0.5, late_fraction=0.0, users=20, seed=SEED + 2
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    versions = Path(settings.table_path("gold.sessions_custom")) / "_delta_log"
    stats = Path(settings.table_path("gold.session_stats_hourly")) / "_delta_log"
    staging = settings.root / "refresh"
    kills: list[tuple[str, bool, bool]] = []  # (moment, its switch pending, stats switched)
    log_path = tmp_path / "jobs.log"
    with open(log_path, "w") as log:
        bronze = _lakehouse(
            ["run", "--layer", "bronze", "--max-files-per-trigger", "1"], settings.root, log
        )
        process = bronze
        try:
            for moment in ("after its first table", "after its marker"):
                known = set(staging.glob(f"*/{MARKER}"))
                first = len(list(versions.glob("*.json")))
                second = len(list(stats.glob("*.json")))
                process = _lakehouse(
                    ["run", "--full-refresh", "gold.sessions_custom"], settings.root, log
                )
                marker, deadline = None, time.monotonic() + 900
                while process.poll() is None:
                    assert time.monotonic() < deadline, f"the refresh reached no mark {moment}"
                    if marker is None:
                        new = set(staging.glob(f"*/{MARKER}")) - known
                        if new:
                            marker = new.pop()  # the rebuild is done; the switch begins
                            if moment == "after its marker":
                                break
                    elif len(list(versions.glob("*.json"))) > first:
                        break
                    time.sleep(0.01)
                assert process.poll() is None, (
                    f"the refresh ended before its kill {moment}:\n{_excerpt(log_path, 0)}"
                )
                _kill(process)
                pending = marker is not None and marker.exists()
                kills.append((moment, pending, len(list(stats.glob("*.json"))) > second))
            assert bronze.wait(timeout=600) == 0, _excerpt(log_path, 0)
        finally:
            for job in (bronze, process):
                _kill(job)
    # the first kill left its switch half done (one table of two switched), the next refresh
    # finished it as it started (gold.session_stats_hourly's commit); the second left its
    # own switch to come, which the flow's next start makes
    assert kills == [("after its first table", True, False), ("after its marker", True, True)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # (what the flow's start prints of the switch)
        run_layers(spark, settings, ["silver", "gold"], out=out)
    assert "  gold.sessions_custom: its checkpoint is the rebuilt one" in out.getvalue()
    assert not list(staging.glob("*")), list(staging.glob("*"))
    assert not list(settings.root.glob("checkpoints/*/*.replaced"))
    verify_all_equal(settings, empty=("silver.late_events",))  # (no line is late)
    _assert_every_batch_recorded_once(settings, log_path)


def _assert_every_batch_recorded_once(settings, log: Path) -> None:
    """ops.stream_progress holds each committed micro-batch of every flow once: a kill between a
    batch's commit and its record is recounted at the next start (the log says how often). An
    endless flow's last no-data batch may be cut by its stop before it is recorded."""
    progress = read_table(settings, "ops.stream_progress")
    rows = progress.groupby(["query_id", "batch_id", "operator_index"], dropna=False).size()
    assert (rows == 1).all(), rows[rows > 1]
    recorded = progress.groupby("query_id")["batch_id"].agg(set)
    recounts = log.read_text().count("recounted: ")
    for layer in ("bronze", "silver", "gold"):
        for flow in layer_flows(layer):
            checkpoint = settings.checkpoint_path(flow.layer, flow.flow)
            committed = set(checkpoints.committed_batches(checkpoint))
            missing = committed - recorded.get(checkpoints.query_id(checkpoint), set())
            if not flow.stops_itself:
                missing -= {max(committed)}
            assert not missing, f"{flow.name}: {sorted(missing)} unrecorded ({recounts} recounts)"


# (CI: one kill after a commit, the kind a restart must skip; make test-all: each kind twice)
@pytest.mark.parametrize(
    ("events", "moments"),
    [
        pytest.param(600, ("committed",), id="killed-once"),
        pytest.param(1500, LAYER_KILLS * 2, id="each-kind-twice", marks=pytest.mark.full),
    ],
)
def test_bronze_killed_while_reading_kafka_loses_and_duplicates_nothing(
    spark, settings, tmp_path, kafka_broker, events, moments
):
    """The records on Kafka (3 partitions per topic), bronze read 40 at a time per micro-batch
    and killed at each of ``moments``: offsets live in the checkpoint and each Delta commit
    carries its batch id, so the restarts lose and duplicate nothing."""
    prefix = f"killed{len(moments)}."
    kafka = {
        "bronze.source": "kafka",
        "kafka.bootstrap_servers": kafka_broker.bootstrap,
        "kafka.topic_prefix": prefix,
        "kafka.partitions": 3,
        "kafka.max_offsets_per_trigger": 40,
    }
    lake = settings.with_overrides(kafka)
    sink = gen.KafkaSink(kafka_broker.bootstrap, 3, prefix)
    entries = generate_closed(
        spark, lake, sink=sink, events=events, hours=2.0, late_fraction=0.0, users=30, seed=SEED
    )
    rng = np.random.default_rng(SEED)
    kills: list[tuple[str, str, int]] = []
    conf = tuple(f"{key}={value}" for key, value in kafka.items())
    with open(tmp_path / "jobs.log", "w") as log:
        _run_killed("bronze", lake.root, rng, log, kills, conf, moments=moments)
    assert [moment for _, moment, _ in kills] == list(moments)
    # every record once: as many rows in bronze and its quarantine as records on the topics
    lines = sum(
        e["sources"][s]["lines"] for e in entries for s in ("events", "impressions", "clicks")
    )
    rows = sum(len(read_table(lake, f"bronze.{s}")) for s in ("events", "impressions", "clicks"))
    assert rows + len(read_table(lake, "bronze.quarantine")) == lines
    run_layers(spark, lake, ["silver", "gold"], out=io.StringIO())
    verify_all_equal(lake, empty=("silver.late_events",))  # (no line is late)


def test_a_flow_whose_python_worker_is_late_to_connect_back_is_restarted(
    spark, settings, tmp_path, shuffle_partitions
):
    """Spark gives a Python process it starts in the driver 10 seconds to connect back; on a
    busy machine one can miss that ("Python worker failed to connect back") and fail its flow.
    Here the first driver-side worker of a transformWithStateInPandas flow never starts (it
    waits until it is killed): the gold job restarts that flow from its checkpoint, and every
    table still equals its batch computation."""
    generate_closed(spark, settings, events=600, hours=1.0, late_fraction=0.0, users=20, seed=SEED)
    with shuffle_partitions(1):  # one silver file: the job reads one file per micro-batch
        run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
    late = tmp_path / "late-python"
    late.write_text(
        "#!/bin/sh\n"
        # mkdir is atomic: only the first driver-side worker started by the job waits
        f'if [ "$2" = pyspark.sql.streaming.transform_with_state_driver_worker ] '
        f"&& mkdir {tmp_path / 'waited'} 2>/dev/null; then exec sleep 3600; fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    late.chmod(0o755)
    with open(tmp_path / "gold.log", "w+") as log:
        job = _submit("gold", settings.root, log, python=str(late))
        try:
            assert job.wait(timeout=600) == 0, _read(log)[-6000:]
        finally:
            _kill(job)  # (and the worker that never started, if Spark left it waiting)
        text = _read(log)
    assert (tmp_path / "waited").is_dir(), "the job started no driver-side worker"
    # the flow whose worker came first (of those with a transformWithStateInPandas
    # processor) is the one restarted
    restarted = [line for line in text.splitlines() if "restarting" in line]
    assert restarted in [
        [
            f"flow {flow}: Python worker failed to connect back. (the machine was too busy); "
            "restarting it from its checkpoint (1 of 2)"
        ]
        for flow in TWS_FLOWS
    ], text[-6000:]
    verify_all_equal(settings, empty=("silver.late_events",))  # (no line is late)


def _read(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()
