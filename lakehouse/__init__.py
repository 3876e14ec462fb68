"""Streaming medallion lakehouse on Spark Structured Streaming with Delta tables."""

# pyproject.toml's [project] version (tests/test_install.py checks they agree): what a checkout
# that is not installed reports
__version__ = "0.1.0"


def version() -> str:
    """The installed distribution's version (importlib.metadata), else :data:`__version__`."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("lakehouse")
    except PackageNotFoundError:
        return __version__
