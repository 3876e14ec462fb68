"""Bronze on Kafka: records produced by ``lakehouse generate --sink kafka`` to a real broker,
read by the bronze flows, and every table of the lake equal to its reference. (Every test here
starts or uses a broker: marker slow, with tests/test_kafka.py, in make test-slow.)"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from verify_helpers import generate_closed, verify_all_equal

from lakehouse import checkpoints, kafka_client
from lakehouse.kafka_options import PLAIN_MODULE
from lakehouse.ops.status import print_status, read_table
from lakehouse.progress import Progress
from lakehouse.proof.verify import bronze_reference, compare
from lakehouse.runner import FlowFailed, declared_tables, run_layers
from lakehouse.tools import generate as gen
from lakehouse.tools import kafka
from lakehouse.tools.processes import free_port

SEED = 20261126


def _kafka_lake(settings, broker, prefix: str, partitions: int, max_offsets: int = 0):
    return settings.with_overrides(
        {
            "bronze.source": "kafka",
            "kafka.bootstrap_servers": broker.bootstrap,
            "kafka.topic_prefix": prefix,
            "kafka.partitions": partitions,
            "kafka.max_offsets_per_trigger": max_offsets,
        }
    )


def _produce(spark, lake, events: int = 600, closed: bool = False) -> list[dict]:
    """Generated records to the lake's topics (then a closing delivery, when ``closed``: every
    gold table gets rows); the runs' manifest entries."""
    sink = gen.KafkaSink(
        lake.kafka.bootstrap_servers, lake.kafka.partitions, lake.kafka.topic_prefix
    )
    if closed:
        return generate_closed(spark, lake, sink, events=events, hours=1.0, users=20, seed=SEED)
    params = gen.params_from_settings(lake, events=events, hours=1.0, users=20, seed=SEED)
    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    return [gen.generate(spark, lake.root, params, progress=quiet, sink=sink)]


@pytest.mark.slow
def test_bad_records_on_a_topic_go_to_quarantine_with_their_offset(spark, settings, kafka_broker):
    """Bronze and verify agree record by record on what a producer other than ours may send:
    bytes that are not JSON, a null value, a record over bronze.max_record_bytes, bytes that
    are not UTF-8; each quarantine row names its record's offset."""
    lake = _kafka_lake(settings, kafka_broker, "bad.", 1)
    topics = [lake.topic(s) for s in ("events", "impressions", "clicks")]
    kafka_client.create_topics(kafka_broker.bootstrap, topics, partitions=1)
    good = '{"event_id":"e%d","user_id":7,"event_time":"2026-01-05T08:00:0%dZ"}'
    big = '{"event_id":"big","user_id":7,"event_time":"2026-01-05T08:00:00Z","page":"%s"}'
    records = [
        (good % (0, 0)).encode(),
        b"not json at all",
        None,
        (big % ("x" * 1_000_000)).encode(),
        b'{"event_id":"e\xff","user_id":7,"event_time":"2026-01-05T08:00:00Z"}',
        (good % (5, 5)).encode(),
    ]
    producer = Producer(
        {"bootstrap.servers": kafka_broker.bootstrap, "message.max.bytes": 2**21, "log_level": 0}
    )
    for value in records:
        producer.produce(topics[0], value=value, key="7")
    assert producer.flush(30) == 0

    run_layers(spark, lake, ["bronze"], out=io.StringIO())
    offset = r"^kafka:bad\.events/0/(\d+)@"
    rows = read_table(lake, "bronze.events")
    assert sorted(
        zip(rows["event_id"], rows["_source_file"].str.extract(offset)[0].astype(int), strict=True)
    ) == [
        ("e0", 0),
        ("e5", 5),
    ]
    quarantine = read_table(lake, "bronze.quarantine")
    quarantine = quarantine.assign(
        offset=quarantine["_source_file"].str.extract(offset)[0].astype(int)
    ).sort_values("offset")
    original = base64.b64encode(records[4]).decode()
    assert [
        (r.offset, r.reason, r.detail, None if r.raw is None else len(r.raw))
        for r in quarantine.itertuples()
    ] == [
        (1, "malformed_json", "not a JSON object", 15),
        (2, "empty_line", "null value", None),
        (3, "too_large", "1,000,076 bytes, over the limit of 1,000,000", 1_000_076),
        # the original bytes of the record that is not UTF-8 are in its detail; raw has U+FFFD
        (4, "invalid_utf8", f"not UTF-8; its bytes in base64: {original}", 65),
    ]
    assert len(records[3]) == 1_000_076 and len(records[4]) == 65  # 1 byte, 1 character

    # verify reads the topic back and expects exactly these rows
    expected_rows, expected_bad = bronze_reference(lake, "events")
    assert sorted(expected_rows["_source_file"]) == sorted(rows["_source_file"])
    assert sorted(
        zip(
            expected_bad["reason"],
            expected_bad["_source_file"],
            expected_bad["raw"].fillna("<null>"),
            strict=False,
        )
    ) == sorted(
        zip(
            quarantine["reason"],
            quarantine["_source_file"],
            quarantine["raw"].fillna("<null>"),
            strict=True,
        )
    )


