"""Kafka as production clusters run it: any client option (SASL, TLS) passed through to
Spark's source and to the project's own clients, secrets never shown, a topic per source.
None of these start Spark or a broker."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from lakehouse.kafka_options import PLAIN_MODULE, SCRAM_MODULE, read_properties
from lakehouse.redaction import redact
from lakehouse.settings import SettingsError, load_settings

CONF = Path(__file__).resolve().parent.parent / "conf" / "lakehouse.toml"
JAAS = f'{PLAIN_MODULE} required username="svc-lake" password="Jaas-Secret-42";'


def _settings(tmp_path, toml: str = "", env: dict | None = None, **overrides):
    path = tmp_path / "lakehouse.toml"
    path.write_text(toml)
    return load_settings(config_path=path, env=env or {}, overrides=overrides)


def test_client_options_reach_spark_and_librdkafka_in_their_own_names(tmp_path):
    """A table in Kafka's names (the keys quoted, or written as TOML's dotted keys): Spark's
    source gets kafka.<key>; librdkafka the same where it names them so, the JAAS config as
    sasl.username and sasl.password, a PEM truststore as ssl.ca.location; kafka.librdkafka_options
    over them."""
    s = _settings(
        tmp_path,
        f"""
[defaults.kafka.options]
"security.protocol" = "sasl_ssl"
sasl.mechanism = "PLAIN"
"sasl.jaas.config" = '{JAAS}'
"ssl.truststore.type" = "PEM"
"ssl.truststore.location" = "/etc/kafka/ca.pem"
"ssl.endpoint.identification.algorithm" = ""
"client.id" = "lakehouse"
"check.crcs" = true
[defaults.kafka.librdkafka_options]
"client.id" = "lakehouse-py"
"enable.ssl.certificate.verification" = false
""",
    )
    assert s.kafka.spark_options() == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": JAAS,
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.client.id": "lakehouse",
        "kafka.check.crcs": "true",
    }
    assert s.kafka.client_options() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc-lake",
        "sasl.password": "Jaas-Secret-42",
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
        "client.id": "lakehouse-py",
        "enable.ssl.certificate.verification": "false",
    }


def test_credentials_in_librdkafkas_style_become_sparks_jaas_config(tmp_path):
    """sasl.username and sasl.password (from the environment here: secrets need no command
    line) give Spark's source the JAAS config of their SCRAM mechanism, quotes escaped."""
    env = {
        "LAKEHOUSE_KAFKA__OPTIONS__SECURITY_PROTOCOL": "SASL_SSL",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL__MECHANISM": "SCRAM-SHA-512",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_USERNAME": "svc",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_PASSWORD": 'pa"ss\\word',
        "LAKEHOUSE_KAFKA__OPTIONS__SSL_KEYSTORE_TYPE": "PKCS12",
        "LAKEHOUSE_KAFKA__OPTIONS__SSL_KEYSTORE_LOCATION": "/etc/kafka/client.p12",
        "LAKEHOUSE_KAFKA__OPTIONS__SSL_KEYSTORE_PASSWORD": "Store-Secret-7",
    }
    s = load_settings("test", config_path=CONF, env=env)
    spark = s.kafka.spark_options()
    assert spark["kafka.sasl.jaas.config"] == (
        f'{SCRAM_MODULE} required username="svc" password="pa\\"ss\\\\word";'
    )
    assert "kafka.sasl.username" not in spark and "kafka.sasl.password" not in spark
    client = s.kafka.client_options()
    assert (client["sasl.username"], client["sasl.password"]) == ("svc", 'pa"ss\\word')
    assert client["ssl.keystore.location"] == "/etc/kafka/client.p12"
    assert client["ssl.keystore.password"] == "Store-Secret-7"


