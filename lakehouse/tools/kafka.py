"""``lakehouse kafka start|stop|status``: Apache Kafka's own broker on this machine's loopback.

One process is broker and controller (KRaft, no ZooKeeper), run with ``java`` from Kafka's jars,
which ``make setup`` fetches with Maven from ``jars/kafka/pom.xml`` into ``jars/kafka-lib/``,
apart from Spark's. Its folder (``--dir``, default ``<root>/kafka``) holds the configuration this
module writes, the data (``data/``, formatted by Kafka's StorageTool on the first start), the
broker's log (``server.log``) and its pid. Production clusters run Kafka elsewhere (the docker
compose file has a ``kafka`` service); the jobs only need ``kafka.bootstrap_servers``, and
``kafka.options`` for a cluster that wants TLS or SASL.

Started with ``users`` (``lakehouse kafka start --sasl``), the broker's one listener is
SASL_PLAINTEXT with the PLAIN mechanism: the users and their passwords go to a JAAS file in its
folder (readable by its owner only), with a user of the broker's own for its inter-broker
connections and for ``lakehouse kafka``'s own calls (:meth:`Broker.client_options`).

Topics and offsets are read with the client of lakehouse.kafka_client (confluent-kafka).
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse import kafka_options
from lakehouse.jars import PROJECT_DIR
from lakehouse.kafka_client import KafkaError, answers, topics
from lakehouse.settings import Settings
from lakehouse.tools.processes import PidFile, Stop, free_port, listening, port_free, stop_group

KAFKA_JARS_DIR = PROJECT_DIR / "jars" / "kafka-lib"
HOST = "127.0.0.1"
# the broker's heap: enough for a test or a laptop's pipeline, small beside Spark's
HEAP = "768m"
# what a fresh broker needs beside its listeners (one node: every internal topic has 1 replica)
BROKER_CONFIG = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "inter.broker.listener.name": "PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # a topic is created on purpose (lakehouse generate --sink kafka), not by a typo
    "auto.create.topics.enable": "false",
    # records up to 2 MB (the producer's limit is set to match)
    "message.max.bytes": str(2 * 1024 * 1024),
}
LOG4J = """status = error
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


# the broker's own SASL user: its inter-broker connections and lakehouse kafka's calls
BROKER_USER = "lakehouse_broker"
_USER = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class Broker:
    """A broker this machine runs: its folder and its client port on loopback."""

    dir: Path
    port: int = 9092

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "broker.pid"

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    @property
    def jaas(self) -> Path:
        """The JAAS file of a broker started with SASL (its users and their passwords)."""
        return self.dir / "jaas.conf"

    def users(self) -> list[str]:
        """The SASL users of the broker (not its own), by name; [] without SASL."""
        found = _jaas_options(self.jaas)
        return sorted(
            k.removeprefix("user_")
            for k in found
            if k.startswith("user_") and k != f"user_{BROKER_USER}"
        )

    def client_options(self) -> dict[str, str]:
        """What a client of this broker needs beside its address (librdkafka's names): with
        SASL, the PLAIN credentials of the broker's own user; {} without."""
        found = _jaas_options(self.jaas)
        if "password" not in found:
            return {}
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": found["username"],
            "sasl.password": found["password"],
        }

    @property
    def process(self) -> PidFile:
        """Its pid file, and what the broker's command line holds: Kafka's main class and the
        path of this folder's server.properties."""
        markers = ("kafka.Kafka", str(self.properties.absolute()))
        return PidFile(self.pid_file, f"the Kafka broker of {self.dir}", markers)

    def pid(self) -> int | None:
        """The broker's pid when it runs (a pid file naming another process does not count)."""
        return self.process.pid()


def broker(settings: Settings, folder: str | Path | None = None, port: int | None = None) -> Broker:
    """The broker of ``lakehouse kafka``: ``folder`` or ``<root>/kafka``; ``port`` or the port
    of ``kafka.bootstrap_servers``."""
    if port is None:
        first = settings.kafka.bootstrap_servers.split(",")[0]
        port = int(first.rpartition(":")[2] or 9092)
    if not 0 < port < 65536:
        raise KafkaError(f"port {port} is not a TCP port (1 to 65535)")
    return Broker(Path(folder) if folder else settings.root / "kafka", port)


