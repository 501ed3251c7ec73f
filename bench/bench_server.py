"""End-to-end benchmark of the real `topics serve` process over loopback.

Starts ``python -m topics serve`` (127.0.0.1, ephemeral port, fresh temp data dir)
for every repetition -- or targets ``--url`` -- and measures:

1. write-ack latency: one keep-alive connection, sequential writes of one record
   whose ``data`` is 64 B of JSON; raw-socket client with a prebuilt request;
2. batched write throughput: 16 connections (asyncio + uvloop, raw sockets), each
   writing batches of 100 x 64 B records back to back; records/s, request p50/p99;
3. diff throughput at limit 1 / 256 / 1000 on a topic pre-filled with 200k records
   (50k with ``--quick``): 4 concurrent readers walk the topic with ``from_seq``
   cursors; every response is parsed with orjson and its records are counted;
4. SSE write-to-deliver latency with 1 / 10 / 100 watchers: the watchers live in a
   separate process (uvloop, raw sockets, one watch session each) and stamp every
   received chunk with ``time.monotonic_ns()``; the writer (this process) writes one
   record every ~5 ms carrying its own ``monotonic_ns()`` send time. CLOCK_MONOTONIC
   is system-wide, so receive - send is a cross-process latency.

For each phase it records the server's CPU time (utime+stime from /proc/<pid>/stat),
the client's CPU time (this process plus the watcher process) and the CPU used by
everything else on the machine. Client and server share the same vCPUs (2 on the
reference machine), so the client's CPU is taken away from the server.

Usage::

    .venv/bin/python bench/bench_server.py                 # full run, 3 repetitions
    .venv/bin/python bench/bench_server.py --quick --repeat 1
    .venv/bin/python bench/bench_server.py --url http://127.0.0.1:4000 --server-pid 1234

Prints one markdown table per section and writes everything (all runs, medians,
environment) to ``--json`` (default ``bench/results/server.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _client import (  # noqa: E402
    AsyncConn,
    ServeProcess,
    SSEParser,
    SyncConn,
    build_request,
    get_path,
    open_watch_streams,
    proc_cpu_s,
    summarize,
    system_busy_s,
)

DATA64 = b'"' + b"x" * 62 + b'"'  # a JSON string value of exactly 64 bytes
RECORD64 = b'{"data":' + DATA64 + b"}"
TARGETS = {
    "write_ack_p50_us": 300.0,
    "batched_records_per_s": 250_000.0,
    "diff_1000_records_per_s": 500_000.0,
    "sse_100_p99_ms": 5.0,
}
SHARED_CPU_NOTE = (
    "client and server run on the same machine and share its {n} vCPUs: every CPU-second "
    "the client (load generator, parsers, watcher process) uses is not available to the server"
)


# -- plumbing -----------------------------------------------------------------------------
class Target:
    """Where the server is, and its PID when we know it (for CPU accounting)."""

    def __init__(self, host: str, port: int, pid: int | None, durability: str | None) -> None:
        self.host, self.port, self.pid, self.durability = host, port, pid, durability
        self.tag = secrets.token_hex(3)  # unique topic names per run (matters with --url)

    def topic(self, name: str) -> str:
        return f"bench.{name}.{self.tag}"

    def conn(self) -> SyncConn:
        return SyncConn(self.host, self.port)

    def request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        return build_request(method, path, body, host=f"{self.host}:{self.port}")

    def put_topic(self, conn: SyncConn, name: str) -> None:
        cfg = {"durability": self.durability} if self.durability else {}
        status, body = conn.roundtrip(self.request("PUT", f"/v0/topics/{name}", orjson.dumps(cfg)))
        if status not in (200, 201):
            raise RuntimeError(f"PUT {name}: {status} {body[:200]!r}")

    def head_seq(self, conn: SyncConn, name: str) -> int:
        status, body = conn.roundtrip(self.request("GET", f"/v0/topics/{name}?touch=false"))
        if status != 200:
            raise RuntimeError(f"GET {name}: {status} {body[:200]!r}")
        return int(orjson.loads(body)["head_seq"])


class Meter:
    """CPU seconds of the server, of the client (this process + extra PIDs) and of the rest."""

    def __init__(self, server_pid: int | None, extra_pids: tuple[int, ...] = ()) -> None:
        self.server_pid, self.extra_pids = server_pid, extra_pids

    def _client(self) -> float:
        return time.process_time() + sum(proc_cpu_s(p) or 0.0 for p in self.extra_pids)

    def _server(self) -> float | None:
        return proc_cpu_s(self.server_pid) if self.server_pid else None

    def start(self) -> Meter:
        self.t0 = time.perf_counter()
        self.s0, self.c0, self.b0 = self._server(), self._client(), system_busy_s()
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        s1, c1, b1 = self._server(), self._client(), system_busy_s()
        server = (s1 - self.s0) if (s1 is not None and self.s0 is not None) else None
        client = c1 - self.c0
        busy = b1 - self.b0
        others = busy - client - (server or 0.0)
        return {
            "wall_s": round(wall, 3),
            "server_cpu_s": None if server is None else round(server, 3),
            "server_cores": None if server is None else round(server / wall, 3),
            "client_cpu_s": round(client, 3),
            "client_cores": round(client / wall, 3),
            "others_cores": round(max(0.0, others) / wall, 3) if server is not None else None,
        }


def wait_quiet(server_pid: int | None, quick: bool) -> dict[str, Any]:
    """Wait (bounded) until processes other than ours use < 0.15 core for a short window."""
    window, give_up = (0.5, 5.0) if quick else (1.0, 20.0)
    deadline = time.monotonic() + give_up
    waited = time.monotonic()
    while True:
        m = Meter(server_pid).start()
        time.sleep(window)
        r = m.stop()
        others = r["others_cores"]
        if others is None:  # unknown server PID: count everything but us
            others = round(max(0.0, (system_busy_s() - m.b0) / window - r["client_cores"]), 3)
        if others < 0.15 or time.monotonic() > deadline:
            return {
                "others_cores_before": others,
                "quiet": others < 0.15,
                "waited_s": round(time.monotonic() - waited, 1),
            }


def run_async(coro: Any) -> Any:
    return uvloop.run(coro)


# -- 1. write-ack latency -------------------------------------------------------------------
def phase_write_ack(tg: Target, quick: bool) -> dict[str, Any]:
    warmup, n = (200, 1000) if quick else (500, 5000)
    topic = tg.topic("ack")
    conn = tg.conn()
    tg.put_topic(conn, topic)
    req = tg.request("POST", f"/v0/topics/{topic}", b'{"records":[' + RECORD64 + b"]}")
    for _ in range(warmup):
        status, body = conn.roundtrip(req)
        if status != 200:
            raise RuntimeError(f"write: {status} {body[:200]!r}")
    gate = wait_quiet(tg.pid, quick)
    samples = [0] * n
    statuses = [0] * n
    bodies: list[bytes] = [b""] * n
    send, read, clock = conn.sock.sendall, conn.read_response, time.perf_counter_ns
    meter = Meter(tg.pid).start()
    for i in range(n):
        t0 = clock()
        send(req)
        st, b = read()
        samples[i] = clock() - t0
        statuses[i] = st
        bodies[i] = b
    cpu = meter.stop()
    conn.close()
    bad = sum(1 for s in statuses if s != 200)
    server_ms = sorted(orjson.loads(b)["performance"]["server_total_ms"] for b in bodies if b)
    lat = summarize(samples)
    return {
        "writes": n,
        "errors": bad,
        "p50_us": lat["p50"],
        "p99_us": lat["p99"],
        "p999_us": lat["p999"],
        "max_us": lat["max"],
        "mean_us": lat["mean"],
        "writes_per_s": round(n / cpu["wall_s"]),
        "server_total_ms_p50": server_ms[len(server_ms) // 2] if server_ms else None,
        "cpu": cpu,
        "gate": gate,
    }


# -- 2. batched write throughput ------------------------------------------------------------
async def _batched(
    tg: Target, topic: str, conns: int, batch: int, warm: float, dur: float
) -> dict[str, Any]:
    body = b'{"records":[' + b",".join([RECORD64] * batch) + b"]}"
    req = tg.request("POST", f"/v0/topics/{topic}", body)
    pool = [await AsyncConn.open(tg.host, tg.port) for _ in range(conns)]
    measuring = False
    stop = False
    lat: list[int] = []
    errors: list[int] = []
    done = 0
    clock = time.perf_counter_ns

    async def worker(c: AsyncConn) -> None:
        nonlocal done
        while not stop:
            t0 = clock()
            st, _ = await c.roundtrip(req)
            dt = clock() - t0
            if st != 200:
                errors.append(st)
                if len(errors) > 100:
                    raise RuntimeError(f"batched write failed with {st}")
                continue
            if measuring:
                lat.append(dt)
                done += 1

    tasks = [asyncio.create_task(worker(c)) for c in pool]
    await asyncio.sleep(warm)
    meter = Meter(tg.pid).start()
    measuring = True
    await asyncio.sleep(dur)
    measuring = False
    cpu = meter.stop()
    stop = True
    await asyncio.gather(*tasks)
    for c in pool:
        c.close()
    s = summarize(lat, 1e6)
    return {
        "connections": conns,
        "batch": batch,
        "requests": done,
        "records": done * batch,
        "errors": len(errors),
        "records_per_s": round(done * batch / cpu["wall_s"]),
        "requests_per_s": round(done / cpu["wall_s"]),
        "req_p50_ms": s.get("p50"),
        "req_p99_ms": s.get("p99"),
        "body_bytes": len(body),
        "cpu": cpu,
    }


def phase_batched(tg: Target, quick: bool) -> dict[str, Any]:
    warm, dur = (0.5, 2.0) if quick else (1.0, 8.0)
    topic = tg.topic("batch")
    conn = tg.conn()
    tg.put_topic(conn, topic)
    gate = wait_quiet(tg.pid, quick)
    res = run_async(_batched(tg, topic, 16, 100, warm, dur))
    head = tg.head_seq(conn, topic)
    conn.close()
    if head < res["records"]:
        raise RuntimeError(f"head_seq {head} < records counted {res['records']}")
    res["head_seq_after"] = head
    res["gate"] = gate
    return res


# -- 3. diff throughput ------------------------------------------------------------------
async def _prefill(tg: Target, topic: str, total: int) -> dict[str, Any]:
    batch = 1000
    body = b'{"records":[' + b",".join([RECORD64] * batch) + b"]}"
    req = tg.request("POST", f"/v0/topics/{topic}", body)
    pool = [await AsyncConn.open(tg.host, tg.port) for _ in range(4)]
    remaining = total // batch
    t0 = time.perf_counter()

    async def worker(c: AsyncConn) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            st, b = await c.roundtrip(req)
            if st != 200:
                raise RuntimeError(f"prefill write: {st} {b[:200]!r}")

    await asyncio.gather(*(worker(c) for c in pool))
    for c in pool:
        c.close()
    wall = time.perf_counter() - t0
    return {"records": total, "wall_s": round(wall, 2), "records_per_s": round(total / wall)}


async def _diff(
    tg: Target, topic: str, head: int, limit: int, readers: int, warm: float, dur: float
) -> dict[str, Any]:
    prefix = (
        f"POST /v0/topics/{topic}/diff HTTP/1.1\r\nHost: {tg.host}:{tg.port}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    pool = [await AsyncConn.open(tg.host, tg.port) for _ in range(readers)]
    measuring = False
    stop = False
    lat: list[int] = []
    n_req = n_rec = n_bytes = 0
    loads = orjson.loads
    clock = time.perf_counter_ns

    async def reader(c: AsyncConn, cursor: int) -> None:
        nonlocal n_req, n_rec, n_bytes
        while not stop:
            body = b'{"from_seq":%d,"limit":%d}' % (cursor, limit)
            t0 = clock()
            st, b = await c.roundtrip(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            dt = clock() - t0
            if st != 200:
                raise RuntimeError(f"diff: {st} {b[:200]!r}")
            d = loads(b)
            got = len(d["records"])
            cursor = d["next_from_seq"]
            if cursor >= head or got == 0:
                cursor = 0  # wrap: walk the topic again
            if measuring:
                n_req += 1
                n_rec += got
                n_bytes += len(b)
                lat.append(dt)

    tasks = [asyncio.create_task(reader(c, i * head // readers)) for i, c in enumerate(pool)]
    await asyncio.sleep(warm)
    meter = Meter(tg.pid).start()
    measuring = True
    await asyncio.sleep(dur)
    measuring = False
    cpu = meter.stop()
    stop = True
    await asyncio.gather(*tasks)
    for c in pool:
        c.close()
    s = summarize(lat, 1e6)
    return {
        "limit": limit,
        "readers": readers,
        "requests": n_req,
        "records": n_rec,
        "records_per_s": round(n_rec / cpu["wall_s"]),
        "requests_per_s": round(n_req / cpu["wall_s"]),
        "mb_per_s": round(n_bytes / cpu["wall_s"] / 1e6, 1),
        "req_p50_ms": s.get("p50"),
        "req_p99_ms": s.get("p99"),
        "cpu": cpu,
    }


def phase_diff(tg: Target, quick: bool) -> dict[str, Any]:
    total, warm, dur = (50_000, 0.5, 2.0) if quick else (200_000, 1.0, 6.0)
    topic = tg.topic("diff")
    conn = tg.conn()
    tg.put_topic(conn, topic)
    prefill = run_async(_prefill(tg, topic, total))
    head = tg.head_seq(conn, topic)
    conn.close()
    if head < total:
        raise RuntimeError(f"prefill: head_seq {head} < {total}")
    out: dict[str, Any] = {"prefill": prefill, "topic_records": head}
    for limit in (1, 256, 1000):
        gate = wait_quiet(tg.pid, quick)
        r = run_async(_diff(tg, topic, head, limit, 4, warm, dur))
        r["gate"] = gate
        out[str(limit)] = r
    return out


# -- 4. SSE write-to-deliver latency ------------------------------------------------------
async def _watchers_main(host: str, port: int, topic: str, n: int, out: Path) -> None:
    loop = asyncio.get_running_loop()
    ctl, streams = await open_watch_streams(host, port, topic, n)
    await asyncio.wait_for(asyncio.gather(*(w.ready for w in streams)), 60)
    cpu0 = sum(os.times()[:2])
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    stop: asyncio.Future[None] = loop.create_future()

    def on_stdin() -> None:
        os.read(0, 4096)
        if not stop.done():
            stop.set_result(None)

    loop.add_reader(0, on_stdin)
    await stop
    loop.remove_reader(0)
    cpu1 = sum(os.times()[:2])
    for w in streams:
        w.transport.close()
    ctl.close()
    deliveries: list[tuple[int, int, int]] = []  # (watcher, record index, latency ns)
    frames = 0
    for wi, w in enumerate(streams):
        parser = SSEParser()
        for ns, data in w.chunks:
            for event, line in parser.feed(data):
                if event != b"record":
                    continue
                frames += 1
                for rec in orjson.loads(line)["records"]:
                    d = rec.get("data")
                    if isinstance(d, dict) and "t" in d:
                        deliveries.append((wi, d["i"], ns - d["t"]))
    out.write_bytes(
        orjson.dumps({"deliveries": deliveries, "frames": frames, "cpu_s_measured": cpu1 - cpu0})
    )


def _sse_level(
    tg: Target, watchers: int, records: int, interval: float, quick: bool, tmp: Path
) -> dict[str, Any]:
    topic = tg.topic(f"sse{watchers}")
    conn = tg.conn()
    tg.put_topic(conn, topic)
    out = tmp / f"watchers-{watchers}-{tg.tag}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_watchers",
            str(watchers),
            "--_topic",
            topic,
            "--url",
            f"http://{tg.host}:{tg.port}",
            "--_out",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != b"READY":
            raise RuntimeError(f"watcher process did not start: {line!r}")
        prefix = (
            f"POST /v0/topics/{topic} HTTP/1.1\r\nHost: {tg.host}:{tg.port}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        send, read = conn.sock.sendall, conn.read_response

        def write(i: int) -> None:
            t = time.monotonic_ns()
            head = b'{"t":%d,"i":%d,"p":"' % (t, i)
            data = head + b"y" * max(0, 64 - len(head) - 2) + b'"}'
            body = b'{"records":[{"data":' + data + b"}]}"
            send(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            st, b = read()
            if st != 200:
                raise RuntimeError(f"SSE writer: {st} {b[:200]!r}")

        for i in range(-20, 0):  # warm-up records (negative index, not counted)
            write(i)
            time.sleep(interval)
        time.sleep(0.2)
        gate = wait_quiet(tg.pid, quick)
        meter = Meter(tg.pid, (proc.pid,)).start()
        nxt = time.perf_counter()
        for i in range(records):
            nxt += interval
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            write(i)
        time.sleep(0.3)  # let the last deliveries land
        cpu = meter.stop()
        proc.stdin.write(b"STOP\n")
        proc.stdin.flush()
        if proc.wait(120) != 0:
            raise RuntimeError(f"watcher process exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        conn.close()
    res = orjson.loads(out.read_bytes())
    out.unlink()
    lats = [lat for _, i, lat in res["deliveries"] if i >= 0]
    unique = {(w, i) for w, i, _ in res["deliveries"] if i >= 0}
    s = summarize(lats, 1e6)
    # per record: the first and the last watcher to receive it (reaction vs fan-out time)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for _, i, lat in res["deliveries"]:
        if i >= 0:
            first[i] = min(first.get(i, lat), lat)
            last[i] = max(last.get(i, lat), lat)
    sf, sl = summarize(first.values(), 1e6), summarize(last.values(), 1e6)
    return {
        "watchers": watchers,
        "records_written": records,
        "expected_deliveries": watchers * records,
        "deliveries": len(lats),
        "unique_deliveries": len(unique),
        "record_frames": res["frames"],
        "p50_ms": s.get("p50"),
        "p99_ms": s.get("p99"),
        "p999_ms": s.get("p999"),
        "max_ms": s.get("max"),
        "mean_ms": s.get("mean"),
        "first_watcher_p50_ms": sf.get("p50"),
        "first_watcher_p99_ms": sf.get("p99"),
        "last_watcher_p50_ms": sl.get("p50"),
        "last_watcher_p99_ms": sl.get("p99"),
        "watcher_process_cpu_s": round(res["cpu_s_measured"], 3),
        "cpu": cpu,
        "gate": gate,
    }


SSE_LEVELS = [1, 10, 100]


def phase_sse(tg: Target, quick: bool) -> dict[str, Any]:
    records = 100 if quick else 400
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sse-") as tmp:
        for n in SSE_LEVELS:
            out[str(n)] = _sse_level(tg, n, records, 0.005, quick, Path(tmp))
    return out


PHASES: dict[str, Callable[[Target, bool], dict[str, Any]]] = {
    "write_ack": phase_write_ack,
    "batched": phase_batched,
    "diff": phase_diff,
    "sse": phase_sse,
}


# -- the server process --------------------------------------------------------------------
class Server(ServeProcess):
    """The server under test over a fresh temporary data dir, removed by :meth:`stop`."""

    def __init__(self, extra_env: dict[str, str]) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-server-"))
        super().__init__(
            self.tmp / "data", self.tmp / "server.log", extra_env, ready_timeout_s=30, cwd=ROOT
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        rc = super().stop(sig, timeout_s)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return rc


# -- orchestration / reporting ------------------------------------------------------------------
def environment() -> dict[str, Any]:
    def git(*a: str) -> str:
        with contextlib.suppress(Exception):
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        return ""

    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for name in ("uvicorn", "uvloop", "httptools", "orjson", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    idle = ""
    with contextlib.suppress(OSError):
        idle = Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "cpuidle_driver": idle,
        "platform": platform.platform(),
        "git_rev": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "loadavg_at_start": os.getloadavg(),
        "versions": versions,
    }


def median_of(runs: list[dict[str, Any]], path: str) -> float | None:
    vals = [v for r in runs if isinstance(v := get_path(r, path), int | float)]
    return statistics.median(vals) if vals else None


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def cell(runs: list[dict[str, Any]], path: str, digits: int = 1) -> str:
    med = median_of(runs, path)
    if len(runs) == 1:
        return fmt(med, digits)
    allv = " / ".join(fmt(get_path(r, path), digits) for r in runs)
    return f"**{fmt(med, digits)}** ({allv})"


def verdict(value: float | None, target: float, higher_is_better: bool) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "MISSED"


def tables(runs: list[dict[str, Any]], cpus: int | None) -> tuple[str, dict[str, Any]]:
    out: list[str] = []
    nr = len(runs)
    hdr = "median (all runs)" if nr > 1 else "value"
    med = {
        "write_ack_p50_us": median_of(runs, "write_ack.p50_us"),
        "batched_records_per_s": median_of(runs, "batched.records_per_s"),
        "diff_1000_records_per_s": median_of(runs, "diff.1000.records_per_s"),
        "sse_100_p99_ms": median_of(runs, "sse.100.p99_ms"),
    }
    verdicts = {
        "write_ack_p50_us": verdict(med["write_ack_p50_us"], TARGETS["write_ack_p50_us"], False),
        "batched_records_per_s": verdict(
            med["batched_records_per_s"], TARGETS["batched_records_per_s"], True
        ),
        "diff_1000_records_per_s": verdict(
            med["diff_1000_records_per_s"], TARGETS["diff_1000_records_per_s"], True
        ),
        "sse_100_p99_ms": verdict(med["sse_100_p99_ms"], TARGETS["sse_100_p99_ms"], False),
    }

    def has(phase: str) -> bool:
        return any(phase in r for r in runs)

    if has("write_ack"):
        out.append(
            f"### 1. Write-ack latency (1 connection, sequential 1-record writes, 64 B data; {hdr})\n"
        )
        out.append("| metric | " + hdr + " |\n|---|---|")
        for label, path, d in [
            ("p50 µs", "write_ack.p50_us", 1),
            ("p99 µs", "write_ack.p99_us", 1),
            ("p99.9 µs", "write_ack.p999_us", 1),
            ("max µs", "write_ack.max_us", 1),
            ("writes/s", "write_ack.writes_per_s", 0),
            ("server-reported server_total_ms p50", "write_ack.server_total_ms_p50", 3),
            ("server CPU (cores)", "write_ack.cpu.server_cores", 2),
            ("client CPU (cores)", "write_ack.cpu.client_cores", 2),
            ("others' CPU (cores)", "write_ack.cpu.others_cores", 2),
        ]:
            out.append(f"| {label} | {cell(runs, path, d)} |")
        out.append(
            f"\nTarget p50 <= {TARGETS['write_ack_p50_us']:.0f} µs: **{verdicts['write_ack_p50_us']}**\n"
        )

    if has("batched"):
        out.append(
            f"### 2. Batched write throughput (16 connections x 100-record batches, 64 B data; {hdr})\n"
        )
        out.append("| metric | " + hdr + " |\n|---|---|")
        for label, path, d in [
            ("records/s", "batched.records_per_s", 0),
            ("requests/s", "batched.requests_per_s", 0),
            ("request p50 ms", "batched.req_p50_ms", 2),
            ("request p99 ms", "batched.req_p99_ms", 2),
            ("server CPU (cores)", "batched.cpu.server_cores", 2),
            ("client CPU (cores)", "batched.cpu.client_cores", 2),
            ("others' CPU (cores)", "batched.cpu.others_cores", 2),
        ]:
            out.append(f"| {label} | {cell(runs, path, d)} |")
        out.append(
            f"\nTarget >= {TARGETS['batched_records_per_s']:,.0f} records/s: **{verdicts['batched_records_per_s']}**\n"
        )

    if has("diff"):
        topic_n = median_of(runs, "diff.topic_records")
        out.append(
            f"### 3. Diff throughput (4 readers walking a {fmt(topic_n, 0)}-record topic, orjson-parsed; {hdr})\n"
        )
        out.append(
            "| limit | records/s | requests/s | MB/s | req p50 ms | req p99 ms | server cores | client cores | others' cores |\n"
            "|---|---|---|---|---|---|---|---|---|"
        )
        for lim in ("1", "256", "1000"):
            p = f"diff.{lim}."
            out.append(
                f"| {lim} | {cell(runs, p + 'records_per_s', 0)} | {cell(runs, p + 'requests_per_s', 0)} | "
                f"{cell(runs, p + 'mb_per_s', 1)} | {cell(runs, p + 'req_p50_ms', 2)} | {cell(runs, p + 'req_p99_ms', 2)} | "
                f"{cell(runs, p + 'cpu.server_cores', 2)} | {cell(runs, p + 'cpu.client_cores', 2)} | "
                f"{cell(runs, p + 'cpu.others_cores', 2)} |"
            )
        out.append(
            f"\nPrefill (4 connections x 1000-record batches): {cell(runs, 'diff.prefill.records_per_s', 0)} records/s. "
            f"Target limit 1000 >= {TARGETS['diff_1000_records_per_s']:,.0f} records/s: "
            f"**{verdicts['diff_1000_records_per_s']}**\n"
        )

    if has("sse"):
        out.append(f"### 4. SSE write-to-deliver latency (1 record every 5 ms; {hdr})\n")
        out.append(
            "| watchers | deliveries (got/expected) | p50 ms | p99 ms | p99.9 ms | max ms | first watcher p50 / p99 ms | last watcher p50 / p99 ms | server cores | client cores | others' cores |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|"
        )
        for n in [str(x) for x in SSE_LEVELS]:
            p = f"sse.{n}."
            got = " / ".join(
                f"{get_path(r, p + 'deliveries')}/{get_path(r, p + 'expected_deliveries')}"
                for r in runs
            )
            out.append(
                f"| {n} | {got} | {cell(runs, p + 'p50_ms', 2)} | {cell(runs, p + 'p99_ms', 2)} | "
                f"{cell(runs, p + 'p999_ms', 2)} | {cell(runs, p + 'max_ms', 2)} | "
                f"{cell(runs, p + 'first_watcher_p50_ms', 2)} / {cell(runs, p + 'first_watcher_p99_ms', 2)} | "
                f"{cell(runs, p + 'last_watcher_p50_ms', 2)} / {cell(runs, p + 'last_watcher_p99_ms', 2)} | "
                f"{cell(runs, p + 'cpu.server_cores', 2)} | "
                f"{cell(runs, p + 'cpu.client_cores', 2)} | {cell(runs, p + 'cpu.others_cores', 2)} |"
            )
        out.append(
            f"\nTarget p99 <= {TARGETS['sse_100_p99_ms']:.0f} ms at 100 watchers: **{verdicts['sse_100_p99_ms']}**\n"
        )
    errs = [
        f"run {i + 1} {ph}: {r['errors'][ph]}"
        for i, r in enumerate(runs)
        for ph in r.get("errors", {})
    ]
    if errs:
        out.append("Errors:\n" + "\n".join(f"- {e}" for e in errs) + "\n")
    out.append("Note: " + SHARED_CPU_NOTE.format(n=cpus) + ".")
    return "\n".join(out), {"medians": med, "verdicts": verdicts}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="short run (smaller sizes and durations)")
    ap.add_argument(
        "--json", type=Path, default=HERE / "results" / "server.json", help="output JSON path"
    )
    ap.add_argument("--repeat", type=int, default=3, help="repetitions (a fresh server each)")
    ap.add_argument("--url", help="target an already-running server (http://host:port)")
    ap.add_argument("--server-pid", type=int, help="with --url: server PID for CPU accounting")
    ap.add_argument("--only", nargs="+", choices=list(PHASES), help="run only these phases")
    ap.add_argument(
        "--durability",
        choices=["ephemeral", "memory", "disk", "fsync"],
        help="durability class of the bench topics (default: the server default, disk)",
    )
    ap.add_argument(
        "--sse-watchers",
        type=int,
        nargs="+",
        default=SSE_LEVELS,
        help="watcher counts for the SSE phase (default: 1 10 100)",
    )
    ap.add_argument("--_watchers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_topic", help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._watchers:  # child mode: the SSE watcher process
        u = urlsplit(args.url)
        run_async(_watchers_main(u.hostname, u.port, args._topic, args._watchers, args._out))
        return 0

    SSE_LEVELS[:] = args.sse_watchers
    env = environment()
    phases = args.only or list(PHASES)
    params = {
        "quick": args.quick,
        "repeat": args.repeat,
        "url": args.url,
        "phases": phases,
        "durability": args.durability or "server default (disk)",
        "sse_watchers": args.sse_watchers,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    print(
        f"# topics server benchmark ({'quick' if args.quick else 'full'}, {args.repeat} run(s))",
        file=sys.stderr,
    )
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        server = None
        if args.url:
            u = urlsplit(args.url)
            tg = Target(u.hostname or "127.0.0.1", u.port or 80, args.server_pid, args.durability)
        else:
            server = Server({})
            tg = Target(server.host, server.port, server.pid, args.durability)
        run: dict[str, Any] = {"run": rep + 1, "server_pid": tg.pid, "errors": {}}
        try:
            for name in phases:
                print(f"run {rep + 1}: {name} ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                try:
                    run[name] = PHASES[name](tg, args.quick)
                except Exception as exc:  # keep going; the error is reported
                    run["errors"][name] = f"{type(exc).__name__}: {exc}"
                    print(f"  error: {run['errors'][name]}", file=sys.stderr)
                print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        finally:
            if server is not None:
                run["server_exit_code"] = server.stop()
        runs.append(run)

    text, summary = tables(runs, env["cpu_count"])
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "environment": env,
        "params": params,
        "targets": TARGETS,
        "note": SHARED_CPU_NOTE.format(n=env["cpu_count"]),
        **summary,
        "runs": runs,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
