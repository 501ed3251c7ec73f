"""The PySpark readers against Parquet, and streaming latency through a server.

Everything Spark-side runs in a child process of this script, one per JVM preset
(`--jvm-flags`), each with its own local SparkSession (`local[2]`,
`topics.spark.session.local_session`): a fresh JVM per preset is the only clean way
to compare JIT and GC flags. The parent fills and exports the data once, starts the
children one after another, merges what they write and prints the tables.

* **Bulk read.** A real server fills one topic with N records (default 2e6; a
  JSON object of about 40 B with tag and node; `TOPICS_SEGMENT_MAX_EVENTS`
  from `--segment-events`, default 250000, so 8 segments at 2e6) and stops
  gracefully, so every record is in a segment. `topics spark-export` writes
  the same rows to Parquet (timed). Four reads of the same rows, alternating
  within each round, `--repeat` rounds:

  - `parquet`: `spark.read.parquet(...)`;
  - `jvm`: `spark.read.format("topics").option("path", ...)` with
    `reader=jvm` (the Java reader of the jar; its plan is checked to say
    `topics (JVM reader)`);
  - `python`: the same with `reader=python` (the Python Data Source);
  - `ceiling`: a Python source of the same schema that yields one
    pre-decoded batch over and over (see `ceiling_source`): the most Spark's
    Python data source path carries here, whatever the decoder.

  Checksums are verified by both topics readers, as always. Each read is
  consumed by each `--consumer` (default both): `noop` (the noop sink; rows
  are produced, values need not be touched) or `hash` (the sum of an xxhash64
  over all seven columns, so every value is read). And each with each
  `--cache` state (default both): `warm` (every file read into the page cache
  first) and `cold` (before every timed read, the segment files and the
  Parquet files are evicted with `posix_fadvise(POSIX_FADV_DONTNEED)`, the
  helper of bench_invariant.py, which needs no root; the share of those files
  still resident after eviction is reported). Best and median rows/s per read,
  and the ratios jvm / Parquet and python / Parquet (rows/s over rows/s).
* **JVM presets.** `--jvm-flags` names one or more presets for
  `spark.driver.extraJavaOptions` / `spark.executor.extraJavaOptions`:
  `session` (whatever `local_session` sets; the default), `c1`
  (`-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`: C1-only JIT), `default` (no extra
  flags: the JVM's own tiered JIT and GC) and `serialgc` (`-XX:+UseSerialGC`
  only). Each preset runs the whole bulk read in its own session; reported per
  preset: the time `local_session` took to return (JVM start), the JVM's
  actual input arguments, and the warm `noop` rows/s of jvm and parquet.
* **Streaming latency.** Once, in the session of the first preset. A server
  and a stream query (`readStream.format("topics").option("url", ...)`,
  `processingTime` trigger of `--trigger-ms`, `foreachBatch` sink). A writer
  appends one record every `1 / --rate` s, each carrying its write-ack wall
  clock (ms) in `data`; the sink records, for each row, `batch arrival wall
  clock - ack time`. Reported: p50/p95/p99/max over all rows after the first
  batch (the first one carries Python-worker start-up). This is write-ack to
  the moment the micro-batch's rows are in the driver's `foreachBatch` (one
  `collect`).

Prints markdown tables and writes JSON (default `bench/results/spark.json`);
docs/BENCHMARKS.md ("Spark source and sink") describes both.

    .venv/bin/python bench/bench_spark.py                       # all of it, 2e6 records
    .venv/bin/python bench/bench_spark.py --skip-stream --jvm-flags c1 default serialgc
    .venv/bin/python bench/bench_spark.py --records 200000 --repeat 3 --stream-seconds 10
    .venv/bin/python bench/bench_spark.py --skip-stream --consumer noop --cache warm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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
from bench_invariant import evict, warm_files
from bench_recovery import Server

ROOT = Path(__file__).resolve().parent.parent

#: `--jvm-flags` presets: the value of spark.driver/executor.extraJavaOptions, or None
#: for "leave local_session's own setting" (FAST_JVM_OPTIONS in topics.spark.session).
PRESETS: dict[str, str | None] = {
    "session": None,
    "c1": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "default": "",
    "serialgc": "-XX:+UseSerialGC",
}
READS = ("parquet", "jvm", "python", "ceiling")
CONSUMERS = ("noop", "hash")
CACHES = ("warm", "cold")
JVM_PLAN_MARK = "topics (JVM reader)"  # in the executed plan of a read the JVM reader does


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


def prepare(tmp: Path, n: int, segment_events: int) -> dict[str, Any]:
    """Fill topic `hist` in `tmp/bulk-data` through a real server (stopped gracefully, so every
    record is in a segment) and export it to Parquet in `tmp/parquet`. No JVM here."""
    data = tmp / "bulk-data"
    s = Server(data, tmp / "bulk.log", {"TOPICS_SEGMENT_MAX_EVENTS": str(segment_events)})
    t = time.perf_counter()
    asyncio.run(fill(s.base, n))
    fill_s = time.perf_counter() - t
    s.stop(signal.SIGTERM)
    from topics.spark.segments import load_offline

    topic = load_offline(str(data))["hist"]
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
    return {
        "records": n,
        "fill_s": round(fill_s, 2),
        "segments": len(topic.cat.segments),
        "segment_bytes": sum(p.stat().st_size for p in (data / "topics").rglob("seg-*")),
        "parquet_bytes": sum(p.stat().st_size for p in pq_dir.glob("*.parquet")),
        "export_s": float(export.stdout.rsplit("(", 1)[1].split(" s)")[0]),
    }


def rates(n: int, ts: list[float]) -> dict[str, Any]:
    return {
        "best_rows_s": round(n / min(ts)),
        "median_rows_s": round(n / statistics.median(ts)),
        "seconds": [round(x, 3) for x in ts],
    }


def ratio(parquet: list[float], other: list[float]) -> dict[str, float]:
    """rows/s of `other` over rows/s of Parquet (the same rows): its time over the other's."""
    return {
        "median": round(statistics.median(parquet) / statistics.median(other), 3),
        "best": round(min(parquet) / min(other), 3),
    }


