"""Airflow DAGs of the lakehouse: the pipeline on a schedule and its daily maintenance.

``lakehouse_pipeline`` runs ``[generate] >> bronze >> silver >> gold``, each layer a
``spark-submit jobs/<layer>.py`` in available-now mode (process what is new, then stop), on
settings ``scheduler.schedule``. ``lakehouse_maintenance`` runs ``lakehouse maintain`` (compaction,
vacuum) on ``scheduler.maintenance_schedule``. Retries and their delay come from the settings too.

The DAGs read the project's settings (``conf/lakehouse.toml``, the profile in
``$LAKEHOUSE_PROFILE``, ``LAKEHOUSE_*`` variables) when Airflow parses this file. Only
``lakehouse.settings`` and ``lakehouse.jars`` are imported, which need the standard library alone, so Airflow can live in
its own virtual environment: the tasks run the project's ``spark-submit`` and ``lakehouse`` from
``scheduler.bin_dir``. ``$LAKEHOUSE_HOME`` is the project checkout (default: two folders above
this file); the tasks run there, and a relative lake root is taken from there.

A run of a layer must never overlap another run of itself (one checkpoint, one writer): the
pipeline DAG allows one active run and no catch-up, so a late run is skipped, not queued; the next
run processes everything that arrived meanwhile.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

HOME = Path(os.environ.get("LAKEHOUSE_HOME") or Path(__file__).resolve().parents[2])
if str(HOME) not in sys.path:
    sys.path.insert(0, str(HOME))

from airflow.providers.standard.operators.bash import BashOperator  # noqa: E402
from airflow.sdk import DAG  # noqa: E402

from lakehouse.jars import NativeJarsMissing, spark_submit_args  # noqa: E402
from lakehouse.settings import duration_seconds, load_settings  # noqa: E402

LAYERS = ("bronze", "silver", "gold")
START = datetime(2026, 1, 1, tzinfo=UTC)


def _settings():
    config = os.environ.get("LAKEHOUSE_CONFIG") or HOME / "conf" / "lakehouse.toml"
    return load_settings(config_path=config)


def _tool(settings, name: str) -> str:
    folder = settings.scheduler.bin_dir
    return str(Path(folder) / name) if folder else name


def _common_args(settings) -> str:
    root = settings.root if settings.root.is_absolute() else HOME / settings.root
    return f"--root {shlex.quote(str(root))} --profile {shlex.quote(settings.profile)}"


def _jars_args(settings) -> str:
    """The project's log4j2 file for the driver, and ``--jars ...`` of delta-spark: the
    driver and the executors load Delta from them. Without them (no `make setup` yet) the job
    itself says what is missing, in one line, instead of the DAG file failing to load."""
    try:
        return " ".join(shlex.quote(a) for a in spark_submit_args(settings))
    except NativeJarsMissing:
        return ""


def _default_args(settings) -> dict:
    return {
        "owner": "lakehouse",
        "retries": settings.scheduler.retries,
        "retry_delay": timedelta(seconds=duration_seconds(settings.scheduler.retry_delay)),
    }


def _task_env(settings) -> dict[str, str]:
    """spark-submit runs the driver with ``$PYSPARK_PYTHON``: the project's interpreter, not
    Airflow's (whose environment does not have pyspark's dependencies)."""
    env = {"PYSPARK_PYTHON": _tool(settings, "python") if settings.scheduler.bin_dir else "python3"}
    env["LAKEHOUSE_PROFILE"] = settings.profile
    return env


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


def build_pipeline_dag(settings) -> DAG:
    args, env = _common_args(settings), _task_env(settings)
    with _dag(
        settings,
        "lakehouse_pipeline",
        "generate (optional) >> bronze >> silver >> gold, available-now",
        settings.scheduler.schedule,
    ) as dag:
        previous = None
        if settings.scheduler.generate_events:
            # one seed per data interval: every run adds new data, a retry writes the same
            seed = "{{ (data_interval_start.int_timestamp // 60) if data_interval_start else 1 }}"
            previous = BashOperator(
                task_id="generate",
                bash_command=f"{shlex.quote(_tool(settings, 'lakehouse'))} generate {args} "
                f"--events {settings.scheduler.generate_events} --seed {seed}",
                cwd=str(HOME),
                env=env,
                append_env=True,
            )
        submit = shlex.quote(_tool(settings, "spark-submit"))
        jars = _jars_args(settings)
        for layer in LAYERS:
            task = BashOperator(
                task_id=layer,
                bash_command=f"{submit} --master {shlex.quote(settings.master)} "
                + (f"{jars} " if jars else "")
                + f"jobs/{layer}.py {args} --trigger available-now",
                cwd=str(HOME),
                env=env,
                append_env=True,
            )
            if previous is not None:
                previous >> task
            previous = task
    return dag


def build_maintenance_dag(settings) -> DAG:
    with _dag(
        settings,
        "lakehouse_maintenance",
        "lakehouse maintain: compact small files, vacuum unreferenced ones",
        settings.scheduler.maintenance_schedule,
    ) as dag:
        BashOperator(
            task_id="maintain",
            bash_command=f"{shlex.quote(_tool(settings, 'lakehouse'))} maintain "
            f"{_common_args(settings)}",
            cwd=str(HOME),
            env=_task_env(settings),
            append_env=True,
        )
    return dag


_SETTINGS = _settings()
pipeline = build_pipeline_dag(_SETTINGS)
maintenance = build_maintenance_dag(_SETTINGS)
