"""The Airflow DAGs (orchestration/dags/lakehouse_dags.py), in Airflow's own virtual environment
(``make airflow-setup``): loaded by a DagBag, then run with ``airflow dags test`` against local
Spark, generating data, running bronze, silver and gold with spark-submit, then maintenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from deltalake import DeltaTable

from lakehouse import oracle
from lakehouse.jars import DEFAULT_JARS_DIR, LOG4J_CONFIG
from lakehouse.runner import layer_flows
from lakehouse.settings import load_settings

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[1]
AIRFLOW_BIN = Path(os.environ.get("LAKEHOUSE_AIRFLOW_BIN", PROJECT / ".venv-airflow" / "bin"))
LOGICAL_DATE = "2026-11-22T00:00:00+00:00"

DAGBAG_PROBE = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": {
        dag_id: {
            "schedule": dag.timetable.expression,
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "tasks": {
                t.task_id: {
                    "downstream": sorted(t.downstream_task_ids),
                    "command": t.bash_command,
                    "retries": t.retries,
                    "retry_delay": t.retry_delay.total_seconds(),
                    "cwd": t.cwd,
                    "env": t.env,
                }
                for t in dag.tasks
            },
        }
        for dag_id, dag in bag.dags.items()
    },
}))
"""


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(f"Airflow is not installed in {AIRFLOW_BIN}: run `make airflow-setup`")
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "orchestration" / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "LAKEHOUSE_PROFILE": "test",
        "LAKEHOUSE_ROOT": str(home / "lake"),
        "LAKEHOUSE_SCHEDULER__BIN_DIR": str(Path(sys.executable).parent),
    }
    env.pop("PYSPARK_PYTHON", None)
    migrate = subprocess.run(
        [str(AIRFLOW_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    return env


def _dagbag(env: dict[str, str]) -> dict:
    probe = subprocess.run(
        [str(AIRFLOW_BIN / "python"), "-c", DAGBAG_PROBE % str(PROJECT / "orchestration" / "dags")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


def test_the_dagbag_loads_the_pipeline_and_maintenance_dags(airflow_env):
    env = {
        **airflow_env,
        "LAKEHOUSE_SCHEDULER__SCHEDULE": "*/30 * * * *",
        "LAKEHOUSE_SCHEDULER__RETRIES": "3",
        "LAKEHOUSE_SCHEDULER__GENERATE_EVENTS": "5000",
    }
    bag = _dagbag(env)
    assert bag["errors"] == {}
    assert set(bag["dags"]) == {"lakehouse_pipeline", "lakehouse_maintenance"}
    pipeline, maintenance = bag["dags"]["lakehouse_pipeline"], bag["dags"]["lakehouse_maintenance"]
    assert pipeline["schedule"] == "*/30 * * * *"
    assert maintenance["schedule"] == "0 0 * * *"  # @daily
    assert (pipeline["max_active_runs"], pipeline["catchup"]) == (1, False)
    tasks = pipeline["tasks"]
    assert {name: t["downstream"] for name, t in tasks.items()} == {
        "generate": ["bronze"],
        "bronze": ["silver"],
        "silver": ["gold"],
        "gold": [],
    }
    bin_dir, lake = env["LAKEHOUSE_SCHEDULER__BIN_DIR"], env["LAKEHOUSE_ROOT"]
    jars = ",".join(sorted(str(p) for p in DEFAULT_JARS_DIR.glob("*.jar")))
    assert "delta-spark_4.2_2.13" in jars  # the driver and executors load Delta from them
    for layer in ("bronze", "silver", "gold"):
        assert tasks[layer]["command"] == (
            f"{bin_dir}/spark-submit --master 'local[2]' "
            f"--driver-java-options -Dlog4j2.configurationFile=file:{LOG4J_CONFIG} "
            f"--jars {jars} jobs/{layer}.py "
            f"--root {lake} --profile test --trigger available-now"
        )
        assert tasks[layer]["cwd"] == str(PROJECT)
        assert tasks[layer]["env"]["PYSPARK_PYTHON"] == f"{bin_dir}/python"
    assert tasks["generate"]["command"].startswith(
        f"{bin_dir}/lakehouse generate --root {lake} --profile test --events 5000 --seed "
    )
    assert maintenance["tasks"]["maintain"]["command"] == (
        f"{bin_dir}/lakehouse maintain --root {lake} --profile test"
    )
    for task in [*tasks.values(), *maintenance["tasks"].values()]:
        assert (task["retries"], task["retry_delay"]) == (3, 300.0)
    # without generate_events there is no generate task
    assert set(_dagbag(airflow_env)["dags"]["lakehouse_pipeline"]["tasks"]) == {
        "bronze",
        "silver",
        "gold",
    }


def _dags_test(env: dict[str, str], dag_id: str) -> None:
    run = subprocess.run(
        [str(AIRFLOW_BIN / "airflow"), "dags", "test", dag_id, LOGICAL_DATE],
        env=env,
        cwd=env["AIRFLOW_HOME"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    # the run's final state, as `dags test` logs it (list-runs would start another CLI)
    logged = (run.stdout + run.stderr).splitlines()
    finished = [line for line in logged if "DagRun Finished" in line]
    assert len(finished) == 1 and f"dag_id={dag_id}," in finished[0], run.stdout[-5000:]
    assert " state=success," in finished[0], (run.stdout + run.stderr)[-5000:]


def _read(settings, name: str) -> pd.DataFrame:
    return DeltaTable(str(settings.table_path(name))).to_pandas()


def test_airflow_dags_test_runs_the_pipeline_and_maintenance(airflow_env):
    env = {
        **airflow_env,
        "LAKEHOUSE_SCHEDULER__GENERATE_EVENTS": "2000",
        # bronze writes a micro-batch in files of 500 rows: small files for the maintenance
        # DAG to compact (by default this one would fit in a single file)
        "LAKEHOUSE_WRITE__ROWS_PER_FILE": "500",
    }
    settings = load_settings("test", env=env)
    _dags_test(env, "lakehouse_pipeline")

    # generate: 2,000 events seeded by the run's data interval (minutes since the epoch)
    manifest = json.loads((settings.landing_path() / "_manifest.json").read_text())
    (generated,) = manifest["runs"]
    assert (generated["params"]["events"], generated["params"]["seed"]) == (2000, 29921760)
    # bronze: every source's rows and quarantine by reason as the generator counted them
    quarantine = _read(settings, "bronze.quarantine")
    for source, books in generated["sources"].items():
        assert len(_read(settings, f"bronze.{source}")) == books["bronze_rows"], source
        by_reason = quarantine[quarantine["source"] == source]["reason"].value_counts()
        assert {k: v for k, v in by_reason.items()} == {
            k: v for k, v in books["quarantine"].items() if v
        }, source
    # every flow of the three layers ran once and succeeded
    runs = _read(settings, "ops.runs")
    flows = [f.name for layer in ("bronze", "silver", "gold") for f in layer_flows(layer)]
    assert sorted(runs["flow"]) == sorted(flows)
    assert set(runs["status"]) == {"succeeded"}
    # gold, computed by the spark-submit gold task, equals its batch computation on silver
    events = _read(settings, "silver.events")
    lateness = pd.Timedelta(minutes=10)
    found = _read(settings, "gold.sessions").sort_values(["user_id", "session_start"])
    expected = oracle.sessions(events, lateness).iloc[:, :6]
    pd.testing.assert_frame_equal(
        found[list(expected.columns)].reset_index(drop=True),
        expected.reset_index(drop=True),
        check_dtype=False,
    )

    # maintenance: bronze.events compacted into one file, rows unchanged
    before = DeltaTable(str(settings.table_path("bronze.events")))
    assert len(before.file_uris()) > 1
    _dags_test(env, "lakehouse_maintenance")
    after = DeltaTable(str(settings.table_path("bronze.events")))
    # delta-spark: the compaction, then the vacuum's start and end, newest first
    operations = [h["operation"] for h in after.history(after.version() - before.version())]
    assert operations == ["VACUUM END", "VACUUM START", "OPTIMIZE"]
    assert len(after.file_uris()) == 1
    assert len(after.to_pandas()) == generated["sources"]["events"]["bronze_rows"]