def test_options_file_is_read_and_options_set_elsewhere_win(tmp_path):
    """kafka.options_file: a client.properties as Kafka's tools read it (a JAAS config over
    continued lines, comments); a key of kafka.options set elsewhere wins."""
    props = tmp_path / "client.properties"
    props.write_text(
        "# the cluster's client settings\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: PLAIN\n"
        f"sasl.jaas.config={PLAIN_MODULE} required \\\n"
        '    username="svc-lake" \\\n'
        '    password="Jaas-Secret-42";\n'
        "! another comment\n"
        "client.id lakehouse-file\n"
    )
    s = _settings(
        tmp_path,
        f'[defaults.kafka]\noptions_file = "{props}"\n',
        {"LAKEHOUSE_KAFKA__OPTIONS__CLIENT_ID": "lakehouse-env"},
    )
    assert s.kafka.options == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": JAAS,
        "client.id": "lakehouse-env",
    }
    assert read_properties(props)["client.id"] == "lakehouse-file"
    with pytest.raises(SettingsError) as err:
        _settings(tmp_path, env={"LAKEHOUSE_KAFKA__OPTIONS_FILE": str(tmp_path / "none")})
    assert str(err.value) == (
        f"setting 'kafka.options_file': cannot read {tmp_path / 'none'}: No such file or directory"
    )


def test_secrets_are_masked_in_the_settings_repr(tmp_path):
    s = _settings(
        tmp_path,
        f"""
[defaults.kafka.options]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "PLAIN"
"sasl.jaas.config" = '{JAAS}'
"ssl.truststore.location" = "/etc/kafka/truststore.jks"
"ssl.truststore.password" = "Trust-Secret-1"
"ssl.keystore.key" = "-----BEGIN PRIVATE KEY----- Pem-Secret-2"
[defaults.kafka.librdkafka_options]
"sasl.oauthbearer.client.secret" = "Oauth-Secret-3"
[defaults.spark_conf]
"spark.hadoop.fs.s3a.secret.key" = "S3-Secret-4"
""",
    )
    for shown in (repr(s), str(s), repr(s.kafka), f"{s}"):
        for secret in ("Jaas-Secret-42", "Trust-Secret-1", "Pem-Secret-2", "Oauth-Secret-3"):
            assert secret not in shown
        assert "S3-Secret-4" not in shown
        assert "'sasl.jaas.config': '***'" in shown
        assert "'ssl.truststore.location': '/etc/kafka/truststore.jks'" in shown  # not a secret
        assert "'security.protocol': 'SASL_SSL'" in shown
    # a text that holds one of them, whatever made it, is redacted
    text = f"could not log in with {JAAS} (-----BEGIN PRIVATE KEY----- Pem-Secret-2)"
    assert redact(text) == "could not log in with *** (***)"
    assert redact('found: password="Jaas-Secret-42"') == 'found: password="***"'


def test_values_that_are_no_secrets_are_not_searched_for(tmp_path):
    """A spark_conf key that happens to name keys, set to true, does not mask every "true"."""
    _settings(
        tmp_path,
        '[defaults.spark_conf]\n"spark.sql.requireAllClusterKeysForCoPartition" = true\n'
        '"spark.io.encryption.keySizeBits" = 256\n',
    )
    assert redact("failOnDataLoss is true, 256 bits") == "failOnDataLoss is true, 256 bits"