def _kafka_jars() -> str:
    if not any(KAFKA_JARS_DIR.glob("kafka_2.13-*.jar")):
        raise KafkaError(
            f"Kafka's jars are missing in {KAFKA_JARS_DIR}: run `make setup` (it fetches them "
            "with Maven from jars/kafka/pom.xml)"
        )
    return str(KAFKA_JARS_DIR / "*")


def _read_properties(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs if not k.lstrip().startswith("#")}


def _write_config(b: Broker, users: Mapping[str, str] | None = None) -> None:
    """server.properties for the broker's port; with ``users`` (name: password), its
    listener SASL_PLAINTEXT with PLAIN and those users, in a JAAS file beside it. The
    controller's port is chosen once, at the first start: the formatted metadata names it as
    the one voter's endpoint."""
    known = _read_properties(b.properties).get("controller.quorum.bootstrap.servers")
    controller = known or f"{HOST}:{free_port(HOST)}"
    listener = "SASL_PLAINTEXT" if users else "PLAINTEXT"
    config = {
        **BROKER_CONFIG,
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": listener,
        "controller.quorum.bootstrap.servers": controller,
        "listeners": f"{listener}://{b.bootstrap},CONTROLLER://{controller}",
        "advertised.listeners": f"{listener}://{b.bootstrap}",
        "log.dirs": str((b.dir / "data").absolute()),
    }
    if users:
        config["sasl.enabled.mechanisms"] = "PLAIN"
        config["sasl.mechanism.inter.broker.protocol"] = "PLAIN"
        _write_jaas(b, users)
    else:
        b.jaas.unlink(missing_ok=True)
    text = "".join(f"{k}={v}\n" for k, v in config.items())
    b.properties.write_text("# written by lakehouse kafka start\n" + text)
    (b.dir / "log4j2.properties").write_text(LOG4J.format(log=b.log.absolute()))


