"""Tiered storage: relocation and diff throughput per tier; live traffic vs a slow cold store.

Everything runs against real processes on 127.0.0.1 (ephemeral ports): ``python -m topics
serve``, a moto S3 server (``python -m moto.server``, its own process so its CPU is counted
apart; objects held in its memory) and, for part 3, a latency-injecting HTTP proxy in front
of moto (a child process of this script). One run measures, side by side:

1. **Relocation throughput.** Topic ``history`` gets ``--history-bytes`` of records
   (``--record-bytes`` each; bench_invariant's fill: 1000-record batches over 4
   connections) on a server *without* a cold tier, with ``TOPICS_SEGMENT_MAX_BYTES`` =
   ``--segment-bytes`` (4 MiB), so the history is many sealed segments. The server is
   stopped (SIGTERM: the final checkpoint writes everything into segments) and the data
   dir copied twice. Each copy is restarted with a cold tier switched on (a local directory
   on the same disk; then ``s3://`` on moto, no proxy), ``TOPICS_HOT_RETAIN_SEGMENTS`` =
   ``--retain`` (1), ``TOPICS_RELOCATE_BYTES_PER_S=0`` (unpaced) and
   ``TOPICS_CHECKPOINT_INTERVAL_MS`` = ``--relocation-checkpoint-ms`` (200). The history's
   segment files are synced and evicted from the page cache before the start
   (``posix_fadvise(DONTNEED)``, as bench_invariant does), so the copies read from the
   disk. The clock starts with one write to another topic (``kick``): a server restarted
   over an idle topic runs no checkpoint cycle, and relocation is queued by the cycle.
   It stops when
   ``/v0/metrics`` ``storage.relocated_segments`` covers every sealed segment but the
   retained one(s) (``.data`` files before the start, minus the active one, minus
   ``--retain``) and nothing is queued. MB/s = ``relocation_copied_bytes`` / that time
   (commits included: a copy counts once a checkpoint cycle committed it); also the copies
   alone (until ``relocation_copied_bytes`` stopped growing), and the CPU seconds of the
   server and of moto over the span. Why not time from the end of a fill: the fill lands in
   the WAL much faster than checkpoints turn it into segments, so that time would be the
   checkpointer's as much as the relocator's; here nothing else runs.
2. **Diff throughput.** One client reads the whole history sequentially with ``diff``
   (``--limit`` 1000, one request at a time on one keep-alive connection) from: *hot* (the
   filled data dir, no cold tier), *local cold dir*, *object store* (moto, direct) and
   *object store + latency* (through the proxy of part 3; time-boxed to
   ``--slow-scan-seconds``, the proxy's counters give the ranged GETs per diff and their
   size), each on a freshly started server. Before the hot and local scans every segment
   file of the history (data dir and cold dir) is evicted with ``posix_fadvise(DONTNEED)``
   after the server started (recovery reads the ``.idx`` files) and the share still
   resident is measured with ``mincore(2)``; the object store's bytes live in moto's
   memory, so there the page cache plays no part and the server's range cache (64 MiB) is
   empty at the start. Reported: records/s, MB/s (response bytes), request p50/p99, the
   ``performance.cold_segments_read`` the responses reported, server and moto CPU.
3. **The hard invariant with a slow cold store.** The object-store copy is started once
   more, now through the proxy, which waits ``--cold-latency-ms`` (20) before forwarding
   each HTTP request (so every ranged GET takes at least that long). Phase A: a live
   writer on a hot topic ``live`` (``--durability``, default fsync) at ``--rate`` (200/s),
   one request at a time, and one SSE subscriber in its own process; no scanner. Phase B:
   the same while ``--scanners`` clients (one process) read the cold history with ``diff``
   as fast as they can (scanner k starts at seq k*head/n and wraps). Writer, subscriber and
   scanners are bench_invariant's own (its ``Live``, its watcher process, its scanner loop;
   the scanner process here also counts the ``cold_segments_read`` of every response). The
   proxy counts the requests it forwarded, so phase B shows how many ranged GETs reached the
   store. At the end of each phase (scanners still running) the delivery governor's
   figures are read from ``/v0/metrics`` (``scheduler``: pressure and its terms, group-commit
   window). ``--rounds`` alternates A and B; samples are pooled. Verdict: p99(B)/p99(A) <=
   1.20 for write ack and SSE delivery. Keep ``--history-bytes`` well above the range cache
   (64 MiB) or a scan that wraps is served from it (the GET count shows it).

moto's server answers every request with ``Connection: close``, so each request to the
store (direct or through the proxy) is also a new loopback TCP connection; its CPU is in
the "moto CPU" / "store cores" figures, not the server's.

Usage::

    .venv/bin/python bench/bench_tiering.py --quick        # smoke run, about a minute
    .venv/bin/python bench/bench_tiering.py                # 300 MB of history, 30 s phases
    .venv/bin/python bench/bench_tiering.py --cold-latency-ms 50 --scanners 4

Prints markdown tables and one JSON line; writes everything to ``--json`` (default
``bench/results/tiering.json``). All processes (server, moto, proxy, clients) share the
machine's vCPUs (2 on the reference machine); their CPU is reported apart. Page-cache
eviction is ``posix_fadvise`` only; ``--drop-caches`` also writes ``/proc/sys/vm/drop_caches``
(root only, the whole machine's cache).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_invariant as inv  # noqa: E402
from _client import (  # noqa: E402
    AsyncConn,
    CpuMeter,
    Spawned,
    SyncConn,
    free_port,
    proc_cpu_s,
    summarize,
)

HISTORY = inv.HISTORY  # "history"
LIVE = inv.LIVE  # "live"
THRESHOLD = inv.THRESHOLD  # 1.20
KICK = "kick"
#: The delivery governor's figures kept from /v0/metrics at the end of each phase.
SCHEDULER_KEYS = (
    "pressure",
    "pressure_terms",
    "commit_window_ms",
    "coalesce_window_ms",
    "pace",
    "deferring",
)
BUCKET = "tiering-bench"
MB = 1_000_000
AWS_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
log = inv.log


# -- moto, the object store (its own process) -------------------------------------------------
class Moto(Spawned):
    """`python -m moto.server` on 127.0.0.1 and a free port, with `bucket` made (an HTTP PUT).

    Objects up to 256 MiB stay in its memory (MOTO_S3_DEFAULT_KEY_BUFFER_SIZE), never in
    temp files. Stopped by its PID."""

    def __init__(self, work: Path, bucket: str, nice: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **AWS_ENV, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(256 << 20)}
        argv = [*_niced(nice), sys.executable, "-m", "moto.server"]
        argv += ["-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(argv, work / "moto.log", cwd=work, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(f"{self.url}/{bucket}", method="PUT")
                with urllib.request.urlopen(req, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL, 10)
                tail = (work / "moto.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"moto did not start:\n{tail}")
            time.sleep(0.1)


# -- the latency proxy (child process) ---------------------------------------------------------
async def _read_chunked(r: asyncio.StreamReader) -> bytes:
    """A chunked request body, raw (sizes, data, trailers), as it came."""
    out = bytearray()
    while True:
        line = await r.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            while (t := await r.readuntil(b"\r\n")) != b"\r\n":
                out += t
            out += b"\r\n"
            return bytes(out)
        out += await r.readexactly(size + 2)


async def _proxy_main(upstream: str, latency_s: float) -> None:
    """Forward HTTP/1.1 to `upstream`, each request `latency_s` after its last byte came.

    One upstream connection per client connection. Requests are framed (head, then a
    Content-Length or chunked body) so each one is delayed; responses flow back as they
    come (a client sends its next request only after the answer). Prints READY, then its
    port; `STATS` on stdin prints the counters as one JSON line; EXIT (or EOF) ends it.
    """
    host, _, port = upstream.removeprefix("http://").rpartition(":")
    stats = {
        "connections": 0,
        "requests": 0,
        "ranged_gets": 0,
        "range_bytes": 0,  # asked for by the ranged GETs
        "gets": 0,
        "heads": 0,
        "puts": 0,
        "other": 0,
        "bytes_to_store": 0,
        "bytes_from_store": 0,
    }

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(1 << 18):
                stats["bytes_from_store"] += len(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
        try:
            ur, uw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.close()
            return
        back = asyncio.create_task(pump(ur, cw))
        try:
            while True:
                head = await cr.readuntil(b"\r\n\r\n")
                first, _, rest = head.partition(b"\r\n")
                method = first.split(b" ", 1)[0]
                hdrs = {}
                for ln in rest.split(b"\r\n"):
                    k, _, v = ln.partition(b":")
                    hdrs[k.strip().lower()] = v.strip()
                body = b""
                if b"content-length" in hdrs:
                    body = await cr.readexactly(int(hdrs[b"content-length"]))
                elif hdrs.get(b"transfer-encoding", b"").lower() == b"chunked":
                    body = await _read_chunked(cr)
                stats["requests"] += 1
                if method == b"GET":
                    stats["gets"] += 1
                    rng = hdrs.get(b"range", b"").removeprefix(b"bytes=").split(b"-")
                    if len(rng) == 2 and rng[0].isdigit() and rng[1].isdigit():
                        stats["ranged_gets"] += 1
                        stats["range_bytes"] += int(rng[1]) - int(rng[0]) + 1
                elif method == b"HEAD":
                    stats["heads"] += 1
                elif method == b"PUT":
                    stats["puts"] += 1
                else:
                    stats["other"] += 1
                stats["bytes_to_store"] += len(head) + len(body)
                await asyncio.sleep(latency_s)
                uw.write(head + body)
                await uw.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError):
            pass
        finally:
            uw.close()
            cw.close()
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await back

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    inv._say("READY")
    inv._say(str(server.sockets[0].getsockname()[1]))
    commands = inv._stdin_lines(asyncio.get_running_loop())
    while (cmd := await commands.get()) not in ("EXIT", ""):
        if cmd == "STATS":
            inv._say(json.dumps(stats))
    server.close()


# -- the scanners (child process): bench_invariant's, counting cold reads ----------------------
_COLD_KEY = b'"cold_segments_read":'
_cold = {"diffs": 0, "diffs_cold": 0, "cold_segments_read": 0}


class _CountingConn(AsyncConn):
    """bench_invariant's scanner connection, also counting each diff's cold_segments_read."""

    async def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        st, b = await super().roundtrip(request)
        if st == 200:
            _cold["diffs"] += 1
            j = b.rfind(_COLD_KEY, max(0, len(b) - 512))
            if j >= 0:
                j += len(_COLD_KEY)
                _cold["diffs_cold"] += 1
                _cold["cold_segments_read"] += int(b[j : b.index(b"}", j)].split(b",")[0])
        return st, b


def _say_counted(line: str) -> None:
    """bench_invariant's `_say`, resetting the counts at STARTED and adding them to the
    figures of a finished phase (its JSON line)."""
    if line == "STARTED":
        for k in _cold:
            _cold[k] = 0
    elif line.startswith("{"):
        line = json.dumps({**json.loads(line), **_cold})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _scanner_role(url: str, head: int, scanners: int, limit: int) -> None:
    """bench_invariant's scanner process with its connection and `_say` swapped for the
    counting ones above; nothing to evict (the object store is not in our page cache)."""
    inv.AsyncConn = _CountingConn  # type: ignore[misc]
    inv._say = _say_counted
    host, _, port = url.removeprefix("http://").rpartition(":")
    uvloop.run(inv._scanner_main(host, int(port), HISTORY, head, scanners, limit, [], 3600.0))


def _niced(nice: int) -> list[str]:
    """An argv prefix running a process at niceness `nice` (`nice` execs: same PID)."""
    return ["nice", "-n", str(nice)] if nice else []


class Child(inv.Child):
    """A child process running *this* script (bench_invariant's Child runs its own)."""

    def __init__(self, args: list[str], nice: int = 0) -> None:
        self.proc = subprocess.Popen(
            [*_niced(nice), sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.expect("READY")


# -- pieces of the orchestration ------------------------------------------------------------------
def seg_env(args: argparse.Namespace, checkpoint_ms: int) -> dict[str, str]:
    return {
        "TOPICS_SEGMENT_MAX_BYTES": str(args.segment_bytes),
        "TOPICS_SEGMENT_MAX_EVENTS": str(100_000_000),  # seal by bytes only
        "TOPICS_HOT_RETAIN_SEGMENTS": str(args.retain),
        "TOPICS_RELOCATE_BYTES_PER_S": "0",
        "TOPICS_CHECKPOINT_INTERVAL_MS": str(checkpoint_ms),
    }


def s3_env(endpoint: str, prefix: str) -> dict[str, str]:
    return {
        **AWS_ENV,
        "AWS_ENDPOINT_URL": endpoint,
        "TOPICS_COLD_DIR": f"s3://{BUCKET}/{prefix}",
    }


def start(data_dir: Path, work: Path, name: str, env: dict[str, str]) -> inv.Server:
    """A server over `data_dir`, its log in `work/<name>/server.log`."""
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    return inv.Server(data_dir, d, env)


def history_paths(data_dir: Path, cold_dir: Path | None = None) -> list[Path]:
    """The history's segment files in the data dir (and in a local cold root)."""
    hdir = inv.history_dir(data_dir)
    paths = inv.segment_files(data_dir, hdir)
    if cold_dir is not None and (cold_dir / "topics" / hdir.name).is_dir():
        paths += inv.segment_files(cold_dir, cold_dir / "topics" / hdir.name)
    return paths


def sync_files(paths: list[Path]) -> None:
    """fsync each file: pages still dirty (a fresh copy) are not evicted by fadvise."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def resident_share(paths: list[Path]) -> float | None:
    res, total = inv.resident_bytes(paths)
    return round(res / total, 4) if total else None


def cpu_of(pids: list[int]) -> float:
    return sum(proc_cpu_s(p) or 0.0 for p in pids)


def head_seq(srv: inv.Server, topic: str = HISTORY) -> int:
    return int(srv.json("GET", f"/v0/topics/{topic}?touch=false")["head_seq"])


def fill_history(args: argparse.Namespace, work: Path, data_dir: Path) -> dict[str, Any]:
    """Fill `history` on a server without a cold tier; stop it (final checkpoint)."""
    records = max(1000, args.history_bytes // args.record_bytes)
    srv = start(data_dir, work, "fill", seg_env(args, args.relocation_checkpoint_ms))
    try:
        srv.json("PUT", f"/v0/topics/{HISTORY}", {"durability": "disk"})
        log(f"fill: {records:,} records of {args.record_bytes} B into {HISTORY} ...")
        fill = uvloop.run(inv._fill(srv, HISTORY, records, args.record_bytes))
        log(f"  {fill}")
    finally:
        stop_s = srv.stop_timed()
    fill["stop_s"] = stop_s  # the final checkpoint writes the segments
    paths = history_paths(data_dir)
    datas = [p for p in paths if p.suffix == ".data"]
    return {
        **fill,
        "segment_files": len(datas),
        "data_bytes": sum(p.stat().st_size for p in datas),
        "idx_bytes": sum(p.stat().st_size for p in paths if p.suffix == ".idx"),
    }


def relocate(
    args: argparse.Namespace,
    work: Path,
    name: str,
    data_dir: Path,
    env: dict[str, str],
    store_pids: list[int],
) -> dict[str, Any]:
    """Start `data_dir` with the cold tier of `env`, kick a checkpoint cycle, time the moves."""
    paths = history_paths(data_dir)
    sealed = len([p for p in paths if p.suffix == ".data"]) - 1  # the newest one is active
    expected = max(0, sealed - args.retain)
    sync_files(paths)  # the data dir is a fresh copy
    evicted = inv.evict(paths, args.drop_caches)
    srv = start(data_dir, work, f"relocate-{name}", env)
    out: dict[str, Any] = {
        "expected_segments": expected,
        "evict": evicted,
        "resident_at_start": resident_share(paths),
        "server_ready_s": round(srv.ready_s, 3),
    }
    try:
        log(f"relocation to {name}: {expected} segments ...")
        s0, st0 = proc_cpu_s(srv.pid) or 0.0, cpu_of(store_pids)
        t0 = time.perf_counter()
        srv.json("POST", f"/v0/topics/{KICK}?return_seqs=false", {"records": [{"data": 0}]})
        copied_last, t_copied, t_done = -1, t0, None
        samples: list[tuple[float, int, int]] = []
        deadline = t0 + args.relocation_timeout
        while True:
            st = srv.metrics()["storage"]
            now = time.perf_counter()
            copied, moved = st.get("relocation_copied_bytes", 0), st.get("relocated_segments", 0)
            samples.append((round(now - t0, 3), moved, copied))
            if copied != copied_last:
                copied_last, t_copied = copied, now
            if moved >= expected and st.get("relocation_queued", 0) == 0:
                t_done = now
                break
            if now > deadline:
                break
            time.sleep(0.02)
        server_cpu = (proc_cpu_s(srv.pid) or 0.0) - s0
        store_cpu = cpu_of(store_pids) - st0
        wall = (t_done or time.perf_counter()) - t0
        copy_wall = t_copied - t0
        time.sleep(3 * args.relocation_checkpoint_ms / 1000)  # any move still to commit
        st = srv.metrics()["storage"]
        out.update(
            {
                "done": t_done is not None,
                "seconds": round(wall, 3),
                "copy_seconds": round(copy_wall, 3),
                "relocated_segments": st.get("relocated_segments"),
                "cold_segments": st.get("cold_segments"),
                "copied_bytes": st.get("relocation_copied_bytes"),
                "failures": st.get("relocation_failures"),
                "mb_per_s": round(copied_last / wall / MB, 1) if wall > 0 else None,
                "copy_mb_per_s": round(copied_last / copy_wall / MB, 1) if copy_wall > 0 else None,
                "server_cpu_s": round(server_cpu, 3),
                "server_cores": round(server_cpu / wall, 3) if wall > 0 else None,
                "store_cpu_s": round(store_cpu, 3) if store_pids else None,
                "samples": samples[:: max(1, len(samples) // 50)],
            }
        )
        if not out["done"]:
            log(f"  relocation to {name} not done in {args.relocation_timeout:g} s: {st}")
    finally:
        out["stop_s"] = srv.stop_timed()
    hot_left = [p for p in history_paths(data_dir) if p.suffix == ".data"]
    out["hot_segments_left"] = len(hot_left)
    log(f"  { ({k: out[k] for k in ('seconds', 'mb_per_s', 'copy_mb_per_s', 'server_cpu_s')}) }")
    return out


def scan_all(
    srv: inv.Server, head: int, limit: int, store_pids: list[int], max_s: float | None = None
) -> dict[str, Any]:
    """One client reading the history from seq 0 to `head` with diff, sequentially (for at
    most `max_s` seconds when given)."""
    conn = SyncConn(srv.host, srv.port)
    prefix = (
        f"POST /v0/topics/{HISTORY}/diff HTTP/1.1\r\nHost: {srv.host}:{srv.port}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    stats = {"requests": 0, "records": 0, "bytes": 0, "diffs_cold": 0, "cold_segments_read": 0}
    lat: list[int] = []
    server_ms: list[float] = []
    cur = 0
    clock = time.perf_counter_ns
    meter = CpuMeter([srv.pid]).start()
    st0 = cpu_of(store_pids)
    t0 = time.perf_counter()
    end = t0 + max_s if max_s else None
    try:
        while cur < head and (end is None or time.perf_counter() < end):
            body = b'{"from_seq":%d,"limit":%d}' % (cur, limit)
            t = clock()
            st, b = conn.roundtrip(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            lat.append(clock() - t)
            if st != 200:
                raise RuntimeError(f"diff from {cur}: {st} {b[:300]!r}")
            j = b.rfind(b'"next_from_seq":') + 16
            nxt = int(b[j : b.index(b",", j)])
            perf = orjson.loads(b[b.rfind(b'"performance":') + 14 : -1])
            server_ms.append(perf.get("server_total_ms", 0.0))
            if perf.get("cold_segments_read"):
                stats["diffs_cold"] += 1
                stats["cold_segments_read"] += perf["cold_segments_read"]
            stats["requests"] += 1
            stats["records"] += max(0, nxt - cur)
            stats["bytes"] += len(b)
            if nxt == cur:
                break
            cur = nxt
    finally:
        conn.close()
    wall = time.perf_counter() - t0
    cpu = meter.stop()
    store_cpu = cpu_of(store_pids) - st0
    s = summarize(lat, 1e6)
    return {
        **stats,
        "complete": cur >= head,
        "wall_s": round(wall, 3),
        "records_per_s": round(stats["records"] / wall),
        "mb_per_s": round(stats["bytes"] / wall / MB, 1),
        "req_p50_ms": s.get("p50"),
        "req_p99_ms": s.get("p99"),
        "req_max_ms": s.get("max"),
        "server_handler_ms_total": round(sum(server_ms), 1),
        "server_cpu_s": cpu["server_cpu_s"],
        "server_cores": cpu["server_cores"],
        "client_cores": cpu["client_cores"],
        "store_cpu_s": round(store_cpu, 3) if store_pids else None,
    }


def proxy_stats(proxy: Child) -> dict[str, int]:
    proxy.send("STATS")
    return dict(json.loads(proxy.readline()))


def diff_run(
    args: argparse.Namespace,
    work: Path,
    name: str,
    data_dir: Path,
    env: dict[str, str],
    cold_dir: Path | None = None,
    store_pids: list[int] | None = None,
    proxy: Child | None = None,
    max_s: float | None = None,
) -> dict[str, Any]:
    """A fresh server over `data_dir`; evict the history's files; scan it all once (or for
    `max_s` seconds). With `proxy`, what the store was asked meanwhile (its counters)."""
    srv = start(data_dir, work, f"diff-{name}", env)
    out: dict[str, Any] = {}
    try:
        head = head_seq(srv)
        paths = history_paths(data_dir, cold_dir)
        ev = inv.evict(paths, args.drop_caches)
        log(
            f"diff scan from {name}: {head:,} records{f' (at most {max_s:g} s)' if max_s else ''} ..."
        )
        p0 = proxy_stats(proxy) if proxy else None
        out.update(scan_all(srv, head, args.limit, store_pids or [], max_s))
        if proxy is not None and p0 is not None:
            out["store_requests"] = {k: v - p0[k] for k, v in proxy_stats(proxy).items()}
        out["head_seq"] = head
        out["evict"] = ev
        out["local_files"] = len([p for p in paths if p.suffix == ".data"])
        log(f"  { ({k: out[k] for k in ('records_per_s', 'mb_per_s', 'cold_segments_read')}) }")
    finally:
        out["stop_s"] = srv.stop_timed()
    return out


def invariant_run(
    args: argparse.Namespace, work: Path, data_dir: Path, env: dict[str, str], proxy: Child,
    store_pids: list[int],
) -> dict[str, Any]:  # fmt: skip
    """Phases A and B (part 3) on `data_dir` with its cold tier behind the latency proxy."""
    srv = start(data_dir, work, "invariant", env)
    children: list[inv.Child] = []
    live: inv.Live | None = None
    phases: list[dict[str, Any]] = []
    report: dict[str, Any] = {"server_ready_s": round(srv.ready_s, 3)}
    try:
        head = head_seq(srv)
        st = srv.metrics()["storage"]
        report["history_head_seq"] = head
        report["cold_segments"] = st.get("cold_segments")
        srv.json("PUT", f"/v0/topics/{LIVE}", {"durability": args.durability})
        out = work / "deliveries.json"
        watcher = inv.Child(["--_role", "watcher", "--_url", srv.url, "--_out", str(out)])
        children.append(watcher)
        scanner = Child(
            ["--_role", "scanner", "--_url", srv.url, "--_head", str(head)]
            + ["--scanners", str(args.scanners), "--limit", str(args.limit)]
        )
        children.append(scanner)
        live = inv.Live(srv, args.rate)
        live.run(args.warmup, counted=False)
        for rnd in range(1, args.rounds + 1):
            for name in ("A", "B"):
                ph: dict[str, Any] = {"phase": name, "round": rnd}
                p0 = proxy_stats(proxy)
                if name == "B":
                    scanner.send("START warm")  # no eviction: nothing of it is in our cache
                    scanner.expect("STARTED")
                log(f"round {rnd}: phase {name} ({args.seconds} s) ...")
                s0 = cpu_of(store_pids)
                meter = CpuMeter([srv.pid], [watcher.pid, scanner.pid]).start()
                ph.update(live.run(args.seconds))
                ph["cpu"] = meter.stop()
                # the delivery governor as the phase ends (scanners still running in B)
                ph["scheduler"] = srv.metrics().get("scheduler", {})
                ph["cpu"]["store_cores"] = round((cpu_of(store_pids) - s0) / ph["cpu"]["wall_s"], 3)
                if name == "B":
                    scanner.send("STOP")
                    ph["scan"] = json.loads(scanner.readline())
                ph["store_requests"] = {k: v - p0[k] for k, v in proxy_stats(proxy).items()}
                if name == "B":
                    time.sleep(0.5)  # let the last scan responses drain
                phases.append(ph)
        time.sleep(0.5)  # the last deliveries
        watcher.finish("STOP")
        scanner.finish("EXIT")
        deliveries = orjson.loads(out.read_bytes())["deliveries"]
    finally:
        if live is not None:
            live.close()
        for c in children:
            c.kill()
        report["server_stop_s"] = srv.stop_timed()

    by_i = dict(deliveries)
    out_phases: dict[str, Any] = {}
    for name in ("A", "B"):
        rounds = [p for p in phases if p["phase"] == name]
        idx = [i for p in rounds for i in range(p["i0"], p["i1"])]
        sse = [by_i[i] for i in idx if i in by_i]
        entry: dict[str, Any] = {
            "writes": sum(len(p["acks"]) for p in rounds),
            "writes_due": round(len(rounds) * args.seconds * args.rate),
            "write_errors": sum(p["errors"] for p in rounds),
            "write_ack_ms": inv.ms([ns for p in rounds for ns in p["acks"]]),
            "write_ack_from_schedule_ms": inv.ms([ns for p in rounds for ns in p["from_schedule"]]),
            "server_ms": inv.ms([ns for p in rounds for ns in p["server"]]),
            "sse_deliveries": len(sse),
            "sse_ms": inv.ms(sse),
            "cpu": [p["cpu"] for p in rounds],
            "scheduler_at_end": [
                {k: p["scheduler"].get(k) for k in SCHEDULER_KEYS} for p in rounds
            ],
            "store_requests": {
                k: sum(p["store_requests"][k] for p in rounds) for k in rounds[0]["store_requests"]
            },
        }
        if name == "B":
            scans = [p["scan"] for p in rounds]
            entry["scan"] = inv.pool_scans(scans)
            for k in ("diffs", "diffs_cold", "cold_segments_read"):
                entry["scan"][k] = sum(s[k] for s in scans)
        out_phases[name] = entry
    a, b = out_phases["A"], out_phases["B"]
    report["phases"] = out_phases
    report["ratios"] = {
        "write_ack_p50": inv.ratio(b["write_ack_ms"].get("p50"), a["write_ack_ms"].get("p50")),
        "write_ack_p99": inv.ratio(b["write_ack_ms"].get("p99"), a["write_ack_ms"].get("p99")),
        "sse_p99": inv.ratio(b["sse_ms"].get("p99"), a["sse_ms"].get("p99")),
        "server_p99": inv.ratio(b["server_ms"].get("p99"), a["server_ms"].get("p99")),
    }
    ok = all(
        r is not None and r <= THRESHOLD
        for r in (report["ratios"]["write_ack_p99"], report["ratios"]["sse_p99"])
    )
    report["verdict"] = "PASS" if ok else "FAIL"
    return report


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    base = work / "data-hot"
    report: dict[str, Any] = {"history": fill_history(args, work, base)}
    log(f"history: {report['history']}")
    local_dir, s3_dir, local_cold = work / "data-local", work / "data-s3", work / "cold-local"
    t = time.perf_counter()
    shutil.copytree(base, local_dir)
    shutil.copytree(base, s3_dir)
    report["copy_data_dirs_s"] = round(time.perf_counter() - t, 2)

    moto = Moto(work, BUCKET, args.store_nice)
    proxy: Child | None = None
    try:
        proxy = Child(
            ["--_role", "proxy", "--_url", moto.url]
            + ["--cold-latency-ms", str(args.cold_latency_ms)],
            args.store_nice,
        )
        proxy_url = f"http://127.0.0.1:{int(proxy.readline())}"
        log(f"moto {moto.url}; latency proxy {proxy_url} (+{args.cold_latency_ms:g} ms a request)")
        store = [moto.pid]
        slow_store = [moto.pid, proxy.pid]
        slow_env = {**seg_env(args, args.relocation_checkpoint_ms), **s3_env(proxy_url, "bench")}
        moto_env = {**seg_env(args, args.relocation_checkpoint_ms), **s3_env(moto.url, "bench")}
        local_env = {
            **seg_env(args, args.relocation_checkpoint_ms),
            "TOPICS_COLD_DIR": str(local_cold),
        }
        hot_env = seg_env(args, args.relocation_checkpoint_ms)
        # 1. relocation throughput
        report["relocation"] = {
            "local": relocate(args, work, "local", local_dir, local_env, []),
            "s3": relocate(args, work, "s3", s3_dir, moto_env, store),
        }
        # 2. diff throughput per tier
        report["diff"] = {
            "hot": diff_run(args, work, "hot", base, hot_env),
            "local": diff_run(args, work, "local", local_dir, local_env, local_cold),
            "s3": diff_run(args, work, "s3", s3_dir, moto_env, store_pids=store),
            "s3_slow": diff_run(
                args,
                work,
                "s3_slow",
                s3_dir,
                slow_env,
                store_pids=slow_store,
                proxy=proxy,
                max_s=args.slow_scan_seconds,
            ),
        }
        shutil.rmtree(local_dir, ignore_errors=True)
        shutil.rmtree(local_cold, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        # 3. the invariant with the store behind the latency proxy
        inv_env = {**seg_env(args, args.checkpoint_ms), **s3_env(proxy_url, "bench")}
        report["invariant"] = invariant_run(args, work, s3_dir, inv_env, proxy, slow_store)
        report["invariant"]["cold_latency_ms"] = args.cold_latency_ms
    finally:
        if proxy is not None:
            proxy.finish("EXIT", 10)
        report["moto_exit"] = moto.stop(signal.SIGTERM, 20)
    return report


# -- output -----------------------------------------------------------------------------------------
fmt = inv.fmt


def tables(report: dict[str, Any], args: argparse.Namespace) -> str:
    h = report["history"]
    out = [
        f"### Relocation (history {h['data_bytes'] / MB:,.0f} MB in {h['segment_files']} "
        f"segments of {args.segment_bytes / 2**20:g} MiB, retain {args.retain}, unpaced)\n",
        "| cold tier | segments moved | MB copied | s to committed | **MB/s** | copies alone MB/s "
        "| server CPU s | server cores | moto CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, title in (("local", "local dir (same disk)"), ("s3", "object store (moto)")):
        r = report["relocation"][name]
        out.append(
            f"| {title} | {r['relocated_segments']} / {r['expected_segments']} | "
            f"{fmt((r['copied_bytes'] or 0) / MB, 1)} | {fmt(r['seconds'], 2)} | "
            f"**{fmt(r['mb_per_s'], 1)}** | {fmt(r['copy_mb_per_s'], 1)} | "
            f"{fmt(r['server_cpu_s'], 2)} | {fmt(r['server_cores'], 2)} | "
            f"{fmt(r['store_cpu_s'], 2)} |"
        )
    out += [
        "",
        f"### Diff scan of the whole history (one client, sequential, limit {args.limit})\n",
        "| source | records | **records/s** | MB/s | req p50 ms | req p99 ms | "
        "diffs with cold reads | server cores | moto CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, title in (
        ("hot", "hot (no cold tier)"),
        ("local", "local cold dir"),
        ("s3", "object store (moto)"),
        ("s3_slow", f"object store +{args.cold_latency_ms:g} ms (proxy)"),
    ):
        d = report["diff"][name]
        out.append(
            f"| {title} | {d['records']:,}{'' if d['complete'] else ' (time-boxed)'} | "
            f"**{fmt(d['records_per_s'], 0)}** | "
            f"{fmt(d['mb_per_s'], 1)} | {fmt(d['req_p50_ms'], 3)} | {fmt(d['req_p99_ms'], 3)} | "
            f"{d['diffs_cold']} / {d['requests']} | {fmt(d['server_cores'], 2)} | "
            f"{fmt(d['store_cpu_s'], 2)} |"
        )
    ev = report["diff"]["local"]["evict"]
    out.append(
        f"\nPage cache: the history's segment files (data dir and local cold dir) were "
        f"evicted with posix_fadvise(DONTNEED){' + drop_caches' if ev['drop_caches'] else ''} "
        "before each hot/local scan and before each relocation; resident after: hot "
        f"{fmt(report['diff']['hot']['evict']['resident_after'], 3)}, local "
        f"{fmt(ev['resident_after'], 3)}. The object store's bytes are in moto's memory."
    )
    sr = report["diff"]["s3_slow"].get("store_requests") or {}
    if sr.get("ranged_gets"):
        d = report["diff"]["s3_slow"]
        out.append(
            f"Object store +{args.cold_latency_ms:g} ms: {sr['ranged_gets']:,} ranged GETs for "
            f"{d['requests']:,} diffs ({sr['ranged_gets'] / max(1, d['requests']):.1f} a diff), "
            f"{sr['range_bytes'] / sr['ranged_gets'] / 1024:,.0f} KiB a GET on average."
        )
    r = report["invariant"]
    ph = r["phases"]
    a, b = ph["A"], ph["B"]
    out += [
        "",
        f"### Live traffic vs scans of an object-store history (+{args.cold_latency_ms:g} ms per "
        f"store request; {args.scanners} scanner(s); {args.rounds} x {args.seconds:g} s per "
        f"phase; live writes {args.rate:g}/s, {args.durability})\n",
        "| metric | A: no scan | B: cold scan | B/A |",
        "|---|---|---|---|",
    ]

    def row(name: str, va: Any, vb: Any, digits: int = 3, rat: bool = False) -> None:
        rr = fmt(inv.ratio(vb, va), 2) if rat else ""
        out.append(f"| {name} | {fmt(va, digits)} | {fmt(vb, digits)} | {rr} |")

    row("write ack p50 ms", a["write_ack_ms"].get("p50"), b["write_ack_ms"].get("p50"), rat=True)
    row(
        "**write ack p99 ms**",
        a["write_ack_ms"].get("p99"),
        b["write_ack_ms"].get("p99"),
        rat=True,
    )
    row("SSE delivery p50 ms", a["sse_ms"].get("p50"), b["sse_ms"].get("p50"), rat=True)
    row("**SSE delivery p99 ms**", a["sse_ms"].get("p99"), b["sse_ms"].get("p99"), rat=True)
    row("write: server's handler p99 ms", a["server_ms"].get("p99"), b["server_ms"].get("p99"))
    out.append(
        f"| writes due / acked / SSE delivered | {a['writes_due']:,} / {a['writes']:,} / "
        f"{a['sse_deliveries']:,} | {b['writes_due']:,} / {b['writes']:,} / "
        f"{b['sse_deliveries']:,} | |"
    )
    sc = b["scan"]
    row("scan records/s", None, sc["records_per_s"], 0)
    row("scan MB/s", None, sc["mb_per_s"], 1)
    out.append(
        f"| scan diffs with cold reads / diffs; cold segments read | | "
        f"{sc['diffs_cold']:,} / {sc['diffs']:,}; {sc['cold_segments_read']:,} | |"
    )
    ga, gb = a["store_requests"], b["store_requests"]
    row("ranged GETs at the store", ga["ranged_gets"], gb["ranged_gets"], 0)
    row(
        "KiB per ranged GET",
        None,
        gb["range_bytes"] / gb["ranged_gets"] / 1024 if gb["ranged_gets"] else None,
        0,
    )
    row("scan wraps", None, sc["wraps"], 0)
    row(
        "governor pressure at phase end",
        a["scheduler_at_end"][-1].get("pressure"),
        b["scheduler_at_end"][-1].get("pressure"),
        2,
    )
    row(
        "group-commit window ms at phase end",
        a["scheduler_at_end"][-1].get("commit_window_ms"),
        b["scheduler_at_end"][-1].get("commit_window_ms"),
        2,
    )
    for key, title in (
        ("server_cores", "server cores"),
        ("client_cores", "bench cores (writer, subscriber, scanners)"),
        ("store_cores", "store cores (moto + proxy)"),
        ("others_cores", "others' cores (store included)"),
    ):
        row(title, max(c[key] for c in a["cpu"]), max(c[key] for c in b["cpu"]), 2)
    rt = r["ratios"]
    out.append(
        f"\nInvariant p99(B)/p99(A) <= {THRESHOLD:.2f}: write ack {fmt(rt['write_ack_p99'])}, "
        f"SSE {fmt(rt['sse_p99'])}: **{r['verdict']}**"
    )
    return "\n".join(out)


def summary(report: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    r = report["invariant"]
    ph = r["phases"]
    return {
        "relocation_mb_per_s": {k: v["mb_per_s"] for k, v in report["relocation"].items()},
        "relocation_server_cpu_s": {k: v["server_cpu_s"] for k, v in report["relocation"].items()},
        "diff_records_per_s": {k: v["records_per_s"] for k, v in report["diff"].items()},
        "diff_mb_per_s": {k: v["mb_per_s"] for k, v in report["diff"].items()},
        "cold_latency_ms": r["cold_latency_ms"],
        "verdict": r["verdict"],
        "threshold": THRESHOLD,
        "ratios": r["ratios"],
        **{
            f"{name}_{key}": {q: ph[name][key].get(q) for q in ("p50", "p99")}
            for name in ("A", "B")
            for key in ("write_ack_ms", "sse_ms")
        },
        "scan_records_per_s": ph["B"]["scan"]["records_per_s"],
        "scan_cold_segments_read": ph["B"]["scan"]["cold_segments_read"],
        "scan_ranged_gets": ph["B"]["store_requests"]["ranged_gets"],
        "slow_scan_gets_per_diff": round(
            report["diff"]["s3_slow"]["store_requests"]["ranged_gets"]
            / max(1, report["diff"]["s3_slow"]["requests"]),
            1,
        ),
        "B_commit_window_ms": ph["B"]["scheduler_at_end"][-1].get("commit_window_ms"),
        "B_pressure_terms": ph["B"]["scheduler_at_end"][-1].get("pressure_terms"),
        "git_rev": env["git_rev"][:12],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 100 MB, 5 s phases")
    ap.add_argument(
        "--history-bytes", type=float, help="record data in the history (default 3e8, quick 1e8)"
    )
    ap.add_argument("--record-bytes", type=int, default=1024, help="history record data size")
    ap.add_argument(
        "--segment-bytes", type=int, default=4 << 20, help="TOPICS_SEGMENT_MAX_BYTES (4 MiB)"
    )
    ap.add_argument("--retain", type=int, default=1, help="TOPICS_HOT_RETAIN_SEGMENTS")
    ap.add_argument(
        "--relocation-checkpoint-ms",
        type=int,
        default=200,
        help="TOPICS_CHECKPOINT_INTERVAL_MS of parts 1 and 2",
    )
    ap.add_argument(
        "--relocation-timeout", type=float, default=900.0, help="give up waiting after (s)"
    )
    ap.add_argument("--limit", type=int, default=1000, help="diff page size")
    ap.add_argument(
        "--cold-latency-ms", type=float, default=20.0, help="proxy delay per store request"
    )
    ap.add_argument(
        "--slow-scan-seconds",
        type=float,
        help="time box of the diff scan through the latency proxy (default 20, quick 5)",
    )
    ap.add_argument("--seconds", type=float, help="length of each phase (default 30, quick 5)")
    ap.add_argument("--warmup", type=float, default=2.0, help="live warm-up seconds")
    ap.add_argument("--rounds", type=int, default=1, help="A/B alternations, pooled")
    ap.add_argument("--scanners", type=int, default=2, help="concurrent scanners in phase B")
    ap.add_argument("--rate", type=float, default=200.0, help="live writes per second")
    ap.add_argument(
        "--durability",
        choices=["ephemeral", "memory", "disk", "fsync"],
        default="fsync",
        help="durability class of the live topic",
    )
    ap.add_argument(
        "--checkpoint-ms", type=int, default=1000, help="TOPICS_CHECKPOINT_INTERVAL_MS of part 3"
    )
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write /proc/sys/vm/drop_caches when evicting (root; the whole machine)",
    )
    ap.add_argument(
        "--json", type=Path, default=HERE / "results" / "tiering.json", help="output JSON path"
    )
    ap.add_argument(
        "--store-nice",
        type=int,
        default=19,
        help="niceness of moto and the latency proxy (default 19): they stand in for a remote"
        " store, so on a small machine their CPU yields to the server and clients (0 = same"
        " priority)",
    )
    ap.add_argument("--_role", choices=["scanner", "proxy"], help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_head", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._role == "scanner":
        _scanner_role(args._url, args._head, args.scanners, args.limit)
        return 0
    if args._role == "proxy":
        uvloop.run(_proxy_main(args._url, args.cold_latency_ms / 1000))
        return 0

    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 30.0
    if args.slow_scan_seconds is None:
        args.slow_scan_seconds = 5.0 if args.quick else 20.0
    if args.history_bytes is None:
        args.history_bytes = 1e8 if args.quick else 3e8
    args.history_bytes = int(args.history_bytes)
    if not 1 <= args.scanners <= 16:
        ap.error("--scanners must be 1-16")
    if args.drop_caches and os.geteuid() != 0:
        ap.error("--drop-caches needs root")
    env = inv.environment()
    log(
        f"# tiering ({'quick' if args.quick else 'full'}; {args.history_bytes / MB:,.0f} MB "
        f"history, +{args.cold_latency_ms:g} ms cold store, {args.scanners} scanner(s))"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-tiering-"))
    try:
        report = run(args, work)
    except BaseException:
        logs = sorted(work.glob("*/server.log"), key=lambda p: p.stat().st_mtime)
        if logs:
            lines = [x for x in logs[-1].read_text().splitlines() if "topics.checkpoint" not in x]
            print(f"{logs[-1]} (checkpoint lines left out):", *lines[-30:], sep="\n", file=sys.stderr)  # fmt: skip
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = {
        k: getattr(args, k)
        for k in (
            "quick",
            "history_bytes",
            "record_bytes",
            "segment_bytes",
            "retain",
            "relocation_checkpoint_ms",
            "limit",
            "cold_latency_ms",
            "slow_scan_seconds",
            "seconds",
            "warmup",
            "rounds",
            "scanners",
            "rate",
            "durability",
            "checkpoint_ms",
            "drop_caches",
        )
    }
    full = {"environment": env, "params": params, **report}
    print(tables(report, args))
    print(json.dumps(summary(report, env)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(full, indent=2) + "\n")
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
