"""Airflow DAGs of the lakehouse: the pipeline on a schedule and its daily maintenance.

``lakehouse_pipeline`` runs ``package`` (and ``generate``, when ``scheduler.generate_events`` is
set), then ``bronze >> silver >> gold`` on settings ``scheduler.schedule``. ``package`` has the
project installed on the worker pack itself (``lakehouse cluster package``) into a folder
(``scheduler.dist_dir``, default ``<root>/dist``; lakehouse.tools.dist): the code zip, the layers'
entry points, the log4j2 file and the delta-spark jars. Each layer is then a
``SparkSubmitOperator`` of that folder's ``jobs/<layer>.py`` with the zip as ``--py-files``, in
available-now mode (process what is new, then stop), on the Airflow connection
``scheduler.spark_conn_id``, which holds the master. The gold task publishes each gold table as
an Airflow asset, so other DAGs can be scheduled on them. ``lakehouse_maintenance`` runs
``lakehouse maintain`` (compaction, vacuum) on ``scheduler.maintenance_schedule``. Retries and
their delay come from the settings too.

Nothing of a checkout is needed where the tasks run: the project installed (its ``spark-submit``,
``lakehouse`` and Python with the dependencies, in ``scheduler.bin_dir`` or on the PATH) and the
settings file (``$LAKEHOUSE_CONFIG``, passed on to every task). The DAGs read the project's
settings (that file, the profile in ``$LAKEHOUSE_PROFILE``, ``LAKEHOUSE_*`` variables) when
Airflow parses this file, through modules of the project that need the standard library alone:
the project is installed into Airflow's own environment without its dependencies (``make
airflow-setup`` does). The gold tables come from ``lakehouse/declared_tables.json``, which a
test keeps equal to the declarations (importing those would import pyspark). A relative lake
root is taken from the folder Airflow parses the DAGs in: set an absolute ``LAKEHOUSE_ROOT``.

A run of a layer must never overlap another run of itself (one checkpoint, one writer): the
pipeline DAG allows one active run and no catch-up, so a late run is skipped, not queued; the next
run processes everything that arrived meanwhile.
"""

from __future__ import annotations

import os
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset

try:
    from lakehouse.declared import layer_tables
    from lakehouse.jars import NativeJarsMissing, native_jars
    from lakehouse.settings import default_config_path, duration_seconds, load_settings
    from lakehouse.tools import dist
except ImportError as exc:
    raise ImportError(
        "the lakehouse DAGs read the project's settings: install the project into Airflow's "
        "environment without its dependencies (`pip install --no-deps <project>`, as `make "
        f"airflow-setup` does): {exc}"
    ) from exc

LAYERS = ("bronze", "silver", "gold")
START = datetime(2026, 1, 1, tzinfo=UTC)


def _config() -> Path | None:
    """The settings file: ``$LAKEHOUSE_CONFIG``, else ``conf/lakehouse.toml`` here or beside
    the project (lakehouse.settings.default_config_path); None: built-in defaults."""
    path = default_config_path()
    return path.absolute() if path else None


def _tool(settings, name: str) -> str:
    folder = settings.scheduler.bin_dir
    return str(Path(folder) / name) if folder else name


def _lake_args(settings) -> list[str]:
    return ["--root", str(settings.root.absolute()), "--profile", settings.profile]


def _command(settings, *args: str) -> str:
    return " ".join(shlex.quote(a) for a in (_tool(settings, "lakehouse"), *args))


def _default_args(settings) -> dict:
    return {
        "owner": "lakehouse",
        "retries": settings.scheduler.retries,
        "retry_delay": timedelta(seconds=duration_seconds(settings.scheduler.retry_delay)),
    }


def _task_env(settings, config: Path | None) -> dict[str, str]:
    """spark-submit runs the driver with ``$PYSPARK_PYTHON``: the project's interpreter, not
    Airflow's (whose environment does not have pyspark's dependencies). Every task reads the
    settings file the DAGs were built from."""
    env = {"PYSPARK_PYTHON": _tool(settings, "python") if settings.scheduler.bin_dir else "python3"}
    env["LAKEHOUSE_PROFILE"] = settings.profile
    if config is not None:
        env["LAKEHOUSE_CONFIG"] = str(config)
    return env


