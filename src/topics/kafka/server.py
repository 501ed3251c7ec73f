"""The Kafka-wire listener: an asyncio server on the loop that owns the engine.

Framing: every request is a 4-byte big-endian size and that many bytes;
responses go back in request order. Requests on one connection are processed
concurrently (a Fetch long-poll does not hold up a Heartbeat behind it) but
each starts in arrival order and Produce stages its records before its first
await, so pipelined writes get their offsets in order.

Bad input never reaches other connections: a frame larger than the limit, a
truncated or undecodable request, an unknown API key or a request before
SASL authentication (when keys are configured) closes only that connection,
with one log line. An API version outside the advertised range is answered
with UNSUPPORTED_VERSION (35).

Exposure limits (docs/KAFKA.md "Limits"). The size prefix is checked before
any of the frame is read, so an oversized one costs nothing: until SASL
authentication completes (when keys are configured) a frame may be at most
:data:`PRE_AUTH_MAX_FRAME` bytes, afterwards `TOPICS_KAFKA_MAX_FRAME_BYTES`.
A frame that has started must arrive whole within
`TOPICS_KAFKA_FRAME_TIMEOUT_MS`; an unauthenticated connection gets the same
time between its frames (the handshake must keep moving); an authenticated one
with no request in progress is closed after `TOPICS_KAFKA_IDLE_TIMEOUT_MS` of
silence, as a Kafka broker does (clients reconnect on their own).

Metrics (docs/KAFKA.md "Metrics"): the frame loop is the one place requests
are counted in :class:`~topics.kafka.metrics.ListenerMetrics` (per request,
never per record); the listener registers its JSON section as
`node.shell_metrics["kafka"]` while it runs, and `/v0/metrics` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections import deque
from collections.abc import Awaitable
from typing import Any

from topics.auth import DEV_PRINCIPAL
from topics.kafka import protocol as P
from topics.kafka.backend import KafkaBackend
from topics.kafka.broker import CLOSE, Broker, ConnState
from topics.kafka.metrics import ListenerMetrics, consumer_lag
from topics.kafka.offsets import internal_topics
from topics.node import Node

__all__ = ["KafkaServer", "start_kafka"]

log = logging.getLogger("topics.kafka")

_SIZE = struct.Struct(">i")
MAX_INFLIGHT = 64
# The largest frame accepted before SASL authentication completes (bytes). The
# requests allowed then (ApiVersions, SaslHandshake, a PLAIN token) are a few
# hundred bytes; this leaves room for long client names and secrets.
PRE_AUTH_MAX_FRAME = 16 * 1024


# What a connection's read loop is doing (for its watchdog).
_WAITING = 0  # for the first byte of the next frame
_IN_FRAME = 1  # reading a frame that has started
_HANDLING = 2  # dispatching a frame (or waiting for room for it)


class _Activity:
    """The read loop's state and since when (loop time, s); `last_tx`: last response sent."""

    __slots__ = ("state", "since", "last_tx")

    def __init__(self) -> None:
        self.state = _HANDLING
        self.since = 0.0
        self.last_tx = 0.0