@pytest.mark.slow
def test_the_same_records_from_files_and_from_kafka_give_the_same_silver_and_gold(
    spark, settings, kafka_broker, tmp_path
):
    """One seed generated twice, to landing files and to Kafka (3 partitions, bronze reading
    at most 250 records per micro-batch over them), a closing delivery after it: every table
    of the Kafka lake equals its reference, each bronze row names its record, and every silver
    and gold table holds the rows of the files' lake, but for the lineage columns (file or
    record)."""
    files = settings.with_overrides({"root": str(tmp_path / "files")})
    topics = _kafka_lake(
        settings.with_overrides({"root": str(tmp_path / "kafka")}), kafka_broker, "same.", 3, 250
    )
    generate_closed(spark, files, events=600, hours=1.0, users=20, seed=SEED)
    entries = _produce(spark, topics, closed=True)
    books = entries[0]["sources"]["events"]
    spans = books["kafka"]["offsets"]
    assert books["kafka"]["topic"] == "same.events"
    assert len(spans) == 3
    assert sum(end - first for first, end in spans.values()) == books["lines"]

    for lake in (files, topics):
        reports = run_layers(spark, lake, ["bronze", "silver", "gold"], out=io.StringIO())
    bronze = {r.flow: r for r in reports if r.flow.startswith("bronze.")}
    lines = sum(e["sources"]["events"]["lines"] for e in entries)
    assert bronze["bronze.events"].input_rows == lines
    # at most 250 records per micro-batch, over the partitions
    assert bronze["bronze.events"].batches == -(-lines // 250)
    verify_all_equal(topics, empty=("silver.late_events",))  # (no line late)
    # lineage: each bronze row names its record's topic, partition, offset and time
    rows = read_table(topics, "bronze.events")
    places = rows["_source_file"].str.extract(r"^kafka:([^/]+)/(\d+)/(\d+)@\d{4}-\d\d-\d\dT")
    assert set(places[0]) == {"same.events"}
    assert len(set(zip(places[1], places[2], strict=True))) == len(rows)

    compared = {}
    for table in (t for t in declared_tables() if not t.startswith("bronze.")):
        a, b = (_rows(read_table(lake, table)) for lake in (files, topics))
        # (as verify compares: doubles within 1e-9 relative, sums added in another order)
        check = compare(
            table,
            a,
            b,
            list(a.columns),
            [c for c in a.columns if c not in a.select_dtypes("float")],
        )
        assert check.same, (table, check.missing[:3], check.unexpected[:3], check.differing[:3])
        compared[table] = len(a)
    # (the seed fixes the rows: both sides empty would pass the comparison, not this)
    assert (compared["silver.events"], compared["gold.sessions"]) == (1497, 77), compared


def _rows(frame):
    """A table's rows without its lineage columns (``_source_file``, ``_quarantined_at``),
    lists and maps as text."""
    frame = frame[[c for c in frame.columns if not c.startswith("_")]]
    return frame.apply(lambda col: col.map(str) if col.dtype == object else col)


@pytest.mark.slow
def test_records_gone_before_bronze_read_them_stop_it_with_the_way_out(
    spark, settings, kafka_broker
):
    lake = _kafka_lake(settings, kafka_broker, "lost.", 1)
    topics = [lake.topic(s) for s in ("events", "impressions", "clicks")]
    kafka_client.create_topics(kafka_broker.bootstrap, topics, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "log_level": 0})
    good = '{"event_id":"e%02d","user_id":7,"event_time":"2026-01-05T08:00:00Z"}'

    def produce(ids) -> None:
        for i in ids:
            producer.produce(topics[0], value=good % i)
        assert producer.flush(30) == 0

    produce(range(10))
    run_layers(spark, lake, ["bronze"], out=io.StringIO())
    produce(range(10, 20))
    # retention, as far as bronze can tell: offsets 10 to 14 deleted before it read them
    client = kafka_client.admin(kafka_broker.bootstrap)
    for future in client.delete_records([TopicPartition(topics[0], 0, 15)]).values():
        future.result(30)
    with pytest.raises(FlowFailed) as failed:
        run_layers(spark, lake, ["bronze"], out=io.StringIO())
    assert str(failed.value) == (
        "flow bronze.events failed: records at offsets [10, 20) of lost.events-0 "
        "(topic-partition) are no longer on the broker (retention deleted them, or the topic "
        "was deleted): they are lost to the lake. To accept the loss and go on from the "
        "earliest record still there, run bronze once with kafka.fail_on_data_loss=false "
        "(--conf, or LAKEHOUSE_KAFKA__FAIL_ON_DATA_LOSS=false)"
    )
    # the way out: what is left is read, once
    run_layers(spark, lake.with_overrides({"kafka.fail_on_data_loss": False}), ["bronze"])
    run_layers(spark, lake, ["bronze"], out=io.StringIO())
    assert sorted(read_table(lake, "bronze.events")["event_id"]) == [
        *(f"e{i:02d}" for i in range(10)),
        *(f"e{i:02d}" for i in range(15, 20)),
    ]
    # lakehouse status: what is on the broker, where bronze's checkpoint is, what is unread
    produce(range(20, 23))
    out = io.StringIO()
    print_status(lake, out)
    lines = out.getvalue().splitlines()
    start = lines.index(f"kafka at {kafka_broker.bootstrap}: records bronze has not read")
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 : start + 5]]
    assert cells == [
        ["flow", "topic", "records", "committed up to (partition:offset)", "not read"],
        ["bronze.events", "lost.events", "8", "0:20", "3"],
        ["bronze.impressions", "lost.impressions", "0", "0:0", "0"],
        ["bronze.clicks", "lost.clicks", "0", "0:0", "0"],
    ]


