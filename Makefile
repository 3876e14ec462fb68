# make demo: set up (once) and run the main job on the embedded backend.
# make test: set up (once) and run the default test suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ROOT ?= ./lakehouse-data

.PHONY: setup demo test test-slow test-e2e test-all lint bench-storage check-java clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

check-java:
	@$(BIN)/python -c "from lakehouse.javacheck import check_java, JavaError; import sys; \
	exec('try:\n check_java()\nexcept JavaError as e:\n print(\"error:\", e); sys.exit(1)')"

demo: setup check-java
	$(BIN)/lakehouse demo --root $(ROOT)

test: setup check-java
	$(BIN)/pytest -m "not slow and not e2e" -q

test-slow: setup check-java
	$(BIN)/pytest -m "slow" -q

test-e2e: setup check-java
	$(BIN)/pytest -m "e2e" -q

test-all: setup check-java
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench-storage: setup check-java
	$(BIN)/python bench/storage.py

clean:
	rm -rf $(ROOT) spark-warehouse metastore_db derby.log .pytest_cache
