"""Run by tests/spark/test_jvm.py in its own process: a fresh session without the
JVM reader's jar, then the jar added to the running session with `ADD JAR`.

    python tests/spark/no_jar_session.py DATA_DIR COLD_DIR

Prints one `KEY value` line per check; logging goes to stderr.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import topics.spark.jvm as jvm


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(name)s %(message)s")
    data, cold = sys.argv[1], sys.argv[2]
    real = jvm.jar_path
    jvm.jar_path = lambda: None  # an install built without a JDK
    from topics.spark import add_jar
    from topics.spark.session import local_session

    spark = local_session("no-jar")
    spark.sparkContext.setLogLevel("ERROR")

    def read(**opts: str) -> Any:
        r = spark.read.format("topics").option("path", data).option("coldDir", cold)
        for k, v in {"topicPattern": ".*", **opts}.items():
            r = r.option(k, v)
        return r.load()

    def jvm_scan(df: Any) -> bool:
        return "topics (JVM reader)" in df._jdf.queryExecution().executedPlan().toString()

    df = read()
    print("no_jar_scan_is_jvm", jvm_scan(df), flush=True)
    print("no_jar_count", df.count(), flush=True)
    try:
        read(reader="jvm").count()
        print("no_jar_forced", "read", flush=True)
    except Exception as e:  # the message is what the test checks
        print("no_jar_forced", "refused" if "not on this session" in str(e) else e, flush=True)
    print("add_jar_without_jar", add_jar(spark), flush=True)
    jvm.jar_path = real
    print("add_jar", add_jar(spark), flush=True)
    df = read()
    print("added_scan_is_jvm", jvm_scan(df), flush=True)
    print("added_count", df.count(), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
