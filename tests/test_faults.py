"""The kill -9 fault matrix (invariant 3): the three layers run as separate ``spark-submit``
processes, each killed with SIGKILL again and again (seeded moments: some at a random time, some
right after a table commit, while the micro-batch is still being committed), restarted from its
checkpoint, and finally let finish; ``lakehouse maintain`` is killed the same way during its
compaction and vacuum of the tables the gold job is reading. Then ``lakehouse verify`` must find
every table equal to its batch computation from the landing files: no row lost, none written
twice, nothing corrupted."""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from verify_helpers import ALL_EQUAL

from lakehouse import checkpoints
from lakehouse.jars import spark_submit_args
from lakehouse.ops.maintain import lake_tables
from lakehouse.ops.status import read_table
from lakehouse.progress import Progress
from lakehouse.proof.verify import run_verify
from lakehouse.runner import layer_flows, run_flows, run_layers
from lakehouse.runner.switch import MARKER
from lakehouse.settings import load_settings
from lakehouse.tools import generate as gen

pytestmark = pytest.mark.faults

PROJECT = Path(__file__).resolve().parents[1]
KILLS_PER_LAYER = 4  # 12 kills in all
MAINTAIN_KILLS = 3  # tries of `lakehouse maintain` beside gold, each killed unless done by then
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


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the job and everything it started (JVM, Python workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _run_killed(
    layer: str, root: Path, rng: np.random.Generator, log, kills: list, conf: tuple = ()
) -> None:
    for attempt in range(KILLS_PER_LAYER):
        log.flush()
        start = os.path.getsize(log.name)
        process = _submit(layer, root, log, conf=conf)
        if attempt % 2 == 0:
            # at a random moment: starting up, planning, reading, writing, committing
            deadline = time.monotonic() + rng.uniform(8.0, 40.0)
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.05)
            moment = "random"
        else:
            # right after the n-th commit of this run: its micro-batch is mid-commit (a table
            # written, the others or the checkpoint not yet)
            target = _commits(root, layer) + int(rng.integers(1, 6))
            while _commits(root, layer) < target and process.poll() is None:
                time.sleep(0.01)
            moment = "after a commit"
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
    SIGKILL at a random moment of its work, right after its n-th commit (an OPTIMIZE, a VACUUM
    START or END: the next step under way), at a random moment from its start, then let finish; once gold is done, the
    whole lake once more (gold's own tables and the ops tables, which the job writes, are
    locked until then). It starts when every gold flow has read, so that no gold flow starts
    from a compacted snapshot, whose files are not in event-time order."""

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
                for attempt in range(MAINTAIN_KILLS):
                    start = self._commits()
                    process = self._start(self._upstream(), handle)
                    # at a random moment of its work (from its first commit on), right after
                    # its n-th commit, at a random moment from its start (it may be starting)
                    moment = ("during", "after a commit", "random")[attempt % 3]
                    first = 1 if moment == "during" else int(self.rng.integers(1, 8))
                    deadline = math.inf
                    while process.poll() is None:
                        if moment == "random" and deadline == math.inf:
                            deadline = time.monotonic() + self.rng.uniform(6.0, 40.0)
                        if self._commits() >= start + first and deadline == math.inf:
                            wait = self.rng.uniform(0.0, 8.0) if moment == "during" else 0.0
                            deadline = time.monotonic() + wait
                        if time.monotonic() >= deadline:
                            break
                        time.sleep(0.01)
                    if process.poll() is not None:
                        self._ended(process, "upstream tables")
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


def test_killed_and_restarted_jobs_leave_every_table_exact(spark, settings, tmp_path):
    params = gen.params_from_settings(
        settings,
        events=2000,
        hours=3.0,  # sessions starting over 3 hours arrive in 40-odd files of 5 minutes
        file_minutes=5.0,
        late_fraction=0.0,
        users=30,
        seed=SEED,
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    rng = np.random.default_rng(SEED)
    kills: list[tuple[str, str, int]] = []
    # (its own generator: it draws beside the layers' kills)
    maintained = _MaintainKilled(settings, np.random.default_rng(SEED + 1), tmp_path / "maint.log")
    with open(tmp_path / "jobs.log", "w") as log:
        for layer in ("bronze", "silver"):
            _run_killed(layer, settings.root, rng, log, kills)
        maintained.start()
        try:
            _run_killed("gold", settings.root, rng, log, kills)
        finally:
            maintained.gold_done.set()
            maintained.join(timeout=1800)
            maintained.stop()
    assert not maintained.is_alive(), "maintain did not end within 30 minutes of gold"
    assert len(kills) == 3 * KILLS_PER_LAYER
    assert sum(moment == "after a commit" for _, moment, _ in kills) == 6
    assert maintained.failure is None, maintained.failure
    # killed twice in the middle of its compaction and vacuum (after commits of its own), and
    # finished: the upstream tables, then all
    assert len([k for k in maintained.kills if k[1]]) >= 2, maintained.kills
    assert maintained.finished[-2:] == ["upstream tables", "every table"], maintained.finished

    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    assert report.getvalue().splitlines()[-1] == ALL_EQUAL
    _assert_every_batch_recorded_once(settings, tmp_path / "jobs.log")


def test_a_refresh_killed_while_it_switches_is_finished_and_exact(spark, settings, tmp_path):
    """``lakehouse run --full-refresh gold.sessions_custom`` (it writes two tables) killed with
    SIGKILL while it switches, beside a bronze job appending new landing files in another
    process: once right after its first table's switch commit, once at a random moment from
    its marker on. The next refresh finishes the first switch, the flow's next run the second:
    every table equals its reference, each micro-batch is recorded once, no staging copy or
    replaced checkpoint is left."""

    def generate(seed: int) -> None:
        params = gen.params_from_settings(
            settings, events=600, hours=1.0, late_fraction=0.0, users=20, seed=seed
        )
        gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))

    generate(SEED)
    run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
    # (the other gold flows run once, at the end)
    custom = [f for f in layer_flows("gold") if f.name == "gold.sessions_custom"]
    run_flows(spark, settings, custom, out=io.StringIO())
    generate(SEED + 1)  # new landing files, which bronze appends beside the refreshes
    versions = Path(settings.table_path("gold.sessions_custom")) / "_delta_log"
    stats = Path(settings.table_path("gold.session_stats_hourly")) / "_delta_log"
    staging = settings.root / "refresh"
    rng = np.random.default_rng(SEED)
    kills: list[tuple[str, bool, bool]] = []  # (moment, its switch pending, stats switched)
    log_path = tmp_path / "jobs.log"
    with open(log_path, "w") as log:
        bronze = _lakehouse(
            ["run", "--layer", "bronze", "--max-files-per-trigger", "1"], settings.root, log
        )
        process = bronze
        try:
            for moment in ("after its first table", "random"):
                known = set(staging.glob(f"*/{MARKER}"))
                first = len(list(versions.glob("*.json")))
                second = len(list(stats.glob("*.json")))
                process = _lakehouse(
                    ["run", "--full-refresh", "gold.sessions_custom"], settings.root, log
                )
                marker, deadline = None, math.inf
                while process.poll() is None and time.monotonic() < deadline:
                    if marker is None:
                        new = set(staging.glob(f"*/{MARKER}")) - known
                        if new:
                            marker = new.pop()  # the rebuild is done; the switch begins
                            if moment == "random":
                                deadline = time.monotonic() + rng.uniform(0.0, 2.0)
                    elif moment != "random" and len(list(versions.glob("*.json"))) > first:
                        break
                    time.sleep(0.01)
                # (at random, the switch may be over before the kill: then it ended by itself)
                ended = process.poll() is not None
                assert not ended or process.returncode == 0, _excerpt(log_path, 0)
                assert moment == "random" or not ended, (
                    f"the refresh ended before its kill {moment}"
                )
                _kill(process)
                pending = marker is not None and marker.exists()
                kills.append((moment, pending, len(list(stats.glob("*.json"))) > second))
            assert bronze.wait(timeout=600) == 0, _excerpt(log_path, 0)
        finally:
            for job in (bronze, process):
                _kill(job)
    # the first kill left its switch half done (one table of two switched); the next refresh
    # finished it
    assert kills[0] == ("after its first table", True, False), kills
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # (what the flow's start prints of the switch)
        run_layers(spark, settings, ["silver", "gold"], out=out)
    if kills[1][1]:  # the flow's start finished the second switch
        assert "  gold.sessions_custom: its checkpoint is the rebuilt one" in out.getvalue()
    assert not list(staging.glob("*")), list(staging.glob("*"))
    assert not list(settings.root.glob("checkpoints/*/*.replaced"))
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    assert report.getvalue().splitlines()[-1] == ALL_EQUAL
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


def test_bronze_killed_while_reading_kafka_loses_and_duplicates_nothing(
    spark, settings, tmp_path, kafka_broker
):
    """The records on Kafka (3 partitions per topic), bronze read 40 at a time per micro-batch
    and killed 4 times (twice right after a commit): offsets live in the checkpoint and each
    Delta commit carries its batch id, so the restarts lose and duplicate nothing."""
    kafka = {
        "bronze.source": "kafka",
        "kafka.bootstrap_servers": kafka_broker.bootstrap,
        "kafka.topic_prefix": "killed.",
        "kafka.partitions": 3,
        "kafka.max_offsets_per_trigger": 40,
    }
    lake = settings.with_overrides(kafka)
    params = gen.params_from_settings(
        lake, events=1500, hours=2.0, late_fraction=0.0, users=30, seed=SEED
    )
    sink = gen.KafkaSink(kafka_broker.bootstrap, 3, "killed.")
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    entry = gen.generate(spark, lake.root, params, progress=quiet, sink=sink)
    rng = np.random.default_rng(SEED)
    kills: list[tuple[str, str, int]] = []
    conf = tuple(f"{key}={value}" for key, value in kafka.items())
    with open(tmp_path / "jobs.log", "w") as log:
        _run_killed("bronze", lake.root, rng, log, kills, conf)
    assert [moment for _, moment, _ in kills] == ["random", "after a commit"] * 2
    # every record once: as many rows in bronze and its quarantine as records on the topics
    lines = sum(entry["sources"][s]["lines"] for s in ("events", "impressions", "clicks"))
    rows = sum(len(read_table(lake, f"bronze.{s}")) for s in ("events", "impressions", "clicks"))
    assert rows + len(read_table(lake, "bronze.quarantine")) == lines
    run_layers(spark, lake, ["silver", "gold"], out=io.StringIO())
    report = io.StringIO()
    assert run_verify(lake, report) == 0, report.getvalue()
    assert report.getvalue().splitlines()[-1] == ALL_EQUAL


def test_a_flow_whose_python_worker_is_late_to_connect_back_is_restarted(
    spark, settings, tmp_path, shuffle_partitions
):
    """Spark gives a Python process it starts in the driver 10 seconds to connect back; on a
    busy machine one can miss that ("Python worker failed to connect back") and fail its flow.
    Here the first driver-side worker of a transformWithStateInPandas flow waits 12 s before
    it starts: the gold job restarts that flow from its checkpoint, and every table still
    equals its batch computation."""
    params = gen.params_from_settings(
        settings, events=600, hours=1.0, late_fraction=0.0, users=20, seed=SEED
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    with shuffle_partitions(1):  # one silver file: the job reads one file per micro-batch
        run_layers(spark, settings, ["bronze", "silver"], out=io.StringIO())
    late = tmp_path / "late-python"
    late.write_text(
        "#!/bin/sh\n"
        # mkdir is atomic: only the first driver-side worker started by the job waits
        f'if [ "$2" = pyspark.sql.streaming.transform_with_state_driver_worker ] '
        f"&& mkdir {tmp_path / 'waited'} 2>/dev/null; then sleep 12; fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    late.chmod(0o755)
    with open(tmp_path / "gold.log", "w+") as log:
        job = _submit("gold", settings.root, log, python=str(late))
        assert job.wait(timeout=600) == 0, _read(log)[-6000:]
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
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    assert report.getvalue().splitlines()[-1] == ALL_EQUAL


def _read(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()
