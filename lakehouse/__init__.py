"""Streaming medallion lakehouse on Spark Structured Streaming with Delta tables."""

__version__ = "0.1.0"
