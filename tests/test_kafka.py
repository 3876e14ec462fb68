"""``lakehouse kafka``: Apache Kafka's broker started, listed and stopped on this machine."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from confluent_kafka import Producer

from lakehouse import kafka_client
from lakehouse.cli import main
from lakehouse.tools import kafka
from lakehouse.tools.processes import free_port, port_free

# brokers started and stopped (a JVM each): with the other Kafka suites, in make test-slow
pytestmark = pytest.mark.slow


def test_start_status_and_stop_a_broker(tmp_path, capsys):
    folder, port = tmp_path / "broker", free_port()
    args = ["--root", str(tmp_path / "lake"), "--dir", str(folder), "--port", str(port)]
    assert main(["kafka", "status", *args]) == 1
    assert capsys.readouterr().out == f"kafka: not running (folder {folder})\n"

    assert main(["kafka", "start", *args]) == 0
    broker = kafka.Broker(folder, port)
    pid = broker.pid()
    assert capsys.readouterr().out == (
        f"kafka: started (pid {pid}) at 127.0.0.1:{port}; log {folder / 'server.log'}\n"
    )
    assert (folder / "data" / "meta.properties").is_file()  # formatted once, KRaft
    # a second start finds it running; the port is then taken for anyone else
    assert main(["kafka", "start", *args]) == 0
    assert capsys.readouterr().out.startswith(f"kafka: already running (pid {pid})")
    other = ["--root", str(tmp_path / "lake"), "--dir", str(tmp_path / "other")]
    assert main(["kafka", "start", *other, "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"lakehouse: error: port {port} on 127.0.0.1 is in use by another process; "
        "choose another with --port\n"
    )

    kafka_client.create_topics(broker.bootstrap, ["clicks", "events"], partitions=3)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    for key, count in (("1", 4), ("2", 1)):
        for i in range(count):
            producer.produce("events", key=key, value=f'{{"i": {i}}}')
    assert producer.flush(30) == 0
    assert main(["kafka", "status", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"kafka: running (pid {pid}) at 127.0.0.1:{port}, data and log in {folder}"
    # a key's records go to one partition: 4 and 1 records in two of the three
    ends = sorted(t.ends for t in kafka_client.topics(broker.bootstrap) if t.topic == "events")[0]
    assert sorted(ends) == [0, 1, 4]
    assert lines[1:] == [
        "  clicks  3 partitions, 0 records, end offsets 0:0 1:0 2:0",
        f"  events  3 partitions, 5 records, end offsets {' '.join(f'{p}:{e}' for p, e in enumerate(ends))}",
    ]

    assert main(["kafka", "stop", *args]) == 0
    assert capsys.readouterr().out == f"kafka: stopped (pid {pid})\n"
    assert broker.pid() is None and port_free(kafka.HOST, port)
    # started again on its data: the topics and records are still there
    assert main(["kafka", "start", *args]) == 0
    assert [(t.topic, t.records) for t in kafka_client.topics(broker.bootstrap)] == [
        ("clicks", 0),
        ("events", 5),
    ]
    assert main(["kafka", "stop", *args]) == 0


def test_a_topic_with_other_partitions_is_refused(kafka_broker):
    kafka_client.create_topics(kafka_broker.bootstrap, ["two"], partitions=2)
    # (it exists: nothing to do)
    kafka_client.create_topics(kafka_broker.bootstrap, ["two"], partitions=2)
    try:
        kafka_client.create_topics(kafka_broker.bootstrap, ["two"], partitions=3)
    except kafka_client.KafkaError as exc:
        assert str(exc) == (
            f"topic two at {kafka_broker.bootstrap} has 2 partitions, not the 3 of "
            "kafka.partitions; set it to match, or use new topics"
        )
    else:
        raise AssertionError("a topic with 2 partitions passed for 3")


def test_a_broker_that_is_not_up_in_time_is_stopped_with_one_line(tmp_path, capsys):
    folder, port = tmp_path / "slow", free_port()
    args = ["--root", str(tmp_path), "--dir", str(folder), "--port", str(port)]
    assert main(["kafka", "start", *args, "--timeout", "0.5"]) == 2
    assert capsys.readouterr().err == (
        f"lakehouse: error: the broker did not come up within 0.5 s (log: {folder / 'server.log'})\n"
    )
    assert kafka.Broker(folder, port).pid() is None
    assert port_free(kafka.HOST, port)


def test_no_java_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    args = ["--root", str(tmp_path), "--port", str(free_port())]
    assert main(["kafka", "start", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lakehouse: error: Java 17 or newer is required by Spark 4 (JAVA_HOME=")
    assert err.count("\n") == 1


def _plain(username: str, password: str) -> dict[str, str]:
    """Settings' environment for PLAIN credentials over SASL_PLAINTEXT, as a production job
    would get its secrets (never on a command line)."""
    return {
        "LAKEHOUSE_KAFKA__OPTIONS__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_MECHANISM": "PLAIN",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_JAAS_CONFIG": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{username}" password="{password}";'
        ),
    }


def test_a_broker_with_sasl_lets_in_the_right_password_only(tmp_path, capsys):
    """``lakehouse kafka start --sasl --users FILE``: the listener is SASL_PLAINTEXT with PLAIN;
    the lake's clients (generate's producer, status, verify) get in with the user's password
    from kafka.options, and are refused in one line with a wrong one, which no output shows."""
    from lakehouse.ops.status import print_status
    from lakehouse.proof.verify import kafka_lines
    from lakehouse.settings import load_settings
    from lakehouse.tools import generate as gen

    folder, port = tmp_path / "broker", free_port()
    users = tmp_path / "users.properties"
    users.write_text("# who may connect\nalice = alice-pw-1234\nbob=bob-pw-5678\n")
    args = ["--root", str(tmp_path / "lake"), "--dir", str(folder), "--port", str(port)]
    assert main(["kafka", "start", *args, "--sasl", "--users", str(users)]) == 0
    broker = kafka.Broker(folder, port)
    try:
        out = capsys.readouterr().out
        assert out == (
            f"kafka: started (pid {broker.pid()}) at 127.0.0.1:{port} (SASL_PLAINTEXT, PLAIN, "
            f"users alice, bob); log {folder / 'server.log'}\n"
        )
        assert broker.jaas.stat().st_mode & 0o777 == 0o600
        assert not kafka_client.answers(broker.bootstrap, 3)  # no credentials: not let in

        def lake(password: str):
            env = {**_plain("alice", password), "LAKEHOUSE_BRONZE__SOURCE": "kafka"}
            env["LAKEHOUSE_KAFKA__BOOTSTRAP_SERVERS"] = broker.bootstrap
            env["LAKEHOUSE_KAFKA__EVENTS__TOPIC"] = "shop.events.v2"
            return load_settings("test", env=env, overrides={"root": str(tmp_path / "lake")})

        right, wrong = lake("alice-pw-1234"), lake("not-alices-pw")
        sink = gen.KafkaSink.from_settings(right)
        lines = ['{"event_id":"e1","user_id":7}', '{"event_id":"e2","user_id":8}']
        landed = gen.Landed(
            np.zeros(2, np.int64), np.array(lines, dtype=object), np.zeros(2, np.int8)
        )
        sink.write("events", landed)
        assert sink.books("events")["kafka"]["topic"] == "shop.events.v2"
        options = right.kafka.client_options()
        read = kafka_lines(broker.bootstrap, "shop.events.v2", options)
        assert sorted(line.text for line in read) == lines

        with pytest.raises(kafka_client.KafkaError) as refused:
            kafka_client.topics(broker.bootstrap, 5, wrong.kafka.client_options())
        message = str(refused.value)
        assert message.startswith(
            f"the Kafka broker at {broker.bootstrap} refused the connection: "
        ), message
        assert "Authentication failed" in message and "\n" not in message
        assert "not-alices-pw" not in message

        # lakehouse status with the wrong password: the line says so, shows no password
        report = io.StringIO()
        print_status(wrong, report)
        text = report.getvalue()
        assert f"kafka at {broker.bootstrap}: records bronze has not read\n  the Kafka " in text
        assert "refused the connection" in text and "not-alices-pw" not in text
        report = io.StringIO()
        print_status(right, report)
        row = next(r for r in report.getvalue().splitlines() if r.startswith("bronze.events"))
        assert re.split(r"\s{2,}", row) == [
            "bronze.events",
            "shop.events.v2",
            "2",
            "not started",
            "2",
        ]

        # lakehouse kafka status uses the broker's own user
        assert main(["kafka", "status", *args]) == 0
        lines_out = capsys.readouterr().out.splitlines()
        assert lines_out[0].startswith(f"kafka: running (pid {broker.pid()}) at 127.0.0.1:{port} (")
        assert any(
            line.startswith("  shop.events.v2  3 partitions, 2 records") for line in lines_out
        )
        assert not any(pw in "".join(lines_out) for pw in ("alice-pw-1234", "bob-pw-5678"))
    finally:
        kafka.stop(broker)


def test_sasl_without_users_takes_the_plain_user_of_the_settings(tmp_path, capsys, monkeypatch):
    for key, value in _plain("carol", "carol-pw-0000").items():
        monkeypatch.setenv(key, value)
    folder, port = tmp_path / "broker", free_port()
    args = ["--root", str(tmp_path / "lake"), "--dir", str(folder), "--port", str(port)]
    assert main(["kafka", "start", *args, "--users", "x"]) == 2
    assert capsys.readouterr().err == "lakehouse: error: --users goes with --sasl\n"
    assert main(["kafka", "start", *args, "--sasl"]) == 0
    broker = kafka.Broker(folder, port)
    try:
        assert "(SASL_PLAINTEXT, PLAIN, user carol)" in capsys.readouterr().out
        plain = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
        carol = {**plain, "sasl.username": "carol", "sasl.password": "carol-pw-0000"}
        assert kafka_client.answers(broker.bootstrap, 5, carol)
        assert not kafka_client.answers(broker.bootstrap, 5, {**carol, "sasl.password": "nope"})
    finally:
        kafka.stop(broker)
    # started again without --sasl: plain text, the JAAS file gone
    assert main(["kafka", "start", *args]) == 0
    try:
        assert not broker.jaas.exists() and broker.users() == []
        assert kafka_client.answers(broker.bootstrap, 5)
    finally:
        kafka.stop(broker)