class KafkaServer:
    """The listener plus the broker state behind it (groups, offsets, producers).

    Serves the engine of `node` with the node's configuration (the
    `TOPICS_KAFKA_*` settings), clock and authenticator (docs/ARCHITECTURE.md,
    "Layers": shells receive a Node).
    """

    def __init__(self, node: Node) -> None:
        cfg = node.config
        self.node = node
        self.cfg = cfg
        self.backend = KafkaBackend(node, hidden=internal_topics())
        auth = node.auth
        self.auth_enabled = auth.enabled
        # Never below the pre-auth cap: the handshake has to fit after login too.
        self.max_frame = max(cfg.kafka_max_frame_bytes, PRE_AUTH_MAX_FRAME)
        self.idle_timeout_s = cfg.kafka_idle_timeout_ms / 1000 or None
        self.frame_timeout_s = cfg.kafka_frame_timeout_ms / 1000 or None
        self.broker = Broker(
            self.backend,
            advertised=("127.0.0.1", 0),
            auth=auth,
            now_ms=node.clock.now_ms(),
        )
        self.host = ""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.metrics = ListenerMetrics()

    async def start(self, host: str, port: int) -> None:
        """Replay committed offsets, then bind `host:port` (0 = ephemeral).

        Raises OSError when the address cannot be bound.
        """
        n = self.broker.offsets.load()
        if n:
            log.info("kafka: replayed %d committed-offset documents", n)
        self._server = await asyncio.start_server(
            self._accept, host, port, reuse_address=True, limit=1 << 20
        )
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        self.broker.advertised = _advertised(self.cfg.kafka_advertised, host, self.port)
        self.broker.groups.start()
        self.node.shell_metrics["kafka"] = self.metrics_json
        log.info(
            "kafka listener on %s:%d (advertised %s:%d, SASL/PLAIN %s)",
            self.host,
            self.port,
            *self.broker.advertised,
            "required" if self.auth_enabled else "off",
        )

    async def stop(self) -> None:
        """Stop accepting, close every connection and the group coordinator."""
        if self.node.shell_metrics.get("kafka") == self.metrics_json:
            del self.node.shell_metrics["kafka"]
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        await self.broker.groups.stop()

    def metrics_json(self) -> dict[str, Any]:
        """The `kafka` section of `/v0/metrics`: the counters plus consumer-group lag
        computed now (:func:`~topics.kafka.metrics.consumer_lag`)."""
        table = self.broker.offsets.table
        return self.metrics.snapshot(consumer_lag(table, self.backend.head_seq))

    # ------------------------------------------------------------ connection

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = ConnState(peer_s, None if self.auth_enabled else DEV_PRINCIPAL)
        m = self.metrics
        m.accepted += 1
        m.open += 1
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("kafka: connection %s failed", peer_s)
        finally:
            for t in list(conn.tasks):
                t.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._conns.discard(task)
            m.open -= 1
            m.closed += 1

    async def _serve(
        self, conn: ConnState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        pending: deque[tuple[int, int, int, Awaitable[Any] | Any]] = deque()
        room = asyncio.Semaphore(MAX_INFLIGHT)
        wake = asyncio.Event()
        closing = False
        act = _Activity()
        loop = asyncio.get_running_loop()
        m = self.metrics

        async def write_loop() -> None:
            try:
                while True:
                    while not pending:
                        wake.clear()
                        await wake.wait()
                    key, ver, corr, item = pending[0]
                    resp = await item if isinstance(item, asyncio.Future) else item
                    pending.popleft()
                    room.release()
                    if resp is None:  # acks=0 produce: no response at all
                        continue
                    if key < 0:  # pre-framed bytes (SASL v0 token answer)
                        assert isinstance(resp, bytes)
                        m.bytes_out += len(resp)
                        writer.write(resp)
                        continue
                    data = P.encode_response(resp, ver, corr)
                    m.bytes_out += len(data)
                    writer.write(data)
                    act.last_tx = loop.time()
                    if not pending:
                        await writer.drain()
                    if conn.close_after and not pending:
                        writer.close()
                        return
            except (ConnectionError, asyncio.CancelledError):
                writer.close()
            except Exception:
                log.exception("kafka: closing %s: response failed", conn.peer)
                writer.close()

        wtask = loop.create_task(write_loop())
        conn.tasks.add(wtask)
        if self.frame_timeout_s is not None or self.idle_timeout_s is not None:
            conn.tasks.add(loop.create_task(self._watchdog(conn, act, pending, writer)))
        try:
            while not closing:
                act.state = _WAITING
                act.since = loop.time()
                first = await reader.readexactly(1)
                act.state = _IN_FRAME
                act.since = loop.time()
                (size,) = _SIZE.unpack(first + await reader.readexactly(3))
                # The size prefix is judged before any of the frame is read.
                limit = self.max_frame if conn.principal is not None else PRE_AUTH_MAX_FRAME
                if size < 0 or size > limit:
                    m.refused += 1
                    log.warning(
                        "kafka: closing %s: request of %d bytes (limit %d%s)",
                        conn.peer,
                        size,
                        limit,
                        "" if conn.principal is not None else " before SASL authentication",
                    )
                    return
                frame = await reader.readexactly(size)
                started = loop.time()
                m.bytes_in += 4 + size
                act.state = _HANDLING
                if wtask.done():
                    return
                if conn.sasl_raw:
                    # SaslHandshake v0: the next frame is a bare PLAIN token.
                    conn.sasl_raw = False
                    err = self.broker.plain_login(conn, frame)
                    if err is not None or conn.principal is None:
                        m.sasl_failures += 1
                        log.info("kafka: closing %s: SASL/PLAIN failed (%s)", conn.peer, err)
                        return
                    await room.acquire()
                    pending.append((-1, 0, 0, _SIZE.pack(0)))
                    wake.set()
                    continue
                req = self.broker.parse(conn, frame)
                if req is None:
                    m.refused += 1
                    return
                m.request(req.key, req.version)
                await room.acquire()
                item = self.broker.answer(conn, req)
                if item is CLOSE:
                    m.refused += 1
                    return
                # Latency and error codes once the response is ready: a
                # handler's future reports when it completes (a Fetch after its
                # long-poll), not when earlier responses have been written.
                if isinstance(item, asyncio.Future):
                    item.add_done_callback(m.on_done(req.key, started))
                else:
                    m.answered(req.key, item, started, loop.time())
                if item is None:  # a handler with nothing to send
                    room.release()
                    continue
                pending.append((req.key, req.version, req.correlation_id, item))
                wake.set()
            await wtask
        finally:
            if not wtask.done():
                wtask.cancel()

    def _watch_limits(self) -> tuple[float | None, float | None, float]:
        """(frame timeout s, idle timeout s, watchdog tick s); both timeouts may be None."""
        ft, it = self.frame_timeout_s, self.idle_timeout_s
        shortest = min(x for x in (ft, it, 60.0) if x is not None)
        return ft, it, min(max(shortest / 4, 0.05), 5.0)

    async def _watchdog(
        self,
        conn: ConnState,
        act: _Activity,
        pending: deque[Any],
        writer: asyncio.StreamWriter,
    ) -> None:
        """Close the connection when a frame stalls or it sits idle (module docstring).

        Runs every quarter of the shortest timeout (0.05-5 s), so a connection
        is closed at most that much after its deadline. The read loop only
        stamps :class:`_Activity`; this costs it no timer per frame.
        """
        frame_s, idle_s, tick = self._watch_limits()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            why = ""
            if act.state == _IN_FRAME:
                if frame_s is not None and now - act.since > frame_s:
                    why = f"a request frame stalled for {int(frame_s * 1000)} ms"
            elif act.state == _WAITING:
                if conn.principal is None:
                    limit = frame_s if frame_s is not None else idle_s
                    if limit is not None and now - act.since > limit:
                        why = f"no request for {int(limit * 1000)} ms before SASL authentication"
                elif idle_s is not None and not pending:
                    if now - max(act.since, act.last_tx) > idle_s:
                        why = f"no request for {int(idle_s * 1000)} ms"
            if why:
                log.info("kafka: closing %s: %s", conn.peer, why)
                # abort(): no waiting for a peer that does not read; the read
                # loop sees the end of the stream and the connection is closed.
                writer.transport.abort()
                return


def _advertised(spec: str | None, bind_host: str, port: int) -> tuple[str, int]:
    """`TOPICS_KAFKA_ADVERTISED` (`host:port` or `host`), else the bound address.

    An unspecified bind address (`0.0.0.0`, `::`) advertises the machine's
    hostname, which clients must be able to resolve.
    """
    if spec:
        h, sep, p = spec.rpartition(":")
        if sep and p.isdigit() and h:
            return h.strip("[]"), int(p)
        return spec.strip("[]"), port
    if bind_host in ("0.0.0.0", "::", ""):
        return socket.gethostname(), port
    return bind_host, port


async def start_kafka(node: Node, host: str, port: int) -> KafkaServer:
    """Build and start a listener on `host:port` for `node` (call after :meth:`Node.start`).

    Raises OSError when the address cannot be bound.
    """
    srv = KafkaServer(node)
    await srv.start(host, port)
    return srv
