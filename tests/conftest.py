"""One Spark session for the whole test run (local[2], 2 shuffle partitions, UTC, UI off)."""

from __future__ import annotations

import pytest

from lakehouse.settings import load_settings


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from lakehouse.session import build_session

    settings = load_settings("test", overrides={"root": str(tmp_path_factory.mktemp("lake"))})
    session = build_session(settings, app_name="lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path):
    """Test-profile settings with a fresh lake root per test."""
    return load_settings("test", overrides={"root": str(tmp_path / "lake")})


@pytest.fixture
def store(spark, settings):
    from lakehouse.storage import table_store

    return table_store(spark, settings)