def _write_jaas(b: Broker, users: Mapping[str, str]) -> None:
    """The JAAS file of the SASL listener: PLAIN, the users, and the broker's own user (a new
    password at each start), readable by its owner only."""
    own = secrets.token_urlsafe(24)

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    options = [f"username={quoted(BROKER_USER)}", f"password={quoted(own)}"]
    options += [f"user_{name}={quoted(pw)}" for name, pw in {BROKER_USER: own, **users}.items()]
    text = (
        "// written by lakehouse kafka start --sasl: the users of the SASL/PLAIN listener\n"
        "KafkaServer {\n"
        f"  {kafka_options.PLAIN_MODULE} required\n"
        + "".join(f"  {option}\n" for option in options)
        + "  ;\n};\n"
    )
    b.jaas.unlink(missing_ok=True)
    fd = os.open(b.jaas, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _jaas_options(path: Path) -> dict[str, str]:
    """The options of the login module in a JAAS file written by :func:`_write_jaas`."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    body = text.partition("{")[2].rpartition("}")[0]
    parsed = kafka_options.parse_jaas(" ".join(body.split()))
    return parsed[1] if parsed else {}


def sasl_users(settings: Settings, users_file: str | Path | None) -> dict[str, str]:
    """The users of a broker started with SASL (name: password): from ``users_file``
    (``name=password`` lines), else the PLAIN credentials of the settings' client options, so
    that the lake's own clients are let in."""
    if users_file:
        path = Path(users_file)
        try:
            users = kafka_options.read_properties(path)
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not a text file"
            raise KafkaError(f"cannot read the users file {path}: {why}") from None
        if not users:
            raise KafkaError(f"the users file {path} names no user (lines name=password)")
    else:
        client = settings.kafka.client_options()
        if client.get("sasl.mechanism") != "PLAIN" or "sasl.username" not in client:
            raise KafkaError(
                "--sasl needs its users: give --users FILE (lines name=password), or PLAIN "
                "credentials in kafka.options (sasl.mechanism PLAIN, and sasl.jaas.config or "
                "sasl.username and sasl.password)"
            )
        users = {client["sasl.username"]: client["sasl.password"]}
    for name in users:
        if not _USER.match(name) or name == BROKER_USER:
            raise KafkaError(
                f"user name {name!r} cannot be used: letters, digits, '_', '.' and '-', starting "
                f"with a letter, and not {BROKER_USER} (the broker's own)"
            )
    return users


def _format(java: str, b: Broker) -> None:
    """Kafka's StorageTool, once: a new cluster id, this node the one controller voter."""
    if (b.dir / "data" / "meta.properties").exists():
        return
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    command = [java, "-cp", _kafka_jars(), "kafka.tools.StorageTool", "format", "--standalone"]
    # (an id may start with "-": given as --cluster-id=ID, not read as an option)
    command += [f"--cluster-id={cluster_id}", "-c", str(b.properties)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KafkaError(f"Kafka's StorageTool could not format {b.dir / 'data'}: {last[0]}")


def _failure(b: Broker) -> str:
    """The broker log's first ERROR line, for a start-up that went wrong."""
    lines = b.log.read_text(errors="replace").splitlines() if b.log.exists() else []
    errors = [line for line in lines if "] ERROR " in line or "] FATAL " in line]
    return (errors or lines[-1:] or ["no log line"])[0]


START_TIMEOUT_S = 90.0


def start(
    b: Broker, timeout_s: float = START_TIMEOUT_S, users: Mapping[str, str] | None = None
) -> tuple[int, bool]:
    """Start the broker in the background and wait until it serves metadata; (pid, whether
    this call started it: False when it ran already). With ``users`` (name: password) its
    listener is SASL_PLAINTEXT with PLAIN, and those users are the ones let in."""
    from lakehouse.javacheck import check_java

    running = b.pid()
    if running is not None:
        if not answers(b.bootstrap, options=b.client_options()):
            raise KafkaError(
                f"a broker from {b.dir} runs (pid {running}) but does not answer at "
                f"{b.bootstrap}; `lakehouse kafka stop --dir {b.dir}` and start it again"
            )
        return running, False
    b.pid_file.unlink(missing_ok=True)  # (stale, if any: it names no broker of this folder)
    java = check_java()
    jars = _kafka_jars()
    if not port_free(HOST, b.port):
        raise KafkaError(
            f"port {b.port} on {HOST} is in use by another process; choose another with --port"
        )
    b.dir.mkdir(parents=True, exist_ok=True)
    _write_config(b, users)
    _format(java, b)
    command = [java, f"-Xms{HEAP}", f"-Xmx{HEAP}", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
    command += [f"-Dlog4j2.configurationFile=file:{(b.dir / 'log4j2.properties').absolute()}"]
    if users:
        command += [f"-Djava.security.auth.login.config={b.jaas.absolute()}"]
    command += ["-cp", jars, "kafka.Kafka", str(b.properties.absolute())]
    with (b.dir / "stdout.log").open("ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=b.dir, start_new_session=True
        )
    b.pid_file.write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    while not (listening(HOST, b.port) and answers(b.bootstrap, 2, b.client_options())):
        code = process.poll()
        if code is not None:
            b.pid_file.unlink(missing_ok=True)
            raise KafkaError(
                f"the broker exited during start-up (exit code {code}): {_failure(b)} "
                f"(log: {b.log})"
            )
        if time.monotonic() > deadline:
            stop_group(process.pid, 10)
            b.pid_file.unlink(missing_ok=True)
            raise KafkaError(f"the broker did not come up within {timeout_s:g} s (log: {b.log})")
        time.sleep(0.3)
    return process.pid, True


def stop(b: Broker, timeout_s: float = 60) -> Stop:
    """Stop the broker (a controlled shutdown on SIGTERM, SIGKILL after ``timeout_s``): its
    pid, or None when it was not running; a pid file naming another process stops nothing, is
    removed, and what it named is said (:class:`lakehouse.tools.processes.PidFile`)."""
    return b.process.stop(timeout_s)


def status_lines(b: Broker) -> list[str]:
    """What ``lakehouse kafka status`` prints: the broker, then a line per topic."""
    pid = b.pid()
    if pid is None:
        return [f"kafka: not running (folder {b.dir})"]
    lines = [f"kafka: running (pid {pid}) at {b.bootstrap}{sasl_note(b)}, data and log in {b.dir}"]
    found = topics(b.bootstrap, options=b.client_options())
    width = max((len(t.topic) for t in found), default=0)
    for t in found:
        ends = " ".join(f"{p}:{end}" for p, end in enumerate(t.ends))
        lines.append(
            f"  {t.topic:<{width}}  {len(t.ends)} partition{'s' * (len(t.ends) != 1)}, "
            f"{t.records:,} records, end offsets {ends}"
        )
    if not found:
        lines.append("  no topics yet: `lakehouse generate --sink kafka` creates them")
    return lines


def sasl_note(b: Broker) -> str:
    """How a client gets in, when the broker was started with SASL."""
    users = b.users()
    if not users:
        return ""
    return f" (SASL_PLAINTEXT, PLAIN, user{'s' * (len(users) > 1)} {', '.join(users)})"