def _submit_env(settings, config: Path | None) -> dict[str, str]:
    """The provider runs ``spark-submit`` from the PATH (it takes no path to it): the PATH
    with ``scheduler.bin_dir`` first."""
    env = _task_env(settings, config)
    if settings.scheduler.bin_dir:
        inherited = os.environ.get("PATH", os.defpath)
        env["PATH"] = os.pathsep.join([settings.scheduler.bin_dir, inherited])
    return env


def _classpath(settings, packed: dist.Dist) -> dict[str, str]:
    """``jars``: delta-spark's jars as the package task copies them (lakehouse.jars names them),
    or ``packages``: Maven coordinates Spark resolves. Without either (no `make setup` yet) the
    package task says what is missing, in one line, instead of the DAG file failing to load."""
    try:
        jars = native_jars(settings)
    except NativeJarsMissing:
        return {}
    if not jars:
        return {"packages": settings.native.jars_packages}
    return {"jars": ",".join(str(p) for p in packed.jar_paths(jars))}


def table_asset(settings, table: str) -> Asset:
    """A table of the lake as an Airflow asset: named ``layer.table``, at its folder's URI."""
    return Asset(name=table, uri=settings.table_path(table).absolute().as_uri(), group="lakehouse")


def _dag(settings, dag_id: str, description: str, schedule: str) -> DAG:
    """One active run, no catch-up: a run never overlaps another on the same checkpoints."""
    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(settings),
        tags=["lakehouse"],
    )


def build_pipeline_dag(settings, config: Path | None) -> DAG:
    args, env = _lake_args(settings), _task_env(settings, config)
    packed = dist.scheduled(settings)
    with _dag(
        settings,
        "lakehouse_pipeline",
        "package, generate (optional) >> bronze >> silver >> gold, available-now",
        settings.scheduler.schedule,
    ) as dag:
        # the installed project, packed where spark-submit reads it (every run: the zip is the
        # code the worker has now)
        first = [
            BashOperator(
                task_id="package",
                bash_command=_command(
                    settings, "cluster", "package", *args, "--output", str(packed.code)
                ),
                env=env,
                append_env=True,
            )
        ]
        if settings.scheduler.generate_events:
            # one seed per data interval: every run adds new data, a retry writes the same
            seed = "{{ (data_interval_start.int_timestamp // 60) if data_interval_start else 1 }}"
            events = str(settings.scheduler.generate_events)
            first.append(
                BashOperator(
                    task_id="generate",
                    bash_command=_command(settings, "generate", *args, "--events", events)
                    + f" --seed {seed}",
                    env=env,
                    append_env=True,
                )
            )
        previous = first
        for layer in LAYERS:
            task = SparkSubmitOperator(
                task_id=layer,
                conn_id=settings.scheduler.spark_conn_id,
                application=str(packed.job(layer)),
                py_files=str(packed.code),
                **_classpath(settings, packed),
                # the project's log4j2 file for the driver (spark-submit starts its JVM, with
                # Spark's own INFO logging otherwise), then the setting driver_java_options
                conf={"spark.driver.extraJavaOptions": dist.driver_java_options(packed, settings)},
                application_args=[*args, "--trigger", "available-now"],
                env_vars=_submit_env(settings, config),
                name=f"lakehouse-{layer}",
                outlets=[table_asset(settings, t) for t in layer_tables(layer)]
                if layer == "gold"
                else [],
            )
            previous >> task
            previous = task
    return dag


def build_maintenance_dag(settings, config: Path | None) -> DAG:
    with _dag(
        settings,
        "lakehouse_maintenance",
        "lakehouse maintain: compact small files, vacuum unreferenced ones",
        settings.scheduler.maintenance_schedule,
    ) as dag:
        BashOperator(
            task_id="maintain",
            bash_command=_command(settings, "maintain", *_lake_args(settings)),
            env=_task_env(settings, config),
            append_env=True,
        )
    return dag


_CONFIG = _config()
_SETTINGS = load_settings(config_path=_CONFIG)
pipeline = build_pipeline_dag(_SETTINGS, _CONFIG)
maintenance = build_maintenance_dag(_SETTINGS, _CONFIG)
