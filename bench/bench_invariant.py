"""Cold history reads must not hurt live traffic: write-ack and SSE p99, with and without a scan.

The invariant: a client scanning deep history from segment files that are *not* in the
page cache must not change the write-ack p99 or the SSE delivery p99 of another topic by
more than 20%. This script measures it against a real ``python -m topics serve``:

1. **Fill.** Topic ``history`` (class ``disk``) gets ``--history-bytes`` of records
   (``--record-bytes`` of JSON string data each, 1000-record batches over 4 connections).
   Topic ``live`` is created with ``--durability`` (default ``fsync``).
2. **Cold start.** The server is stopped with SIGTERM: its final checkpoint moves every
   record into ``topics/<id>/seg-*.data/.idx`` and nothing is left in the WAL. Then the
   history's segment files are evicted from the page cache (``posix_fadvise(DONTNEED)``
   on every ``.data`` and ``.idx``; as root also ``echo 1 > /proc/sys/vm/drop_caches``)
   and the server is started again, so history reads come from the segment files and
   from the disk. The resident share of those files is measured with ``mincore(2)``.
3. **Phase A (baseline).** One client writes one small record to ``live`` at a fixed rate
   (``--rate``, default 200/s), one request at a time on one keep-alive connection;
   write-ack latency is send to response. A subscriber in a separate process (one watch
   session, one SSE stream on ``live``) stamps every received chunk with
   ``time.monotonic_ns()``; each record carries its writer's ``monotonic_ns()``, so
   delivery latency = arrival - send across processes.
4. **Phase B (cold scan).** The same, while ``--scanners`` clients (one process, one
   connection each) read ``history`` with ``diff`` at ``--limit`` (the server's largest,
   1000) as fast as they can. Scanner k starts at seq k*head/n and wraps at the head.
   Before the phase the history is evicted again, and every ``--evict-every`` seconds
   during it the scanner process evicts it once more (readahead included) so the scan
   stays cold. The kernel never evicts pages a process has mapped, and the server keeps
   sealed segments ``mmap``-ed in an LRU of ``TOPICS_MAX_OPEN_SEGMENT_FILES`` handles
   (default 256): the script starts the server with ``--open-files`` (default 16), so the
   segments a scanner has left are unmapped and the eviction reaches them, and a scanner
   that wraps reads cold again. After the phase the history is evicted once more and the
   share still resident (mapped, so out of reach) is reported (``--open-files 0`` keeps
   the server default; then what the scan read stays resident and a second pass is warm).
5. Optional ``--warm`` phase W: the history files are read into the page cache first and
   the scan runs without eviction: the share of B/A that is the scan's CPU, not its I/O.

``--rounds R`` alternates A, B (, W) R times; each phase's samples are pooled over the
rounds. The verdict: p99(B) / p99(A) <= 1.20 for both write ack and SSE delivery.

Where the ack time goes: every write's response carries ``performance.server_total_ms``,
the time spent inside the server's handler. The writer keeps it next to the ack it saw,
so each phase also reports the handler's share and the rest (ack minus handler, per
write: the network stack, the event loops of both sides, and waiting for a CPU). Both are
information only; the verdict stays on the acks the client saw.

``--peer redis``: the same A/B shape against a ``redis-server`` started by the script
(127.0.0.1, a free port, a temp dir; ``--appendonly yes --save ""
--auto-aof-rewrite-percentage 0``, ``--appendfsync always`` for ``--durability fsync``,
``everysec`` otherwise), run after the topics phases. A stream ``history`` is filled with as
many ``--record-bytes`` records as the topics history holds (pipelined XADD; with
``--quick`` at most 200,000; ``--peer-records`` sets it). The writer does ``XADD live`` of
the same ~64-byte record on the same schedule; the scanner process opens ``--scanners``
connections, each looping ``XRANGE history (<last id> + COUNT <--limit>`` (replies parsed
by hiredis) and wrapping at the end. No SSE side, and the Redis history is in memory: its
scan is warm, ours is cold. A second table and ``peer_redis`` in the JSON hold the results;
without ``redis-server`` (or hiredis) the peer is skipped with a message.

Usage::

    .venv/bin/python bench/bench_invariant.py --quick            # smoke run, about 30 s
    .venv/bin/python bench/bench_invariant.py                    # 2 GB of history, 30 s phases
    .venv/bin/python bench/bench_invariant.py --data-dir /tmp/inv   # fill once, then reuse
    .venv/bin/python bench/bench_invariant.py --quick --peer redis  # and the same vs Redis

Prints a markdown table and one JSON line; writes everything to ``--json`` (default
``bench/results/invariant.json``). All processes share the machine's vCPUs (2 on the
reference machine): the scanners' CPU is taken from the server and from the live clients.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import json
import os
import platform
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

import numpy as np
import orjson
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _client import (  # noqa: E402
    AsyncConn,
    CpuMeter,
    RespConn,
    ServeProcess,
    Spawned,
    SSEParser,
    SyncConn,
    build_request,
    free_port,
    open_watch_streams,
    resp,
    summarize,
)

try:
    import hiredis
except ImportError:  # --peer redis is skipped, with a message
    hiredis = None

THRESHOLD = 1.20
HISTORY = "history"
LIVE = "live"
GB = 1_000_000_000
PEER_QUICK_RECORDS = 200_000  # the most records --quick puts into the Redis history


# -- page cache -----------------------------------------------------------------------
def segment_files(data_dir: Path, topic_dir: Path | None = None) -> list[Path]:
    """The `.data` and `.idx` files of one topic directory (or of all, when None)."""
    dirs = [topic_dir] if topic_dir else sorted((data_dir / "topics").glob("*"))
    return sorted(p for d in dirs for p in d.glob("seg-*") if p.suffix in (".data", ".idx"))


def history_dir(data_dir: Path) -> Path:
    """The topic directory holding the most segment bytes: the history, by far."""
    dirs = [d for d in (data_dir / "topics").glob("*") if d.is_dir()]
    if not dirs:
        raise RuntimeError(f"no topic directories under {data_dir / 'topics'}")
    return max(dirs, key=lambda d: sum(p.stat().st_size for p in d.glob("seg-*.data")))


def fadvise_dontneed(paths: list[Path]) -> int:
    """Drop the clean, unmapped cached pages of `paths`; returns the files done."""
    done = 0
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                done += 1
            finally:
                os.close(fd)
    return done


def drop_caches() -> bool:
    """`echo 1 > /proc/sys/vm/drop_caches` (root only): True when it worked."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def warm_files(paths: list[Path]) -> int:
    """Read every file once (into the page cache); returns the bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                total += len(chunk)
    return total


_PAGE = os.sysconf("SC_PAGE_SIZE")
_libc: Any = None


def resident_bytes(paths: list[Path]) -> tuple[int, int]:
    """(bytes in the page cache, total bytes) of `paths`, by `mincore(2)` on a fresh map.

    Mapping a file does not fault its pages in, so this only looks.
    """
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    resident = total = 0
    failed = ctypes.c_void_p(-1).value
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            total += size
            addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, failed):
                continue
            try:
                pages = (size + _PAGE - 1) // _PAGE
                vec = (ctypes.c_ubyte * pages)()
                if _libc.mincore(addr, size, vec) == 0:
                    n = int((np.frombuffer(vec, dtype=np.uint8) & 1).sum())
                    resident += min(size, n * _PAGE)
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident, total


def evict(paths: list[Path], use_drop_caches: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    files = fadvise_dontneed(paths)
    dropped = drop_caches() if use_drop_caches else False
    res, total = resident_bytes(paths)
    return {
        "fadvise_files": files,
        "drop_caches": dropped,
        "seconds": round(time.perf_counter() - t0, 3),
        "resident_after": round(res / total, 4) if total else None,
    }


# -- the server process -------------------------------------------------------------------
class Server(ServeProcess):
    """The server under test over `data_dir`, with the requests this script makes."""

    def __init__(self, data_dir: Path, work: Path, extra_env: dict[str, str]) -> None:
        self.work = work
        super().__init__(data_dir, work / "server.log", extra_env, cwd=ROOT)

    def request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        return build_request(method, path, body, host=f"{self.host}:{self.port}")

    def json(self, method: str, path: str, body: Any = None) -> Any:
        conn = SyncConn(self.host, self.port)
        try:
            raw = None if body is None else orjson.dumps(body)
            st, b = conn.roundtrip(self.request(method, path, raw))
        finally:
            conn.close()
        if st not in (200, 201):
            raise RuntimeError(f"{method} {path}: {st} {b[:200]!r}")
        return orjson.loads(b)

    def metrics(self) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/v0/metrics", headers={"Accept": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return dict(orjson.loads(r.read()))

    def stop_timed(self) -> float:
        """SIGTERM (a graceful stop checkpoints everything), wait; the seconds it took."""
        t0 = time.perf_counter()
        self.stop(signal.SIGTERM, 600)
        return round(time.perf_counter() - t0, 2)


# -- fill -------------------------------------------------------------------------------------
async def _fill(srv: Server, topic: str, records: int, record_bytes: int) -> dict[str, Any]:
    batch = 1000
    data = b'"' + b"h" * max(0, record_bytes - 2) + b'"'
    body = b'{"records":[' + b",".join([b'{"data":' + data + b"}"] * batch) + b"]}"
    req = srv.request("POST", f"/v0/topics/{topic}", body)
    pool = [await AsyncConn.open(srv.host, srv.port) for _ in range(4)]
    total_batches = (records + batch - 1) // batch
    remaining = total_batches
    t0 = time.perf_counter()
    last = t0

    async def worker(c: AsyncConn) -> None:
        nonlocal remaining, last
        while remaining > 0:
            remaining -= 1
            st, b = await c.roundtrip(req)
            if st not in (200, 201):
                raise RuntimeError(f"fill write: {st} {b[:200]!r}")
            now = time.perf_counter()
            if now - last > 5:
                last = now
                done = (total_batches - remaining) * batch
                print(
                    f"  fill: {done:,} / {total_batches * batch:,} records "
                    f"({done * record_bytes / (now - t0) / 1e6:.0f} MB/s)",
                    file=sys.stderr,
                    flush=True,
                )

    await asyncio.gather(*(worker(c) for c in pool))
    for c in pool:
        c.close()
    wall = time.perf_counter() - t0
    n = total_batches * batch
    return {
        "records": n,
        "wall_s": round(wall, 2),
        "records_per_s": round(n / wall),
        "mb_per_s": round(n * record_bytes / wall / 1e6, 1),
    }


# -- the SSE subscriber (child process) ------------------------------------------------------
def _stdin_lines(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str]:
    """Lines of fd 0 as an asyncio queue (the parent's commands); "" at EOF."""
    q: asyncio.Queue[str] = asyncio.Queue()
    buf = bytearray()

    def on_stdin() -> None:
        data = os.read(0, 4096)
        if not data:
            loop.remove_reader(0)
            q.put_nowait("")
            return
        buf.extend(data)
        while (k := buf.find(b"\n")) >= 0:
            q.put_nowait(buf[:k].decode().strip())
            del buf[: k + 1]

    loop.add_reader(0, on_stdin)
    return q


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _watcher_main(host: str, port: int, topic: str, out: Path) -> None:
    loop = asyncio.get_running_loop()
    ctl, (stream,) = await open_watch_streams(host, port, topic, 1)
    await asyncio.wait_for(stream.ready, 60)
    commands = _stdin_lines(loop)
    _say("READY")
    while await commands.get() not in ("STOP", ""):
        pass
    stream.transport.close()
    ctl.close()
    deliveries: list[tuple[int, int]] = []  # (record index, latency ns)
    parser = SSEParser()
    for ns, data in stream.chunks:
        for event, line in parser.feed(data):
            if event != b"record":
                continue
            for rec in orjson.loads(line)["records"]:
                d = rec.get("data")
                if isinstance(d, dict) and "t" in d:
                    deliveries.append((d["i"], ns - d["t"]))
    out.write_bytes(orjson.dumps({"deliveries": deliveries}))


def scan_figures(stats: dict[str, Any], lat: list[int], wall: float) -> dict[str, Any]:
    """A scan phase's counters with its rates and request latencies (ms)."""
    s = summarize(lat, 1e6)
    return {
        **stats,
        "wall_s": round(wall, 3),
        "records_per_s": round(stats["records"] / wall),
        "mb_per_s": round(stats["bytes"] / wall / 1e6, 1),
        "req_p50_ms": s.get("p50"),
        "req_p99_ms": s.get("p99"),
        "req_max_ms": s.get("max"),
    }


# -- the scanners (child process) -------------------------------------------------------------
async def _scanner_main(
    host: str,
    port: int,
    topic: str,
    head: int,
    n: int,
    limit: int,
    evict_paths: list[Path],
    evict_every: float,
) -> None:
    loop = asyncio.get_running_loop()
    prefix = (
        f"POST /v0/topics/{topic}/diff HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    cursors = [k * head // n for k in range(n)]
    commands = _stdin_lines(loop)
    clock = time.perf_counter_ns
    _say("READY")

    async def cycle(cold: bool) -> dict[str, Any]:
        """One scan phase: from START to STOP; returns its figures."""
        running = True
        stats = {"requests": 0, "records": 0, "bytes": 0, "wraps": 0, "errors": 0}
        lat: list[int] = []
        evictions: list[float] = []

        async def evict_now() -> None:
            t = time.perf_counter()
            await asyncio.to_thread(fadvise_dontneed, evict_paths)
            evictions.append(time.perf_counter() - t)

        async def scan(k: int, c: AsyncConn) -> None:
            while running:
                cur = cursors[k]
                body = b'{"from_seq":%d,"limit":%d}' % (cur, limit)
                t0 = clock()
                st, b = await c.roundtrip(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                dt = clock() - t0
                if st != 200:
                    stats["errors"] += 1
                    if stats["errors"] > 100:
                        raise RuntimeError(f"diff: {st} {b[:200]!r}")
                    continue
                # the cursor fields follow the records array: the last occurrence is theirs
                j = b.rfind(b'"next_from_seq":') + 16
                nxt = int(b[j : b.index(b",", j)])
                stats["requests"] += 1
                stats["records"] += max(0, nxt - cur)
                stats["bytes"] += len(b)
                lat.append(dt)
                if nxt >= head or nxt == cur:
                    stats["wraps"] += 1
                    nxt = 0
                cursors[k] = nxt

        async def evictor() -> None:
            while True:
                await asyncio.sleep(evict_every)
                await evict_now()

        if cold:
            await evict_now()
        # new connections per phase: the server closes one whose first request head has
        # not arrived within TOPICS_HTTP_HEADER_TIMEOUT_MS (10 s) of its opening
        pool = [await AsyncConn.open(host, port) for _ in range(n)]
        t_start = time.perf_counter()
        tasks = [asyncio.create_task(scan(k, c)) for k, c in enumerate(pool)]
        ev = asyncio.create_task(evictor()) if cold else None
        _say("STARTED")
        while await commands.get() not in ("STOP", ""):
            pass
        running = False
        wall = time.perf_counter() - t_start
        if ev is not None:
            ev.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ev
        await asyncio.gather(*tasks)
        for c in pool:
            c.close()
        return {
            **scan_figures(stats, lat, wall),
            "evictions": len(evictions),
            "evict_s_max": round(max(evictions), 4) if evictions else None,
            "cursors": list(cursors),
        }

    while (cmd := await commands.get()) not in ("EXIT", ""):
        if cmd.startswith("START"):
            _say(json.dumps(await cycle(cold=cmd.split()[1:] != ["warm"])))


# -- the live writer (this process) --------------------------------------------------------------
def live_data(i: int) -> tuple[int, bytes]:
    """Live record `i`: (now, monotonic ns; about 64 bytes of JSON carrying it and `i`)."""
    t = time.monotonic_ns()
    head = b'{"t":%d,"i":%d,"p":"' % (t, i)
    return t, head + b"y" * max(0, 64 - len(head) - 2) + b'"}'


class ScheduledWriter:
    """Writes one record at a time at a fixed rate; a subclass sends one (`write`)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next_i = 0

    def write(self, i: int) -> tuple[bool, int, int | None]:
        """Send record `i` and wait for its answer: (ok, ack ns, the server's own ns of it,
        when the answer says)."""
        raise NotImplementedError

    def run(self, seconds: float, counted: bool = True) -> dict[str, Any]:
        """Write on a fixed schedule for `seconds` of wall time; indices and ack latencies.

        One request at a time: a write due while the previous one is still out goes
        as soon as that one is answered (`from_schedule` adds that slip to its ack).
        Where the answer gives the server's handler time, `server` holds it and
        `outside` the ack minus it, per write.
        """
        base = self.next_i if counted else -1_000_000 - self.next_i
        acks: list[int] = []
        late: list[int] = []  # schedule slip + ack: what a client on the schedule sees
        server: list[int] = []
        outside: list[int] = []
        errors = 0
        start = time.perf_counter()
        end = start + seconds
        k = 0
        while True:
            due = start + k * self.interval
            if due >= end:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            slip = max(0.0, time.perf_counter() - due)
            ok, ns, server_ns = self.write(base + k)
            if not ok:
                errors += 1
            acks.append(ns)
            late.append(ns + int(slip * 1e9))
            if server_ns is not None:
                server.append(server_ns)
                outside.append(ns - server_ns)
            k += 1
            if time.perf_counter() >= end:
                break
        if counted:
            self.next_i += k
        return {
            "i0": base,
            "i1": base + k,
            "acks": acks,
            "from_schedule": late,
            "server": server,
            "outside": outside,
            "errors": errors,
        }

    def close(self) -> None:
        raise NotImplementedError


class Live(ScheduledWriter):
    """One keep-alive connection writing one record at a time to `live` at a fixed rate."""

    def __init__(self, srv: Server, rate: float) -> None:
        super().__init__(rate)
        self.srv = srv
        self.conn = SyncConn(srv.host, srv.port)
        self.prefix = (
            f"POST /v0/topics/{LIVE} HTTP/1.1\r\nHost: {srv.host}:{srv.port}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()

    def write(self, i: int) -> tuple[bool, int, int | None]:
        t, data = live_data(i)
        body = b'{"records":[{"data":' + data + b"}]}"
        self.conn.sock.sendall(self.prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        st, b = self.conn.read_response()
        ns = time.monotonic_ns() - t
        if st != 200:
            return False, ns, None
        server_ms = (orjson.loads(b).get("performance") or {}).get("server_total_ms")
        return True, ns, None if server_ms is None else round(server_ms * 1e6)

    def close(self) -> None:
        self.conn.close()


class Child:
    """A child process of this script speaking the line protocol on stdin/stdout."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.expect("READY")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            raise RuntimeError(f"child {self.proc.args[2:4]} ended (exit {self.proc.poll()})")
        return line

    def expect(self, word: str) -> None:
        line = self.readline()
        if line != word:
            raise RuntimeError(f"child said {line!r}, expected {word!r}")

    def finish(self, line: str, timeout: float = 300) -> int:
        with contextlib.suppress(BrokenPipeError):
            self.send(line)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- the Redis peer (--peer redis) ----------------------------------------------------------------
class RespAsync(AsyncConn):
    """An asyncio Redis connection, one command in flight; counts the bytes received.
    `roundtrip` (of AsyncConn) returns the reply as hiredis parsed it."""

    def __init__(self) -> None:
        super().__init__()
        self.reader = hiredis.Reader()
        self.received = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.reader.feed(data)
        w: Any = self.waiter
        if w is not None and not w.done() and (x := self.reader.gets()) is not False:
            self.waiter = None
            w.set_result(x)


async def _redis_scanner_main(host: str, port: int, starts: list[bytes], limit: int) -> None:
    """The Redis scanners (child process): one connection per start id, each looping
    `XRANGE history <cursor> + COUNT limit` from START to STOP, wrapping at the end."""
    loop = asyncio.get_running_loop()
    cursors = list(starts)  # "-" or an id (inclusive) at first, then "(" + last id
    count = b"%d" % limit
    commands = _stdin_lines(loop)
    clock = time.perf_counter_ns
    pool = [await RespAsync.open(host, port) for _ in starts]
    _say("READY")

    async def cycle() -> dict[str, Any]:
        running = True
        stats = {"requests": 0, "records": 0, "bytes": 0, "wraps": 0, "errors": 0}
        lat: list[int] = []

        async def scan(k: int, c: RespAsync) -> None:
            while running:
                got = c.received
                t0 = clock()
                rep = await c.roundtrip(
                    resp(b"XRANGE", HISTORY.encode(), cursors[k], b"+", b"COUNT", count)
                )
                dt = clock() - t0
                if isinstance(rep, hiredis.ReplyError):
                    stats["errors"] += 1
                    if stats["errors"] > 100:
                        raise RuntimeError(f"XRANGE: {rep}")
                    continue
                stats["requests"] += 1
                stats["records"] += len(rep)
                stats["bytes"] += c.received - got
                lat.append(dt)
                if len(rep) < limit:
                    stats["wraps"] += 1
                    cursors[k] = b"-"
                else:
                    cursors[k] = b"(" + rep[-1][0]

        t_start = time.perf_counter()
        tasks = [asyncio.create_task(scan(k, c)) for k, c in enumerate(pool)]
        _say("STARTED")
        while await commands.get() not in ("STOP", ""):
            pass
        running = False
        wall = time.perf_counter() - t_start
        await asyncio.gather(*tasks)
        return scan_figures(stats, lat, wall)

    while (cmd := await commands.get()) not in ("EXIT", ""):
        if cmd.startswith("START"):
            _say(json.dumps(await cycle()))
    for c in pool:
        c.close()


class RedisLive(ScheduledWriter):
    """One Redis connection doing `XADD live * d <record>` one at a time at a fixed rate."""

    def __init__(self, host: str, port: int, rate: float) -> None:
        super().__init__(rate)
        self.conn = RespConn(host, port)

    def write(self, i: int) -> tuple[bool, int, int | None]:
        t, data = live_data(i)
        (rep,) = self.conn.roundtrip(resp(b"XADD", LIVE.encode(), b"*", b"d", data))
        return not isinstance(rep, hiredis.ReplyError), time.monotonic_ns() - t, None

    def close(self) -> None:
        self.conn.close()


class RedisServer(Spawned):
    """`redis-server` on 127.0.0.1 and a free port over `work`, AOF on, no RDB, no AOF
    rewrites; returns once it answers PING. Stopped by its PID (:meth:`Spawned.stop`)."""

    def __init__(self, work: Path, appendfsync: str) -> None:
        self.host, self.port = "127.0.0.1", free_port()
        work.mkdir(parents=True, exist_ok=True)
        log_path = work / "redis.log"
        argv = [
            "redis-server",
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(work),
            "--daemonize", "no",
            "--appendonly", "yes",
            "--appendfsync", appendfsync,
            "--save", "",
            "--auto-aof-rewrite-percentage", "0",
        ]  # fmt: skip
        super().__init__(argv, log_path, cwd=work)
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL, 10)
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not start:\n{tail}")
            time.sleep(0.01)

    def _answers(self) -> bool:
        with contextlib.suppress(OSError):
            c = RespConn(self.host, self.port, timeout=2)
            try:
                return bool(c.roundtrip(resp(b"PING"))[0] == b"PONG")
            finally:
                c.close()
        return False


# -- orchestration -------------------------------------------------------------------------------
def ms(values: list[int]) -> dict[str, float]:
    """Nanosecond samples as milliseconds (µs resolution)."""
    s = summarize(values)  # µs, one decimal
    return {k: (s[k] if k == "n" else round(s[k] / 1e3, 4)) for k in s}


def ratio(b: float | None, a: float | None) -> float | None:
    if not a or b is None:
        return None
    return round(b / a, 3)


def pool_scans(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """The scanner figures of several rounds, pooled (rates over the summed wall time)."""
    wall = sum(s["wall_s"] for s in scans)
    records = sum(s["records"] for s in scans)
    nbytes = sum(s["bytes"] for s in scans)
    return {
        "records": records,
        "bytes": nbytes,
        "records_per_s": round(records / wall) if wall else 0,
        "mb_per_s": round(nbytes / wall / 1e6, 1) if wall else 0,
        "wraps": sum(s["wraps"] for s in scans),
        "errors": sum(s["errors"] for s in scans),
        "rounds": scans,
    }


def environment() -> dict[str, Any]:
    rev = ""
    with contextlib.suppress(Exception):
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "git_rev": rev,
        "root": os.geteuid() == 0,
        "loadavg_at_start": os.getloadavg(),
    }


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data_dir = Path(args.data_dir) if args.data_dir else work / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {"TOPICS_CHECKPOINT_INTERVAL_MS": str(args.checkpoint_ms)}
    if args.open_files:
        env["TOPICS_MAX_OPEN_SEGMENT_FILES"] = str(args.open_files)
    use_drop = not args.no_drop_caches and os.geteuid() == 0
    report: dict[str, Any] = {"data_dir": str(data_dir)}
    want = max(1000, args.history_bytes // args.record_bytes)

    # 1. fill (or reuse a filled data dir)
    srv = Server(data_dir, work, env)
    try:
        have = 0
        with contextlib.suppress(RuntimeError):
            have = int(srv.json("GET", f"/v0/topics/{HISTORY}?touch=false")["head_seq"])
        if have < want:
            if have == 0:
                srv.json("PUT", f"/v0/topics/{HISTORY}", {"durability": "disk"})
            log(f"fill: {want - have:,} records of {args.record_bytes} B into {HISTORY} ...")
            report["fill"] = uvloop.run(_fill(srv, HISTORY, want - have, args.record_bytes))
            log(f"  {report['fill']}")
        else:
            log(f"reusing {have:,} records of {HISTORY} in {data_dir}")
            report["fill"] = {"reused_records": have}
        srv.json("PUT", f"/v0/topics/{LIVE}", {"durability": args.durability})
    finally:
        report["stop_after_fill_s"] = srv.stop_timed()
    log(f"server stopped (final checkpoint) in {report['stop_after_fill_s']} s")

    # 2. cold start
    hdir = history_dir(data_dir)
    paths = segment_files(data_dir, hdir)
    data_bytes = sum(p.stat().st_size for p in paths if p.suffix == ".data")
    report["history_segments"] = {
        "dir": hdir.name,
        "segment_files": len([p for p in paths if p.suffix == ".data"]),
        "data_bytes": data_bytes,
        "idx_bytes": sum(p.stat().st_size for p in paths if p.suffix == ".idx"),
    }
    log(f"history: {report['history_segments']}")
    srv = Server(data_dir, work, env)
    children: list[Child] = []
    live: Live | None = None
    try:
        head = int(srv.json("GET", f"/v0/topics/{HISTORY}?touch=false")["head_seq"])
        st = srv.metrics().get("storage", {})
        report["after_restart"] = {
            "history_head_seq": head,
            "chunk_bytes": st.get("chunk_bytes"),
            "segments": st.get("segments"),
            "recovery": st.get("recovery"),
        }
        if data_bytes < 0.9 * head * args.record_bytes:
            raise RuntimeError(
                f"only {data_bytes:,} B of history in segments for {head:,} records: "
                "not checkpointed?"
            )
        report["evict_initial"] = evict(paths, use_drop)
        log(f"evicted: {report['evict_initial']}")

        out = work / "deliveries.json"
        watcher = Child(["--_role", "watcher", "--_url", srv.url, "--_out", str(out)])
        children.append(watcher)
        scanner = Child(
            [
                "--_role",
                "scanner",
                "--_url",
                srv.url,
                "--_head",
                str(head),
                "--scanners",
                str(args.scanners),
                "--limit",
                str(args.limit),
                "--evict-every",
                str(args.evict_every),
                "--_evict_dir",
                str(hdir),
            ]
        )
        children.append(scanner)
        pids = (watcher.pid, scanner.pid)
        live = Live(srv, args.rate)
        live.run(args.warmup, counted=False)  # warm-up records: negative indices

        phases: list[dict[str, Any]] = []
        names = ["A", "B", *(["W"] if args.warm else [])]
        for rnd in range(1, args.rounds + 1):
            for name in names:
                ph: dict[str, Any] = {"phase": name, "round": rnd}
                if name == "B":
                    ph["evict"] = evict(paths, use_drop)
                    scanner.send("START cold")
                    scanner.expect("STARTED")
                elif name == "W":
                    t = time.perf_counter()
                    warm_files(paths)
                    res, tot = resident_bytes(paths)
                    ph["prewarm"] = {
                        "seconds": round(time.perf_counter() - t, 2),
                        "resident": round(res / tot, 4) if tot else None,
                    }
                    scanner.send("START warm")
                    scanner.expect("STARTED")
                log(f"round {rnd}: phase {name} ({args.seconds} s) ...")
                meter = CpuMeter([srv.pid], pids).start()
                ph.update(live.run(args.seconds))
                ph["cpu"] = meter.stop()
                if name in ("B", "W"):
                    scanner.send("STOP")
                    ph["scan"] = json.loads(scanner.readline())
                    if name == "B":  # what is left now cannot be evicted: mapped pages
                        fadvise_dontneed(paths)
                    res, tot = resident_bytes(paths)
                    ph["resident_after"] = round(res / tot, 4) if tot else None
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

    # 3. per phase: pool the rounds
    by_i = dict(deliveries)  # record index -> latency (one subscriber, one delivery each)
    out_phases: dict[str, Any] = {}
    for name in names:
        rounds = [p for p in phases if p["phase"] == name]
        acks = [ns for p in rounds for ns in p["acks"]]
        sched = [ns for p in rounds for ns in p["from_schedule"]]
        idx = [i for p in rounds for i in range(p["i0"], p["i1"])]
        sse = [by_i[i] for i in idx if i in by_i]
        entry: dict[str, Any] = {
            "writes": len(acks),
            "writes_due": round(len(rounds) * args.seconds * args.rate),
            "write_errors": sum(p["errors"] for p in rounds),
            "write_ack_ms": ms(acks),
            "write_ack_from_schedule_ms": ms(sched),
            "server_ms": ms([ns for p in rounds for ns in p["server"]]),
            "outside_ms": ms([ns for p in rounds for ns in p["outside"]]),
            "sse_deliveries": len(sse),
            "sse_ms": ms(sse),
            "cpu": [p["cpu"] for p in rounds],
        }
        if name != "A":
            entry["scan"] = pool_scans([p["scan"] for p in rounds])
            entry["resident_after"] = [p.get("resident_after") for p in rounds]
            if name == "B":
                entry["evict"] = [p["evict"] for p in rounds]
            else:
                entry["prewarm"] = [p["prewarm"] for p in rounds]
        out_phases[name] = entry
    report["phases"] = out_phases
    a, b = out_phases["A"], out_phases["B"]
    report["ratios"] = {
        "write_ack_p99": ratio(b["write_ack_ms"].get("p99"), a["write_ack_ms"].get("p99")),
        "sse_p99": ratio(b["sse_ms"].get("p99"), a["sse_ms"].get("p99")),
        "server_p99": ratio(b["server_ms"].get("p99"), a["server_ms"].get("p99")),
        "outside_p99": ratio(b["outside_ms"].get("p99"), a["outside_ms"].get("p99")),
    }
    if "W" in out_phases:
        w = out_phases["W"]
        report["ratios"]["warm_write_ack_p99"] = ratio(
            w["write_ack_ms"].get("p99"), a["write_ack_ms"].get("p99")
        )
        report["ratios"]["warm_sse_p99"] = ratio(w["sse_ms"].get("p99"), a["sse_ms"].get("p99"))
    ok = all(
        r is not None and r <= THRESHOLD
        for r in (report["ratios"]["write_ack_p99"], report["ratios"]["sse_p99"])
    )
    report["verdict"] = "PASS" if ok else "FAIL"
    report["eviction_method"] = "posix_fadvise(DONTNEED)" + (
        " + drop_caches" if report["evict_initial"]["drop_caches"] else ""
    )
    return report


def redis_missing() -> str | None:
    """Why --peer redis cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server not found on PATH"
    if hiredis is None:
        return "the hiredis module is not installed"
    return None


def _redis_fill(
    conn: RespConn, records: int, record_bytes: int, starts_at: list[int]
) -> tuple[dict[str, Any], dict[int, bytes]]:
    """`records` XADDs of `record_bytes` to the history, 1000 per pipeline; the fill's
    figures and the ids of the records at `starts_at` (indices)."""
    batch = 1000
    cmd = resp(b"XADD", HISTORY.encode(), b"*", b"d", b"h" * record_bytes)
    want = set(starts_at)
    ids: dict[int, bytes] = {}
    t0 = last = time.perf_counter()
    done = 0
    while done < records:
        n = min(batch, records - done)
        replies = conn.roundtrip(cmd * n, n)
        if any(isinstance(r, hiredis.ReplyError) for r in replies):
            raise RuntimeError(
                f"XADD history: {next(r for r in replies if not isinstance(r, bytes))}"
            )
        for j in want.intersection(range(done, done + n)):
            ids[j] = replies[j - done]
        done += n
        now = time.perf_counter()
        if now - last > 5:
            last = now
            log(f"  redis fill: {done:,} / {records:,} records")
    wall = time.perf_counter() - t0
    return {
        "records": records,
        "wall_s": round(wall, 2),
        "records_per_s": round(records / wall),
        "mb_per_s": round(records * record_bytes / wall / 1e6, 1),
    }, ids


def run_redis_peer(args: argparse.Namespace, work: Path, records: int) -> dict[str, Any]:
    """Phases A and B against redis-server: XADD at --rate, with and without the scanners."""
    fsync = "always" if args.durability == "fsync" else "everysec"
    version = ""
    with contextlib.suppress(Exception):
        version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    report: dict[str, Any] = {
        "version": version,
        "appendfsync": fsync,
        "history_records": records,
        "record_bytes": args.record_bytes,
        "history_in_memory": True,  # warm, while the topics history is cold
        "sse": "not measured",
    }
    rdir = work / "redis"
    log(f"redis peer: redis-server --appendfsync {fsync}, {records:,} history records ...")
    srv = RedisServer(rdir, fsync)
    report["pid"] = srv.pid
    scanner: Child | None = None
    live: RedisLive | None = None
    phases: list[dict[str, Any]] = []
    try:
        conn = RespConn(srv.host, srv.port)
        starts_at = [k * records // args.scanners for k in range(args.scanners)]
        try:
            report["fill"], ids = _redis_fill(conn, records, args.record_bytes, starts_at)
        finally:
            conn.close()
        log(f"  {report['fill']}")
        starts = ["-" if k == 0 else ids[k].decode() for k in starts_at]
        scanner = Child(
            [
                "--_role",
                "redis-scanner",
                "--_url",
                f"{srv.host}:{srv.port}",
                "--_starts=" + ",".join(starts),  # one "=" argument: the first is "-"
                "--limit",
                str(args.limit),
            ]
        )
        live = RedisLive(srv.host, srv.port, args.rate)
        live.run(args.warmup, counted=False)
        for rnd in range(1, args.rounds + 1):
            for name in ("A", "B"):
                ph: dict[str, Any] = {"phase": name, "round": rnd}
                if name == "B":
                    scanner.send("START")
                    scanner.expect("STARTED")
                log(f"redis round {rnd}: phase {name} ({args.seconds} s) ...")
                meter = CpuMeter([srv.pid], [scanner.pid]).start()
                ph.update(live.run(args.seconds))
                ph["cpu"] = meter.stop()
                if name == "B":
                    scanner.send("STOP")
                    ph["scan"] = json.loads(scanner.readline())
                    time.sleep(0.5)  # let the last scan replies drain
                phases.append(ph)
        scanner.finish("EXIT")
        report["aof_bytes"] = sum(p.stat().st_size for p in rdir.rglob("*.aof*") if p.is_file())
    finally:
        if live is not None:
            live.close()
        if scanner is not None:
            scanner.kill()
        t0 = time.perf_counter()
        report["exit_code"] = srv.stop(signal.SIGTERM, 60)
        report["server_stop_s"] = round(time.perf_counter() - t0, 2)

    out_phases: dict[str, Any] = {}
    for name in ("A", "B"):
        rounds = [p for p in phases if p["phase"] == name]
        entry: dict[str, Any] = {
            "writes": sum(len(p["acks"]) for p in rounds),
            "writes_due": round(len(rounds) * args.seconds * args.rate),
            "write_errors": sum(p["errors"] for p in rounds),
            "write_ack_ms": ms([ns for p in rounds for ns in p["acks"]]),
            "write_ack_from_schedule_ms": ms([ns for p in rounds for ns in p["from_schedule"]]),
            "cpu": [p["cpu"] for p in rounds],
        }
        if name == "B":
            entry["scan"] = pool_scans([p["scan"] for p in rounds])
        out_phases[name] = entry
    report["phases"] = out_phases
    a, b = out_phases["A"], out_phases["B"]
    report["ratios"] = {
        "write_ack_p99": ratio(b["write_ack_ms"].get("p99"), a["write_ack_ms"].get("p99")),
        "write_ack_from_schedule_p99": ratio(
            b["write_ack_from_schedule_ms"].get("p99"), a["write_ack_from_schedule_ms"].get("p99")
        ),
    }
    return report


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, int | float):
        return f"{v:,.{digits}f}"
    return str(v)


def table(report: dict[str, Any], args: argparse.Namespace) -> str:
    ph = report["phases"]
    cols = [n for n in ("A", "B", "W") if n in ph]
    label = {"A": "A: baseline", "B": "B: cold scan", "W": "W: warm scan"}
    hs = report["history_segments"]
    out = [
        f"### Cold history scan vs live traffic ({args.scanners} scanner(s), "
        f"{hs['data_bytes'] / GB:.2f} GB of history in {hs['segment_files']} segments, "
        f"{args.rounds} x {args.seconds:g} s per phase, live writes {args.rate:g}/s "
        f"({args.durability}))\n",
        "| metric | " + " | ".join(label[c] for c in cols) + " | B/A |",
        "|---|" + "---|" * (len(cols) + 1),
    ]

    def row(name: str, get: Any, digits: int = 2, rat: bool = False) -> None:
        vals = [get(ph[c]) for c in cols]
        r = fmt(ratio(vals[1], vals[0]), 2) if rat else ""
        out.append(f"| {name} | " + " | ".join(fmt(v, digits) for v in vals) + f" | {r} |")

    for key, title in (("write_ack_ms", "write ack"), ("sse_ms", "SSE delivery")):
        row(f"{title} p50 ms", lambda p, k=key: p[k].get("p50"), 3)
        row(f"**{title} p99 ms**", lambda p, k=key: p[k].get("p99"), 3, rat=True)
        row(f"{title} max ms", lambda p, k=key: p[k].get("max"), 3)
        if key == "write_ack_ms":
            row("write ack: server's handler p99 ms", lambda p: p["server_ms"].get("p99"), 3, True)
            row(
                "write ack: outside the handler p99 ms",
                lambda p: p["outside_ms"].get("p99"),
                3,
                True,
            )
    row(
        "write ack p99 from schedule ms",
        lambda p: p["write_ack_from_schedule_ms"].get("p99"),
        3,
        rat=True,
    )
    out.append(
        "| writes due / acked / SSE delivered | "
        + " | ".join(
            f"{ph[c]['writes_due']:,} / {ph[c]['writes']:,} / {ph[c]['sse_deliveries']:,}"
            for c in cols
        )
        + " | |"
    )
    row("scan records/s", lambda p: p.get("scan", {}).get("records_per_s"), 0)
    row("scan MB/s", lambda p: p.get("scan", {}).get("mb_per_s"), 1)
    row("scan wraps", lambda p: p.get("scan", {}).get("wraps"), 0)
    row(
        "history resident after phase (B: evicted once more)",
        lambda p: (p.get("resident_after") or [None])[-1],
        3,
    )
    for key, title in (
        ("server_cores", "server cores"),
        ("client_cores", "bench cores"),
        ("others_cores", "others' cores"),
    ):
        row(title, lambda p, k=key: max(c[k] for c in p["cpu"]), 2)
    row(
        "server major page faults",
        lambda p: sum(c.get("server_major_faults", 0) for c in p["cpu"]),
        0,
    )
    r = report["ratios"]
    ev = report["evict_initial"]
    out.append(
        f"\nEviction: {report['eviction_method']}; history resident after the first "
        f"eviction: {fmt(ev['resident_after'], 3)}. CPU rows are the largest of the rounds."
    )
    out.append(
        "A write that falls due while the previous one is out waits for it: fewer writes than "
        "due means the writer fell behind, and 'from schedule' adds that wait to the ack."
    )
    out.append(
        "'server's handler' is the write's performance.server_total_ms; 'outside' is the ack "
        "minus it, per write (network stack, both event loops, waiting for a CPU)."
    )
    out.append(
        f"Invariant p99(B)/p99(A) <= {THRESHOLD:.2f}: write ack {fmt(r['write_ack_p99'])}, "
        f"SSE {fmt(r['sse_p99'])}: **{report['verdict']}**"
    )
    resident = (ph["B"].get("resident_after") or [0.0])[-1] or 0.0
    if ph["B"]["scan"]["wraps"] and resident > 0.5:
        out.append(
            f"Note: a scanner wrapped and {resident:.0%} of the history was resident after "
            "phase B: pages the server still has mapped are never evicted, so part of the "
            "scan was warm. Use a larger --history-bytes or a smaller --open-files."
        )
    return "\n".join(out)


def peer_table(peer: dict[str, Any], args: argparse.Namespace) -> str:
    """The --peer redis table (or the line saying why it was skipped)."""
    if "skipped" in peer:
        return f"Redis peer skipped: {peer['skipped']}."
    ph = peer["phases"]
    a, b = ph["A"], ph["B"]
    version = next((w[2:] for w in peer["version"].split() if w.startswith("v=")), "?")
    out = [
        f"### Redis peer, same shape (redis-server {version}, appendfsync "
        f"{peer['appendfsync']}; {peer['history_records']:,} records of {peer['record_bytes']} B "
        f"in stream {HISTORY}, in memory: a warm scan, ours is cold; {args.scanners} scanner(s) "
        f"XRANGE COUNT {args.limit}; {args.rounds} x {args.seconds:g} s per phase, "
        f"XADD {args.rate:g}/s)\n",
        "| metric | A: baseline | B: scan | B/A |",
        "|---|---|---|---|",
    ]

    def row(name: str, va: Any, vb: Any, digits: int = 3, rat: bool = False) -> None:
        r = fmt(ratio(vb, va), 2) if rat else ""
        out.append(f"| {name} | {fmt(va, digits)} | {fmt(vb, digits)} | {r} |")

    for q in ("p50", "p99", "max"):
        name = f"**write ack {q} ms**" if q == "p99" else f"write ack {q} ms"
        row(name, a["write_ack_ms"].get(q), b["write_ack_ms"].get(q), rat=q == "p99")
    key = "write_ack_from_schedule_ms"
    row("write ack p99 from schedule ms", a[key].get("p99"), b[key].get("p99"), rat=True)
    out.append(
        f"| writes due / acked | {a['writes_due']:,} / {a['writes']:,} | "
        f"{b['writes_due']:,} / {b['writes']:,} | |"
    )
    row("scan records/s", None, b["scan"]["records_per_s"], 0)
    row("scan MB/s", None, b["scan"]["mb_per_s"], 1)
    row("scan wraps", None, b["scan"]["wraps"], 0)
    for k, title in (
        ("server_cores", "server cores"),
        ("client_cores", "bench cores"),
        ("others_cores", "others' cores"),
    ):
        row(title, max(c[k] for c in a["cpu"]), max(c[k] for c in b["cpu"]), 2)
    out.append("| SSE delivery | not measured for Redis | not measured for Redis | |")
    out.append(
        f"\nRedis fill: {peer['fill']['records']:,} records in {peer['fill']['wall_s']:g} s "
        "(pipelined XADD). The scanners' replies are parsed by hiredis in their process."
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 200 MB of history, 5 s phases, --open-files 4",
    )
    ap.add_argument("--seconds", type=float, help="length of each phase (default 30, quick 5)")
    ap.add_argument(
        "--history-bytes",
        type=float,
        help="record data to fill the history with (default 2e9, quick 2e8)",
    )
    ap.add_argument("--record-bytes", type=int, default=1024, help="history record data size")
    ap.add_argument("--scanners", type=int, default=2, help="concurrent scanners (1-16)")
    ap.add_argument(
        "--durability",
        choices=["ephemeral", "memory", "disk", "fsync"],
        default="fsync",
        help="durability class of the live topic (default fsync)",
    )
    ap.add_argument("--rate", type=float, default=200.0, help="live writes per second")
    ap.add_argument("--limit", type=int, default=1000, help="diff page size of the scanners")
    ap.add_argument("--rounds", type=int, default=1, help="A/B alternations, pooled")
    ap.add_argument("--warm", action="store_true", help="add phase W (scan on a warm cache)")
    ap.add_argument("--warmup", type=float, default=2.0, help="live warm-up seconds")
    ap.add_argument("--evict-every", type=float, default=1.0, help="re-eviction period (s)")
    ap.add_argument("--checkpoint-ms", type=int, default=1000, help="TOPICS_CHECKPOINT_INTERVAL_MS")
    ap.add_argument(
        "--open-files",
        type=int,
        help="TOPICS_MAX_OPEN_SEGMENT_FILES of the server (default 16, quick 4: segments the "
        "scan has left are unmapped and can be evicted again; 0 = the server default, 256)",
    )
    ap.add_argument("--no-drop-caches", action="store_true", help="never write drop_caches")
    ap.add_argument(
        "--peer",
        choices=["redis"],
        help="then run phases A and B against redis-server (skipped when it is missing)",
    )
    ap.add_argument(
        "--peer-records",
        type=int,
        help="records in the Redis history (default: as many as the topics history; "
        f"quick: at most {PEER_QUICK_RECORDS:,})",
    )
    ap.add_argument(
        "--data-dir", help="data dir to fill, or reuse when filled, and keep (default: temp)"
    )
    ap.add_argument(
        "--json", type=Path, default=HERE / "results" / "invariant.json", help="output JSON path"
    )
    ap.add_argument(
        "--_role", choices=["watcher", "scanner", "redis-scanner"], help=argparse.SUPPRESS
    )
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_head", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_evict_dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_starts", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._role:
        host, _, port = args._url.removeprefix("http://").rpartition(":")
        if args._role == "watcher":
            uvloop.run(_watcher_main(host, int(port), LIVE, args._out))
        elif args._role == "redis-scanner":
            starts = [x.encode() for x in args._starts.split(",")]
            uvloop.run(_redis_scanner_main(host, int(port), starts, args.limit))
        else:
            files = segment_files(Path(), args._evict_dir)
            uvloop.run(
                _scanner_main(
                    host,
                    int(port),
                    HISTORY,
                    args._head,
                    args.scanners,
                    args.limit,
                    files,
                    args.evict_every,
                )
            )
        return 0

    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 30.0
    if args.open_files is None:
        args.open_files = 4 if args.quick else 16
    if args.history_bytes is None:
        args.history_bytes = 2e8 if args.quick else 2e9
    args.history_bytes = int(args.history_bytes)
    if not 1 <= args.scanners <= 16:
        ap.error("--scanners must be 1-16")
    env = environment()
    print(
        f"# cold-read invariant ({'quick' if args.quick else 'full'}; "
        f"{args.history_bytes / GB:.2f} GB history, {args.scanners} scanner(s))",
        file=sys.stderr,
    )
    peer_missing = redis_missing() if args.peer == "redis" else None
    if peer_missing:
        log(f"--peer redis will be skipped: {peer_missing}")
    work = Path(tempfile.mkdtemp(prefix="bench-invariant-"))
    try:
        report = run(args, work)
        if args.peer == "redis":
            if peer_missing:
                report["peer_redis"] = {"skipped": peer_missing}
            else:
                records = args.peer_records or report["after_restart"]["history_head_seq"]
                if args.quick and not args.peer_records:
                    records = min(records, PEER_QUICK_RECORDS)
                report["peer_redis"] = run_redis_peer(args, work, records)
    except BaseException:
        log_path = work / "server.log"
        if log_path.exists():
            lines = [x for x in log_path.read_text().splitlines() if "topics.checkpoint" not in x]
            print(
                "server log (checkpoint lines left out):", *lines[-30:], sep="\n", file=sys.stderr
            )
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the temp data dir too; --data-dir stays
    params = {
        k: getattr(args, k)
        for k in (
            "quick",
            "seconds",
            "history_bytes",
            "record_bytes",
            "scanners",
            "durability",
            "rate",
            "limit",
            "rounds",
            "warm",
            "evict_every",
            "checkpoint_ms",
            "open_files",
            "peer",
        )
    }
    full = {"environment": env, "params": params, **report}
    print(table(report, args))
    if "peer_redis" in report:
        print()
        print(peer_table(report["peer_redis"], args))
    summary = {
        "verdict": report["verdict"],
        "threshold": THRESHOLD,
        "ratios": report["ratios"],
        **{
            f"{name}_{key}": {
                "p50": report["phases"][name][key].get("p50"),
                "p99": report["phases"][name][key].get("p99"),
                "max": report["phases"][name][key].get("max"),
            }
            for name in report["phases"]
            for key in ("write_ack_ms", "sse_ms", "server_ms", "outside_ms")
        },
        "scan_records_per_s": report["phases"]["B"]["scan"]["records_per_s"],
        "scan_mb_per_s": report["phases"]["B"]["scan"]["mb_per_s"],
        "eviction": report["eviction_method"],
        "git_rev": env["git_rev"][:12],
    }
    peer = report.get("peer_redis")
    if peer and "phases" in peer:
        summary["peer_redis"] = {
            "appendfsync": peer["appendfsync"],
            "history_records": peer["history_records"],
            "write_ack_p99_ratio": peer["ratios"]["write_ack_p99"],
            **{
                f"{name}_write_ack_ms": {
                    q: peer["phases"][name]["write_ack_ms"].get(q) for q in ("p50", "p99", "max")
                }
                for name in ("A", "B")
            },
            "scan_records_per_s": peer["phases"]["B"]["scan"]["records_per_s"],
        }
    elif peer:
        summary["peer_redis"] = peer
    print(json.dumps(summary))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(full, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
