"""Side by side: topics, Redis Streams and NATS JetStream on the same machine, same client shape.

Each round starts every system fresh (own temporary data dir, 127.0.0.1, an ephemeral
port) for every workload, runs the workload against topics, then Redis, then NATS, and
stops the server by its PID. Rounds repeat that (``--rounds``, default 3), so the three
systems are measured interleaved, never one after the other in blocks.

Systems and durability classes (a row of the table compares one class):

- **durable**: topics with topic durability ``fsync`` (acknowledged after the group
  fdatasync) against ``redis-server --appendonly yes --appendfsync always`` (fsync before
  the reply). NATS is not in this class: the file store of nats-server 2.9 (Debian 12)
  acknowledges without any fsync and has no option to make it sync.
- **fast**: topics ``disk`` (acknowledged once queued for the WAL) against Redis
  ``--appendfsync everysec`` and NATS JetStream (file storage).

Redis always runs with ``--save '' --auto-aof-rewrite-percentage 0`` (no RDB, no
background rewrite fork); NATS from a config file (``listen``, ``jetstream {store_dir}``).
topics is ``python -m topics serve`` through ``_client.ServeProcess``. A peer whose
binary is absent (``shutil.which``; Redis also needs the ``hiredis`` module) is skipped
with the reason printed; ``--peers none`` runs topics alone (the smoke test does).

Every record is 100 bytes of JSON. Every client is a raw socket with prebuilt request
bytes, one request in flight per connection: HTTP/1.1 for topics (``_client``), RESP for
Redis (replies parsed by ``hiredis.Reader``) and the NATS text protocol for NATS
(``PUB subject reply n``; JetStream acks arrive as ``MSG`` on the connection's reply
inbox; the parser here is hand-written, nats-py is not used). Workloads:

1. ``ingest``: 16 connections, each sending 100 records per round trip back to back for
   8 s after 1 s of warm-up: topics one ``POST /v0/topics/:topic`` of 100 records; Redis a
   pipeline of 100 ``XADD``; NATS 100 ``PUB`` then the 100 acks. Records/s, request
   p50/p99 and server CPU µs per record. The count stored afterwards is checked.
2. ``ack``: one connection, one record per request, 5000 sequential writes after 500 of
   warm-up. Ack latency p50/p99 (send to reply).
3. ``live``: one writer (this process, one connection) writes one record every 5 ms
   carrying its ``time.monotonic_ns()``; 1 and 100 subscribers in a separate process
   stamp every received chunk with ``monotonic_ns()`` (CLOCK_MONOTONIC is system-wide),
   and the chunks are parsed after the run. topics is measured twice: SSE (one
   ``POST /v0/watch`` session per subscriber, ``tail``) and WebSocket (``subscribe`` with
   ``tail``); Redis ``XREAD BLOCK 0 COUNT 1000`` from the last id seen (the reply must be
   parsed as it arrives, to send the next XREAD); NATS one push consumer per subscriber
   (deliver policy ``new``, ack none, its own deliver subject). Delivery p50/p99.
4. ``catchup``: 1e6 records are written (4 connections x 1000 per request), then one
   connection reads all of them in pages of 1000 and parses every page: topics ``diff``
   with ``limit`` 1000 and ``orjson.loads``; Redis ``XRANGE key (last + COUNT 1000`` parsed
   by hiredis; NATS a durable pull consumer (ack none) asked for batches of 1000, every
   ``MSG`` framed by the parser. Records/s and server CPU µs per record.
5. ``restart``: on the same 1e6 records, the server is stopped (SIGTERM: a graceful stop
   for all three) and started again; the time from the start to the first successful
   read of the last record (topics ``diff``, Redis ``XREVRANGE + - COUNT 1``, NATS
   ``$JS.API.STREAM.MSG.GET``), polled every 5 ms.

``catchup`` and ``restart`` run in the fast class only (how the data was synced does not
change a read); they share one fill when both are selected.

Before every timed part a quiet gate waits until the processes that are not ours use
less than 0.1 core for 1 s (giving up after 20 s); the result keeps whether it was quiet
and the others' cores, both in the gate and over the run. Server CPU is utime+stime of
the server process (all its threads) from ``/proc/<pid>/stat`` before and after.

Where the shapes differ: the topics catch-up client decodes every record's ``data``
(the page is one JSON document) while hiredis and the NATS framer leave each 100 B
payload as bytes; the Redis live subscriber parses replies as they arrive, the others
after the run; topics answers an ingest request with one HTTP response (with the 100
seqs), Redis with 100 replies, NATS with 100 ack messages.

Usage::

    python bench/bench_peers.py                        # 3 rounds, full sizes (~8 min)
    python bench/bench_peers.py --quick                # small sizes, 1 round (< 2 min)
    python bench/bench_peers.py --only ingest ack --rounds 5
    python bench/bench_peers.py --quick --peers none   # topics alone

Prints a markdown table: per workload and metric, the median of each system with every
run in parentheses, and the ratio topics / peer of the medians. A ratio above 1 means
topics' number is higher: better for records/s, worse for latency, CPU per record and
seconds. Writes every run to ``--json`` (default ``bench/results/peers.json``). Clients
and servers share the machine's vCPUs (2 on the reference machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from topics.client.errors import parse_retry_after

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
    wait_quiet,
)
from bench_server import environment  # noqa: E402

try:
    import hiredis
except ImportError:  # the Redis side is skipped, with this as the reason
    hiredis = None

HOST = "127.0.0.1"
REC = b'{"p":"' + b"x" * 92 + b'"}'  # every record: 100 bytes of JSON
DURABLE, FAST = "durable", "fast"
PEERS = ("redis", "nats")
CLASS_SYSTEMS = {DURABLE: ("topics", "redis"), FAST: ("topics", "redis", "nats")}
WORKLOADS = ("ingest", "ack", "live", "catchup", "restart")
WORKLOAD_CLASSES = {
    "ingest": (DURABLE, FAST),
    "ack": (DURABLE, FAST),
    "live": (DURABLE, FAST),
    "history": (FAST,),  # catchup and restart
}
TOPICS_DURABILITY = {DURABLE: "fsync", FAST: "disk"}
REDIS_FSYNC = {DURABLE: "always", FAST: "everysec"}


@dataclass(frozen=True)
class Sizes:
    conns: int = 16
    batch: int = 100
    ingest_warm_s: float = 1.0
    ingest_s: float = 8.0
    ack_warmup: int = 500
    ack_writes: int = 5000
    live_levels: tuple[int, ...] = (1, 100)
    live_records: int = 400
    live_interval_s: float = 0.005
    history: int = 1_000_000
    page: int = 1000
    gate_window_s: float = 1.0
    gate_give_up_s: float = 20.0


FULL = Sizes()
QUICK = Sizes(
    ingest_warm_s=0.3,
    ingest_s=1.0,
    ack_warmup=100,
    ack_writes=300,
    live_levels=(1, 10),
    live_records=40,
    history=20_000,
    gate_window_s=0.5,
    gate_give_up_s=2.0,
)


def live_record(i: int) -> bytes:
    """A 100-byte JSON record carrying its send time (monotonic ns) and index."""
    head = b'{"t":%d,"i":%d,"p":"' % (time.monotonic_ns(), i)
    return head + b"y" * (100 - len(head) - 2) + b'"}'


def nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# -- RESP (Redis) -------------------------------------------------------------------------------
class _Pipelined(asyncio.Protocol):
    """An asyncio connection with one request (or pipeline) in flight: `roundtrip(req, n)`
    writes `req` and waits until `n` replies have arrived (subclasses collect them in
    `got` and call :meth:`_settle`)."""

    def __init__(self) -> None:
        self.got: list[Any] = []
        self.need = 0
        self.waiter: asyncio.Future[list[Any]] | None = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        nodelay(transport.get_extra_info("socket"))

    def _settle(self) -> None:
        w = self.waiter
        if w is not None and len(self.got) >= self.need:
            got, self.waiter, self.got = self.got, None, []
            w.set_result(got)

    async def roundtrip(self, req: bytes, n: int) -> list[Any]:
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.waiter, self.need = fut, n
        self.transport.write(req)
        return await fut

    def close(self) -> None:
        self.transport.close()


class RespAsync(_Pipelined):
    """An asyncio Redis connection; one pipeline in flight, `roundtrip(req, n)`."""

    def __init__(self) -> None:
        super().__init__()
        self.reader = hiredis.Reader()

    @classmethod
    async def open(cls, port: int) -> RespAsync:
        _, proto = await asyncio.get_running_loop().create_connection(cls, HOST, port)
        return proto

    def data_received(self, data: bytes) -> None:
        reader, got = self.reader, self.got
        reader.feed(data)
        while (x := reader.gets()) is not False:
            got.append(x)
        self._settle()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("redis closed the connection"))


def redis_errors(replies: list[Any]) -> str | None:
    bad = [r for r in replies if isinstance(r, hiredis.ReplyError)]
    return f"{len(bad)} errors, first: {bad[0]}" if bad else None


# -- the NATS text protocol -----------------------------------------------------------------------
NATS_CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
    b'"protocol":1,"name":"bench_peers"}\r\n'
)
Msg = tuple[bytes, list[bytes], bytes]  # (op, arguments, payload)


def nats_pub(subject: bytes, reply: bytes, payload: bytes) -> bytes:
    return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)


class NatsParser:
    """Incremental parser of what a NATS server sends: `feed(data)` returns the messages
    completed by `data` as (op, arguments, payload); op is b"MSG", b"HMSG" (payload =
    headers + body), b"PING", b"PONG", b"INFO", b"+OK" or b"-ERR"."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Msg]:
        buf = self.buf
        buf += data
        out: list[Msg] = []
        pos, n = 0, len(buf)
        find, rfind, startswith = buf.find, buf.rfind, buf.startswith
        while True:
            eol = find(b"\r\n", pos)
            if eol < 0:
                break
            msg = startswith(b"MSG ", pos)
            if msg or startswith(b"HMSG ", pos):
                # the size is the last field; the arguments are only split when asked for
                end = eol + 2 + int(buf[rfind(b" ", pos, eol) + 1 : eol])
                if n < end + 2:
                    break
                out.append((b"MSG" if msg else b"HMSG", [], bytes(buf[eol + 2 : end])))
                pos = end + 2
            else:
                args = bytes(buf[pos:eol]).split()
                out.append((args[0] if args else b"", args, b""))
                pos = eol + 2
        del buf[:pos]
        return out


