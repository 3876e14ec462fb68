# make demo: set up (once) and run the main job on the native Delta backend (delta-spark).
# make test: set up (once) and run the default test suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ROOT ?= ./lakehouse-data
# the slowest tests of a run, printed after it: where a suite's minutes go (DURATIONS= for none)
DURATIONS ?= --durations=10

JARS_DIR := jars/lib
JARS_STAMP := $(JARS_DIR)/.fetched

AIRFLOW_VENV := .venv-airflow
AIRFLOW_VERSION := 3.3.2
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed

.PHONY: setup jars airflow-setup scheduler demo test test-slow test-e2e test-faults test-matrix test-all lint bench bench-storage check-java clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The JVM jars of the native backend (delta-spark, Spark's Kafka connector), fetched with Maven
# from jars/pom.xml once, and again only when the pom changes. Without Maven the Python side is
# still set up and the embedded backend works; the native one says what to install.
$(JARS_STAMP): jars/pom.xml
	@if ! command -v mvn >/dev/null 2>&1; then \
	  echo "warning: mvn not found: the native Delta backend (the default) needs its jars; install Maven (e.g. apt-get install maven) and run make setup again, or use --backend embedded"; \
	else \
	  echo "fetching the delta-spark jars with Maven into $(JARS_DIR) (once)"; \
	  rm -rf $(JARS_DIR).tmp && \
	  if ! mvn -q -B -Dstyle.color=never -f jars/pom.xml dependency:copy-dependencies \
	      -DincludeScope=runtime -DoutputDirectory=lib.tmp > jars/mvn.log 2>&1; then \
	    cat jars/mvn.log; echo "error: Maven could not fetch the jars (log: jars/mvn.log)"; exit 1; \
	  fi; \
	  rm -rf $(JARS_DIR) && mv $(JARS_DIR).tmp $(JARS_DIR) && touch $(JARS_STAMP); \
	fi

jars: $(JARS_STAMP)

setup: $(STAMP) $(JARS_STAMP)

# Apache Airflow lives in its own virtual environment (its dependency tree is not ours); the
# DAGs import only lakehouse.settings and run the tools of .venv.
$(AIRFLOW_STAMP):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11"; exit 1; }
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install --quiet "apache-airflow==$(AIRFLOW_VERSION)"
	@touch $(AIRFLOW_STAMP)

airflow-setup: $(AIRFLOW_STAMP)

# Airflow's all-in-one mode on this machine (UI on http://localhost:8080), the DAGs running
# the tools of .venv on the lake ROOT.
scheduler: setup airflow-setup check-java
	AIRFLOW_HOME=$${AIRFLOW_HOME:-$(CURDIR)/.airflow} \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/orchestration/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	LAKEHOUSE_ROOT=$(abspath $(ROOT)) \
	LAKEHOUSE_SCHEDULER__BIN_DIR=$(CURDIR)/$(BIN) \
	$(AIRFLOW_VENV)/bin/airflow standalone

check-java:
	@$(BIN)/python -c "from lakehouse.javacheck import check_java, JavaError; import sys; \
	exec('try:\n check_java()\nexcept JavaError as e:\n print(\"error:\", e); sys.exit(1)')"

demo: setup check-java
	$(BIN)/lakehouse demo --root $(ROOT)

test: setup check-java
	$(BIN)/pytest -m "not slow and not e2e and not faults and not matrix" -q $(DURATIONS)

test-slow: setup check-java
	$(BIN)/pytest -m "slow" -q $(DURATIONS)

test-e2e: setup check-java airflow-setup
	$(BIN)/pytest -m "e2e" -q $(DURATIONS)

test-faults: setup check-java
	$(BIN)/pytest -m "faults" -q $(DURATIONS)

test-matrix: setup check-java
	$(BIN)/pytest -m "matrix" -q $(DURATIONS)

test-all: setup check-java airflow-setup
	$(BIN)/pytest -q $(DURATIONS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# the benchmark suite: 1,000,000 events, every layer and gold flow, median of 3 (about 80 min)
bench: setup check-java
	$(BIN)/python bench/run.py

bench-storage: setup check-java
	$(BIN)/python bench/storage.py

clean:
	rm -rf $(ROOT) .airflow spark-warehouse metastore_db derby.log .pytest_cache
	# jars/lib stays: `rm -rf jars/lib` fetches the jars again at the next make setup
