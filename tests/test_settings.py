from pathlib import Path

import pytest

from lakehouse.settings import SettingsError, duration_seconds, load_settings

CONF = Path(__file__).resolve().parent.parent / "conf" / "lakehouse.toml"


def test_profiles_layer_over_defaults():
    local = load_settings("local", config_path=CONF, env={})
    test = load_settings("test", config_path=CONF, env={})
    assert (local.master, local.shuffle_partitions) == ("local[*]", 4)
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
            "unknown setting 'trigger.mod'; allowed here: interval, max_files_per_trigger, mode",
        ),
        ({"backend": "s3"}, {}, "setting 'backend' must be one of embedded, native; got 's3'"),
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
        ({"shuffle_partitions": "0"}, {}, "setting 'shuffle_partitions' must be > 0; got 0"),
        (
            {"state_store.changelog_checkpointing": "maybe"},
            {},
            "must be true or false; got 'maybe'",
        ),
        ({}, {"LAKEHOUSE_WATERMARK__EVENTS": "1 minute"}, "unknown setting 'watermark'"),
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
    bad.write_text("[defaults]\nbackend = 'embedded'\nroots = 'x'\n")
    with pytest.raises(SettingsError, match="unknown setting 'roots'"):
        load_settings(config_path=bad, env={})
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(config_path=tmp_path / "missing.toml", env={})


def test_invalid_table_names():
    s = load_settings("test", config_path=CONF, env={})
    for name in ("sessions", "platinum.sessions", "gold.Sessions", "gold.a.b"):
        with pytest.raises(SettingsError, match="expected '<layer>.<table>'"):
            s.table_path(name)


def test_durations():
    assert duration_seconds("10 minutes") == 600
    assert duration_seconds("1 hour") == 3600
    assert duration_seconds("5 seconds") == 5