def nats_error(msg: Msg) -> str | None:
    """Why a reply is not a successful JetStream ack or API answer (None when it is)."""
    op, _, payload = msg
    if op == b"HMSG":
        return payload.split(b"\r\n", 1)[0].decode(errors="replace")  # "NATS/1.0 503"
    if payload.startswith(b'{"error"') or b'"error":{' in payload:
        return payload[:200].decode(errors="replace")
    return None


class NatsSync:
    """A blocking NATS connection subscribed to its own reply inbox."""

    def __init__(self, port: int, inbox: bytes = b"_INBOX.sync", timeout: float | None = None):
        self.sock = nodelay(socket.create_connection((HOST, port), timeout=timeout))
        self.parser = NatsParser()
        self.inbox = inbox
        self.sock.sendall(NATS_CONNECT + b"SUB %s 1\r\nPING\r\n" % inbox)
        while not any(m[0] == b"PONG" for m in self._recv()):
            pass

    def _recv(self) -> list[Msg]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("nats closed the connection")
        msgs = self.parser.feed(data)
        if any(m[0] == b"PING" for m in msgs):
            self.sock.sendall(b"PONG\r\n")
        if any(m[0] == b"-ERR" for m in msgs):
            raise ConnectionError(f"nats: {[m for m in msgs if m[0] == b'-ERR']}")
        return msgs

    def roundtrip(self, req: bytes, n: int = 1) -> list[Msg]:
        """Send `req`, return the next `n` messages (MSG/HMSG) that arrive."""
        self.sock.sendall(req)
        out: list[Msg] = []
        while len(out) < n:
            out += [m for m in self._recv() if m[0] in (b"MSG", b"HMSG")]
        return out

    def api(self, subject: bytes, body: Any) -> Any:
        """A JetStream API request; the decoded answer (RuntimeError on an error)."""
        (msg,) = self.roundtrip(nats_pub(subject, self.inbox, orjson.dumps(body)))
        err = nats_error(msg)
        if err:
            raise RuntimeError(f"{subject.decode()}: {err}")
        return orjson.loads(msg[2])

    def close(self) -> None:
        self.sock.close()


class NatsAsync(_Pipelined):
    """An asyncio NATS connection with its own reply inbox; `roundtrip(req, n)` waits for
    n messages on it (one request or batch in flight)."""

    def __init__(self, inbox: bytes) -> None:
        super().__init__()
        self.inbox = inbox
        self.parser = NatsParser()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, port: int, inbox: bytes) -> NatsAsync:
        _, proto = await asyncio.get_running_loop().create_connection(
            lambda: cls(inbox), HOST, port
        )
        await proto.ready
        return proto

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        transport.write(NATS_CONNECT + b"SUB %s 1\r\nPING\r\n" % self.inbox)

    def data_received(self, data: bytes) -> None:
        got = self.got
        for m in self.parser.feed(data):
            op = m[0]
            if op == b"MSG" or op == b"HMSG":
                got.append(m)
            elif op == b"PING":
                self.transport.write(b"PONG\r\n")
            elif op == b"PONG" and not self.ready.done():
                self.ready.set_result(None)
            elif op == b"-ERR":
                self.connection_lost(ConnectionError(repr(m)))
        self._settle()

    def connection_lost(self, exc: BaseException | None) -> None:
        err = exc or ConnectionError("nats closed the connection")
        for fut in (self.waiter, self.ready):
            if fut is not None and not fut.done():
                fut.set_exception(err)