def bulk_reads(
    spark: Any, tmp: Path, n: int, repeat: int, consumers: list[str], caches: list[str]
) -> dict[str, Any]:
    """The four reads of `prepare`'s data, for each consumer and cache state (module doc)."""
    from pyspark.sql import functions as F

    from topics.spark.segments import load_offline

    data, pq_dir = tmp / "bulk-data", tmp / "parquet"
    segments = len(load_offline(str(data))["hist"].cat.segments)
    spark.dataSource.register(ceiling_source())

    def topics_df(reader: str) -> Any:
        rd = spark.read.format("topics").option("path", str(data)).option("topics", "hist")
        return rd.option("reader", reader).load()

    def ceiling_df() -> Any:
        rd = spark.read.format("topics_ceiling").option("path", str(data))
        rd = rd.option("topic", "hist").option("partitions", str(segments))
        return rd.option("rows", str(n)).load()

    frames = {
        "parquet": lambda: spark.read.parquet(str(pq_dir)),
        "jvm": lambda: topics_df("jvm"),
        "python": lambda: topics_df("python"),
        "ceiling": ceiling_df,
    }

    def consume(df: Any, consumer: str) -> None:
        if consumer == "noop":
            df.write.format("noop").mode("overwrite").save()
        else:  # "hash": every value of every row is read (a hash over all columns, summed)
            cols = ("topic", "seq", "ts", "tag", "node", "meta", "data")
            df.agg(F.sum(F.pmod(F.xxhash64(*cols), F.lit(1_000_003)))).collect()

    # Each topics read is done by the reader it names, and every read has the same rows.
    plans = {
        k: JVM_PLAN_MARK in frames[k]()._jdf.queryExecution().executedPlan().toString()
        for k in ("jvm", "python")
    }
    assert plans == {"jvm": True, "python": False}, plans
    counts = {k: frames[k]().count() for k in ("parquet", "jvm", "python")}
    assert set(counts.values()) == {n}, (counts, n)

    files = [p for d in (data, pq_dir) for p in sorted(d.rglob("*")) if p.is_file()]
    for consumer in consumers:  # warm-up: planner, Python workers, the JIT
        for k in READS:
            consume(frames[k](), consumer)
    out: dict[str, Any] = {}
    for consumer in consumers:
        out[consumer] = {}
        for cache in caches:
            if cache == "warm":
                warm_files(files)  # a cold block before may have left them out
            times: dict[str, list[float]] = {k: [] for k in READS}
            resident: list[float] = []
            for _ in range(repeat):
                for k in READS:
                    if cache == "cold":
                        # Both data sets, every file (segments, indexes, snapshots, Parquet).
                        resident.append(evict(files, False)["resident_after"] or 0.0)
                    times[k].append(timed(lambda k=k, c=consumer: consume(frames[k](), c)))
            res: dict[str, Any] = {k: rates(n, times[k]) for k in READS}
            res["ratios"] = {
                f"{k}_parquet": ratio(times["parquet"], times[k]) for k in ("jvm", "python")
            }
            if cache == "cold":
                res["resident_after_max"] = max(resident)
            out[consumer][cache] = res
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


