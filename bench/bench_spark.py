"""The PySpark source against Parquet, and streaming latency through a server (issue 4).

Two measurements, one local SparkSession (`local[2]`, `topics.spark.session`):

* **Bulk read.** A real server fills one topic with N records (default 2e6; a
  JSON object of about 40 B with tag and node; `TOPICS_SEGMENT_MAX_EVENTS`
  from `--segment-events`, default 250000, so 8 segments at 2e6) and stops
  gracefully, so every record is in a segment. `topics spark-export` writes
  the same rows to Parquet (timed). Then, alternating, each read is consumed
  by `--consumer`: the `noop` sink (default; rows are produced, values need
  not be touched) or `hash` (the sum of an xxhash64 over all seven columns,
  so every value is read). The reads: `spark.read.format("topics")
  .option("path", ...)` (checksums verified, as always) and
  `spark.read.parquet(...)`. Best and median rows/s of `--repeat` runs each;
  the ratio source / Parquet is the issue's target (>= 0.5). A third read,
  `ceiling`, is a Python source of the same schema that yields one
  pre-decoded batch over and over (see `ceiling_source`): the most Spark's
  Python data source path carries here, whatever the decoder.
* **Streaming latency.** A server and a stream query
  (`readStream.format("topics").option("url", ...)`, `processingTime` trigger
  of `--trigger-ms`, `foreachBatch` sink). A writer appends one record every
  `1 / --rate` s, each carrying its write-ack wall clock (ms) in `data`;
  the sink records, for each row, `batch arrival wall clock - ack time`.
  Reported: p50/p95/p99/max over all rows after the first batch (the first
  one carries Python-worker start-up). This is write-ack to the moment the
  micro-batch's rows are in the driver's `foreachBatch` (one `collect`).

Prints markdown tables and writes JSON (default `bench/results/spark.json`).

    .venv/bin/python bench/bench_spark.py                       # both, 2e6 records
    .venv/bin/python bench/bench_spark.py --records 200000 --repeat 3 --stream-seconds 10
    .venv/bin/python bench/bench_spark.py --skip-stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recovery import Server

ROOT = Path(__file__).resolve().parent.parent


async def fill(base: str, n: int, per: int = 1000, conns: int = 4) -> None:
    """`n` records in batches of `per` over `conns` connections, topic `hist`."""

    async def worker(k: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            for b in range(k, n // per, conns):
                first = b * per
                recs = [
                    {
                        "data": {"order": first + j, "sku": f"S-{(first + j) % 97}", "qty": j % 9},
                        "tag": f"t{j % 16}",
                        "node": f"gw-{k}",
                    }
                    for j in range(per)
                ]
                r = await c.post(
                    "/v0/topics/hist",
                    content=orjson.dumps({"records": recs}),
                    headers={"content-type": "application/json"},
                )
                r.raise_for_status()

    await asyncio.gather(*(worker(k) for k in range(conns)))


def ceiling_source() -> Any:
    """Format `topics_ceiling`: the cost of Spark's Python source path alone.

    Each of `partitions` tasks decodes ONE Arrow batch from the topic's first
    segment and yields it again and again until it has produced `rows` rows:
    the same schema and values as the real source, almost no decoding. Its
    rows/s is the most any Python data source can deliver for this schema here.
    """
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from topics.spark.segments import DDL_SCHEMA, Bounds, load_offline, plan_slices, read_slice

    class Part(InputPartition):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Reader(DataSourceReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.path = options["path"]
            self.topic = options["topic"]
            self.parts = int(options["partitions"])
            self.rows = int(options["rows"])

        def partitions(self) -> list[Part]:
            per = self.rows // self.parts
            return [Part(per + (i < self.rows % self.parts)) for i in range(self.parts)]

        def read(self, partition: Any) -> Any:
            found = load_offline(self.path)
            sl = plan_slices(found, {self.topic: Bounds()}, self.path, None)[0]
            batch = next(iter(read_slice(sl)))
            left = partition.rows
            while left > 0:
                b = batch if left >= batch.num_rows else batch.slice(0, left)
                left -= b.num_rows
                yield b

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "topics_ceiling"

        def schema(self) -> str:
            return DDL_SCHEMA

        def reader(self, schema: Any) -> Reader:
            return Reader(dict(self.options))

    return Ceiling


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bulk(
    spark: Any, tmp: Path, n: int, repeat: int, segment_events: int, consumer: str
) -> dict[str, Any]:
    data = tmp / "bulk-data"
    s = Server(data, tmp / "bulk.log", {"TOPICS_SEGMENT_MAX_EVENTS": str(segment_events)})
    t = time.perf_counter()
    asyncio.run(fill(s.base, n))
    fill_s = time.perf_counter() - t
    s.stop(signal.SIGTERM)
    from topics.spark.segments import load_offline

    topic = load_offline(str(data))["hist"]
    segments = len(topic.cat.segments)
    seg_bytes = sum(p.stat().st_size for p in (data / "topics").rglob("seg-*"))

    pq_dir = tmp / "parquet"
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "topics",
            "spark-export",
            str(data),
            "--to",
            "parquet",
            str(pq_dir),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    export_s = float(export.stdout.rsplit("(", 1)[1].split(" s)")[0])
    pq_bytes = sum(p.stat().st_size for p in pq_dir.glob("*.parquet"))

    from pyspark.sql import functions as F

    def consume(df: Any) -> None:
        if consumer == "noop":
            df.write.format("noop").mode("overwrite").save()
        else:  # "hash": every value of every row is read (a hash over all columns, summed)
            cols = ("topic", "seq", "ts", "tag", "node", "meta", "data")
            df.agg(F.sum(F.pmod(F.xxhash64(*cols), F.lit(1_000_003)))).collect()

    def read_topics() -> None:
        consume(
            spark.read.format("topics").option("path", str(data)).option("topics", "hist").load()
        )

    def read_parquet() -> None:
        consume(spark.read.parquet(str(pq_dir)))

    spark.dataSource.register(ceiling_source())

    def read_ceiling() -> None:
        rd = spark.read.format("topics_ceiling").option("path", str(data))
        rd = rd.option("topic", "hist").option("partitions", str(segments))
        consume(rd.option("rows", str(n)).load())

    # Same rows on both sides.
    c1 = (
        spark.read.format("topics")
        .option("path", str(data))
        .option("topics", "hist")
        .load()
        .count()
    )
    c2 = spark.read.parquet(str(pq_dir)).count()
    assert c1 == c2 == n, (c1, c2, n)
    read_topics()  # warm-up: planner and Python workers start
    read_parquet()
    read_ceiling()
    times: dict[str, list[float]] = {"topics": [], "parquet": [], "ceiling": []}
    for _ in range(repeat):
        times["topics"].append(timed(read_topics))
        times["parquet"].append(timed(read_parquet))
        times["ceiling"].append(timed(read_ceiling))

    def rates(ts: list[float]) -> dict[str, float]:
        return {
            "best_rows_s": round(n / min(ts)),
            "median_rows_s": round(n / statistics.median(ts)),
            "seconds": [round(x, 3) for x in ts],
        }

    out = {
        "records": n,
        "consumer": consumer,
        "fill_s": round(fill_s, 2),
        "segments": segments,
        "segment_bytes": seg_bytes,
        "parquet_bytes": pq_bytes,
        "export_s": export_s,
        "topics": rates(times["topics"]),
        "parquet": rates(times["parquet"]),
        "ceiling": rates(times["ceiling"]),
    }
    out["ratio_median"] = round(
        statistics.median(times["parquet"]) / statistics.median(times["topics"]), 2
    )
    out["ratio_best"] = round(min(times["parquet"]) / min(times["topics"]), 2)
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(pq_dir, ignore_errors=True)
    return out


def stream(spark: Any, tmp: Path, seconds: float, rate: float, trigger_ms: int) -> dict[str, Any]:
    s = Server(tmp / "stream-data", tmp / "stream.log")
    lat_ms: list[float] = []
    batches: list[int] = []
    lock = threading.Lock()
    with httpx.Client(base_url=s.base) as c:
        c.post("/v0/topics/live", json={"records": [{"data": {"warm": True}}]}).raise_for_status()

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select("data").collect()
        now = time.time() * 1000
        with lock:
            batches.append(len(rows))
            if batch_id == 0:
                return  # Python worker start-up
            for r in rows:
                d = orjson.loads(r["data"])
                if "ack_ms" in d:
                    lat_ms.append(now - d["ack_ms"])

    q = (
        spark.readStream.format("topics")
        .option("url", s.base)
        .option("topics", "live")
        .option("startingSeq", "earliest")
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
    try:
        while not batches:  # the query is up and has done its first batch
            time.sleep(0.05)
        with httpx.Client(base_url=s.base) as c:
            end = time.monotonic() + seconds
            k = 0
            while time.monotonic() < end:
                # ack_ms is set before the request; the ack follows within the write's latency
                # (about 0.3 ms here), counted in the latency.
                body = {"records": [{"data": {"k": k, "ack_ms": time.time() * 1000}}]}
                c.post("/v0/topics/live", json=body).raise_for_status()
                k += 1
                time.sleep(1 / rate)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(lat_ms) >= k:
                    break
            time.sleep(0.05)
    finally:
        q.stop()
        s.stop(signal.SIGTERM)
    lat_ms.sort()

    def pct(p: float) -> float:
        return round(lat_ms[min(len(lat_ms) - 1, int(p * len(lat_ms)))], 1)

    return {
        "trigger_ms": trigger_ms,
        "rate_per_s": rate,
        "written": k,
        "seen": len(lat_ms),
        "batches": len(batches),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": round(lat_ms[-1], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--consumer",
        choices=["noop", "hash"],
        default="noop",
        help="noop: the noop sink; hash: sum of xxhash64 over every column (reads every value)",
    )
    ap.add_argument(
        "--segment-events", type=int, default=250_000, help="TOPICS_SEGMENT_MAX_EVENTS of the fill"
    )
    ap.add_argument("--stream-seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=200.0, help="streamed records per second")
    ap.add_argument("--trigger-ms", type=int, nargs="*", default=[0, 100])
    ap.add_argument("--skip-bulk", action="store_true")
    ap.add_argument("--skip-stream", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "bench/results/spark.json"))
    args = ap.parse_args()

    from topics.spark.session import local_session

    spark = local_session("bench-spark")
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "pyspark": spark.version,
            "load_avg_start": os.getloadavg(),
        },
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
    }
    try:
        with tempfile.TemporaryDirectory(prefix="topics-bench-spark-") as d:
            if not args.skip_bulk:
                print(f"filling {args.records:,} records ...", file=sys.stderr)
                out["bulk"] = b = bulk(
                    spark, Path(d), args.records, args.repeat, args.segment_events, args.consumer
                )
                print(
                    f"\n{b['records']:,} records, {b['segments']} segments "
                    f"({b['segment_bytes'] / 1e6:.0f} MB), Parquet {b['parquet_bytes'] / 1e6:.0f} MB "
                    f"(spark-export {b['export_s']} s)\n"
                )
                print("| read | best rows/s | median rows/s |")
                print("|---|---|---|")
                for k in ("topics", "parquet", "ceiling"):
                    print(f"| {k} | {b[k]['best_rows_s']:,} | {b[k]['median_rows_s']:,} |")
                print(f"\nsource / Parquet: {b['ratio_median']}x median, {b['ratio_best']}x best\n")
            if not args.skip_stream:
                out["stream"] = []
                for tm in args.trigger_ms:
                    print(f"streaming, trigger {tm} ms ...", file=sys.stderr)
                    out["stream"].append(stream(spark, Path(d), args.stream_seconds, args.rate, tm))
                print("| trigger | records | batches | p50 ms | p95 ms | p99 ms | max ms |")
                print("|---|---|---|---|---|---|---|")
                for r in out["stream"]:
                    print(
                        f"| {r['trigger_ms']} ms | {r['seen']}/{r['written']} | {r['batches']} | "
                        f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['max_ms']} |"
                    )
    finally:
        spark.stop()
    out["env"]["load_avg_end"] = os.getloadavg()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
