"""The Airflow DAGs (orchestration/dags/lakehouse_dags.py), in Airflow's own virtual environment
(``make airflow-setup``: Airflow, its Apache Spark provider and the project without its
dependencies): loaded by a DagBag, then run with ``airflow dags test`` against local Spark,
packing the project, generating data, running bronze, silver and gold with the provider's
SparkSubmitOperator, then maintenance. Nothing the tasks run refers to the checkout: the
settings file is a copy, the layers run from the packed folder under the lake root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from deltalake import DeltaTable

from lakehouse.jars import DEFAULT_JARS_DIR
from lakehouse.proof import oracle
from lakehouse.runner import layer_flows
from lakehouse.settings import load_settings

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[1]
AIRFLOW_BIN = Path(os.environ.get("LAKEHOUSE_AIRFLOW_BIN", PROJECT / ".venv-airflow" / "bin"))
LOGICAL_DATE = "2026-11-22T00:00:00+00:00"
# the Airflow connection the layers' tasks use (scheduler.spark_conn_id): it holds the master
SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[2]"})

DAGBAG_PROBE = """
import json
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

def task(t):
    found = {
        "type": type(t).__name__,
        "downstream": sorted(t.downstream_task_ids),
        "retries": t.retries,
        "retry_delay": t.retry_delay.total_seconds(),
        "outlets": [{"name": a.name, "uri": a.uri, "group": a.group} for a in t.outlets],
    }
    if isinstance(t, SparkSubmitOperator):
        hook = t._get_hook()  # resolves the connection, builds spark-submit's command line
        found.update(
            conn_id=t._conn_id,
            master=hook._connection["master"],
            command=hook._build_spark_submit_command(t.application),
            env=t.env_vars,
        )
    else:
        found.update(command=t.bash_command, cwd=t.cwd, env=t.env)
    return found

bag = DagBag(dag_folder=%r)
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": {
        dag_id: {
            "schedule": dag.timetable.expression,
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "tasks": {t.task_id: task(t) for t in dag.tasks},
        }
        for dag_id, dag in bag.dags.items()
    },
}))
"""

# the asset events a run recorded in Airflow's database, with the task that published them
ASSET_EVENTS_PROBE = """
import json
from sqlalchemy import select
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as session:
    rows = session.execute(
        select(AssetModel.name, AssetModel.uri, AssetEvent.source_dag_id, AssetEvent.source_task_id)
        .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
    ).all()