def nats_acks_failed(msgs: list[Msg]) -> str | None:
    for m in msgs:
        if err := nats_error(m):
            return err
    return None


# -- the servers ----------------------------------------------------------------------------------
class Server:
    """One system's server process over its own directory, restartable on the same data."""

    name = ""
    port = 0

    def __init__(self, work: Path) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def start(self, wait: bool = True) -> None:
        raise NotImplementedError

    def stop(self) -> float:
        """A graceful stop (SIGTERM); the seconds until the process had exited."""
        raise NotImplementedError


class TopicsServer(Server):
    name = "topics"

    def start(self, wait: bool = True) -> None:  # ServeProcess always waits for /readyz
        self.proc = ServeProcess(
            self.work / "data", self.work / "server.log", ready_timeout_s=600, cwd=ROOT
        )
        self.port = self.proc.port

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> float:
        t0 = time.perf_counter()
        self.proc.stop(signal.SIGTERM, 600)
        return time.perf_counter() - t0


class PeerServer(Server):
    argv: list[str]

    def start(self, wait: bool = True) -> None:
        if not self.port:
            self.port = free_port()
        self.proc = Spawned(self.command(), self.work / f"{self.name}.log", cwd=self.work)
        if wait:
            deadline = time.monotonic() + 30
            while not self.answers():
                if self.proc.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.work / f"{self.name}.log").read_text(errors="replace")
                    self.proc.stop(signal.SIGKILL, 10)
                    raise RuntimeError(f"{self.name} did not start:\n{log[-2000:]}")
                time.sleep(0.005)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> float:
        t0 = time.perf_counter()
        self.proc.stop(signal.SIGTERM, 600)
        return time.perf_counter() - t0

    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self) -> bool:
        raise NotImplementedError


class RedisServer(PeerServer):
    name = "redis"

    def __init__(self, work: Path, fsync: str) -> None:
        super().__init__(work)
        self.fsync = fsync

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind", HOST,
            "--port", str(self.port),
            "--dir", str(self.work),
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",
            "--auto-aof-rewrite-percentage", "0",
            "--daemonize", "no",
        ]  # fmt: skip

    def answers(self) -> bool:
        with contextlib.suppress(OSError):
            c = RespConn(HOST, self.port, timeout=2)
            try:
                return bool(c.roundtrip(resp(b"PING"))[0] == b"PONG")
            finally:
                c.close()
        return False


class NatsServer(PeerServer):
    name = "nats"

    def command(self) -> list[str]:
        conf = self.work / "nats.conf"
        store = json.dumps(str(self.work / "store"))
        conf.write_text(f"listen: {HOST}:{self.port}\njetstream {{ store_dir: {store} }}\n")
        return ["nats-server", "-c", str(conf)]

    def answers(self) -> bool:
        with contextlib.suppress(OSError, RuntimeError):
            c = NatsSync(self.port, timeout=2)
            try:
                c.api(b"$JS.API.INFO", {})
                return True
            finally:
                c.close()
        return False


def make_server(system: str, klass: str, work: Path) -> Server:
    if system == "topics":
        return TopicsServer(work)
    if system == "redis":
        return RedisServer(work, REDIS_FSYNC[klass])
    return NatsServer(work)


# -- one client type per system, the same operations for each -------------------------------------
Req = tuple[bytes, int]  # request bytes, replies expected


class Side:
    """What a workload asks of a system: requests, connections, reads and checks."""

    name = ""

    def __init__(self, srv: Server, klass: str) -> None:
        self.srv, self.klass = srv, klass
        self.throttled = 0  # 429 answers waited out and resent (a client honours Retry-After)

    def create(self, name: str) -> None: ...
    def batch(self, name: str, records: Sequence[bytes], conn_no: int = 0) -> Req: ...
    async def aopen(self, conn_no: int) -> Any: ...
    async def aop(self, conn: Any, req: Req) -> str | None: ...
    def sopen(self) -> Any: ...
    def sop(self, conn: Any, req: Req) -> str | None: ...
    def stored(self, name: str) -> int: ...
    def read_all(self, name: str, n: int, page: int) -> int: ...
    def read_last(self, name: str, n: int) -> bool: ...


