"""PySpark source and sink for topics: `spark.read.format("topics")` (docs/SPARK.md).

Install with the `spark` extra of the `topics-server` distribution (pyspark >= 4, pyarrow, pandas < 3;
Java 17 at run time). The format is registered automatically in every new
SparkSession through the `pyspark_topics` module (Spark looks up importable
`pyspark_*` modules exposing `DefaultSource`); :func:`register` does it by hand,
e.g. for a session started before the package was installed.

Reads: `option("path", DATA_DIR)` reads segment files offline, one task per
segment, in Java when the session has the package's jar (:func:`jar_path`,
:func:`add_jar`, :func:`local_session` adds it) and in Python otherwise;
`option("url", "http://host:port")` reads through a server, in batch or as a
stream. Writes: `df.write.format("topics").option("url", ...)`. The options,
schema and guarantees are in docs/SPARK.md ("Two readers" for the jar).
"""

from __future__ import annotations

from typing import Any

from topics.spark.segments import DDL_SCHEMA

__all__ = ["DDL_SCHEMA", "TopicsDataSource", "add_jar", "jar_path", "local_session", "register"]


def __getattr__(name: str) -> Any:
    if name == "TopicsDataSource":
        from topics.spark.source import TopicsDataSource

        return TopicsDataSource
    if name in ("add_jar", "jar_path"):
        from topics.spark import jvm

        return getattr(jvm, name)
    if name == "local_session":
        from topics.spark.session import local_session

        return local_session
    raise AttributeError(name)


def register(spark: Any, *, force: bool = False) -> None:
    """Register format "topics" in the SparkSession `spark`.

    Does nothing when the format is already known (auto-registration found the
    installed `pyspark_topics` module) unless `force`.
    """
    from topics.spark.source import TopicsDataSource

    if not force:
        try:
            if spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("topics"):
                return
        except Exception:  # Spark Connect sessions have no JVM handle: just register
            pass
    spark.dataSource.register(TopicsDataSource)