print(json.dumps([list(row) for row in rows]))
"""


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(f"Airflow is not installed in {AIRFLOW_BIN}: run `make airflow-setup`")
    home = tmp_path_factory.mktemp("airflow-home")
    # the settings file where a deployment puts it, not the checkout's
    config = shutil.copyfile(PROJECT / "conf" / "lakehouse.toml", home / "lakehouse.toml")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "orchestration" / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
        "LAKEHOUSE_CONFIG": str(config),
        "LAKEHOUSE_PROFILE": "test",
        "LAKEHOUSE_ROOT": str(home / "lake"),
        "LAKEHOUSE_SCHEDULER__BIN_DIR": str(Path(sys.executable).parent),
    }
    env.pop("PYSPARK_PYTHON", None)
    _migrate(env)
    return env


def _migrate(env: dict[str, str]) -> None:
    """Airflow's database in ``AIRFLOW_HOME``, made or brought up to date."""
    migrate = subprocess.run(
        [str(AIRFLOW_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]


def _probe(env: dict[str, str], code: str):
    probe = subprocess.run(
        [str(AIRFLOW_BIN / "python"), "-c", code],
        env=env,
        cwd=env["AIRFLOW_HOME"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


def _dagbag(env: dict[str, str]) -> dict:
    return _probe(env, DAGBAG_PROBE % str(PROJECT / "orchestration" / "dags"))


def _values(task: dict) -> list[str]:
    """Every string a task runs with: its command and its environment (but the PATH, which
    the worker's is appended to)."""
    command = task["command"]
    env = {k: v for k, v in task["env"].items() if k != "PATH"}
    return [*(command if isinstance(command, list) else [command]), *env.values()]


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
        "package": ["bronze"],
        "generate": ["bronze"],
        "bronze": ["silver"],
        "silver": ["gold"],
        "gold": [],
    }
    bin_dir, lake, config = (
        env["LAKEHOUSE_SCHEDULER__BIN_DIR"],
        env["LAKEHOUSE_ROOT"],
        env["LAKEHOUSE_CONFIG"],
    )
    # the layers: spark-submit of the packed folder (<root>/dist) through the connection
    dist = f"{lake}/dist"
    jars = ",".join(f"{dist}/jars/{p.name}" for p in sorted(DEFAULT_JARS_DIR.glob("*.jar")))
    assert "delta-spark_4.2_2.13" in jars  # the driver and executors load Delta from them
    for layer in ("bronze", "silver", "gold"):
        task = tasks[layer]
        assert (task["type"], task["conn_id"], task["master"]) == (
            "SparkSubmitOperator",
            "spark_default",
            "local[2]",
        )
        assert task["command"] == [
            "spark-submit",
            "--master", "local[2]",
            "--conf",
            # the project's log4j2 file, then the test profile's driver_java_options
            f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{dist}/log4j2.properties"
            " -XX:TieredStopAtLevel=1",
            "--py-files", f"{dist}/lakehouse-code.zip",
            "--jars", jars,
            "--name", f"lakehouse-{layer}",
            f"{dist}/jobs/{layer}.py",
            "--root", lake, "--profile", "test", "--trigger", "available-now",
        ]  # fmt: skip
        assert task["env"]["PYSPARK_PYTHON"] == f"{bin_dir}/python"
        assert task["env"]["LAKEHOUSE_CONFIG"] == config
        # the provider runs spark-submit from the PATH: bin_dir's first
        assert task["env"]["PATH"].split(os.pathsep)[0] == bin_dir
    # the package task packs the installed project there first; generate and maintain run the
    # installed lakehouse
    assert tasks["package"]["command"] == (
        f"{bin_dir}/lakehouse cluster package --root {lake} --profile test "
        f"--output {dist}/lakehouse-code.zip"
    )
    assert tasks["generate"]["command"].startswith(
        f"{bin_dir}/lakehouse generate --root {lake} --profile test --events 5000 --seed "
    )
    assert maintenance["tasks"]["maintain"]["command"] == (
        f"{bin_dir}/lakehouse maintain --root {lake} --profile test"
    )
    for name in ("package", "generate"):
        assert tasks[name]["type"] == "BashOperator"
        assert tasks[name]["env"]["LAKEHOUSE_CONFIG"] == config
    all_tasks = [*tasks.values(), *maintenance["tasks"].values()]
    for task in all_tasks:
        assert (task["retries"], task["retry_delay"]) == (3, 300.0)
    # no task needs the checkout: none runs in it, none names a file of it (the project's
    # tools in bin_dir are its installation, here the checkout's .venv)
    for task in all_tasks:
        assert task.get("cwd") is None
        for value in _values(task):
            assert str(PROJECT) not in value.replace(bin_dir, "<bin_dir>"), value
    # the gold task publishes each gold table the declarations list as an asset at its folder
    gold = [o.table for flow in layer_flows("gold") for o in flow.outputs]
    assert tasks["gold"]["outlets"] == [
        {
            "name": table,
            "uri": f"file://{lake}/tables/gold/{table.removeprefix('gold.')}",
            "group": "lakehouse",
        }
        for table in dict.fromkeys(gold)
    ]
    assert [t["outlets"] for name, t in tasks.items() if name != "gold"] == [[]] * 4

    # without generate_events there is no generate task; the connection is a setting, and
    # its master is spark-submit's
    other = {
        **airflow_env,
        "LAKEHOUSE_SCHEDULER__SPARK_CONN_ID": "spark_cluster",
        "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps(
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}
        ),
    }
    tasks = _dagbag(other)["dags"]["lakehouse_pipeline"]["tasks"]
    assert set(tasks) == {"package", "bronze", "silver", "gold"}
    for layer in ("bronze", "silver", "gold"):
        assert (tasks[layer]["conn_id"], tasks[layer]["command"][1:3]) == (
            "spark_cluster",
            ["--master", "spark://127.0.0.1:7077"],
        )


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


# CI: 500 events; make test-all: 2,000
@pytest.mark.parametrize(
    "events", [500, pytest.param(2000, marks=pytest.mark.full, id="2000")], ids=str
)
def test_airflow_dags_test_runs_the_pipeline_and_maintenance(airflow_env, events, tmp_path):
    env = {
        **airflow_env,
        # an Airflow home and a lake of its own: make test-all runs both sizes, and Airflow
        # keeps the first lake's tables as its assets
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
        "LAKEHOUSE_SCHEDULER__GENERATE_EVENTS": str(events),
        # bronze admits 20 landing files per micro-batch and writes each in one file: several
        # small files for the maintenance DAG to compact (read at once, they would be one)
        "LAKEHOUSE_TRIGGER__MAX_FILES_PER_TRIGGER": "20",
    }
    Path(env["AIRFLOW_HOME"]).mkdir()
    _migrate(env)
    settings = load_settings("test", env=env)
    _dags_test(env, "lakehouse_pipeline")

    # generate: the events, seeded by the run's data interval (minutes since the epoch)
    manifest = json.loads((settings.landing_path() / "_manifest.json").read_text())
    (generated,) = manifest["runs"]
    assert (generated["params"]["events"], generated["params"]["seed"]) == (events, 29921760)
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
    # the layers ran from the folder the package task packed; the gold task published an
    # asset event of each gold table
    packed = sorted(p.name for p in (settings.root / "dist").iterdir())
    assert packed == ["jars", "jobs", "lakehouse-code.zip", "log4j2.properties"]
    gold = dict.fromkeys(o.table for flow in layer_flows("gold") for o in flow.outputs)
    assert sorted(_probe(env, ASSET_EVENTS_PROBE)) == sorted(
        [table, settings.table_path(table).as_uri(), "lakehouse_pipeline", "gold"] for table in gold
    )

    # maintenance: bronze.events compacted into one file, rows unchanged
    before = DeltaTable(str(settings.table_path("bronze.events")))
    assert len(before.file_uris()) > 1
    _dags_test(env, "lakehouse_maintenance")
    after = DeltaTable(str(settings.table_path("bronze.events")))
    # delta-spark's compaction; no vacuum: the files it removed are younger than the
    # retention (168 hours), so VACUUM would delete none of them
    operations = [h["operation"] for h in after.history(after.version() - before.version())]
    assert operations == ["OPTIMIZE"]
    assert len(after.file_uris()) == 1
    assert len(after.to_pandas()) == generated["sources"]["events"]["bronze_rows"]
