"""docker/: no Docker engine runs here, so the compose file is parsed and every service's command
is checked against the project: spark-class runs a class that pyspark's jars hold, lakehouse
commands parse with the real command line, scripts exist and are shipped by the Dockerfile, every
LAKEHOUSE_* variable (the image's ENV and the services') is a valid setting or ignored with its
warning, the image does not run as root, and every server has a healthcheck and a restart
policy."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import zipfile
from pathlib import Path

import pyspark
import pytest
import yaml
from dockerfile_helpers import final_stage, image_env, image_user, workdir

from lakehouse import settings as settings_module
from lakehouse.cli import build_parser
from lakehouse.settings import ENV_PREFIX, PROJECT_VARIABLES, Settings, load_settings
from lakehouse.tools.sqlauth import is_loopback

PROJECT = Path(__file__).resolve().parents[1]
DOCKER = PROJECT / "docker"
SPARK_HOME = Path(pyspark.__file__).parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _dockerfile_copies() -> dict[str, str]:
    """COPY source -> destination (relative to the image's work dir), from the build context
    (not from an earlier build stage)."""
    copies = {}
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            *sources, dest = line.split()[1:]
            for source in sources:
                copies[source] = dest
    return copies


def _jar_classes() -> set[str]:
    classes = set()
    for jar in (SPARK_HOME / "jars").glob("spark-*.jar"):
        with zipfile.ZipFile(jar) as archive:
            classes.update(
                n[: -len(".class")].replace("/", ".")
                for n in archive.namelist()
                if n.endswith(".class")
            )
    return classes


def _pipeline_services(compose) -> dict:
    """The services on the project's image (all but the Kafka broker)."""
    return {k: v for k, v in compose["services"].items() if k != "kafka"}


def test_the_compose_services(compose):
    assert set(compose["services"]) == {"spark-master", "spark-worker", "sql", "scheduler", "kafka"}
    for name, service in _pipeline_services(compose).items():
        build = service["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == (
            DOCKER / "Dockerfile"
        ), name
        assert "lake:/lake" in service["volumes"], f"{name} must share the lake root"
    assert compose["services"]["spark-worker"]["deploy"]["replicas"] >= 2


def test_every_command_refers_to_something_that_exists(compose):
    classes = None
    copies = _dockerfile_copies()
    for name, service in _pipeline_services(compose).items():
        command = service["command"]
        program, args = command[0], command[1:]
        if program == "spark-class":
            assert (SPARK_HOME / "bin" / "spark-class").is_file()
            classes = classes or _jar_classes()
            assert args[0] in classes, f"{name}: {args[0]} is not in pyspark's jars"
        elif program == "lakehouse":
            parsed = build_parser().parse_args(args)  # exits on an unknown command or flag
            assert parsed.func.__name__ == "cmd_" + args[0].replace("-", "_"), name
        elif program == "bash":
            script = PROJECT / args[0]
            assert script.is_file(), f"{name}: {args[0]} does not exist"
            assert copies.get(args[0]) == f"./{args[0]}", f"{name}: the image lacks {args[0]}"
            syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert syntax.returncode == 0, syntax.stderr
        else:
            pytest.fail(f"{name}: unexpected program {program!r}")


def test_the_environment_is_valid_settings_pointing_at_the_master(compose):
    master = compose["services"]["spark-master"]["command"]
    host, port = master[master.index("--host") + 1], master[master.index("--port") + 1]
    kafka = compose["services"]["kafka"]["environment"]
    # the broker's listener for other containers, as the jobs' settings name it
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")[0].removeprefix("PLAINTEXT://")
    for name, service in _pipeline_services(compose).items():
        # what the container sees: the image's ENV, then the service's environment
        env = {**image_env(), **{k: str(v) for k, v in service["environment"].items()}}
        settings = load_settings(config_path=PROJECT / "conf" / "lakehouse.toml", env=env)
        assert settings.master == f"spark://{host}:{port}", name
        assert settings.root == Path("/lake"), name
        assert settings.profile == "cluster", name
        assert settings.kafka.bootstrap_servers == advertised, name
    worker = compose["services"]["spark-worker"]["command"]
    assert worker[-1] == f"spark://{host}:{port}"
    # the DAGs' spark-submit tasks get the master from their Airflow connection
    scheduler = compose["services"]["scheduler"]["environment"]
    connection = json.loads(scheduler["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert connection == {"conn_type": "spark", "host": f"spark://{host}", "port": int(port)}


def test_the_dockerfile_ships_what_the_image_runs():
    text = (DOCKER / "Dockerfile").read_text()
    for source in _dockerfile_copies():
        assert (PROJECT / source).exists(), f"COPY {source}: not in the project"
    # every package the project installs is copied before `pip install .`
    packages = re.search(r"include = \[(.*?)\]", (PROJECT / "pyproject.toml").read_text())[1]
    install_at = text.index("pip install --no-cache-dir .")
    for package in re.findall(r'"(\w+)\*"', packages):
        assert text.index(f"COPY {package} ") < install_at, package
    assert "FROM python:3.11" in text and "openjdk-17" in text
    # delta-spark's jars come from the project's own pom, as with `make setup`, into
    # the folder the image's settings point at
    assert "COPY jars/pom.xml ./jars/pom.xml" in text
    assert "-f jars/pom.xml dependency:copy-dependencies" in text
    assert "COPY --from=jars /build/jars/lib ./jars/lib" in text
    # with the JDBC server's guard and login, built from jars/sql as make setup builds it
    assert "COPY jars/sql ./jars/sql" in text
    assert "-f jars/sql/pom.xml package" in text
    assert "cp jars/sql/target/lakehouse-sql.jar jars/lib/lakehouse-sql.jar" in text
    assert "ENV LAKEHOUSE_NATIVE__JARS_DIR=/opt/lakehouse/jars/lib" in text
    # the Airflow the image installs is the one the Makefile installs and the tests use, with
    # the same Apache Spark provider, and the project (without its dependencies) for the DAGs
    makefile = (PROJECT / "Makefile").read_text()
    airflow = re.search(r"AIRFLOW_VERSION := (\S+)", makefile)[1]
    assert f'"apache-airflow=={airflow}"' in text
    provider = re.search(r"AIRFLOW_SPARK_PROVIDER_VERSION := (\S+)", makefile)[1]
    assert f'"apache-airflow-providers-apache-spark=={provider}"' in text
    assert "/opt/airflow-venv/bin/pip install --no-cache-dir --no-deps ." in text


def test_the_kafka_service_is_the_broker_the_project_runs_locally(compose):
    """Apache Kafka's image at the version of the jars `lakehouse kafka start` runs, in KRaft
    mode with one voter: itself."""
    kafka = compose["services"]["kafka"]
    version = re.search(
        r"<kafka.version>(.+)</kafka.version>", (PROJECT / "jars" / "kafka" / "pom.xml").read_text()
    )[1]
    assert kafka["image"] == f"apache/kafka:{version}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "kafka:/var/lib/kafka/data" in kafka["volumes"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which variables this process was warned about already."""
    monkeypatch.setattr(settings_module, "_WARNED", set(), raising=False)


def test_every_lakehouse_variable_of_the_image_is_a_setting_or_ignored_with_a_warning(
    fresh_warnings, caplog
):
    """The image's ENV lines must not stop a command (LAKEHOUSE_HOME did: "unknown setting
    'home'"): each LAKEHOUSE_* one is a setting, one of the project's own variables, or ignored
    with its warning. LAKEHOUSE_CONFIG names the settings file the image holds."""
    env = image_env()
    variables = [key for key in env if key.startswith(ENV_PREFIX)]
    assert variables
    with caplog.at_level(logging.WARNING, logger="lakehouse.settings"):
        load_settings(config_path=PROJECT / "conf" / "lakehouse.toml", env=env)
    warned = " ".join(r.getMessage() for r in caplog.records)
    sections = set(Settings.__dataclass_fields__)
    for key in variables:
        name = key[len(ENV_PREFIX) :]
        first = name.lower().split("__")[0]
        assert name in PROJECT_VARIABLES or first in sections or key in warned, key
    config = env[ENV_PREFIX + "CONFIG"]
    copies = _dockerfile_copies()
    relative = Path(config).relative_to(workdir())
    assert copies.get(relative.parts[0]) == f"./{relative.parts[0]}", f"the image lacks {config}"
    assert (PROJECT / relative).is_file(), config


def test_the_jdbc_server_checks_logins_against_a_mounted_secret(compose):
    """The sql service binds beyond loopback: its settings name a password file, the secret
    sql_users mounted where they say (a file of the project's folder docker/, which git
    ignores), and it runs as the image's user."""
    sql = compose["services"]["sql"]
    command = sql["command"]
    assert not is_loopback(command[command.index("--host") + 1])
    env = {**image_env(), **{k: str(v) for k, v in sql["environment"].items()}}
    settings = load_settings(config_path=PROJECT / "conf" / "lakehouse.toml", env=env)
    assert settings.sql.auth_file == "/run/secrets/sql_users"
    assert sql["secrets"] == ["sql_users"]
    assert compose["secrets"]["sql_users"] == {"file": "./sql_users"}
    assert "docker/sql_users" in (PROJECT / ".gitignore").read_text().splitlines()
    assert "user" not in sql


def test_the_image_does_not_run_as_root(compose):
    """USER names a user the Dockerfile creates, not root; it owns the folders the processes
    write: the work dir and every volume's mount point of the services on the image."""
    user = image_user()
    assert user is not None, "the image has no USER: it runs as root"
    name = user.split(":")[0]
    assert name not in ("root", "0"), user
    creates = [line for line in final_stage() if "useradd" in line]
    assert creates, "the Dockerfile creates no user"
    if name.isdigit():
        assert f"--uid {name}" in creates[0], creates[0]
    owned = set()
    for line in final_stage():
        for command in re.split(r"&&|;", line.removeprefix("RUN ")):
            words = shlex.split(command)
            if words and words[0] == "chown":
                owned.update(w.rstrip("/") for w in words[2:] if not w.startswith("-"))
    mounts = {
        volume.split(":")[1]
        for service in _pipeline_services(compose).values()
        for volume in service["volumes"]
    }
    for folder in sorted(mounts | {workdir()}):
        assert folder in owned, f"{folder} is not chown-ed to the image's user"


def _checked_port(service: dict) -> int:
    """The local port a service's healthcheck connects to."""
    text = " ".join(service["healthcheck"]["test"])
    match = re.search(r"127\.0\.0\.1(?::|',\s*)(\d+)", text)
    assert match, f"the healthcheck does not connect to 127.0.0.1: {text}"
    return int(match[1])


def _flag(command: list[str], flag: str) -> int:
    return int(command[command.index(flag) + 1])


def test_every_server_has_a_healthcheck_on_its_own_port_and_a_restart_policy(compose):
    services = compose["services"]
    for name, service in services.items():
        restart = service.get("restart", "no")
        assert restart in ("always", "unless-stopped") or restart.startswith("on-failure"), name
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"
        if check["test"][1:3] == ["python", "-c"]:
            compile(check["test"][3], f"{name} healthcheck", "exec")
    assert _checked_port(services["spark-master"]) == _flag(
        services["spark-master"]["command"], "--webui-port"
    )
    assert _checked_port(services["spark-worker"]) == _flag(
        services["spark-worker"]["command"], "--webui-port"
    )
    assert _checked_port(services["sql"]) == _flag(services["sql"]["command"], "--port")
    script = (PROJECT / services["scheduler"]["command"][1]).read_text()
    api_port = int(re.search(r"api-server --port (\d+)", script)[1])
    assert _checked_port(services["scheduler"]) == api_port
    listeners = services["kafka"]["environment"]["KAFKA_LISTENERS"]
    assert _checked_port(services["kafka"]) == int(re.search(r"PLAINTEXT://:(\d+)", listeners)[1])


def test_a_service_starts_when_those_it_needs_are_healthy(compose):
    """depends_on with conditions, not plain lists (which wait for a container to start, not
    for its server to serve); a service waited on as healthy has a healthcheck."""
    services = compose["services"]
    for name, service in services.items():
        needs = service.get("depends_on", {})
        assert isinstance(needs, dict), f"{name}: depends_on is a plain list"
        for other, how in needs.items():
            assert how["condition"] == "service_healthy", f"{name} on {other}"
            assert "healthcheck" in services[other], f"{name} waits on {other}, unchecked"
    assert set(services["spark-worker"]["depends_on"]) == {"spark-master"}
    assert set(services["sql"]["depends_on"]) == {"spark-master"}
    assert set(services["scheduler"]["depends_on"]) == {"spark-master", "spark-worker"}
