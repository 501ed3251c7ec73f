"""Small raw-socket HTTP/1.1 helpers shared by the bench scripts.

The clients here are deliberately minimal so that they add as little as
possible to what is measured: requests are prebuilt ``bytes``, responses are
framed by ``Content-Length`` (with a ``Transfer-Encoding: chunked`` fallback,
since the server may stream JSON bodies chunked), and nothing else about the
response is interpreted unless the caller asks.

Also here: nearest-rank percentiles, CPU-time readers for ``/proc/<pid>/stat``
and ``/proc/stat``, an incremental SSE parser (de-chunking + ``data:``
lines) used offline by the watcher process, and :class:`ServeProcess`, the
server under test of every script.
"""

from __future__ import annotations

import asyncio
import atexit
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import orjson

__all__ = [
    "ServeProcess",
    "ChunkRecorder",
    "get_path",
    "open_watch_streams",
    "AsyncConn",
    "RespConn",
    "SSEParser",
    "SyncConn",
    "CpuMeter",
    "Spawned",
    "build_request",
    "free_port",
    "parse_response",
    "percentile",
    "resp",
    "proc_cpu_s",
    "proc_major_faults",
    "summarize",
    "system_busy_s",
    "wait_quiet",
]

_TICK = os.sysconf("SC_CLK_TCK")


# -- requests / responses -------------------------------------------------------------
def build_request(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Iterable[tuple[str, str]] = (),
    host: str = "127.0.0.1",
) -> bytes:
    """One complete HTTP/1.1 keep-alive request as bytes."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


def parse_response(buf: bytearray) -> tuple[int, bytes, int] | None:
    """Parse one complete response at the start of ``buf``.

    Returns ``(status, body, consumed_bytes)`` or ``None`` if more bytes are needed.
    Content-Length framing is the fast path; chunked is decoded (no trailers).
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    start = end + 4
    head = bytes(buf[:end]).lower()
    status = int(head[9:12])
    j = head.find(b"\r\ncontent-length:")
    if j >= 0:
        k = head.find(b"\r\n", j + 2)
        n = int(head[j + 17 : k if k >= 0 else len(head)])
        if len(buf) < start + n:
            return None
        return status, bytes(buf[start : start + n]), start + n
    if b"\r\ntransfer-encoding: chunked" in head:
        pos = start
        parts: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                if len(buf) < eol + 4:
                    return None
                return status, b"".join(parts), eol + 4
            data_start = eol + 2
            if len(buf) < data_start + size + 2:
                return None
            parts.append(bytes(buf[data_start : data_start + size]))
            pos = data_start + size + 2
    # no body framing (e.g. 204/304)
    return status, b"", start