def test_secrets_are_redacted_by_their_form_too():
    """A text recorded before (an old ops.runs row), or a secret no settings held."""
    assert redact('... required username="u" password="never-loaded-9";') == (
        '... required username="u" password="***";'
    )
    assert redact("ssl.keystore.password=abc123 and token: xyz, user=me") == (
        "ssl.keystore.password=*** and token: ***, user=me"
    )
    assert redact("Authentication failed: Invalid username or password") == (
        "Authentication failed: Invalid username or password"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"LAKEHOUSE_KAFKA__OPTIONS__BOOTSTRAP_SERVERS": "b:9092"},
            "setting 'kafka.options.bootstrap.servers' cannot be set: the brokers are setting "
            "kafka.bootstrap_servers",
        ),
        (
            {"LAKEHOUSE_KAFKA__OPTIONS__AUTO_OFFSET_RESET": "latest"},
            "setting 'kafka.options.auto.offset.reset' cannot be set: a bronze flow starts at "
            "kafka.starting_offsets, then goes on from its checkpoint",
        ),
        (
            {"LAKEHOUSE_KAFKA__OPTIONS__SECURITY_PROTOCOL": "TLS"},
            "setting 'kafka.options.security.protocol' must be one of PLAINTEXT, SSL, "
            "SASL_PLAINTEXT, SASL_SSL; got 'TLS'",
        ),
        (
            {"LAKEHOUSE_KAFKA__OPTIONS__SASL_PASSWORD": "Lone-Secret-5"},
            "setting 'kafka.options': sasl.username and sasl.password go together; one is missing",
        ),
        (
            {
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_USERNAME": "u",
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_PASSWORD": "Lone-Secret-5",
            },
            "setting 'kafka.options': sasl.username and sasl.password need sasl.mechanism "
            "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; got none",
        ),
        (
            {
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_MECHANISM": "PLAIN",
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_USERNAME": "u",
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_PASSWORD": "Lone-Secret-5",
                "LAKEHOUSE_KAFKA__OPTIONS__SASL_JAAS_CONFIG": JAAS,
            },
            "setting 'kafka.options': give the credentials as sasl.jaas.config or as "
            "sasl.username and sasl.password, not both",
        ),
        (
            {"LAKEHOUSE_KAFKA__OPTIONS__SASL_JAAS_CONFIG": 'username="u" password="Lone-Secret-5"'},
            "setting 'kafka.options.sasl.jaas.config' is not a JAAS login module line "
            '(\'<LoginModule class> required username="..." password="...";\')',
        ),
        ({"LAKEHOUSE_KAFKA__OPTIONS": "security.protocol=SSL"}, "must be a table of key = value"),
    ],
)
def test_client_options_that_cannot_be_used_fail_in_one_line_without_their_value(env, message):
    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env=env)
    assert message in str(err.value)
    assert "Lone-Secret-5" not in str(err.value) and "\n" not in str(err.value)


def test_each_source_can_name_its_topic(tmp_path):
    s = load_settings(
        "test",
        config_path=CONF,
        env={
            "LAKEHOUSE_KAFKA__TOPIC_PREFIX": "shop.",
            "LAKEHOUSE_KAFKA__CLICKS__TOPIC": "ads.clicks-v2",
            "LAKEHOUSE_KAFKA__CLICKS__STARTING_OFFSETS": '{"0": 5}',
        },
    )
    assert [s.topic(x) for x in ("events", "impressions", "clicks")] == [
        "shop.events",
        "shop.impressions",
        "ads.clicks-v2",
    ]
    assert s.kafka.starting_offsets_of("clicks", s.topic("clicks")) == '{"ads.clicks-v2": {"0": 5}}'
    with pytest.raises(SettingsError) as err:
        s.with_overrides({"kafka.events.topic": "ads.clicks-v2"})
    assert str(err.value) == (
        "sources events and clicks both read topic ads.clicks-v2: set kafka.clicks.topic (or "
        "kafka.events.topic) to a topic of its own"
    )
    with pytest.raises(SettingsError) as err:
        s.with_overrides({"kafka.impressions.topic": "no spaces"})
    assert str(err.value) == (
        "setting 'kafka.impressions.topic' must be a Kafka topic name: letters, digits, '.', "
        "'_' and '-' (at most 249); got 'no spaces'"
    )


