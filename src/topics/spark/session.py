"""A local SparkSession set up for the topics source (tests, examples, benchmarks).

On a cluster, build the session as usual (`spark-submit` sets the master); the
settings below that matter there too are `spark.sql.python.filterPushdown.enabled`
(seq/ts/topic pushdown) and a Python with `topics-server[spark]` installed on every
executor (`PYSPARK_PYTHON`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["FAST_JVM_OPTIONS", "local_session"]

log = logging.getLogger("topics.spark")

#: The serial GC only: on the 2-core project machine a session starts in about 5.0 s
#: with it (4.7 s when C1 is the only JIT, 5.4 s with neither), and keeping the C2 JIT
#: doubles the JVM reader's speed (`bench/bench_spark.py --jvm-flags c1 default
#: serialgc`, docs/BENCHMARKS.md).
FAST_JVM_OPTIONS = "-XX:+UseSerialGC"


def local_session(
    app_name: str = "topics",
    *,
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
) -> Any:
    """Start (or get) a local SparkSession: loopback only, no UI, fast JVM flags.

    Sets `PYSPARK_PYTHON`/`PYSPARK_DRIVER_PYTHON` to this interpreter (so the
    Python workers import the same packages) and `SPARK_LOCAL_IP=127.0.0.1`
    unless already set, enables Python filter pushdown, puts the JVM reader's
    jar in `spark.jars` (docs/SPARK.md, "Two readers"; when the install has no
    jar, one log line says offline reads use the Python reader) and registers
    the `topics` format explicitly (harmless when auto-registration already did).
    `master` may be `local[N,F]` to let a failed task be retried `F - 1` times.
    A `spark.jars` in `conf` is kept, with the reader's jar added.
    Returns the `pyspark.sql.SparkSession`.
    """
    from pyspark.sql import SparkSession

    from topics.spark.jvm import NO_JAR, jar_path

    conf = dict(conf or {})
    jar = jar_path()
    if jar is None:
        log.warning(NO_JAR)
    else:
        conf["spark.jars"] = ",".join(j for j in (conf.get("spark.jars"), jar) if j)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", FAST_JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", FAST_JVM_OPTIONS)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
    )
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    from topics.spark import register

    register(spark)
    return spark