class SyncConn:
    """A blocking keep-alive connection (TCP_NODELAY) for sequential request/response."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        return self.read_response()

    def read_response(self) -> tuple[int, bytes]:
        buf = self.buf
        recv = self.sock.recv
        while True:
            parsed = parse_response(buf) if buf else None
            if parsed is not None:
                status, body, used = parsed
                del buf[:used]
                return status, body
            chunk = recv(262144)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk

    def close(self) -> None:
        self.sock.close()


class AsyncConn(asyncio.Protocol):
    """An asyncio (uvloop) keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost: BaseException | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> AsyncConn:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, host, port)
        return proto

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self.waiter
        if w is not None and not w.done():
            parsed = parse_response(self.buf)
            if parsed is not None:
                status, body, used = parsed
                del self.buf[:used]
                self.waiter = None
                w.set_result((status, body))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc or ConnectionError("server closed the connection")
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(self.lost)

    async def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        if self.lost is not None:
            raise ConnectionError(str(self.lost))
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.waiter = fut
        self.transport.write(request)
        return await fut

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# -- SSE --------------------------------------------------------------------------------
class SSEParser:
    """Incremental parser for one SSE response: headers, de-chunking, frames.

    ``feed(data)`` returns the frames *completed* by ``data`` as ``(event, data_line)``
    pairs (``data_line`` is the bytes after ``data: ``; comment frames are skipped).
    """

    def __init__(self) -> None:
        self.raw = bytearray()
        self.headers_done = False
        self.status = 0
        self.chunked = False
        self.payload = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.raw += data
        if not self.headers_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return []
            head = bytes(self.raw[:end]).lower()
            self.status = int(head[9:12])
            self.chunked = b"\r\ntransfer-encoding: chunked" in head
            del self.raw[: end + 4]
            self.headers_done = True
        if self.chunked:
            raw = self.raw
            pos = 0
            while True:
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(bytes(raw[pos:eol]).split(b";", 1)[0], 16)
                if len(raw) < eol + 2 + size + 2:
                    break
                self.payload += raw[eol + 2 : eol + 2 + size]
                pos = eol + 2 + size + 2
            del raw[:pos]
        else:
            self.payload += self.raw
            self.raw.clear()
        frames: list[tuple[bytes, bytes]] = []
        payload = self.payload
        pos = 0
        while True:
            end = payload.find(b"\n\n", pos)
            if end < 0:
                break
            event = b"message"
            data_line = b""
            for line in bytes(payload[pos:end]).split(b"\n"):
                if line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line.startswith(b"data:"):
                    data_line = line[5:].lstrip()
            if data_line or event != b"message":
                frames.append((event, data_line))
            pos = end + 2
        del payload[:pos]
        return frames


# -- Redis (RESP) clients for the peer comparisons -----------------------------------------
def resp(*args: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)])


class RespConn:
    """A blocking Redis connection (TCP_NODELAY): `roundtrip(req, n)` sends `req` and returns
    the next `n` replies, parsed by hiredis (an error reply is a `hiredis.ReplyError`).
    Needs the `hiredis` module (imported on first use)."""

    def __init__(self, host: str, port: int, timeout: float | None = None) -> None:
        import hiredis

        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def roundtrip(self, req: bytes, n: int = 1) -> list[Any]:
        self.sock.sendall(req)
        out: list[Any] = []
        reader, recv = self.reader, self.sock.recv
        while True:
            while len(out) < n and (x := reader.gets()) is not False:
                out.append(x)
            if len(out) == n:
                return out
            data = recv(1 << 20)
            if not data:
                raise ConnectionError("redis closed the connection")
            reader.feed(data)

    def close(self) -> None:
        self.sock.close()


# -- statistics ---------------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in [0, 1])."""
    if not sorted_values:
        return math.nan
    idx = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[idx])


def summarize(values_ns: Iterable[int], scale: float = 1e3) -> dict[str, float]:
    """p50/p99/p999/max/mean of nanosecond samples, converted by ``scale`` (default µs)."""
    vals = sorted(values_ns)
    if not vals:
        return {"n": 0}
    nd = 1 if scale <= 1e3 else 3  # 0.1 µs, or 1 µs in ms: a 5% step at 0.5 ms must show
    return {
        "n": len(vals),
        "p50": round(percentile(vals, 0.50) / scale, nd),
        "p99": round(percentile(vals, 0.99) / scale, nd),
        "p999": round(percentile(vals, 0.999) / scale, nd),
        "max": round(vals[-1] / scale, nd),
        "mean": round(sum(vals) / len(vals) / scale, nd),
    }


