import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse import settings as settings_module
from lakehouse.settings import SettingsError, duration_seconds, load_settings

CONF = Path(__file__).resolve().parent.parent / "conf" / "lakehouse.toml"


def test_profiles_layer_over_defaults():
    local = load_settings("local", config_path=CONF, env={})
    test = load_settings("test", config_path=CONF, env={})
    assert (local.master, local.shuffle_partitions) == ("local[*]", 0)
    assert (test.master, test.shuffle_partitions) == ("local[2]", 2)
    assert test.watermarks.events == "10 minutes"
    assert test.state_store.provider == "rocksdb" and test.state_store.changelog_checkpointing


def test_environment_then_flags_override_the_file():
    env = {"LAKEHOUSE_ROOT": "/data/lake", "LAKEHOUSE_TRIGGER__MODE": "continuous"}
    s = load_settings("test", config_path=CONF, env=env)
    assert s.root == Path("/data/lake") and s.trigger.mode == "continuous"
    s = load_settings(
        "test", config_path=CONF, env=env, overrides={"root": "/x", "shuffle_partitions": "3"}
    )
    assert s.root == Path("/x") and s.shuffle_partitions == 3 and s.trigger.mode == "continuous"


def test_profile_from_environment():
    assert load_settings(config_path=CONF, env={"LAKEHOUSE_PROFILE": "cluster"}).master == (
        "spark://127.0.0.1:7077"
    )


def test_lake_layout():
    s = load_settings("test", config_path=CONF, env={}, overrides={"root": "/lake"})
    assert s.table_path("gold.sessions") == Path("/lake/tables/gold/sessions")
    assert s.checkpoint_path("silver", "events") == Path("/lake/checkpoints/silver/events")
    assert s.landing_path("clicks") == Path("/lake/landing/clicks")


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        (
            {"trigger.mod": "x"},
            {},
            "unknown setting 'trigger.mod'; allowed here: bronze_interval, gold_interval, "
            "interval, max_files_per_trigger, mode, restart_delay, restarts, silver_interval",
        ),
        (
            {"trigger.mode": "once"},
            {},
            "setting 'trigger.mode' must be one of available-now, continuous; got 'once'",
        ),
        (
            {"watermarks.events": "ten minutes"},
            {},
            "setting 'watermarks.events': invalid duration 'ten minutes'",
        ),
        ({"shuffle_partitions": "-1"}, {}, "setting 'shuffle_partitions' must be >= 0; got -1"),
        (
            {"state_store.changelog_checkpointing": "maybe"},
            {},
            "must be true or false; got 'maybe'",
        ),
        (
            {},
            {"LAKEHOUSE_WATERMARKS__EVENT": "1 minute"},
            "unknown setting 'watermarks.event'; allowed here: attribution, clicks, events, "
            "impressions (from environment variable LAKEHOUSE_WATERMARKS__EVENT)",
        ),
        (
            {"scheduler.spark_conn_id": "spark default"},
            {},
            "setting 'scheduler.spark_conn_id' must be an Airflow connection id (letters, "
            "digits, '.', '_', '-'); got 'spark default'",
        ),
        ({"scheduler.spark_conn_id": ""}, {}, "must be an Airflow connection id"),
        (
            {"write.arrow_append_rows": "0"},
            {},
            "setting 'write.arrow_append_rows' was removed: every table is written by the one "
            "engine its declaration names (delta-rs by default), whatever the size of a "
            "micro-batch; remove it",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(overrides, env, message):
    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env=env, overrides=overrides)
    assert message in str(err.value)