def test_the_error_line_of_the_cli_is_redacted(tmp_path, capsys, monkeypatch):
    """Whatever error a command ends with, a secret of the settings is not in its line."""
    from lakehouse import cli
    from lakehouse.commands import status
    from lakehouse.errors import LakehouseError

    monkeypatch.setenv("LAKEHOUSE_KAFKA__OPTIONS__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("LAKEHOUSE_KAFKA__OPTIONS__SASL_JAAS_CONFIG", JAAS)

    def fails(args):
        cli.settings_from_args(args)
        raise LakehouseError(f"the JVM said: kafka.sasl.jaas.config={JAAS}")

    monkeypatch.setattr(status, "cmd_status", fails)
    assert cli.main(["status", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Jaas-Secret-42" not in err and err.startswith("lakehouse: error: the JVM said: ")


def test_ops_runs_status_and_report_never_show_a_secret(tmp_path, capsys):
    """A flow whose error holds the JAAS config (a failure to start, a query's error):
    ops.runs records it redacted; status and the report redact rows recorded before too."""
    import datetime as dt

    from lakehouse.ops.report import build_report
    from lakehouse.ops.status import print_status, read_table
    from lakehouse.runner.books import RunBook, flow_reports
    from lakehouse.runner.monitoring import record_runs

    env = {
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_MECHANISM": "PLAIN",
        "LAKEHOUSE_KAFKA__OPTIONS__SASL_JAAS_CONFIG": JAAS,
        "LAKEHOUSE_BRONZE__SOURCE": "kafka",
    }
    s = load_settings("test", config_path=CONF, env=env, overrides={"root": str(tmp_path)})
    book = RunBook(s)
    book.failed_to_start("bronze.events", RuntimeError(f"bad options: {JAAS}"))

    class Query:  # what flow_reports reads of a streaming query that failed
        id = "q1"
        recentProgress: list = []

        def exception(self):
            return RuntimeError(
                "[STREAM_FAILED] Query [id = q1] terminated with exception: "
                f"kafka.sasl.jaas.config={JAAS} was refused\n=== Streaming Query ===\n..."
            )

    reports = flow_reports(s, {"bronze.clicks": [Query()]}, 0.0)
    book.record({"bronze.clicks": Query()}, reports)
    runs = read_table(s, "ops.runs")
    assert sorted(runs["error"]) == [
        "[STREAM_FAILED] Query [id = q1] terminated with exception: "
        "kafka.sasl.jaas.config=*** was refused",
        "bad options: ***",
    ]
    # a row recorded before secrets were redacted
    old = {
        "run_id": "r0",
        "flow": "bronze.impressions",
        "started_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "ended_at": dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC),
        "status": "failed",
        "batches": 0,
        "input_rows": 0,
        "error": 'login: password="Old-Secret-6"',
    }
    record_runs(s, [old])
    out = io.StringIO()
    s_plain = s.with_overrides({"bronze.source": "files"})  # (no broker to ask)
    print_status(s_plain, out)
    html = build_report(s_plain)
    for shown in (out.getvalue(), html):
        assert "Jaas-Secret-42" not in shown and "Old-Secret-6" not in shown
    assert 'login: password="***"' in out.getvalue()
    assert "login: password=&quot;***&quot;" in html


def test_a_refused_login_or_access_is_one_line_naming_it():
    """What Spark's Kafka source ends with when the broker refuses bronze (the text of the
    Java client's exception, as Spark's query error carries it)."""
    from lakehouse.runner.books import kafka_failure

    s = load_settings(
        "test",
        config_path=CONF,
        env={"LAKEHOUSE_BRONZE__SOURCE": "kafka", "LAKEHOUSE_KAFKA__EVENTS__TOPIC": "shop.ev"},
    )
    refused = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
        "SaslAuthenticationException: Authentication failed: Invalid username or password\n"
        "\tat java.base/java.util.concurrent.CompletableFuture.reportGet(...)"
    )
    assert kafka_failure(s, "bronze.events", refused) == (
        "the Kafka broker at 127.0.0.1:9092 refused bronze's login for topic shop.ev "
        "(SaslAuthenticationException: Authentication failed: Invalid username or password); "
        "check the credentials and TLS settings in kafka.options"
    )
    denied = (
        "terminated with exception: org.apache.kafka.common.errors."
        "TopicAuthorizationException: Not authorized to access topics: [clicks]"
    )
    assert kafka_failure(s, "bronze.clicks", denied) == (
        "the Kafka broker at 127.0.0.1:9092 refused bronze access to topic clicks "
        "(TopicAuthorizationException: Not authorized to access topics: [clicks]); check the "
        "user's ACLs on the topic and kafka.options"
    )
    assert (
        kafka_failure(s.with_overrides({"bronze.source": "files"}), "bronze.events", refused)
        is None
    )