def child(args: argparse.Namespace) -> int:
    """One preset: start its session, run what the parent asked for, write JSON to `--_out`."""
    import pyspark.sql  # noqa: F401  (before the clock: the session start is the JVM's)

    from topics.spark.session import FAST_JVM_OPTIONS, local_session

    flags = PRESETS[args._preset]
    conf = {}
    if flags is not None:
        conf = {"spark.driver.extraJavaOptions": flags, "spark.executor.extraJavaOptions": flags}
    t = time.perf_counter()
    spark = local_session(f"bench-spark-{args._preset}", conf=conf)
    start_s = time.perf_counter() - t
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._jvm
    mx = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    out: dict[str, Any] = {
        "session": {
            "jvm_options": FAST_JVM_OPTIONS if flags is None else flags,
            # What the driver JVM (also the executor in local mode) really got: its -X options
            # (PySpark adds many --add-opens of its own, left out here).
            "jvm_args": [str(a) for a in mx.getInputArguments() if str(a).startswith("-X")],
            "java": str(jvm.java.lang.System.getProperty("java.version")),
            "pyspark": spark.version,
            "session_start_s": round(start_s, 2),
        }
    }
    tmp = Path(args._dir)
    try:
        if args._bulk:
            out["reads"] = bulk_reads(
                spark, tmp, args.records, args.repeat, args.consumer, args.cache
            )
        if args._stream:
            out["stream"] = []
            for tm in args.trigger_ms:
                print(f"streaming, trigger {tm} ms ...", file=sys.stderr)
                out["stream"].append(stream(spark, tmp, args.stream_seconds, args.rate, tm))
    finally:
        spark.stop()
    Path(args._out).write_text(json.dumps(out))
    return 0


def run_preset(args: argparse.Namespace, tmp: Path, preset: str, streaming: bool) -> Any:
    """This script as a child for `preset`; its JSON, or None when it failed."""
    res = tmp / f"preset-{preset}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_preset", preset]
    cmd += ["--_dir", str(tmp), "--_out", str(res), "--records", str(args.records)]
    cmd += ["--repeat", str(args.repeat), "--consumer", *args.consumer, "--cache", *args.cache]
    cmd += ["--stream-seconds", str(args.stream_seconds), "--rate", str(args.rate)]
    cmd += ["--trigger-ms", *(str(t) for t in args.trigger_ms)]
    cmd += ["--_bulk"] if not args.skip_bulk else []
    cmd += ["--_stream"] if streaming else []
    print(f"JVM preset {preset} ...", file=sys.stderr)
    rc = subprocess.run(cmd, stdout=sys.stderr).returncode  # stdout stays tables and JSON
    if rc != 0 or not res.exists():
        print(f"JVM preset {preset}: the child failed (exit code {rc})", file=sys.stderr)
        return None
    return json.loads(res.read_text())


def cell(r: dict[str, Any]) -> str:
    return f"{r['median_rows_s']:,} ({r['best_rows_s']:,})"