def test_unknown_profile_and_file_errors(tmp_path):
    with pytest.raises(
        SettingsError, match="unknown profile 'prod'; allowed: cluster, local, test"
    ):
        load_settings("prod", config_path=CONF, env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[defaults]\nlog_level = 'WARN'\nroots = 'x'\n")
    with pytest.raises(SettingsError, match="unknown setting 'roots'"):
        load_settings(config_path=bad, env={})
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(config_path=tmp_path / "missing.toml", env={})


def test_without_a_settings_file_the_built_in_defaults_are_the_local_profile(monkeypatch):
    """An installed package run outside a checkout finds no conf/lakehouse.toml: its built-in
    defaults are what the file says for the local profile; another profile says how to give
    the file."""
    monkeypatch.setattr(settings_module, "default_config_path", lambda: None)
    assert load_settings(env={}) == load_settings("local", config_path=CONF, env={})
    with pytest.raises(SettingsError) as err:
        load_settings(env={"LAKEHOUSE_PROFILE": "cluster"})
    assert str(err.value) == (
        "unknown profile 'cluster': without a settings file (there is none at "
        "./conf/lakehouse.toml; give one with --config or LAKEHOUSE_CONFIG) the only profile "
        "is 'local'"
    )


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which variables this process was warned about already."""
    monkeypatch.setattr(settings_module, "_WARNED", set(), raising=False)


def test_a_variable_that_names_no_setting_is_ignored_with_one_warning(fresh_warnings, caplog):
    """Other tools set LAKEHOUSE_* variables too: one whose first part names no setting is
    ignored, with one warning per variable (however often the settings are loaded); the
    project's own (LAKEHOUSE_HOME of the DAG file and the image) without one."""
    env = {
        "LAKEHOUSE_HOME": "/opt/lakehouse",
        "LAKEHOUSE_VERSION": "2",
        "LAKEHOUSE_WATERMARK__EVENTS": "1 minute",
        "LAKEHOUSE_ROOT": "/lake",
    }
    with caplog.at_level(logging.WARNING, logger="lakehouse.settings"):
        settings = load_settings("test", config_path=CONF, env=env)
        assert load_settings("test", config_path=CONF, env=env) == settings
    assert settings == load_settings("test", config_path=CONF, env={}, overrides={"root": "/lake"})
    assert [r.getMessage() for r in caplog.records] == [
        "lakehouse: warning: ignoring environment variable LAKEHOUSE_VERSION: no setting is "
        "named 'version'",
        "lakehouse: warning: ignoring environment variable LAKEHOUSE_WATERMARK__EVENTS: no "
        "setting is named 'watermark' (did you mean LAKEHOUSE_WATERMARKS__EVENTS?)",
    ]


def test_the_warning_is_one_line_and_a_misspelt_key_one_line_of_error(tmp_path):
    """As a command shows them: the warning on stderr in one line, and a key misspelt inside a
    known section (LAKEHOUSE_TRIGGER__MODEE) stops the command in one line, as before."""
    probe = (
        "import sys; from lakehouse.settings import load_settings; "
        f"load_settings(config_path={str(CONF)!r}); load_settings(config_path={str(CONF)!r})"
    )
    env = {**os.environ, "LAKEHOUSE_NOT_A_SETTING": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("LAKEHOUSE_") or "NOT_A" in k}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "lakehouse: warning: ignoring environment variable LAKEHOUSE_NOT_A_SETTING: no setting "
        "is named 'not_a_setting'\n"
    )
    env["LAKEHOUSE_TRIGGER__MODEE"] = "continuous"
    done = subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "status", "--root", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "lakehouse: warning: ignoring environment variable LAKEHOUSE_NOT_A_SETTING: no setting "
        "is named 'not_a_setting'",
        "lakehouse: error: unknown setting 'trigger.modee'; allowed here: bronze_interval, "
        "gold_interval, interval, max_files_per_trigger, mode, restart_delay, restarts, "
        "silver_interval (from environment variable LAKEHOUSE_TRIGGER__MODEE)",
    ]


RETIRED = (
    "the embedded Delta backend (delta-rs) is gone: every table is read and written with "
    "delta-spark; remove the setting 'backend'"
)