@pytest.mark.slow
def test_a_topic_can_start_at_its_own_offsets_and_read_its_own_batch_size(
    spark, settings, kafka_broker
):
    """kafka.<source>.starting_offsets and .max_offsets_per_trigger apply to that topic only:
    events starts at offset 4 and reads 2 records per micro-batch, clicks reads all at once."""
    lake = _kafka_lake(settings, kafka_broker, "own.", 1, max_offsets=100).with_overrides(
        {
            "kafka.events.starting_offsets": '{"0": 4}',
            "kafka.events.max_offsets_per_trigger": 2,
            "kafka.clicks.max_offsets_per_trigger": 0,
        }
    )
    topics = {s: lake.topic(s) for s in ("events", "impressions", "clicks")}
    kafka_client.create_topics(kafka_broker.bootstrap, list(topics.values()), partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "log_level": 0})
    event = '{"event_id":"e%d","user_id":7,"event_time":"2026-01-05T08:00:0%dZ"}'
    click = (
        '{"click_id":"c%d","impression_id":"i%d","ad_id":1,"user_id":7,'
        '"click_time":"2026-01-05T08:00:0%dZ"}'
    )
    for i in range(10):
        producer.produce(topics["events"], value=event % (i, i))
        producer.produce(topics["clicks"], value=click % (i, i, i))
    assert producer.flush(30) == 0

    reports = {r.flow: r for r in run_layers(spark, lake, ["bronze"], out=io.StringIO())}
    assert sorted(read_table(lake, "bronze.events")["event_id"]) == [f"e{i}" for i in range(4, 10)]
    assert (reports["bronze.events"].batches, reports["bronze.events"].input_rows) == (3, 6)
    assert len(read_table(lake, "bronze.clicks")) == 10
    assert (reports["bronze.clicks"].batches, reports["bronze.clicks"].input_rows) == (1, 10)