class TopicsSide(Side):
    name = "topics"

    def _req(self, method: str, path: str, body: bytes | None) -> bytes:
        return build_request(method, path, body, host=f"{HOST}:{self.srv.port}")

    def create(self, name: str) -> None:
        cfg = orjson.dumps({"durability": TOPICS_DURABILITY[self.klass]})
        c = self.sopen()
        st, b = c.roundtrip(self._req("PUT", f"/v0/topics/{name}", cfg))
        c.close()
        if st not in (200, 201):
            raise RuntimeError(f"PUT {name}: {st} {b[:200]!r}")

    def batch(self, name: str, records: Sequence[bytes], conn_no: int = 0) -> Req:
        body = b'{"records":[' + b",".join(b'{"data":' + r + b"}" for r in records) + b"]}"
        return self._req("POST", f"/v0/topics/{name}", body), 1

    async def aopen(self, conn_no: int) -> AsyncConn:
        return await AsyncConn.open(HOST, self.srv.port)

    def _wait_s(self, st: int, b: bytes) -> float | None:
        """How long to wait before resending, when the answer is a throttle; else None."""
        if st != 429 or self.throttled >= 1000:
            return None
        self.throttled += 1
        detail = None
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = orjson.loads(b)["error"].get("detail")
        wait = parse_retry_after(None, detail if isinstance(detail, dict) else None)
        return 0.05 if wait is None else wait

    async def aop(self, conn: AsyncConn, req: Req) -> str | None:
        while True:
            st, b = await conn.roundtrip(req[0])
            if (wait := self._wait_s(st, b)) is None:
                return None if st == 200 else f"{st} {b[:200]!r}"
            await asyncio.sleep(wait)

    def sopen(self) -> SyncConn:
        return SyncConn(HOST, self.srv.port)

    def sop(self, conn: SyncConn, req: Req) -> str | None:
        while True:
            st, b = conn.roundtrip(req[0])
            if (wait := self._wait_s(st, b)) is None:
                return None if st == 200 else f"{st} {b[:200]!r}"
            time.sleep(wait)

    def stored(self, name: str) -> int:
        c = self.sopen()
        st, b = c.roundtrip(self._req("GET", f"/v0/topics/{name}?touch=false", None))
        c.close()
        return int(orjson.loads(b)["head_seq"]) if st == 200 else -1

    def read_all(self, name: str, n: int, page: int) -> int:
        c = self.sopen()
        prefix = (
            f"POST /v0/topics/{name}/diff HTTP/1.1\r\nHost: {HOST}:{self.srv.port}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        got = cursor = 0
        loads = orjson.loads
        while got < n:
            body = b'{"from_seq":%d,"limit":%d}' % (cursor, page)
            st, b = c.roundtrip(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            if st != 200:
                raise RuntimeError(f"diff: {st} {b[:200]!r}")
            d = loads(b)
            got += len(d["records"])
            cursor = d["next_from_seq"]
            if d["caught_up"]:
                break
        c.close()
        return got

    def read_last(self, name: str, n: int) -> bool:
        try:
            c = self.sopen()
        except OSError:
            return False
        try:
            body = orjson.dumps({"from_seq": n - 1, "limit": 1})
            st, b = c.roundtrip(self._req("POST", f"/v0/topics/{name}/diff", body))
            return st == 200 and [r["$seq"] for r in orjson.loads(b)["records"]] == [n]
        finally:
            c.close()


class RedisSide(Side):
    name = "redis"

    def create(self, name: str) -> None:  # a stream exists from its first XADD
        c = self.sopen()
        c.roundtrip(resp(b"DEL", name.encode()))
        c.close()

    def batch(self, name: str, records: Sequence[bytes], conn_no: int = 0) -> Req:
        key = name.encode()
        return b"".join(resp(b"XADD", key, b"*", b"d", r) for r in records), len(records)

    async def aopen(self, conn_no: int) -> RespAsync:
        return await RespAsync.open(self.srv.port)

    async def aop(self, conn: RespAsync, req: Req) -> str | None:
        return redis_errors(await conn.roundtrip(*req))

    def sopen(self) -> RespConn:
        return RespConn(HOST, self.srv.port)

    def sop(self, conn: RespConn, req: Req) -> str | None:
        return redis_errors(conn.roundtrip(*req))

    def stored(self, name: str) -> int:
        c = self.sopen()
        (n,) = c.roundtrip(resp(b"XLEN", name.encode()))
        c.close()
        return int(n)

    def read_all(self, name: str, n: int, page: int) -> int:
        c = self.sopen()
        key, count = name.encode(), str(page).encode()
        start = b"-"
        got = 0
        while got < n:
            (entries,) = c.roundtrip(resp(b"XRANGE", key, start, b"+", b"COUNT", count))
            if isinstance(entries, hiredis.ReplyError):
                raise RuntimeError(f"XRANGE: {entries}")
            if not entries:
                break
            got += len(entries)
            start = b"(" + entries[-1][0]
        c.close()
        return got

    def read_last(self, name: str, n: int) -> bool:
        try:
            c = RespConn(HOST, self.srv.port, timeout=5)
        except OSError:
            return False
        try:
            (r,) = c.roundtrip(resp(b"XREVRANGE", name.encode(), b"+", b"-", b"COUNT", b"1"))
            return isinstance(r, list) and len(r) == 1  # -LOADING while the AOF is read
        except OSError:
            return False
        finally:
            c.close()


STREAM = b"BENCH"


class NatsSide(Side):
    """Every name is a subject `bench.<name>` of the one file-backed stream BENCH."""

    name = "nats"

    def create(self, name: str) -> None:
        c = self.sopen()
        with contextlib.suppress(RuntimeError):  # one stream for all names
            c.api(
                b"$JS.API.STREAM.CREATE." + STREAM,
                {
                    "name": STREAM.decode(),
                    "subjects": ["bench.>"],
                    "storage": "file",
                    "retention": "limits",
                    "discard": "old",
                    "num_replicas": 1,
                },
            )
        c.close()

    def batch(self, name: str, records: Sequence[bytes], conn_no: int = 0) -> Req:
        subj, inbox = f"bench.{name}".encode(), b"_INBOX.%d" % conn_no
        return b"".join(nats_pub(subj, inbox, r) for r in records), len(records)

    async def aopen(self, conn_no: int) -> NatsAsync:
        return await NatsAsync.open(self.srv.port, b"_INBOX.%d" % conn_no)

    async def aop(self, conn: NatsAsync, req: Req) -> str | None:
        return nats_acks_failed(await conn.roundtrip(*req))

    def sopen(self) -> NatsSync:
        return NatsSync(self.srv.port, b"_INBOX.0")

    def sop(self, conn: NatsSync, req: Req) -> str | None:
        return nats_acks_failed(conn.roundtrip(*req))

    def stored(self, name: str) -> int:
        c = self.sopen()
        info = c.api(b"$JS.API.STREAM.INFO." + STREAM, {"subjects_filter": f"bench.{name}"})
        c.close()
        return int(info["state"].get("subjects", {}).get(f"bench.{name}", 0))

    def read_all(self, name: str, n: int, page: int) -> int:
        c = NatsSync(self.srv.port, b"_INBOX.pull")
        durable = f"cu_{name}".replace(".", "_")
        c.api(
            f"$JS.API.CONSUMER.DURABLE.CREATE.BENCH.{durable}".encode(),
            {
                "stream_name": STREAM.decode(),
                "config": {
                    "durable_name": durable,
                    "deliver_policy": "all",
                    "ack_policy": "none",
                    "filter_subject": f"bench.{name}",
                    "max_waiting": 1,
                },
            },
        )
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.BENCH.{durable}".encode()
        got = 0
        while got < n:
            want = min(page, n - got)
            msgs = c.roundtrip(nats_pub(nxt, c.inbox, b'{"batch":%d}' % want), want)
            if msgs[0][0] != b"MSG":
                raise RuntimeError(f"pull: {nats_error(msgs[0])}")
            got += len(msgs)
        c.close()
        return got

    def read_last(self, name: str, n: int) -> bool:
        try:
            c = NatsSync(self.srv.port, timeout=5)
        except OSError:
            return False
        try:
            (msg,) = c.roundtrip(
                nats_pub(b"$JS.API.STREAM.MSG.GET.BENCH", c.inbox, b'{"seq":%d}' % n)
            )
            return nats_error(msg) is None and b'"message"' in msg[2]
        except OSError:
            return False
        finally:
            c.close()


SIDES: dict[str, type[Side]] = {"topics": TopicsSide, "redis": RedisSide, "nats": NatsSide}


# -- measuring ------------------------------------------------------------------------------------
class Bench:
    """The sizes and the gate, shared by every workload."""

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes

    def gate(self, server_pid: int, client_pids: Sequence[int] = ()) -> dict[str, Any]:
        s = self.sizes
        return wait_quiet(
            [server_pid], client_pids, window_s=s.gate_window_s, give_up_s=s.gate_give_up_s
        )


async def _drive(
    side: Side,
    name: str,
    records: int,
    conns: int,
    *,
    warm_s: float = 0.0,
    dur_s: float | None = None,
    total: int | None = None,
) -> dict[str, Any]:
    """`conns` connections, each sending `records` records per request back to back: for
    `dur_s` after `warm_s` (measured), or until `total` requests were answered (a fill)."""
    pool = [await side.aopen(k) for k in range(conns)]
    reqs = [side.batch(name, [REC] * records, k) for k in range(conns)]  # NATS: k's inbox
    measuring = dur_s is None
    stop = False
    lat: list[int] = []
    errors: list[str] = []
    left = total if total is not None else -1
    clock = time.perf_counter_ns
    op = side.aop

    async def worker(c: Any, req: Req) -> None:
        nonlocal left
        while not stop and left != 0:
            left -= 1
            t0 = clock()
            err = await op(c, req)
            dt = clock() - t0
            if err:
                errors.append(err)
                if total is not None or len(errors) > 20:
                    raise RuntimeError(f"writes fail: {err}")
            elif measuring:
                lat.append(dt)

    meter = CpuMeter([side.srv.pid])
    tasks = [asyncio.create_task(worker(c, r)) for c, r in zip(pool, reqs, strict=True)]
    if dur_s is not None:
        await asyncio.sleep(warm_s)
        meter.start()
        measuring = True
        await asyncio.sleep(dur_s)
        measuring = False
        cpu = meter.stop()
        stop = True
        await asyncio.gather(*tasks)
    else:
        meter.start()
        await asyncio.gather(*tasks)
        cpu = meter.stop()
    for c in pool:
        c.close()
    return {"requests": len(lat), "errors": len(errors), "lat": summarize(lat), "cpu": cpu}


def run_ingest(bench: Bench, side: Side) -> dict[str, Any]:
    s = bench.sizes
    side.create("ingest")
    gate = bench.gate(side.srv.pid)
    res = uvloop.run(
        _drive(side, "ingest", s.batch, s.conns, warm_s=s.ingest_warm_s, dur_s=s.ingest_s)
    )
    cpu = res["cpu"]
    records = res["requests"] * s.batch
    return {
        "records": records,
        "records_per_s": round(records / cpu["wall_s"]),
        "req_p50_us": res["lat"].get("p50"),
        "req_p99_us": res["lat"].get("p99"),
        "cpu_us_per_record": round(cpu["server_cpu_s"] / records * 1e6, 2) if records else None,
        "errors": res["errors"],
        "throttled": side.throttled,
        "stored_after": side.stored("ingest"),
        "cpu": cpu,
        "gate": gate,
    }


def run_ack(bench: Bench, side: Side) -> dict[str, Any]:
    s = bench.sizes
    side.create("ack")
    req = side.batch("ack", [REC])
    conn = side.sopen()
    for _ in range(s.ack_warmup):
        if err := side.sop(conn, req):
            raise RuntimeError(f"write: {err}")
    gate = bench.gate(side.srv.pid)
    samples = [0] * s.ack_writes
    errors = 0
    op, clock = side.sop, time.perf_counter_ns
    meter = CpuMeter([side.srv.pid]).start()
    for i in range(s.ack_writes):
        t0 = clock()
        err = op(conn, req)
        samples[i] = clock() - t0
        errors += err is not None
    cpu = meter.stop()
    conn.close()
    lat = summarize(samples)
    return {
        "writes": s.ack_writes,
        "errors": errors,
        "throttled": side.throttled,
        "p50_us": lat["p50"],
        "p99_us": lat["p99"],
        "p999_us": lat["p999"],
        "max_us": lat["max"],
        "writes_per_s": round(s.ack_writes / cpu["wall_s"]),
        "cpu_us_per_record": round(cpu["server_cpu_s"] / s.ack_writes * 1e6, 2),
        "cpu": cpu,
        "gate": gate,
    }


def run_live(bench: Bench, side: Side, tmp: Path) -> dict[str, Any]:
    modes = ("sse", "ws") if isinstance(side, TopicsSide) else ("sub",)
    out: dict[str, Any] = {}
    for n in bench.sizes.live_levels:
        for mode in modes:
            out[f"{mode}_{n}"] = _live_level(bench, side, mode, n, tmp)
    return out


def _live_level(bench: Bench, side: Side, mode: str, n: int, tmp: Path) -> dict[str, Any]:
    s = bench.sizes
    name = f"live.{mode}.{n}"
    side.create(name)
    out = tmp / f"deliveries-{name}.json"
    child = Spawned(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_sub",
            f"{side.name}:{mode}",
            "--_port",
            str(side.srv.port),
            "--_n",
            str(n),
            "--_name",
            name,
            "--_out",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    conn = side.sopen()
    try:
        proc = child.proc
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != b"READY":
            raise RuntimeError(f"subscriber process did not start: {line!r}")

        def write(i: int) -> None:
            if err := side.sop(conn, side.batch(name, [live_record(i)])):
                raise RuntimeError(f"live writer: {err}")

        for i in range(-20, 0):  # warm-up records (negative index, not counted)
            write(i)
            time.sleep(s.live_interval_s)
        time.sleep(0.2)
        gate = bench.gate(side.srv.pid, [child.pid])
        meter = CpuMeter([side.srv.pid], [child.pid]).start()
        nxt = time.perf_counter()
        for i in range(s.live_records):
            nxt += s.live_interval_s
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            write(i)
        time.sleep(0.3)  # the last deliveries
        cpu = meter.stop()
        proc.stdin.write(b"STOP\n")
        proc.stdin.flush()
        if proc.wait(300) != 0:
            raise RuntimeError(f"subscriber process exited with {proc.returncode}")
    finally:
        child.stop(signal.SIGKILL, 10)
        conn.close()
    res = orjson.loads(out.read_bytes())
    out.unlink()
    lats = [lat for _, i, lat in res["deliveries"] if i >= 0]
    unique = {(k, i) for k, i, _ in res["deliveries"] if i >= 0}
    lat = summarize(lats)
    return {
        "subscribers": n,
        "records": s.live_records,
        "expected": n * s.live_records,
        "delivered": len(unique),
        "p50_us": lat.get("p50"),
        "p99_us": lat.get("p99"),
        "p999_us": lat.get("p999"),
        "max_us": lat.get("max"),
        "cpu": cpu,
        "gate": gate,
    }


def run_history(
    bench: Bench, side: Side, catchup: bool, restart: bool
) -> dict[str, dict[str, Any]]:
    """Fill `history` records, then read them all (catchup) and restart on them."""
    s = bench.sizes
    n = s.history
    side.create("history")
    fill = uvloop.run(_drive(side, "history", s.page, 4, total=n // s.page))
    stored = side.stored("history")
    if stored != n:
        raise RuntimeError(f"fill: {stored} records stored, {n} written")
    fill_info = {
        "records": n,
        "records_per_s": round(n / fill["cpu"]["wall_s"]),
        "cpu_us_per_record": round(fill["cpu"]["server_cpu_s"] / n * 1e6, 2),
    }
    out: dict[str, dict[str, Any]] = {}
    if catchup:
        gate = bench.gate(side.srv.pid)
        meter = CpuMeter([side.srv.pid]).start()
        got = side.read_all("history", n, s.page)
        cpu = meter.stop()
        if got != n:
            raise RuntimeError(f"catch-up read {got} records of {n}")
        out["catchup"] = {
            "records": got,
            "page": s.page,
            "records_per_s": round(got / cpu["wall_s"]),
            "cpu_us_per_record": round(cpu["server_cpu_s"] / got * 1e6, 2),
            "fill": fill_info,
            "cpu": cpu,
            "gate": gate,
        }
    if restart:
        gate = bench.gate(side.srv.pid)
        stop_s = side.srv.stop()
        t0 = time.perf_counter()
        side.srv.start(wait=False)
        polls = 0
        while not side.read_last("history", n):
            polls += 1
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("the last record was not readable within 600 s")
            time.sleep(0.005)
        out["restart"] = {
            "records": n,
            "restart_s": round(time.perf_counter() - t0, 3),
            "stop_s": round(stop_s, 3),
            "polls": polls,
            "fill": fill_info,
            "gate": gate,
        }
    return out


# -- the subscriber process -------------------------------------------------------------------------
def ws_frame(payload: bytes) -> bytes:
    """One masked client text frame."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x81, 0x80 | n])
    elif n < 65536:
        head = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x81, 0x80 | 127]) + n.to_bytes(8, "big")
    body = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
    return head + mask + body


class WSParser:
    """Incremental parser of the server side of a WebSocket: the 101 head, then frames;
    `feed(data)` returns the text messages completed by `data`."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.head_done = False
        self.partial = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self.buf
        buf += data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return []
            del buf[: end + 4]
            self.head_done = True
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n, hl = b1 & 0x7F, 2
            if n == 126:
                if len(buf) - pos < 4:
                    break
                n, hl = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif n == 127:
                if len(buf) - pos < 10:
                    break
                n, hl = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if len(buf) - pos < hl + n:
                break
            op = b0 & 0x0F
            if op in (0, 1):  # continuation / text
                self.partial += buf[pos + hl : pos + hl + n]
                if b0 & 0x80:
                    out.append(bytes(self.partial))
                    self.partial.clear()
            pos += hl + n
        del buf[:pos]
        return out


class WsRecorder(asyncio.Protocol):
    """A WebSocket subscriber that keeps every chunk with its arrival time."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self.request = build_request(
            "GET",
            "/v0/ws",
            headers=[
                ("Upgrade", "websocket"),
                ("Connection", "Upgrade"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("Sec-WebSocket-Version", "13"),
            ],
            host=f"{host}:{port}",
        )
        self.subscribe = orjson.dumps(
            {"op": "subscribe", "request_id": 1, "topic": name, "tail": True}
        )
        self.chunks: list[tuple[int, bytes]] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.seen = b""
        self.sent = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.chunks.append((time.monotonic_ns(), data))
        if not self.ready.done():
            self.seen += data
            if not self.sent and b"\r\n\r\n" in self.seen:
                if not self.seen.startswith(b"HTTP/1.1 101"):
                    self.ready.set_exception(RuntimeError(self.seen[:200].decode()))
                    return
                self.transport.write(ws_frame(self.subscribe))
                self.sent = True
            if b'"subscribed"' in self.seen:
                self.ready.set_result(None)


class XreadRecorder(asyncio.Protocol):
    """A Redis subscriber: `XREAD BLOCK 0` from the last id seen; each reply is parsed as
    it arrives (the next XREAD needs its last id) and its entries keep the arrival time."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.reader = hiredis.Reader()
        self.entries: list[tuple[int, bytes]] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: Any = None

    def xread(self, last: bytes) -> bytes:
        return resp(b"XREAD", b"BLOCK", b"0", b"COUNT", b"1000", b"STREAMS", self.key, last)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        nodelay(transport.get_extra_info("socket"))
        transport.write(resp(b"PING") + self.xread(b"$"))

    def data_received(self, data: bytes) -> None:
        ns = time.monotonic_ns()
        reader = self.reader
        reader.feed(data)
        while (x := reader.gets()) is not False:
            if x == b"PONG":
                self.ready.set_result(None)
                continue
            if not isinstance(x, list):
                raise RuntimeError(f"XREAD: {x!r}")
            last = b"$"
            for _, entries in x:
                for eid, fields in entries:
                    self.entries.append((ns, fields[1]))
                    last = eid
            self.transport.write(self.xread(last))


class NatsRecorder(asyncio.Protocol):
    """A NATS subscriber with its own push consumer (deliver policy new, ack none); the
    set-up is parsed as it arrives, the deliveries are kept as chunks with arrival times."""

    def __init__(self, k: int, name: str) -> None:
        self.deliver = b"dlv.%d" % k
        self.create = orjson.dumps(
            {
                "stream_name": STREAM.decode(),
                "config": {
                    "deliver_subject": self.deliver.decode(),
                    "deliver_policy": "new",
                    "ack_policy": "none",
                    "filter_subject": f"bench.{name}",
                    "replay_policy": "instant",
                },
            }
        )
        self.parser = NatsParser()
        self.chunks: list[tuple[int, bytes]] = []
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.created = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        nodelay(transport.get_extra_info("socket"))
        transport.write(
            NATS_CONNECT
            + b"SUB %s 1\r\nSUB _INBOX.sub 2\r\n" % self.deliver
            + nats_pub(b"$JS.API.CONSUMER.CREATE." + STREAM, b"_INBOX.sub", self.create)
        )

    def data_received(self, data: bytes) -> None:
        if self.ready.done():
            self.chunks.append((time.monotonic_ns(), data))
            return
        for op, _, payload in self.parser.feed(data):
            if op == b"PING":
                self.transport.write(b"PONG\r\n")
            elif op in (b"MSG", b"HMSG") and not self.created:
                if err := nats_error((op, [], payload)):
                    self.ready.set_exception(RuntimeError(f"consumer create: {err}"))
                    return
                self.created = True
                self.transport.write(b"PING\r\n")  # the consumer is in place once PONG is back
            elif op == b"PONG" and self.created:
                self.ready.set_result(None)


def _stdin_wait(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    done: asyncio.Future[None] = loop.create_future()

    def on_stdin() -> None:
        os.read(0, 4096)
        loop.remove_reader(0)
        if not done.done():
            done.set_result(None)

    loop.add_reader(0, on_stdin)
    return done


async def _subscribers_main(system: str, mode: str, port: int, n: int, name: str, out: Path):
    """The subscriber process: `n` subscriptions, READY, wait for a line on stdin, then
    parse what arrived and write (subscriber, record index, latency ns) triples."""
    loop = asyncio.get_running_loop()
    subs: list[Any] = []
    ctl: AsyncConn | None = None
    if system == "topics" and mode == "sse":
        ctl, streams = await open_watch_streams(HOST, port, name, n)
        subs += streams
    else:
        for k in range(n):
            if system == "topics":
                factory: Callable[[], asyncio.Protocol] = lambda: WsRecorder(HOST, port, name)  # noqa: E731
            elif system == "redis":
                factory = lambda: XreadRecorder(name.encode())  # noqa: E731
            else:
                factory = lambda k=k: NatsRecorder(k, name)  # noqa: E731
            _, rec = await loop.create_connection(factory, HOST, port)
            subs.append(rec)
    await asyncio.wait_for(asyncio.gather(*(s.ready for s in subs)), 120)
    stop = _stdin_wait(loop)
    cpu0 = sum(os.times()[:2])
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    await stop
    cpu1 = sum(os.times()[:2])
    for s in subs:
        s.transport.close()
    if ctl is not None:
        ctl.close()

    deliveries: list[tuple[int, int, int]] = []

    def add(k: int, ns: int, data: Any) -> None:
        if isinstance(data, dict) and "t" in data:
            deliveries.append((k, data["i"], ns - data["t"]))

    for k, s in enumerate(subs):
        if isinstance(s, XreadRecorder):
            for ns, value in s.entries:
                add(k, ns, orjson.loads(value))
        elif isinstance(s, NatsRecorder):
            parser = NatsParser()
            for ns, data in s.chunks:
                for op, _, payload in parser.feed(data):
                    if op == b"MSG":
                        add(k, ns, orjson.loads(payload))
        elif isinstance(s, WsRecorder):
            ws = WSParser()
            for ns, data in s.chunks:
                for text in ws.feed(data):
                    m = orjson.loads(text)
                    if m.get("op") == "record":
                        for r in m["records"]:
                            add(k, ns, r.get("data"))
        else:
            sse = SSEParser()
            for ns, data in s.chunks:
                for event, line in sse.feed(data):
                    if event == b"record":
                        for r in orjson.loads(line)["records"]:
                            add(k, ns, r.get("data"))
    out.write_bytes(orjson.dumps({"deliveries": deliveries, "cpu_s": cpu1 - cpu0}))


# -- orchestration ---------------------------------------------------------------------------------
def peer_status(wanted: Sequence[str]) -> dict[str, str | None]:
    """For each peer: None when it can run, else why it is skipped."""
    out: dict[str, str | None] = {}
    for p in PEERS:
        if p not in wanted:
            out[p] = "not selected (--peers)"
        elif p == "redis" and not shutil.which("redis-server"):
            out[p] = "redis-server not found (apt-get install redis-server)"
        elif p == "redis" and hiredis is None:
            out[p] = "the hiredis module is missing (pip install hiredis)"
        elif p == "nats" and not shutil.which("nats-server"):
            out[p] = "nats-server not found (apt-get install nats-server)"
        else:
            out[p] = None
    return out


def peer_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, argv in (
        ("redis-server", ["redis-server", "--version"]),
        ("nats-server", ["nats-server", "--version"]),
    ):
        if shutil.which(argv[0]):
            with contextlib.suppress(Exception):
                out[name] = subprocess.run(
                    argv, capture_output=True, text=True, timeout=10
                ).stdout.strip()
    if hiredis is not None:
        out["hiredis"] = hiredis.__version__
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_one(
    bench: Bench, step: str, klass: str, system: str, rnd: int, work: Path, selected: set[str]
) -> list[dict[str, Any]]:
    """Start `system` fresh, run one step of the workloads on it, stop it."""
    d = work / f"r{rnd}-{step}-{klass}-{system}"
    srv = make_server(system, klass, d)
    base = {"round": rnd, "class": klass, "system": system}
    if system == "topics":
        base["config"] = f"durability {TOPICS_DURABILITY[klass]}"
    elif system == "redis":
        base["config"] = f"appendfsync {REDIS_FSYNC[klass]}"
    else:
        base["config"] = "file store"
    names = [w for w in ("catchup", "restart") if w in selected] if step == "history" else [step]
    t0 = time.perf_counter()
    try:
        srv.start()
        side = SIDES[system](srv, klass)
        if step == "ingest":
            results = {"ingest": run_ingest(bench, side)}
        elif step == "ack":
            results = {"ack": run_ack(bench, side)}
        elif step == "live":
            results = {"live": {"levels": run_live(bench, side, d)}}
        else:
            results = run_history(bench, side, "catchup" in selected, "restart" in selected)
        out = [{**base, "workload": w, **results[w]} for w in names]
    except Exception as exc:  # keep going; the error is in the results
        err = f"{type(exc).__name__}: {exc}"
        log(f"  error: {err}")
        out = [{**base, "workload": w, "error": err} for w in names]
    finally:
        with contextlib.suppress(Exception):
            srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    log(f"  {step} {klass} {system}: {time.perf_counter() - t0:.1f} s")
    return out


def run_all(args: argparse.Namespace, bench: Bench, systems: dict[str, bool]) -> list[Any]:
    selected = set(args.only or WORKLOADS)
    steps = [w for w in ("ingest", "ack", "live") if w in selected]
    if selected & {"catchup", "restart"}:
        steps.append("history")
    runs: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        for rnd in range(1, args.rounds + 1):
            for step in steps:
                for klass in WORKLOAD_CLASSES[step]:
                    for system in CLASS_SYSTEMS[klass]:
                        if systems.get(system):
                            log(f"round {rnd}: {step} {klass} {system} ...")
                            runs += run_one(bench, step, klass, system, rnd, work, selected)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs


# -- the table -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    workload: str
    klass: str
    label: str
    topics_key: str
    peer_key: str
    digits: int = 0


def rows(levels: Sequence[int]) -> list[Row]:
    out: list[Row] = []
    for klass in (DURABLE, FAST):
        out += [
            Row("ingest", klass, "records/s", "records_per_s", "records_per_s"),
            Row("ingest", klass, "request p99 µs", "req_p99_us", "req_p99_us"),
            Row(
                "ingest", klass, "server CPU µs/record", "cpu_us_per_record", "cpu_us_per_record", 2
            ),
        ]
    for klass in (DURABLE, FAST):
        out += [
            Row("ack", klass, "p50 µs", "p50_us", "p50_us"),
            Row("ack", klass, "p99 µs", "p99_us", "p99_us"),
        ]
    for klass in (DURABLE, FAST):
        for n in levels:
            for q in ("p50", "p99"):
                for mode in ("sse", "ws"):
                    out.append(
                        Row(
                            "live",
                            klass,
                            f"{n} sub, {q} µs (topics {mode.upper()})",
                            f"levels.{mode}_{n}.{q}_us",
                            f"levels.sub_{n}.{q}_us",
                        )
                    )
    out += [
        Row("catchup", FAST, "records/s", "records_per_s", "records_per_s"),
        Row("catchup", FAST, "server CPU µs/record", "cpu_us_per_record", "cpu_us_per_record", 2),
        Row("restart", FAST, "start to last record, s", "restart_s", "restart_s", 2),
        Row("restart", FAST, "graceful stop, s", "stop_s", "stop_s", 2),
    ]
    return out


def pick(run: dict[str, Any], key: str) -> float | None:
    d: Any = run
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d if isinstance(d, int | float) else None


def fmt(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def cell(vals: list[float | None], digits: int) -> tuple[str, float | None]:
    got = [v for v in vals if v is not None]
    if not got:
        return "–", None
    med = statistics.median(got)
    if len(vals) == 1:
        return fmt(med, digits), med
    return f"**{fmt(med, digits)}** ({' / '.join(fmt(v, digits) for v in vals)})", med


def table(runs: list[dict[str, Any]], levels: Sequence[int]) -> str:
    out = [
        "| workload | class | metric | topics | Redis | NATS | topics/Redis | topics/NATS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows(levels):
        cells: dict[str, tuple[str, float | None]] = {}
        for system in ("topics", "redis", "nats"):
            mine = [
                r
                for r in runs
                if r["workload"] == row.workload
                and r["class"] == row.klass
                and r["system"] == system
                and "error" not in r
            ]
            key = row.topics_key if system == "topics" else row.peer_key
            cells[system] = cell([pick(r, key) for r in mine], row.digits) if mine else ("", None)
        if not any(v for _, v in cells.values()):
            continue
        t = cells["topics"][1]
        ratios = [
            fmt(t / p, 2) if t is not None and p else ""
            for p in (cells["redis"][1], cells["nats"][1])
        ]
        out.append(
            f"| {row.workload} | {row.klass} | {row.label} | {cells['topics'][0]} | "
            f"{cells['redis'][0]} | {cells['nats'][0]} | {ratios[0]} | {ratios[1]} |"
        )
    return "\n".join(out)


def notes(runs: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    gates = []
    for r in runs:
        for g in _gates(r):
            gates.append(g)
    if gates:
        loud = [g for g in gates if not g["quiet"]]
        out.append(
            f"Quiet gate: {len(gates) - len(loud)} of {len(gates)} timed parts started on a "
            f"quiet machine; others' cores at the start: max {max(g['others_cores'] for g in gates):.2f}."
        )
    others = [c["others_cores"] for r in runs for c in _cpus(r)]
    if others:
        out.append(
            f"Others' cores during the timed parts: median {statistics.median(others):.2f}, "
            f"max {max(others):.2f}."
        )
    for r in runs:
        if "error" in r:
            out.append(
                f"Error: round {r['round']} {r['workload']} {r['class']} {r['system']}: {r['error']}"
            )
        for key, lv in (r.get("levels") or {}).items():
            if isinstance(lv, dict) and lv.get("delivered") != lv.get("expected"):
                out.append(
                    f"Lost deliveries: round {r['round']} live {r['class']} {r['system']} {key}: "
                    f"{lv.get('delivered')} of {lv.get('expected')}."
                )
    return out


def _gates(r: dict[str, Any]) -> list[dict[str, Any]]:
    if "gate" in r:
        return [r["gate"]]
    return [v["gate"] for v in (r.get("levels") or {}).values() if "gate" in v]


def _cpus(r: dict[str, Any]) -> list[dict[str, Any]]:
    if "cpu" in r:
        return [r["cpu"]]
    return [v["cpu"] for v in (r.get("levels") or {}).values() if "cpu" in v]


HEADER = (
    "Medians of {rounds} round(s), every run in parentheses. Class durable: topics "
    "durability `fsync` vs Redis `appendfsync always`; class fast: topics `disk` vs Redis "
    "`appendfsync everysec` vs NATS JetStream file store (nats-server 2.9 acknowledges "
    "without fsync). Ratios are topics / peer of the medians: above 1 means topics' number "
    "is higher, which is better for records/s and worse for latency, CPU per record and "
    "seconds."
)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 round (smoke test)")
    ap.add_argument("--rounds", type=int, help="rounds (default 3, --quick 1)")
    ap.add_argument("--only", nargs="+", choices=WORKLOADS, help="run only these workloads")
    ap.add_argument(
        "--peers",
        default="redis,nats",
        help="comma-separated peers to run, or 'none' (default redis,nats)",
    )
    ap.add_argument(
        "--json", type=Path, default=HERE / "results" / "peers.json", help="output JSON path"
    )
    ap.add_argument("--_sub", help=argparse.SUPPRESS)
    ap.add_argument("--_port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_name", help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._sub:  # child mode: the live subscribers
        system, mode = args._sub.split(":")
        uvloop.run(_subscribers_main(system, mode, args._port, args._n, args._name, args._out))
        return 0

    sizes = QUICK if args.quick else FULL
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    wanted = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p]
    unknown = set(wanted) - set(PEERS)
    if unknown:
        ap.error(f"unknown peers: {', '.join(sorted(unknown))}")
    status = peer_status(wanted)
    for p, why in status.items():
        if why:
            log(f"skipping {p}: {why}")
    systems = {"topics": True, **{p: why is None for p, why in status.items()}}
    env = environment()
    env["peers"] = peer_versions()
    log(f"# topics vs peers ({'quick' if args.quick else 'full'}, {args.rounds} round(s))")
    runs = run_all(args, Bench(sizes), systems)

    text = "\n".join(
        [
            HEADER.format(rounds=args.rounds),
            "",
            table(runs, sizes.live_levels),
            "",
            *notes(runs),
            f"Machine: {env['cpu_count']} vCPUs ({env['cpu_model']}), shared by the clients and "
            "the servers.",
        ]
    )
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "environment": env,
        "params": {
            "quick": args.quick,
            "rounds": args.rounds,
            "only": args.only or list(WORKLOADS),
            "peers": {p: why or "ran" for p, why in status.items()},
            "sizes": asdict(sizes),
            "record_bytes": len(REC),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        },
        "table": text,
        "runs": runs,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