def test_the_retired_backend_setting_says_it_is_gone(tmp_path, capsys):
    """Asking for the embedded backend, in any place a setting comes from, is one line saying
    it is gone; naming the backend that remains is harmless and ignored."""
    from lakehouse.cli import main

    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env={}, overrides={"backend": "embedded"})
    assert str(err.value) == RETIRED
    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env={"LAKEHOUSE_BACKEND": "embedded"})
    assert str(err.value) == f"{RETIRED} (from environment variable LAKEHOUSE_BACKEND)"
    old = tmp_path / "old.toml"
    old.write_text("[defaults]\nbackend = 'embedded'\n")
    with pytest.raises(SettingsError, match="embedded Delta backend"):
        load_settings(config_path=old, env={})
    kept = load_settings("test", config_path=CONF, env={"LAKEHOUSE_BACKEND": "native"})
    assert kept == load_settings("test", config_path=CONF, env={})
    assert main(["status", "--root", str(tmp_path), "--backend", "embedded"]) == 2
    assert capsys.readouterr().err == f"lakehouse: error: {RETIRED}\n"


def test_invalid_table_names():
    s = load_settings("test", config_path=CONF, env={})
    for name in ("sessions", "platinum.sessions", "gold.Sessions", "gold.a.b"):
        with pytest.raises(SettingsError, match="expected '<layer>.<table>'"):
            s.table_path(name)


def test_durations():
    assert duration_seconds("10 minutes") == 600
    assert duration_seconds("1 hour") == 3600
    assert duration_seconds("5 seconds") == 5


def test_a_kafka_topic_can_set_its_own_starting_offsets_and_batch_size():
    env = {
        "LAKEHOUSE_KAFKA__TOPIC_PREFIX": "shop.",
        "LAKEHOUSE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "5000",
        "LAKEHOUSE_KAFKA__EVENTS__STARTING_OFFSETS": '{"0": 1200, "2": -2}',
        "LAKEHOUSE_KAFKA__CLICKS__MAX_OFFSETS_PER_TRIGGER": "0",
        "LAKEHOUSE_KAFKA__IMPRESSIONS__STARTING_OFFSETS": "latest",
    }
    kafka = load_settings("test", config_path=CONF, env=env).kafka
    assert kafka.starting_offsets_of("events", "shop.events") == (
        '{"shop.events": {"0": 1200, "2": -2}}'
    )
    assert kafka.starting_offsets_of("impressions", "shop.impressions") == "latest"
    assert kafka.starting_offsets_of("clicks", "shop.clicks") == "earliest"  # kafka.'s
    assert [kafka.max_offsets_of(s) for s in ("events", "impressions", "clicks")] == [
        5000,
        5000,
        0,
    ]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "kafka.events.starting_offsets",
            '{"0": "x"}',
            "setting 'kafka.events.starting_offsets' must be earliest, latest, or a JSON object"
            ' of offsets per partition such as {"0": 1200, "1": -2} (-2 earliest, -1 latest);'
            ' got \'{"0": "x"}\'',
        ),
        ("kafka.clicks.starting_offsets", "oldest", "must be earliest, latest, or a JSON object"),
        ("kafka.starting_offsets", '{"0": 1}', "must be one of earliest, latest"),
        (
            "kafka.events.max_offsets_per_trigger",
            "-2",
            "setting 'kafka.events.max_offsets_per_trigger' must be -1 "
            "(kafka.max_offsets_per_trigger), 0 (no limit) or more; got -2",
        ),
    ],
)
def test_bad_kafka_topic_settings_say_what_is_allowed(key, value, message):
    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env={}, overrides={key: value})
    assert message in str(err.value)


def test_a_refresh_stages_a_flow_and_its_table_of_the_same_name_apart(tmp_path):
    from lakehouse.runner import layer_flows
    from lakehouse.runner.switch import staged_settings

    settings = load_settings("local", overrides={"root": str(tmp_path)})
    flow = next(f for f in layer_flows("gold") if f.name == "gold.sessions")
    staged = staged_settings(settings, tmp_path / "refresh" / "r1", [flow])
    assert staged.checkpoint_path("gold", "sessions") == (
        tmp_path / "refresh" / "r1" / "checkpoints" / "gold" / "sessions"
    )
    assert staged.table_path("gold.sessions") == (
        tmp_path / "refresh" / "r1" / "tables" / "gold" / "sessions"
    )
    assert staged.checkpoint_path("gold", "user_activity") == (
        tmp_path / "checkpoints" / "gold" / "user_activity"
    )


