# make demo: set up (once) and run the main job (Delta tables through delta-spark).
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
# the JDBC server's read-only guard and login (Java, jars/sql), built into the jars folder
SQL_JAR := $(JARS_DIR)/lakehouse-sql.jar
SQL_SOURCES := jars/sql/pom.xml $(shell find jars/sql/src -type f 2>/dev/null)
# Apache Kafka's broker (lakehouse kafka start), in a folder of its own: never on Spark's classpath
KAFKA_JARS_DIR := jars/kafka-lib
KAFKA_JARS_STAMP := $(KAFKA_JARS_DIR)/.fetched
# the driver JVM's class archive (lakehouse/class_archive.py, make class-archive), beside the jars
CLASS_ARCHIVE := $(JARS_DIR)/classes.jsa

# SeaweedFS's weed command (lakehouse objectstore: an S3 store on loopback for the tests and
# the demo), built once from the Go module proxy: `go install` refuses the command (its go.mod
# has replace directives), so the module is downloaded and `go build ./weed` runs in a copy.
# About 10 CPU-minutes the first time; Go's module and build caches keep the work, so a fresh
# clone on the same machine builds it again in a minute or so. Without Go, a warning.
WEED_MODULE := github.com/seaweedfs/seaweedfs
WEED_VERSION := v0.0.0-20261109003541-7506e5f91cd6
WEED_DIR := build/weed
WEED := $(WEED_DIR)/weed

AIRFLOW_VENV := .venv-airflow
AIRFLOW_VERSION := 3.3.2
# SparkSubmitOperator (the DAGs' layer tasks); 6.3.4 needs apache-airflow>=2.11 and brings only
# Spark Connect's client (pyspark-client), not Spark: spark-submit is the project's
AIRFLOW_SPARK_PROVIDER_VERSION := 6.3.4
# named after the versions: a venv made before the provider was added gets it at the next make
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed-$(AIRFLOW_VERSION)-spark-$(AIRFLOW_SPARK_PROVIDER_VERSION)

.PHONY: setup jars objectstore-setup airflow-setup scheduler demo test test-slow test-e2e test-faults test-full test-all coverage lint bench bench-storage check-java class-archive clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# --no-compile: Python compiles a module when it is first imported, and keeps it; pip compiling
# every module of every package was about half of the install (52 s against 29 s here for
# .venv, 72 s against 35 s for .venv-airflow, whose modules are mostly never imported)
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	@touch $(STAMP)

# JVM jars fetched with Maven from a pom, once, and again only when the pom changes:
# $(call fetch_jars,POM,DIR,WHAT). Without Maven the Python side is still set up; the jobs, and
# the Kafka broker, then say what to install (or set native.jars_packages: Spark fetches them).
define fetch_jars
	@if ! command -v mvn >/dev/null 2>&1; then \
	  echo "warning: mvn not found: $(3) cannot be fetched; install Maven (e.g. apt-get install maven) and run make setup again"; \
	else \
	  echo "fetching $(3) with Maven into $(2) (once)"; \
	  rm -rf $(2).tmp && \
	  if ! mvn -q -B -Dstyle.color=never -f $(1) dependency:copy-dependencies \
	      -DincludeScope=runtime -DoutputDirectory=$(abspath $(2)).tmp > $(2).log 2>&1; then \
	    cat $(2).log; echo "error: Maven could not fetch the jars (log: $(2).log)"; exit 1; \
	  fi; \
	  rm -rf $(2) && mv $(2).tmp $(2) && touch $(2)/.fetched; \
	fi
endef