@pytest.mark.slow
def test_a_broker_stopped_under_continuous_bronze_fails_it_and_a_restart_resumes(
    spark, settings, tmp_path
):
    """Bronze runs continuously; the broker stops: each flow fails once its calls time out
    (kafka.api_timeout_s, 3 tries), is started again alone after trigger.restart_delay, fails
    again and stops for good, and the run ends with one line. The broker back, more records
    produced, bronze run again: every table equals its reference, nothing lost or read
    twice."""
    port = free_port()
    broker = kafka.Broker(tmp_path / "broker", port)
    kafka.start(broker)
    try:
        lake = _kafka_lake(settings, broker, "", 3).with_overrides({"kafka.api_timeout_s": 5})
        _produce(spark, lake, events=150)
        env = {
            **os.environ,
            "LAKEHOUSE_BRONZE__SOURCE": "kafka",
            "LAKEHOUSE_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
            "LAKEHOUSE_KAFKA__API_TIMEOUT_S": "5",
            "LAKEHOUSE_TRIGGER__INTERVAL": "1 second",
            "LAKEHOUSE_TRIGGER__RESTARTS": "1",
            "LAKEHOUSE_TRIGGER__RESTART_DELAY": "1 second",
        }
        command = [sys.executable, "-m", "lakehouse.cli", "run", "--layer", "bronze"]
        command += ["--trigger", "continuous", "--root", str(lake.root), "--profile", "test"]
        log = tmp_path / "bronze.log"
        with open(log, "w") as output:
            job = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        events = lake.checkpoint_path("bronze", "events")
        deadline = time.monotonic() + 300
        while not checkpoints.committed_batches(events) and time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert checkpoints.committed_batches(events), "bronze committed nothing in 5 minutes"
        kafka.stop(broker)
        job.wait(timeout=300)
        err = log.read_text()
        assert job.returncode == 1, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(
            r"lakehouse: error: flow bronze\.(events|impressions|clicks) failed: the Kafka broker "
            rf"at 127\.0\.0\.1:{port} did not answer \(.+\); once it is back, run bronze again: "
            r"it goes on from the offsets in its checkpoint, and nothing is lost",
            last,
        ), last
        assert "NetworkClient" not in err  # no reconnection warnings, several a second
        for flow in ("events", "impressions", "clicks"):
            said = [line for line in err.splitlines() if line.startswith(f"flow bronze.{flow} ")]
            assert len(said) == 2, said
            # the broker's trouble in the user's words; the way out only once the runner gives up
            assert re.fullmatch(
                rf"flow bronze\.{flow} failed: the Kafka broker at 127\.0\.0\.1:{port} did not "
                r"answer \(.+\); starting it again alone in 1 s \(1 of 1\), the other flows run on",
                said[0],
            ), said[0]
            assert re.fullmatch(
                rf"flow bronze\.{flow} failed for good after 1 restart\(s\): the Kafka broker at "
                rf"127\.0\.0\.1:{port} did not answer \(.+\); once it is back, run bronze again: "
                r"it goes on from the offsets in its checkpoint, and nothing is lost; the other "
                r"flows run on",
                said[1],
            ), said[1]

        kafka.start(broker)
        # a second run of the generator, while it was down, and a closing delivery
        _produce(spark, lake, events=150, closed=True)
        run_layers(spark, lake, ["bronze", "silver", "gold"], out=io.StringIO())
        verify_all_equal(lake, empty=("silver.late_events",))  # (no line late)
    finally:
        kafka.stop(broker)


def _sasl_lake(settings, broker, root, password: str):
    """A lake whose bronze reads the broker's topics over SASL_PLAINTEXT as user bronze."""
    jaas = f'{PLAIN_MODULE} required username="bronze" password="{password}";'
    lake = settings.with_overrides({"root": str(root)})
    return _kafka_lake(lake, broker, "sasl.", 1).with_overrides(
        {
            "kafka.options.security.protocol": "SASL_PLAINTEXT",
            "kafka.options.sasl.mechanism": "PLAIN",
            "kafka.options.sasl.jaas.config": jaas,
        }
    )