def test_a_flag_left_out_keeps_what_conf_says():
    import argparse

    from lakehouse.cli import settings_from_args

    args = argparse.Namespace(
        conf=["kafka.bootstrap_servers=127.0.0.1:19092", "root=/lake"],
        root=None,
        backend=None,
        verbose=False,
        profile="local",
        config=None,
    )
    settings = settings_from_args(args, {"kafka.bootstrap_servers": None})
    assert settings.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert settings.root == Path("/lake")
    flagged = settings_from_args(args, {"kafka.bootstrap_servers": "10.0.0.1:9092"})
    assert flagged.kafka.bootstrap_servers == "10.0.0.1:9092"


def test_a_layer_can_run_at_its_own_interval_in_continuous_mode():
    """trigger.<layer>_interval sets one layer's processing-time interval; the others keep
    trigger.interval. In available-now mode every flow runs once, whatever the intervals."""
    from lakehouse.storage import trigger_kwargs

    s = load_settings(
        "test",
        config_path=CONF,
        env={"LAKEHOUSE_TRIGGER__GOLD_INTERVAL": "1 minute"},
        overrides={"trigger.mode": "continuous", "trigger.interval": "10 seconds"},
    )
    assert trigger_kwargs(s.trigger, "gold") == {"processingTime": "1 minute"}
    assert trigger_kwargs(s.trigger, "bronze") == {"processingTime": "10 seconds"}
    once = s.with_overrides({"trigger.mode": "available-now"})
    assert trigger_kwargs(once.trigger, "gold") == {"availableNow": True}
    with pytest.raises(SettingsError, match="setting 'trigger.silver_interval': invalid duration"):
        s.with_overrides({"trigger.silver_interval": "soon"})


def test_the_airflow_dags_spark_connection_and_package_folder():
    s = load_settings("test", config_path=CONF, env={})
    assert (s.scheduler.spark_conn_id, s.scheduler.dist_dir) == ("spark_default", "")
    env = {"LAKEHOUSE_SCHEDULER__SPARK_CONN_ID": "spark_cluster"}
    assert load_settings("test", config_path=CONF, env=env).scheduler.spark_conn_id == (
        "spark_cluster"
    )


def test_a_lake_root_given_as_a_uri_is_one_line_of_error_and_no_folder_named_after_it(
    tmp_path, monkeypatch, capsys
):
    """`--root s3a://bucket/lake` had become a local folder named `s3a:`, with no word that the
    lake lives on a local disk. Now any URI but file:// is refused, naming only its scheme (a
    URI may carry credentials), and nothing is created; file:///abs is that local path."""
    from lakehouse.cli import main

    monkeypatch.chdir(tmp_path)
    for uri, scheme in (("s3a://KEY:SECRET@bucket/lake", "s3a"), ("S3://bucket/lake", "S3")):
        assert main(["status", "--root", uri]) == 2
        assert capsys.readouterr().err == (
            f"lakehouse: error: setting 'root' is a {scheme}:// URI: this version keeps the lake "
            "on a local disk only (object storage is not supported yet); give a local folder\n"
        )
    assert list(tmp_path.iterdir()) == []
    local = load_settings(
        "test", config_path=CONF, env={}, overrides={"root": f"file://{tmp_path}"}
    )
    assert local.root == tmp_path
    with pytest.raises(SettingsError) as err:
        load_settings("test", config_path=CONF, env={}, overrides={"root": "file://lake"})
    assert str(err.value) == (
        "setting 'root': a file:// URI names an absolute path (file:///srv/lake)"
    )
