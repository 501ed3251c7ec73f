"""Rough throughput of topics-jvm against the Python `topics` source (same data, same session).

Usage: python spark-jvm/bench.py [RECORDS] [c2]   (default 200000; build the jar first)
With "c2" the driver JVM runs with the default JIT and GC instead of
topics.spark.session's FAST_JVM_OPTIONS (C1 only, serial GC).
Writes RECORDS records (tag, node, ~60-byte JSON data) through a real server with
50,000-record segments, then times `df.write.format("noop")` (every column
materialised) for each source, best and median of 5, local[2]. Numbers on a
shared 2-core machine are noisy.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from plan_json import write_plan  # noqa: E402
from tests.spark.support import client, write  # noqa: E402
from tests.support.process import ServerProcess  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory(prefix="topics-jvm-bench-") as t:
        tmp = Path(t)
        env = {"TOPICS_SEGMENT_MAX_EVENTS": "50000", "TOPICS_HOT_RETAIN_SEGMENTS": "1000000"}
        srv = ServerProcess(tmp, env=env)
        t0 = time.monotonic()
        try:
            with client(srv) as c:
                for b in range(0, n, 5000):
                    write(
                        c,
                        "bench",
                        [
                            {
                                "data": {
                                    "i": i,
                                    "sku": f"S-{i % 97}",
                                    "qty": i % 13,
                                    "note": "abcdefgh",
                                },
                                "tag": f"t{i % 5}",
                                "node": f"gw-{i % 3}",
                            }
                            for i in range(b, min(n, b + 5000))
                        ],
                    )
        finally:
            assert srv.stop() == 0
        print(f"wrote {n} records in {time.monotonic() - t0:.1f}s")
        data = tmp / "data"
        plan = tmp / "plan.json"
        parts = write_plan(str(plan), str(data), None, ["bench"], "json")
        from topics.spark.session import local_session

        conf = {"spark.jars": str(HERE / "build" / "topics-spark-jvm.jar")}
        if "c2" in sys.argv[2:]:
            conf["spark.driver.extraJavaOptions"] = "-XX:+UseParallelGC"
        spark = local_session("topics-jvm-bench", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            srcs = {
                "topics-jvm": lambda: (
                    spark.read.format("topics-jvm").option("plan", str(plan)).load()
                ),
                "topics (python)": lambda: (
                    spark.read.format("topics")
                    .option("path", str(data))
                    .option("topics", "bench")
                    .load()
                ),
            }
            for name, df in srcs.items():
                assert df().count() == n, name
                times = []
                for _ in range(5):
                    t1 = time.monotonic()
                    df().write.format("noop").mode("overwrite").save()
                    times.append(time.monotonic() - t1)
                print(
                    f"{name}: {parts} partitions, best {n / min(times) / 1e6:.2f} M rows/s, "
                    f"median {n / statistics.median(times) / 1e6:.2f} M rows/s"
                )
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