def print_tables(out: dict[str, Any]) -> None:
    sessions = out["sessions"]
    if "bulk" in out:
        b = out["bulk"]
        print(
            f"\n{b['records']:,} records, {b['segments']} segments "
            f"({b['segment_bytes'] / 1e6:.0f} MB), Parquet {b['parquet_bytes'] / 1e6:.0f} MB "
            f"(spark-export {b['export_s']} s)"
        )
        for preset, reads in b["reads"].items():
            s = sessions[preset]
            print(
                f"\nJVM preset `{preset}` (`{s['jvm_options'] or 'no extra flags'}`), "
                f"session start {s['session_start_s']} s. rows/s median (best):\n"
            )
            print(
                "| consumer | cache | parquet | jvm | python | ceiling "
                "| jvm / parquet | python / parquet | resident after eviction |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for consumer, by_cache in reads.items():
                for cache, r in by_cache.items():
                    q = r["ratios"]
                    ratios = [
                        f"{q[k]['median']:.2f} ({q[k]['best']:.2f})"
                        for k in ("jvm_parquet", "python_parquet")
                    ]
                    res = r.get("resident_after_max")
                    print(
                        f"| {consumer} | {cache} | "
                        + " | ".join(cell(r[k]) for k in READS)
                        + f" | {' | '.join(ratios)} | {'-' if res is None else f'{res:.1%}'} |"
                    )
    print("\nJVM presets (warm, noop consumer, median rows/s):\n")
    print(
        "| preset | JVM options | session start s | jvm rows/s | parquet rows/s | jvm / parquet |"
    )
    print("|---|---|---|---|---|---|")
    for row in out["jvm_presets"]:

        def v(x: Any, f: str = ",") -> str:
            return "-" if x is None else format(x, f)

        print(
            f"| {row['preset']} | `{row['jvm_options'] or '(none)'}` | "
            f"{v(row['session_start_s'], '')} | {v(row['jvm_warm_noop_rows_s'])} | "
            f"{v(row['parquet_warm_noop_rows_s'])} | {v(row['jvm_parquet_warm_noop'], '.2f')} |"
        )
    if out.get("stream"):
        print(f"\nstreaming (JVM preset `{out['stream_preset']}`):\n")
        print("| trigger | records | batches | p50 ms | p95 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|---|---|")
        for r in out["stream"]:
            print(
                f"| {r['trigger_ms']} ms | {r['seen']}/{r['written']} | {r['batches']} | "
                f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['max_ms']} |"
            )
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--consumer",
        nargs="+",
        choices=CONSUMERS,
        default=list(CONSUMERS),
        help="noop: the noop sink; hash: sum of xxhash64 over every column (reads every value)",
    )
    ap.add_argument(
        "--cache",
        nargs="+",
        choices=CACHES,
        default=list(CACHES),
        help="warm: files in the page cache; cold: evicted (fadvise) before every timed read",
    )
    ap.add_argument(
        "--jvm-flags",
        nargs="+",
        choices=list(PRESETS),
        default=["session"],
        help="JVM option presets, one session (child process) each: "
        + "; ".join(
            f"{k}: {'local_session' if v is None else v or 'none'}" for k, v in PRESETS.items()
        ),
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
    # The child side of one preset (run_preset); not for direct use.
    ap.add_argument("--_preset", choices=list(PRESETS), help=argparse.SUPPRESS)
    ap.add_argument("--_dir", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_bulk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_stream", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.consumer = list(dict.fromkeys(args.consumer))
    args.cache = list(dict.fromkeys(args.cache))
    args.jvm_flags = list(dict.fromkeys(args.jvm_flags))
    if args._preset:
        return child(args)

    from importlib.metadata import version

    out: dict[str, Any] = {
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "pyspark": version("pyspark"),
            "load_avg_start": os.getloadavg(),
        },
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "params": {
            k: getattr(args, k)
            for k in ("records", "repeat", "consumer", "cache", "jvm_flags", "segment_events")
        },
        "sessions": {},
    }
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="topics-bench-spark-") as d:
        tmp = Path(d)
        if not args.skip_bulk:
            print(f"filling {args.records:,} records ...", file=sys.stderr)
            out["bulk"] = prepare(tmp, args.records, args.segment_events)
            out["bulk"]["reads"] = {}
        for i, preset in enumerate(args.jvm_flags):
            streaming = not args.skip_stream and i == 0
            r = run_preset(args, tmp, preset, streaming)
            if r is None:
                failed.append(preset)
                out["sessions"][preset] = {"error": "the child process failed (see stderr)"}
                continue
            out["sessions"][preset] = r["session"]
            if "reads" in r:
                out["bulk"]["reads"][preset] = r["reads"]
            if "stream" in r:
                out["stream"], out["stream_preset"] = r["stream"], preset
    out["jvm_presets"] = []
    for preset, s in out["sessions"].items():
        warm = out.get("bulk", {}).get("reads", {}).get(preset, {}).get("noop", {}).get("warm")
        out["jvm_presets"].append(
            {
                "preset": preset,
                "jvm_options": s.get("jvm_options"),
                "session_start_s": s.get("session_start_s"),
                "jvm_warm_noop_rows_s": warm["jvm"]["median_rows_s"] if warm else None,
                "parquet_warm_noop_rows_s": warm["parquet"]["median_rows_s"] if warm else None,
                "jvm_parquet_warm_noop": warm["ratios"]["jvm_parquet"]["median"] if warm else None,
            }
        )
    out["env"]["load_avg_end"] = os.getloadavg()
    print_tables(out)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    print(f"wrote {args.json}", file=sys.stderr)
    if failed:
        print(f"failed JVM presets: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
