"""``lakehouse kafka``: Apache Kafka's broker started, listed and stopped on this machine."""

from __future__ import annotations

from confluent_kafka import Producer

from lakehouse import kafka
from lakehouse.cli import main
from lakehouse.processes import free_port, port_free


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

    kafka.create_topics(broker.bootstrap, ["clicks", "events"], partitions=3)
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
    ends = sorted(t.ends for t in kafka.topics(broker.bootstrap) if t.topic == "events")[0]
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
    assert [(t.topic, t.records) for t in kafka.topics(broker.bootstrap)] == [
        ("clicks", 0),
        ("events", 5),
    ]
    assert main(["kafka", "stop", *args]) == 0


def test_a_topic_with_other_partitions_is_refused(kafka_broker):
    kafka.create_topics(kafka_broker.bootstrap, ["two"], partitions=2)
    kafka.create_topics(kafka_broker.bootstrap, ["two"], partitions=2)  # exists: nothing to do
    try:
        kafka.create_topics(kafka_broker.bootstrap, ["two"], partitions=3)
    except kafka.KafkaError as exc:
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
