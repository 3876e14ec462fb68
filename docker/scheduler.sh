#!/usr/bin/env bash
# The Airflow side of the compose file: metadata database, DAG processor, API server (the UI, on
# port 8081) and scheduler in one container. The DAGs are orchestration/dags/lakehouse_dags.py.
set -euo pipefail
airflow=/opt/airflow-venv/bin/airflow
"$airflow" db migrate
"$airflow" dag-processor &
"$airflow" api-server --port 8081 &
"$airflow" scheduler &
# one process dying takes the container down, so the orchestrator restarts it whole
wait -n
exit 1
