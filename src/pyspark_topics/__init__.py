"""Automatic registration of the `topics` format in every SparkSession.

Spark imports each importable top-level `pyspark_*` module at session start and
registers its `DefaultSource`; this module only re-exports the real source from
:mod:`topics.spark.source`.
"""

from topics.spark.source import TopicsDataSource as DefaultSource

__all__ = ["DefaultSource"]