# -- CPU accounting -----------------------------------------------------------------------
def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 of stat(5) is
    index 0); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of process ``pid`` (all its threads), in seconds; None if gone."""
    fields = _proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


def proc_major_faults(pid: int) -> int | None:
    """Major page faults of process ``pid`` so far (all its threads: a fault that had to
    wait for the disk); None if gone."""
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[9])  # field 12 of stat(5)


def system_busy_s() -> float:
    """Busy CPU-seconds of the whole machine since boot (all CPUs, /proc/stat)."""
    with open("/proc/stat", "rb") as f:
        line = f.readline()
    vals = [int(x) for x in line.split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    guest = sum(vals[8:10]) if len(vals) > 9 else 0  # already counted in user/nice
    return (sum(vals) - idle - guest) / _TICK


class ChunkRecorder(asyncio.Protocol):
    """An SSE client connection that keeps every received chunk with its arrival time.

    Chunks are `(time.monotonic_ns(), bytes)`; parsing happens afterwards, off the
    measured path. `ready` resolves once the stream's `retry:` preamble arrived.
    """

    def __init__(self) -> None:
        self.transport: Any = None
        self.chunks: list[tuple[int, bytes]] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.seen = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append((time.monotonic_ns(), data))
        if not self.ready.done():
            self.seen += data
            if b"retry:" in self.seen:
                self.ready.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionError("stream closed before it started"))


async def open_watch_streams(
    host: str, port: int, topic: str, n: int
) -> tuple[AsyncConn, list[ChunkRecorder]]:
    """`n` SSE streams on `topic` from its head: one watch session each (`POST /v0/watch`
    with `tail`, on the returned control connection), each stream a :class:`ChunkRecorder`.

    Raises RuntimeError when a session is refused. The caller waits for `ready`.
    """
    loop = asyncio.get_running_loop()
    hostport = f"{host}:{port}"
    ctl = await AsyncConn.open(host, port)
    create = build_request(
        "POST", "/v0/watch", orjson.dumps({"topics": {topic: {"tail": True}}}), host=hostport
    )
    streams: list[ChunkRecorder] = []
    for _ in range(n):
        st, b = await ctl.roundtrip(create)
        if st != 200:
            raise RuntimeError(f"POST /v0/watch: {st} {b[:200]!r}")
        url = orjson.loads(b)["stream_url"]
        transport, rec = await loop.create_connection(ChunkRecorder, host, port)
        transport.write(
            build_request("GET", url, headers=[("Accept", "text/event-stream")], host=hostport)
        )
        streams.append(rec)
    return ctl, streams


def get_path(d: Any, path: str) -> Any:
    """`d["a"]["b"]` for `path` "a.b", or None where a key is missing."""
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


# -- the server under test -------------------------------------------------------------
#: Servers and helper processes started and not stopped yet (:class:`ServeProcess`,
#: :class:`Spawned`): killed at exit, whatever ended the script.
_RUNNING: set[Any] = set()


@atexit.register
def _stop_leftovers() -> None:
    for proc in list(_RUNNING):
        proc.stop(signal.SIGKILL, 10)


class Spawned:
    """Any process a script starts (a peer server, a subscriber process); stopped by its PID.

    Output goes to `log` (appended) unless `stdout` is given. Killed at exit when the
    script has not stopped it; also a context manager. :class:`ServeProcess` is one.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log: Path | None = None,
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = open(log, "ab") if log is not None else None  # closed in stop()
        out: Any = stdout if stdout is not None else (self.log or subprocess.DEVNULL)
        self.proc = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=out,
            stderr=self.log if self.log is not None else None,
            cwd=cwd,
            env=env,
        )
        _RUNNING.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int | None:
        """Send `sig`, wait (SIGKILL after `timeout_s`); returns the exit code."""
        _RUNNING.discard(self)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.log is not None and not self.log.closed:
            self.log.close()
        return self.proc.returncode


