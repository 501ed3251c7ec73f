"""Run by tests/spark/test_offline_s3.py in its own process, with `AWS_*` in its
environment from the start (as on a cluster, where the driver and the executors have
them): both readers on a data directory whose cold tier is an object store.

    python tests/spark/s3_session.py DATA_DIR COLD_URL

Prints one `KEY value` line per check.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    from topics.spark.session import local_session

    data, cold = sys.argv[1], sys.argv[2]
    spark = local_session("s3-readers")
    spark.sparkContext.setLogLevel("ERROR")

    def read(reader: str) -> Any:
        return (
            spark.read.format("topics")
            .option("path", data)
            .option("coldDir", cold)
            .option("topicPattern", ".*")
            .option("reader", reader)
            .load()
        )

    jvm, py = read("jvm"), read("python")
    print("jvm_scan", "topics (JVM reader)" in jvm._jdf.queryExecution().executedPlan().toString())
    print("jvm_count", jvm.count())
    print("python_count", py.count())
    print("jvm_minus_python", jvm.exceptAll(py).count())
    print("python_minus_jvm", py.exceptAll(jvm).count())
    spark.stop()


if __name__ == "__main__":
    main()