# delta-spark and Spark's Kafka connector
$(JARS_STAMP): jars/pom.xml
	$(call fetch_jars,jars/pom.xml,$(JARS_DIR),the jars of delta-spark and Spark's Kafka source)

$(KAFKA_JARS_STAMP): jars/kafka/pom.xml
	$(call fetch_jars,jars/kafka/pom.xml,$(KAFKA_JARS_DIR),the jars of the Kafka broker (lakehouse kafka start))

# lakehouse serve-sql's read-only guard and login: compiled (and its JUnit tests run) by Maven
# against the Spark and Hive jars pyspark ships, which Maven Central has at the same versions
# (`provided`: nothing more is copied), then put beside delta-spark's jars; again when its pom
# or a source changes, or after the folder is fetched anew. About 8 s once Maven's cache holds
# what it needs (the first time it downloads about 60 MB of them).
# A jar of the project's own Java (jars/NAME: pom.xml and src/), built with `mvn package`
# (which runs its JUnit tests, if any) and copied beside delta-spark's jars:
# $(call build_jar,NAME,JAR,WHAT). Without Maven, a warning.
define build_jar
	@if ! command -v mvn >/dev/null 2>&1; then \
	  echo "warning: mvn not found: $(3) (jars/$(1)) cannot be built; install Maven (e.g. apt-get install maven) and run make setup again"; \
	elif [ -d $(JARS_DIR) ]; then \
	  echo "building $(3) (jars/$(1)) with Maven into $(JARS_DIR)"; \
	  if ! mvn -q -B -Dstyle.color=never -f jars/$(1)/pom.xml package > jars/$(1).log 2>&1; then \
	    cat jars/$(1).log; echo "error: Maven could not build jars/$(1) (log: jars/$(1).log)"; exit 1; \
	  fi; \
	  cp jars/$(1)/target/$(notdir $(2)) $(2); \
	fi
endef

$(SQL_JAR): $(JARS_STAMP) $(SQL_SOURCES)
	$(call build_jar,sql,$(SQL_JAR),lakehouse serve-sql's guard and login)

# Delta's log on S3 with put-if-absent commits (jars/logstore: a LogStore on Delta's public
# interface), built like the guard above and put beside delta-spark's jars
LOGSTORE_JAR := $(JARS_DIR)/lakehouse-logstore.jar
LOGSTORE_SOURCES := jars/logstore/pom.xml $(shell find jars/logstore/src -type f 2>/dev/null)
$(LOGSTORE_JAR): $(JARS_STAMP) $(LOGSTORE_SOURCES)
	$(call build_jar,logstore,$(LOGSTORE_JAR),Delta's S3 log store)

# The classes a Spark driver loads, parsed and verified once and mapped by every later driver
# (Java's class data sharing), for machines that start many short drivers (scheduled runs, the
# CLI): `make class-archive`, once and again when the packages or the jars change. The demo on a
# few thousand events records it, about 3 minutes. `lakehouse run --layer bronze` on a small lake
# took 22.5 s with it against 31.3 s (medians of 3); CI's test steps took as long with it as
# without, so `make setup` leaves it out. Without Java or the jars it is not recorded.
$(CLASS_ARCHIVE): $(STAMP) $(JARS_STAMP) $(SQL_JAR) $(LOGSTORE_JAR)
	@if ! command -v java >/dev/null 2>&1 || [ ! -f $(JARS_STAMP) ]; then \
	  echo "warning: no Java or no jars: the driver JVM's class archive is not recorded"; \
	else \
	  $(BIN)/python -m lakehouse.class_archive; \
	fi

class-archive: setup check-java $(CLASS_ARCHIVE)

jars: $(JARS_STAMP) $(KAFKA_JARS_STAMP) $(SQL_JAR) $(LOGSTORE_JAR)

# the binary, built again when it is missing or WEED_VERSION changes (its version file is newer)
$(WEED_DIR)/.version-$(WEED_VERSION):
	@mkdir -p $(WEED_DIR) && rm -f $(WEED_DIR)/.version-* && touch $@

$(WEED): $(WEED_DIR)/.version-$(WEED_VERSION)
	@if ! command -v go >/dev/null 2>&1; then \
	  echo "warning: go not found: SeaweedFS's weed command (lakehouse objectstore) cannot be built; install Go 1.26 and run make setup again"; \
	else \
	  echo "building SeaweedFS's weed command into $(WEED) (once; about 10 CPU-minutes the first time on a machine)"; \
	  src=$$(cd /tmp && GOFLAGS= go mod download -json $(WEED_MODULE)@$(WEED_VERSION) 2> $(CURDIR)/$(WEED_DIR)/build.log | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	  if [ -z "$$src" ]; then \
	    cat $(WEED_DIR)/build.log; echo "error: go could not download $(WEED_MODULE)@$(WEED_VERSION) (log: $(WEED_DIR)/build.log)"; exit 1; \
	  fi; \
	  rm -rf $(WEED_DIR)/src $(WEED_DIR)/weed.tmp && cp -r "$$src" $(WEED_DIR)/src && chmod -R u+w $(WEED_DIR)/src || exit 1; \
	  if ! (cd $(WEED_DIR)/src && GOFLAGS=-buildvcs=false go build -ldflags="-s -w" -o ../weed.tmp ./weed) > $(WEED_DIR)/build.log 2>&1; then \
	    tail -20 $(WEED_DIR)/build.log; echo "error: go could not build weed (log: $(WEED_DIR)/build.log)"; exit 1; \
	  fi; \
	  mv $(WEED_DIR)/weed.tmp $(WEED) && rm -rf $(WEED_DIR)/src; \
	fi

objectstore-setup: $(WEED)

setup: $(STAMP) $(JARS_STAMP) $(KAFKA_JARS_STAMP) $(SQL_JAR) $(LOGSTORE_JAR) $(WEED)

# Apache Airflow lives in its own virtual environment (its dependency tree is not ours), with
# the Apache Spark provider, and the project without its dependencies: the DAG file imports only
# lakehouse's standard-library modules (settings, jars, dist, declared) and runs .venv's
# spark-submit and lakehouse.
$(AIRFLOW_STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11"; exit 1; }
	test -x $(AIRFLOW_VENV)/bin/pip || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install --quiet --no-compile "apache-airflow==$(AIRFLOW_VERSION)" \
	  "apache-airflow-providers-apache-spark==$(AIRFLOW_SPARK_PROVIDER_VERSION)"
	$(AIRFLOW_VENV)/bin/pip install --quiet --no-compile --no-deps -e .
	@touch $(AIRFLOW_STAMP)

airflow-setup: $(AIRFLOW_STAMP)

# Airflow's all-in-one mode on this machine (UI on http://localhost:8080), the DAGs running
# the tools of .venv on the lake ROOT; their spark-submit tasks' connection holds SPARK_MASTER
# (unless AIRFLOW_CONN_SPARK_DEFAULT says otherwise).
SPARK_MASTER ?= local[*]
scheduler: setup airflow-setup check-java
	AIRFLOW_CONN_SPARK_DEFAULT=$${AIRFLOW_CONN_SPARK_DEFAULT:-'{"conn_type": "spark", "host": "$(SPARK_MASTER)"}'} \
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

# CI's set is every test not marked full: `make test` (the default suite), then the slow, e2e
# and faults steps (.ci/run). What CI leaves out (the rest of the matrices, the full sizes)
# is marked full: `make test-full` runs it, `make test-all` everything (docs/development.md
# says which changes need it before they are done).
CI_SET := not full

test: setup check-java
	$(BIN)/pytest -m "not slow and not e2e and not faults and not full" -q $(DURATIONS)

test-slow: setup check-java
	$(BIN)/pytest -m "slow and not full" -q $(DURATIONS)

test-e2e: setup check-java airflow-setup
	$(BIN)/pytest -m "e2e and not full" -q $(DURATIONS)

test-faults: setup check-java
	$(BIN)/pytest -m "faults and not full" -q $(DURATIONS)

test-full: setup check-java airflow-setup
	$(BIN)/pytest -m "full" -q $(DURATIONS)

test-all: setup check-java airflow-setup
	$(BIN)/pytest -q $(DURATIONS)

# Line and branch coverage of the product code (bronze, silver, gold, lakehouse) by CI's set,
# the processes the tests start included (spark-submit jobs, the commands, Spark's Python
# workers), measured with coverage.py through pytest-cov ([tool.coverage] in pyproject.toml;
# the data file's path is absolute, for the processes that start elsewhere): per file, then
# the total, and .coverage-data/coverage.json
COVERAGE_DATA := $(CURDIR)/.coverage-data
coverage: setup check-java airflow-setup
	rm -rf $(COVERAGE_DATA) && mkdir -p $(COVERAGE_DATA)
	COVERAGE_FILE=$(COVERAGE_DATA)/.coverage $(BIN)/pytest -m "$(CI_SET)" -q --cov \
	  --cov-report=term:skip-covered --cov-report=json:$(COVERAGE_DATA)/coverage.json $(DURATIONS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# the benchmark suite: 1,000,000 events, every layer and gold flow, median of 3 (about 80 min)
bench: setup check-java
	$(BIN)/python bench/run.py

bench-storage: setup check-java
	$(BIN)/python bench/storage.py

clean:
	rm -rf $(ROOT) .airflow spark-warehouse metastore_db derby.log .pytest_cache jars/sql/target .coverage-data
	# jars/lib stays: `rm -rf jars/lib` fetches the jars again at the next make setup