class ServeProcess(Spawned):
    """`python -m topics serve` on 127.0.0.1:0 over `data_dir`; stopped by its PID.

    Every `TOPICS_*` variable of this process is dropped; the server gets host
    127.0.0.1, an ephemeral HTTP port (read back from `TOPICS_PORT_FILE`), no
    Kafka listener unless `env` sets one, and `env` on top. Its output goes to
    `log` (appended). The constructor returns once `/readyz` answers 200
    (`ready_s`: seconds from the start) and raises RuntimeError when the server
    exits first or is not ready within `ready_timeout_s`. A server the script
    has not stopped when it exits (an exception, a failed check) is killed then;
    also usable as a context manager that stops it on leaving.
    """

    def __init__(
        self,
        data_dir: Path,
        log: Path,
        env: dict[str, str] | None = None,
        *,
        ready_timeout_s: float = 300.0,
        cwd: Path | None = None,
    ) -> None:
        self.port_file = log.parent / f"port-{time.monotonic_ns()}"
        full = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
        full.update(
            TOPICS_HOST="127.0.0.1",
            TOPICS_PORT="0",
            TOPICS_KAFKA_PORT="0",
            TOPICS_PORT_FILE=str(self.port_file),
            TOPICS_DATA_DIR=str(data_dir),
        )
        full.update(env or {})
        self.log_path = log
        self.host = "127.0.0.1"
        self.port = 0
        t0 = time.perf_counter()
        super().__init__([sys.executable, "-m", "topics", "serve"], log, cwd=cwd, env=full)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                self.stop()
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"server exited during startup:\n{tail}")
            if not self.port:
                text = self.port_file.read_text().strip() if self.port_file.exists() else ""
                if text:
                    host, _, port = text.rpartition(":")
                    self.host, self.port = host, int(port)
            if self.port and self._ready():
                self.ready_s = time.perf_counter() - t0
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not become ready in {ready_timeout_s:.0f} s")
            time.sleep(0.005)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int | None:
        """Send `sig` (SIGTERM: a graceful stop), wait (SIGKILL after `timeout_s`);
        returns the exit code."""
        code = super().stop(sig, timeout_s)
        self.port_file.unlink(missing_ok=True)
        return code


# -- helpers for the scripts that start other processes (bench_peers) ------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back, close).

    For servers that cannot report the port they bound (Redis, NATS); another process
    may take it in between, which the caller sees as a failed start.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class CpuMeter:
    """CPU seconds over a span: the servers', the client's (this process and `client_pids`)
    and everyone else's (the whole machine's busy time minus both); and the servers'
    major page faults."""

    def __init__(self, server_pids: Sequence[int], client_pids: Sequence[int] = ()) -> None:
        self.server_pids, self.client_pids = tuple(server_pids), tuple(client_pids)

    def _server(self) -> float:
        return sum(proc_cpu_s(p) or 0.0 for p in self.server_pids)

    def _client(self) -> float:
        return time.process_time() + sum(proc_cpu_s(p) or 0.0 for p in self.client_pids)

    def _faults(self) -> int:
        return sum(proc_major_faults(p) or 0 for p in self.server_pids)

    def start(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.s0, self.c0, self.b0 = self._server(), self._client(), system_busy_s()
        self.f0 = self._faults()
        return self

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        server = self._server() - self.s0
        client = self._client() - self.c0
        others = max(0.0, system_busy_s() - self.b0 - server - client)
        return {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(server, 3),
            "server_cores": round(server / wall, 3),
            "client_cpu_s": round(client, 3),
            "client_cores": round(client / wall, 3),
            "others_cores": round(others / wall, 3),
            "server_major_faults": self._faults() - self.f0,
        }


def wait_quiet(
    server_pids: Sequence[int],
    client_pids: Sequence[int] = (),
    *,
    threshold: float = 0.1,
    window_s: float = 1.0,
    give_up_s: float = 20.0,
) -> dict[str, Any]:
    """Wait until processes not ours use < `threshold` cores over one `window_s`.

    Gives up after `give_up_s`; the result says whether the machine was quiet and how
    many cores the others used in the last window.
    """
    t0 = time.monotonic()
    while True:
        meter = CpuMeter(server_pids, client_pids).start()
        time.sleep(window_s)
        others = meter.stop()["others_cores"]
        waited = time.monotonic() - t0
        if others < threshold or waited >= give_up_s:
            return {
                "quiet": others < threshold,
                "others_cores": others,
                "waited_s": round(waited, 1),
            }