REFUSED = (
    r"flow bronze\.(events|impressions|clicks) failed: the Kafka broker at 127\.0\.0\.1:\d+ "
    r"refused bronze's login for topic sasl\.\w+ \(SaslAuthenticationException: Authentication "
    r"failed: Invalid username or password\); check the credentials and TLS settings in "
    r"kafka\.options"
)


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    """A broker of its own that lets in user bronze (SASL_PLAINTEXT, PLAIN), for the tests of
    this module that log in to it (each on topics of its own)."""
    broker = kafka.Broker(tmp_path_factory.mktemp("sasl-broker"), free_port())
    kafka.start(broker, users={"bronze": "Bronze-pw-2468"})
    yield broker
    kafka.stop(broker)


@pytest.mark.slow
def test_bronze_reads_a_sasl_broker_with_its_password_and_fails_in_one_line_without(
    spark, settings, tmp_path, sasl_broker
):
    """The broker lets in user bronze (SASL_PLAINTEXT, PLAIN): with the right password in
    kafka.options bronze reads its topics; with a wrong one each flow fails in one line naming
    the refused login, and the password is in no error, ops.runs row or status line."""
    broker = sasl_broker
    right = _sasl_lake(settings, broker, tmp_path / "right", "Bronze-pw-2468")
    topics = [right.topic(s) for s in ("events", "impressions", "clicks")]
    client = right.kafka.client_options()
    kafka_client.create_topics(broker.bootstrap, topics, 1, client)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0, **client})
    event = '{"event_id":"e%d","user_id":7,"event_time":"2026-01-05T08:00:0%dZ"}'
    for i in range(3):
        producer.produce(topics[0], value=event % (i, i))
    assert producer.flush(30) == 0
    run_layers(spark, right, ["bronze"], out=io.StringIO())
    assert sorted(read_table(right, "bronze.events")["event_id"]) == ["e0", "e1", "e2"]

    wrong = _sasl_lake(settings, broker, tmp_path / "wrong", "Not-the-pw-1357")
    with pytest.raises(FlowFailed) as failed:
        run_layers(spark, wrong, ["bronze"], out=io.StringIO())
    message = str(failed.value)
    assert re.fullmatch(REFUSED, message), message
    errors = read_table(wrong, "ops.runs")["error"].dropna()
    assert errors.str.fullmatch(REFUSED.split(" failed: ", 1)[1]).any(), list(errors)
    out = io.StringIO()
    print_status(wrong, out)
    assert "refused the connection" in out.getvalue()  # the backlog's line
    for shown in (message, *errors, out.getvalue()):
        assert "Not-the-pw-1357" not in shown


@pytest.mark.slow
def test_a_refused_login_is_the_last_line_of_lakehouse_run_and_no_output_shows_the_password(
    tmp_path, sasl_broker
):
    """``lakehouse run --layer bronze`` with the password from the environment (as a
    scheduler passes secrets): a wrong one ends the run with exit code 1 and the refused login
    as its last line; neither the JVM's log (the query's plan among it) nor anything else
    printed holds the password."""
    broker = sasl_broker
    kafka_client.create_topics(
        broker.bootstrap, ["events", "impressions", "clicks"], 1, broker.client_options()
    )
    env = {
        **os.environ,
        "LAKEHOUSE_BRONZE__SOURCE": "kafka",
        "LAKEHOUSE_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap,
        "LAKEHOUSE_KAFKA__OPTIONS__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_MECHANISM": "PLAIN",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_USERNAME": "bronze",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_PASSWORD": "Not-the-pw-1357",
    }
    command = [sys.executable, "-m", "lakehouse.cli", "run", "--layer", "bronze"]
    command += ["--root", str(tmp_path / "lake"), "--profile", "test"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"lakehouse: error: " + REFUSED.replace("sasl\\.", ""), last), last
    assert "Not-the-pw-1357" not in done.stdout + done.stderr
