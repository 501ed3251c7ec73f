"""Serve the ASGI app over HTTP/1.1, WebSocket and cleartext HTTP/2 on one port.

uvicorn (uvloop + httptools) handles HTTP/1.1 and WebSocket upgrades: it is the
fastest stack measured for single-connection latency, but it has no usable
HTTP/2.  :class:`AutoProtocol` therefore sniffs the first bytes of every
connection: the HTTP/2 connection preface (prior-knowledge "h2c", no Upgrade)
hands the connection to :class:`H2Protocol`, a small ``h2``-based HTTP/2 ->
ASGI bridge; anything else goes to :class:`Http1Protocol` (uvicorn's httptools
protocol with the guards below).  Either way the chosen protocol replaces the
sniffer via ``transport.set_protocol``, so there is no per-call delegation
afterwards.

Connection-level guards (docs/HTTP_INPUT.md "Connections"), on every protocol:

* a request head (request line + headers) must be complete within
  ``TOPICS_HTTP_HEADER_TIMEOUT_MS`` of its first byte (of the connection, for
  the first request), else the connection is closed;
* open connections are capped per process and per client address
  (``TOPICS_MAX_CONNECTIONS``, ``TOPICS_MAX_CONNECTIONS_PER_IP``); a connection
  over a cap gets one ``503 too_many_connections`` answer and is closed;
* a request target longer than :data:`MAX_URL_BYTES` is ``414 uri_too_long``;
  more than :data:`MAX_HEADERS` header fields or :data:`MAX_HEADER_BYTES` of
  them is ``431 headers_too_large``; a method that is a well-formed token but
  not one the parser knows (``get``, ``FOO``) is ``405 method_not_allowed``;
  any other malformed request is ``400 invalid_request``.  All of these carry
  the error body (docs/API.md, "3.1 The envelope") and close the connection (HTTP/1.1) or
  answer just that stream (HTTP/2);
* a WebSocket message larger than the body limit is dropped unread and reported
  to the app, which answers it with an error message; the socket stays open.

:func:`start_server` runs uvicorn inside the *current* event loop (the engine
lives there too) and returns a :class:`ServerHandle` with the bound port and an
awaitable graceful ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events as ev
import h2.exceptions
import h2.settings
import httptools
import uvicorn
import uvicorn.config
from h2.errors import ErrorCodes
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from topics.errors import TopicsError, bad_request
from topics.http.app import RECEIVED_AT
from topics.http.responses import error_resp

__all__ = [
    "AutoProtocol",
    "DirectBody",
    "DirectWs",
    "direct_writer",
    "ConnectionSlots",
    "Guards",
    "H2Protocol",
    "Http1Protocol",
    "ServerHandle",
    "WSProtocol",
    "build_config",
    "start_server",
]

logger = logging.getLogger("uvicorn.error")

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# RFC 9113 8.2.2: connection-specific headers must not appear in HTTP/2 messages.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
STREAM_WINDOW = 256 * 1024  # receive window we grant each stream (bounds per-stream buffering)
CONNECTION_WINDOW = 1024 * 1024  # receive window for the whole connection
MAX_CONCURRENT_STREAMS = 128
SHUTDOWN_GRACE = 5.0  # seconds in-flight h2 streams get on shutdown if no graceful timeout is set
_500_START = {
    "type": "http.response.start",
    "status": 500,
    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")],
}
_500_BODY = {"type": "http.response.body", "body": b"Internal Server Error"}

MAX_URL_BYTES = 8192  # request target (path + query), bytes
MAX_HEADER_BYTES = 32768  # sum of header names and values, bytes
MAX_HEADERS = 100  # header fields per request
REFUSED_LINGER_S = 2.0  # how long a refused connection may take to send its request
HEADER_TIMEOUT_MS = 10_000
MAX_CONNECTIONS = 16_384
MAX_CONNECTIONS_PER_IP = 4_096
WS_MAX_MESSAGE = 64 * 1024 * 1024  # when the body limit is off
# RFC 9110 5.6.2 token: what a method may be spelled with.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True, slots=True)
class Guards:
    """Request-head and connection limits shared by every protocol of one server.

    `header_timeout` is seconds (None = no limit); the caps count connections
    (0 = no cap); `ws_max_message` is bytes.
    """

    header_timeout: float | None = HEADER_TIMEOUT_MS / 1000
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_ip: int = MAX_CONNECTIONS_PER_IP
    ws_max_message: int = 16 * 1024 * 1024
    max_url_bytes: int = MAX_URL_BYTES
    max_header_bytes: int = MAX_HEADER_BYTES
    max_headers: int = MAX_HEADERS


class ConnectionSlots:
    """Open connections per process and per client address (docs/HTTP_INPUT.md).

    A slot is keyed by the connection's transport and released when the
    connection is lost, whichever protocol then owns it; releasing twice is
    harmless.  When a cap looks full, transports that are already closing are
    released first, so a protocol that never reported its loss cannot leak one.
    """

    def __init__(self, total: int, per_ip: int) -> None:
        self.total = total
        self.per_ip = per_ip
        self.owner: dict[Any, str] = {}  # transport -> client address
        self.by_ip: dict[str, set[Any]] = {}

    def __len__(self) -> int:
        return len(self.owner)

    def acquire(self, transport: Any, ip: str) -> TopicsError | None:
        """Take a slot for `transport`; the refusal (503) when a cap is reached."""
        if self.total and len(self.owner) >= self.total:
            self._sweep(list(self.owner))
            if len(self.owner) >= self.total:
                return _too_many("max_connections", self.total)
        peers = self.by_ip.get(ip)
        if self.per_ip and peers is not None and len(peers) >= self.per_ip:
            self._sweep(list(peers))
            if len(peers) >= self.per_ip:
                return _too_many("max_connections_per_ip", self.per_ip)
        self.owner[transport] = ip
        self.by_ip.setdefault(ip, set()).add(transport)
        return None

    def release(self, transport: Any) -> None:
        ip = self.owner.pop(transport, None)
        if ip is None:
            return
        peers = self.by_ip.get(ip)
        if peers is not None:
            peers.discard(transport)
            if not peers:
                del self.by_ip[ip]

    def _sweep(self, transports: list[Any]) -> None:
        for t in transports:
            if t.is_closing():
                self.release(t)


def _too_many(limit: str, maximum: int) -> TopicsError:
    return TopicsError(
        503,
        "too_many_connections",
        f"too many open connections (limit {limit}: {maximum}); retry later",
        {"limit": limit, "max": maximum},
    )


def _uri_too_long(limit: int) -> TopicsError:
    return TopicsError(414, "uri_too_long", f"the request target exceeds {limit} bytes")


def _headers_too_large(what: str) -> TopicsError:
    return TopicsError(431, "headers_too_large", f"request headers are too large: {what}")


def _bad_method(method: bytes) -> TopicsError:
    shown = method[:32].decode("ascii", "replace")
    return TopicsError(405, "method_not_allowed", f"{shown} is not allowed here")


def _guards(config: uvicorn.Config) -> Guards:
    g = getattr(config, "topics_guards", None)
    return g if isinstance(g, Guards) else Guards()


def _slots(config: uvicorn.Config) -> ConnectionSlots | None:
    return getattr(config, "topics_slots", None)


def _release_slot(config: uvicorn.Config, transport: Any) -> None:
    slots = _slots(config)
    if slots is not None and transport is not None:
        slots.release(transport)


def _refusal_app(err: TopicsError) -> Any:
    """An ASGI app answering every request with `err` and closing the connection."""
    resp = error_resp(err)
    headers = [
        *resp.headers,
        (b"content-length", b"%d" % len(resp.body)),
        (b"connection", b"close"),
    ]

    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": resp.body})

    return refuse


class _HeadRejected(Exception):
    """Raised from a parser callback: the request head breaks a limit."""

    def __init__(self, err: TopicsError) -> None:
        super().__init__(err.message)
        self.err = err


class _Connection(asyncio.Protocol):
    """What our protocols share: uvicorn's constructor and a one-shot timer."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: Any = None  # uvloop transports are not asyncio.Transport subclasses
        self.timer: asyncio.TimerHandle | None = None
        self.guards = _guards(config)
        # Loop time by which the first request head must be complete (None: no limit).
        self.deadline: float | None = None
        self.refusal: TopicsError | None = None  # over a connection cap: answer this, close

    def _set_timer(self, delay: float | None, callback: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None if delay is None else self.loop.call_later(delay, callback)


class AutoProtocol(_Connection):
    """Per-connection sniffer: HTTP/2 preface -> :class:`H2Protocol`, else :class:`Http1Protocol`.

    uvicorn builds it like its own protocols:
    ``AutoProtocol(config=config, server_state=server_state, app_state=app_state, _loop=loop)``.
    Cleartext only (no TLS / ALPN).  It also takes the connection's slot (or
    notes the refusal the chosen protocol will answer with) and starts the clock
    for the first request head.
    """

    buffer = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        slots = _slots(self.config)
        if slots is not None:
            peer = get_remote_addr(transport)
            self.refusal = slots.acquire(transport, peer[0] if peer else "")
        timeout = self.guards.header_timeout
        if self.refusal is not None:
            timeout = min(timeout or REFUSED_LINGER_S, REFUSED_LINGER_S)
            logger.debug("refusing a connection: %s", self.refusal.message)
        if timeout is None:  # no head timeout: only an idle sniffer is closed
            self._set_timer(self.config.timeout_keep_alive, transport.close)
            return
        self.deadline = self.loop.time() + timeout
        self._set_timer(timeout, transport.close)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data
        if len(buf) < len(H2_PREFACE) and H2_PREFACE.startswith(buf):
            self.buffer = buf  # may still become the h2 preface: wait for more bytes
            return
        self._forget()  # the real protocol registers itself
        cls: type[H2Protocol | Http1Protocol]
        cls = H2Protocol if buf.startswith(H2_PREFACE) else Http1Protocol
        proto = cls(self.config, self.server_state, self.app_state, self.loop)
        proto.deadline = self.deadline
        if self.refusal is not None:
            proto.refuse(self.refusal)
        # Swap *before* feeding: the HTTP/1.1 protocol may swap in a WebSocket
        # protocol while handling these bytes, and that one must win.
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        proto.data_received(buf)

    def _forget(self) -> None:
        self.server_state.connections.discard(self)
        self._set_timer(None, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        _release_slot(self.config, self.transport)

    def shutdown(self) -> None:
        """Graceful shutdown (called by uvicorn): nothing is in flight yet, just close."""
        self.transport.close()


class DirectBody:
    """Writes the next piece of a streamed (chunked) response straight to the socket.

    The long-lived streams (SSE) send many small pieces; going through the ASGI
    `send` costs a coroutine and a message dict per piece, and a publication
    would have to wake each stream's task first. With this object a piece is
    written by whoever produced it, from a plain callback, as one chunk.
    Ask :meth:`writable` first, in the same step: it is False whenever the ASGI
    path has work to do (the response not started or already complete, not
    chunked, a `HEAD` request, the peer gone, or the socket's write buffer above
    its high water mark; the caller then awaits `send`, which waits for the
    drain). Made by :func:`direct_writer` for the HTTP/1.1 protocol only;
    HTTP/2 streams use `send`.
    """

    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    def writable(self) -> bool:
        """True when :meth:`write` may write now."""
        c = self._cycle
        return bool(
            c.response_started
            and c.chunked_encoding
            and not c.response_complete
            and not c.disconnected
            and not c.flow.write_paused
            and c.scope["method"] != "HEAD"
            and not c.transport.is_closing()
        )

    def write(self, body: bytes) -> None:
        """Write `body` (non-empty) as one chunk; :meth:`writable` said yes in this step."""
        self._cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    def pending(self) -> int:
        """Bytes written but not yet taken by the kernel (the transport's buffer)."""
        return int(self._cycle.transport.get_write_buffer_size())

    def full(self) -> bool:
        """True while the socket takes nothing more (the buffer is above its high water)."""
        return bool(self._cycle.flow.write_paused)


class Http1Protocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol with the request-head guards of this module.

    Adds, per connection: the head deadline, URL / header size and count limits,
    canonical JSON error bodies for requests the parser refuses (405 for an
    unknown method token, 400 otherwise), a refusal mode for connections over a
    cap, and the release of the connection slot.
    """

    PREFIX_BYTES = 64  # how much of a request's first line is kept to explain a refusal

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guards = _guards(self.config)
        self.deadline: float | None = None
        self.refusal: TopicsError | None = None
        self.head_timer: asyncio.TimerHandle | None = None
        self.received_at = 0.0  # perf_counter of the last read
        self.in_head = False  # between the first byte of a request and its last header
        self.in_body = False  # between a request's last header and the end of its body
        self.head_bytes = 0  # bytes received for the current head (from the next read on)
        self.begun_in_feed = False
        self.header_bytes = 0
        self.header_count = 0
        # The first bytes of the current request, while we know where it starts.
        self.prefix = bytearray()
        self.at_boundary = True
        self.completed_in_feed = False
        self.begun_after_complete = False

    def refuse(self, err: TopicsError) -> None:
        """Answer the first request with `err` (then close), without running the app."""
        self.refusal = err
        self.app = _refusal_app(err)

    # -- asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        timeout = self.guards.header_timeout
        if self.deadline is not None:
            self._start_head_timer(max(0.0, self.deadline - self.loop.time()))
        elif timeout is not None:
            self._start_head_timer(timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)
        _release_slot(self.config, self.transport)

    def data_received(self, data: bytes) -> None:
        self.received_at = time.perf_counter()
        self._unset_keepalive_if_required()
        timeout = self.guards.header_timeout
        if self.head_timer is None and timeout is not None and self._awaiting_head():
            self._start_head_timer(timeout)
        if self.at_boundary and len(self.prefix) < self.PREFIX_BYTES:
            self.prefix += data[: self.PREFIX_BYTES - len(self.prefix)]
        self.completed_in_feed = self.begun_after_complete = self.begun_in_feed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            self._refuse_request(exc)
            return
        if self.in_head:
            # httptools keeps a header line to itself until it ends: bound it here
            # (to the limits plus one read, since where a head starts within a read
            # is not known).
            self.head_bytes = 0 if self.begun_in_feed else self.head_bytes + len(data)
            g = self.guards
            if self.head_bytes > g.max_url_bytes + g.max_header_bytes + 4096:
                if len(self.url) > g.max_url_bytes or not self.header_count:
                    self._send_error(_uri_too_long(g.max_url_bytes))
                else:
                    self._send_error(_headers_too_large(f"more than {g.max_header_bytes} bytes"))
                return
        if self.completed_in_feed and not self.begun_after_complete:
            self.at_boundary = True  # the next byte starts a new request
            self.prefix = bytearray()

    # -- parser callbacks ---------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        # When the read that began this request arrived (perf_counter s): the app
        # measures how long requests wait for the loop (docs/SCHEDULER.md, "Pressure").
        self.scope[RECEIVED_AT] = self.received_at  # type: ignore[literal-required]
        self.in_head = True
        self.begun_in_feed = True
        self.head_bytes = self.header_bytes = self.header_count = 0
        if self.completed_in_feed:
            self.begun_after_complete = True
        if self.head_timer is None and self.guards.header_timeout is not None:
            self._start_head_timer(self.guards.header_timeout)

    def on_url(self, url: bytes) -> None:
        limit = self.guards.max_url_bytes
        if len(self.url) + len(url) > limit:
            raise _HeadRejected(_uri_too_long(limit))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        g = self.guards
        self.header_count += 1
        self.header_bytes += len(name) + len(value)
        if self.header_count > g.max_headers:
            raise _HeadRejected(_headers_too_large(f"more than {g.max_headers} fields"))
        if self.header_bytes > g.max_header_bytes:
            raise _HeadRejected(_headers_too_large(f"more than {g.max_header_bytes} bytes"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.in_body = True
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.in_body = False
        self.completed_in_feed = True
        self.at_boundary = False
        if (
            self.cycle is not None
            and self.cycle.response_complete
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # Answered before the body was all in (uvicorn armed the keep-alive timer
            # then, and each later read disarmed it): idle from now on.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _should_upgrade(self) -> bool:
        return self.refusal is None and super()._should_upgrade()

    # -- guards -------------------------------------------------------------------
    def _awaiting_head(self) -> bool:
        if self.in_head:
            return True
        return not self.in_body and (self.cycle is None or self.cycle.response_complete)

    def _start_head_timer(self, delay: float) -> None:
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(delay, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            logger.debug("closing a connection: no complete request head in time")
            self.transport.close()

    def _refuse_request(self, exc: httptools.HttpParserError) -> None:
        """Answer a request the parser gave up on with the canonical error, and close."""
        cause = exc.__context__
        if isinstance(cause, _HeadRejected):
            err = cause.err
        elif isinstance(exc, httptools.HttpParserInvalidMethodError):
            err = self._classify_method()
        else:
            err = bad_request(f"malformed HTTP request: {exc}")
        logger.debug("refusing a request: %s", err.message)
        self._send_error(err)

    def _classify_method(self) -> TopicsError:
        """405 for a method that is a token the parser does not know, 400 otherwise."""
        if self.at_boundary:
            line = bytes(self.prefix).lstrip(b"\r\n")
            m = _TOKEN.match(line)
            if m is not None and (m.end() == len(line) or line[m.end()] == 0x20):
                return _bad_method(m.group())
        return bad_request("malformed HTTP request line")

    def _send_error(self, err: TopicsError) -> None:
        """Write `err` as a complete HTTP/1.1 response with `connection: close`, and close."""
        self._cancel_head_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a response is under way: cannot answer in between
            return
        resp = error_resp(err)
        out = [STATUS_LINE[resp.status]]
        for name, value in [*self.server_state.default_headers, *resp.headers]:
            out += [name, b": ", value, b"\r\n"]
        out += [b"content-length: %d\r\n" % len(resp.body), b"connection: close\r\n\r\n"]
        out.append(resp.body)
        self.transport.write(b"".join(out))
        self.transport.close()


def _wake(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class _Stream:
    """One HTTP/2 request/response exchange, seen by the app as ASGI ``receive``/``send``."""

    def __init__(self, proto: H2Protocol, sid: int, scope: dict[str, Any]) -> None:
        self.proto, self.sid, self.scope = proto, sid, scope
        self.chunks: list[bytes] = []
        self.unacked = 0  # flow-controlled bytes received but not yet consumed by the app
        self.more_body = True  # the client has not ended its side yet
        self.body_done = False  # the final http.request message was delivered
        self.disconnected = self.started = self.complete = False
        self.rx: asyncio.Future[None] | None = None  # receive() waiting for data
        self.tx: asyncio.Future[None] | None = None  # send() waiting for flow-control window

    def disconnect(self) -> None:
        self.disconnected = True
        _wake(self.rx)
        _wake(self.tx)

    async def run(self, app: Any) -> None:
        try:
            try:
                await app(self.scope, self.receive, self.send)
            except asyncio.CancelledError:  # e.g. graceful-shutdown timeout
                if not self.complete:
                    self.proto.reset(self.sid, ErrorCodes.CANCEL)
                raise
            except Exception as exc:
                logger.error("Exception in ASGI application\n", exc_info=exc)
            else:
                if self.complete or self.disconnected:
                    return
                verb = "completing" if self.started else "starting"
                logger.error("ASGI callable returned without %s response.", verb)
            if self.started:  # too late for a 500: abort just this stream
                self.proto.reset(self.sid, ErrorCodes.INTERNAL_ERROR)
            else:
                try:
                    await self.send(_500_START)
                    await self.send(_500_BODY)
                except Exception:
                    self.proto.reset(self.sid, ErrorCodes.INTERNAL_ERROR)
        finally:
            self.proto.stream_done(self)

    async def receive(self) -> dict[str, Any]:
        """Request body chunks as DATA arrives, then ``http.disconnect`` once done or gone."""
        while not (self.disconnected or self.complete):
            if self.chunks or (not self.more_body and not self.body_done):
                body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
                self.chunks = []
                self.body_done = not self.more_body
                if self.unacked:  # hand the window back only once the app has the bytes
                    self.proto.ack(self.sid, self.unacked)
                    self.unacked = 0
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            self.rx = self.proto.loop.create_future()
            await self.rx
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        """Headers go out with the first body frame (or on the next loop turn); DATA at once."""
        if self.disconnected:
            return
        kind = message["type"]
        if self.complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )
        expected = "http.response.body" if self.started else "http.response.start"
        if kind != expected:
            raise RuntimeError(f"Expected ASGI message '{expected}', but got '{kind}'.")
        proto = self.proto
        if not self.started:
            self.started = True
            headers = [(b":status", b"%d" % message["status"]), *proto.server_state.default_headers]
            for name, value in message.get("headers", ()):
                if (name := name.lower()) not in HOP_BY_HOP:
                    headers.append((name, value))
            try:
                proto.conn.send_headers(self.sid, headers)
            except h2.exceptions.StreamClosedError:
                self.disconnect()
            proto.schedule_flush()
            return
        more = message.get("more_body", False)
        body = b"" if self.scope["method"] == "HEAD" else message.get("body", b"")
        try:
            await proto.send_data(self, body, end=not more)
        finally:
            if not more:
                self.complete = True
                _wake(self.rx)


class H2Protocol(_Connection):
    """One cleartext HTTP/2 server connection; every stream runs the ASGI app in its own task.

    Same constructor as uvicorn's protocols; normally created by :class:`AutoProtocol`
    once it has seen the connection preface.  A stream whose request head breaks a
    limit of :class:`Guards` (or has a malformed method) is answered with the
    canonical error without running the app; the connection carries on.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app = self.config.loaded_app
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.streams: dict[int, _Stream] = {}
        self.writable = asyncio.Event()  # cleared while the transport buffer is too full
        self.writable.set()
        self.closing = self.flush_scheduled = False

    def refuse(self, err: TopicsError) -> None:
        """Answer the first stream with `err`, then send GOAWAY and close."""
        self.refusal = err
        self.app = _refusal_app(err)

    # -- asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self.server, self.client = get_local_addr(transport), get_remote_addr(transport)
        codes = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                codes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                codes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        # Until the first request arrives the head deadline applies, later the
        # keep-alive timeout whenever no stream is open.
        if self.deadline is not None:
            self._set_timer(max(0.0, self.deadline - self.loop.time()), self.close)
        else:
            self._set_timer(self.config.timeout_keep_alive, self.close)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()  # h2 has queued a GOAWAY describing the error
            self.transport.close()
            return
        for event in events:
            s = self.streams.get(getattr(event, "stream_id", 0))
            if isinstance(event, ev.RequestReceived):
                self._start_stream(event)
            elif isinstance(event, ev.DataReceived):
                if s is None or s.complete or s.disconnected:  # nobody will read it
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                else:
                    s.chunks.append(event.data)
                    s.unacked += event.flow_controlled_length
                    _wake(s.rx)
            elif isinstance(event, ev.StreamEnded) and s is not None:
                s.more_body = False
                _wake(s.rx)
            elif isinstance(event, ev.StreamReset) and s is not None:
                s.disconnect()
            elif isinstance(event, ev.WindowUpdated | ev.RemoteSettingsChanged):
                for t in [s] if s is not None else self.streams.values():
                    _wake(t.tx)
            elif isinstance(event, ev.ConnectionTerminated):
                self.transport.close()  # h2 will not send anything after the peer's GOAWAY
                return
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._set_timer(None, None)
        self.writable.set()
        for s in list(self.streams.values()):
            s.disconnect()
        _release_slot(self.config, self.transport)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def shutdown(self) -> None:
        """Graceful shutdown (called by uvicorn): refuse new streams, GOAWAY + close once idle.

        The GOAWAY is sent only after in-flight streams finish (or the grace period
        ends) because h2-based clients such as httpx abort every open stream as soon
        as they receive one, whatever its last-stream-id.
        """
        if not self.closing:
            self.closing = True
            grace = self.config.timeout_graceful_shutdown
            self._set_timer(SHUTDOWN_GRACE if grace is None else grace, self.close)
            if not self.streams:
                self.close()

    # -- streams -------------------------------------------------------------------
    def _start_stream(self, event: ev.RequestReceived) -> None:
        sid = event.stream_id
        if self.closing:
            self.conn.reset_stream(sid, ErrorCodes.REFUSED_STREAM)  # safe for clients to retry
            return
        self._set_timer(None, None)
        pseudo: dict[bytes, bytes] = {}
        headers: list[tuple[bytes, bytes]] = []
        size = 0
        for name, value in event.headers or ():
            if name[:1] == b":":
                pseudo[name] = value
            else:
                headers.append((name, value))
                size += len(name) + len(value)
        method = pseudo.get(b":method", b"")
        g = self.guards
        app = self.app
        err: TopicsError | None = None
        if _TOKEN.fullmatch(method) is None:
            err = bad_request("malformed HTTP request: the method is not a token")
            method = b"GET"
        elif len(pseudo.get(b":path", b"")) > g.max_url_bytes:
            err = _uri_too_long(g.max_url_bytes)
        elif len(headers) > g.max_headers:
            err = _headers_too_large(f"more than {g.max_headers} fields")
        elif size > g.max_header_bytes:
            err = _headers_too_large(f"more than {g.max_header_bytes} bytes")
        if err is not None and self.refusal is None:
            logger.debug("refusing a stream: %s", err.message)
            app = _refusal_app(err)
        if b":authority" in pseudo and not any(name == b"host" for name, _ in headers):
            headers.insert(0, (b"host", pseudo[b":authority"]))
        raw_path, _, query = pseudo.get(b":path", b"").partition(b"?")
        path = raw_path.decode("latin-1")
        root = self.config.root_path
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": method.decode("ascii"),
            "scheme": "http",
            "path": root + (unquote(path) if "%" in path else path),
            "raw_path": root.encode("ascii") + raw_path,
            "query_string": query,
            "root_path": root,
            "headers": headers,
            "client": self.client,
            "server": self.server,
        }
        if self.app_state is not None:
            scope["state"] = self.app_state.copy()
        stream = self.streams[sid] = _Stream(self, sid, scope)
        context = contextvars.Context() if self.config.reset_contextvars else None
        task = self.loop.create_task(stream.run(app), context=context)
        self.server_state.tasks.add(task)
        task.add_done_callback(self.server_state.tasks.discard)

    def stream_done(self, s: _Stream) -> None:
        """The app task of stream ``s`` has finished, successfully or not."""
        del self.streams[s.sid]
        self.server_state.total_requests += 1
        if s.unacked:
            self.conn.acknowledge_received_data(s.unacked, s.sid)
        if s.complete and s.more_body and not s.disconnected:
            self.reset(s.sid, ErrorCodes.NO_ERROR)  # answered early: client may stop uploading
        s.disconnect()  # late send()/receive() calls become no-ops / disconnects
        self.flush()
        if self.refusal is not None:
            self.close()  # over a connection cap: one answer, then GOAWAY
            return
        if self.streams or self.transport.is_closing():
            return
        if self.closing:
            self.close()
        else:
            self._set_timer(self.config.timeout_keep_alive, self.close)

    async def send_data(self, s: _Stream, data: bytes, end: bool) -> None:
        """Write ``data`` on stream ``s`` now, honouring transport backpressure and h2 windows."""
        conn, offset = self.conn, 0
        while not s.disconnected:
            if not self.writable.is_set():
                await self.writable.wait()  # only this connection's streams wait for its reader
                continue
            try:
                window = min(conn.local_flow_control_window(s.sid), conn.max_outbound_frame_size)
                if len(data) - offset <= window:
                    conn.send_data(s.sid, data[offset:] if offset else data, end_stream=end)
                    self.flush()
                    return
                if window > 0:
                    conn.send_data(s.sid, data[offset : offset + window])
                    offset += window
                    self.flush()
                    continue
            except h2.exceptions.StreamClosedError:
                s.disconnect()
                return
            s.tx = self.loop.create_future()
            await s.tx  # woken by WINDOW_UPDATE, SETTINGS, reset or connection loss

    def ack(self, sid: int, size: int) -> None:
        """Give ``size`` consumed bytes back to the peer's send windows."""
        self.conn.acknowledge_received_data(size, sid)
        self.schedule_flush()

    def reset(self, sid: int, code: ErrorCodes) -> None:
        """Send RST_STREAM unless the stream is already closed."""
        try:
            self.conn.reset_stream(sid, code)
        except h2.exceptions.H2Error:
            pass
        self.flush()

    def flush(self) -> None:
        """Write whatever h2 has queued straight to the transport."""
        if (data := self.conn.data_to_send()) and not self.transport.is_closing():
            self.transport.write(data)

    def schedule_flush(self) -> None:
        """Flush on the next loop turn, so response headers share a write with the first DATA."""
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self.flush_scheduled = False
        self.flush()

    def close(self) -> None:
        """Send GOAWAY and close the transport (streams still running see a disconnect)."""
        self._set_timer(None, None)
        if not self.transport.is_closing():
            try:
                self.conn.close_connection()
            except h2.exceptions.H2Error:
                pass
            self.flush()
            self.transport.close()


class DirectWs:
    """Writes text messages straight to a WebSocket, without the ASGI `send`.

    The WebSocket counterpart of :class:`DirectBody`: :meth:`write` frames the
    messages (JSON bytes, sent as text without a decode/encode round trip) and
    writes them in one call. :meth:`writable` is False before the handshake is
    complete, once a close was sent or the peer left, and while the socket's
    write buffer is above its high water mark.
    """

    __slots__ = ("_proto",)

    def __init__(self, proto: WebSocketsSansIOProtocol) -> None:
        self._proto = proto

    def writable(self) -> bool:
        """True when :meth:`write` may write now."""
        p = self._proto
        if p.close_sent or p.disconnected or p.initial_response is not None:
            return False  # closing, gone, or the upgrade was answered with HTTP
        return bool(p.handshake_complete) and p.writable.is_set() and not p.transport.is_closing()

    def write(self, *messages: bytes) -> None:
        """Send each of `messages` as a text message; :meth:`writable` said yes in this step."""
        conn = self._proto.conn
        for m in messages:
            conn.send_text(m)
        self._proto.transport.write(b"".join(conn.data_to_send()))


def direct_writer(send: Any) -> DirectBody | DirectWs | None:
    """The direct writer behind an ASGI `send` of this module's protocols.

    uvicorn hands the app the bound `send` of the request's cycle (HTTP/1.1) or
    of the WebSocket protocol: its owner is the connection the writer writes
    to. None for anything else (HTTP/2 streams, a test transport, a `send`
    wrapped by middleware), whose callers keep to `send`.
    """
    owner = getattr(send, "__self__", None)
    if isinstance(owner, RequestResponseCycle):
        return DirectBody(owner)
    if isinstance(owner, WebSocketsSansIOProtocol):
        return DirectWs(owner)
    return None


class WSProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, with oversized messages dropped unread.

    Incoming frames are scanned (headers only) before the ``websockets`` parser
    sees them.  A data message growing past ``ws_max_size`` bytes is not buffered:
    its frames are skipped as they arrive, and once its last frame has gone by the
    app receives ``{"type": "websocket.receive", "text": None, "bytes": None,
    "topics.oversized": <bytes seen>, "topics.limit": <limit>}`` so it can answer
    with an error message; the connection stays open (docs/HTTP_INPUT.md
    "WebSocket").  Anything the scan does not expect (reserved bits, unmasked or
    malformed frames) is handed to ``websockets`` unchanged, which closes the
    connection with the protocol error as before.
    """

    # A final, empty, masked continuation frame: ends a message cut short.
    _END_FRAGMENT = b"\x80\x80\x00\x00\x00\x00"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit: int = self.config.ws_max_size
        self.handshake_fed = False  # the first data is the (re-encoded) upgrade request
        self.passthrough = False  # give up scanning: hand every byte to websockets
        self.fhead = bytearray()  # a frame header that is still incomplete
        self.remaining = 0  # payload bytes of the current frame still to come
        self.forwarding = True  # whether they go to websockets
        self.msg_size: int | None = None  # bytes of the data message in progress
        self.dropping = False  # the message in progress is being skipped
        self.notify_after = False  # report the skipped message once this frame ends
        self.swallow_next = False  # websockets will deliver a cut-short message: drop it

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        _release_slot(self.config, self.transport)

    def data_received(self, data: bytes) -> None:
        if self.passthrough or not self.handshake_fed:
            self.handshake_fed = True
            super().data_received(data)
            return
        mv = memoryview(data)
        out: list[bytes | memoryview] = []
        i, n = 0, len(data)
        while i < n:
            if self.remaining:
                take = min(self.remaining, n - i)
                if self.forwarding:
                    out.append(mv[i : i + take])
                i += take
                self.remaining -= take
                if not self.remaining and self.notify_after:
                    self._flush(out)
                    self._notify_oversized()
                continue
            need = self._header_size()
            take = min(need - len(self.fhead), n - i)
            self.fhead += mv[i : i + take]
            i += take
            if len(self.fhead) < need or need == 2 and self._header_size() > 2:
                continue
            if not self._frame(out):
                out.append(mv[i:])  # unexpected: websockets decides (and fails the connection)
                self.passthrough = True
                break
            if not self.remaining and self.notify_after:
                self._flush(out)
                self._notify_oversized()
        self._flush(out)

    def _header_size(self) -> int:
        h = self.fhead
        if len(h) < 2:
            return 2
        n = h[1] & 0x7F
        return 2 + (2 if n == 126 else 8 if n == 127 else 0) + (4 if h[1] & 0x80 else 0)

    def _frame(self, out: list[bytes | memoryview]) -> bool:
        """Decide what happens to the frame whose header is in ``fhead``; False: give up."""
        h = self.fhead
        fin, rsv, opcode, masked = h[0] & 0x80, h[0] & 0x70, h[0] & 0x0F, h[1] & 0x80
        n = h[1] & 0x7F
        length = int.from_bytes(h[2:4]) if n == 126 else int.from_bytes(h[2:10]) if n == 127 else n
        if rsv or not masked or opcode in (3, 4, 5, 6, 7) or opcode > 10 or length >= 1 << 63:
            out.append(bytes(h))
            return False
        head = bytes(h)
        h.clear()
        self.remaining = length
        forward = True
        if opcode >= 8:  # control frame: websockets checks it
            pass
        elif opcode in (1, 2):  # a new message
            if self.msg_size is not None:
                out.append(head)
                return False
            self.msg_size = length
            forward = length <= self.limit
            self.dropping = not forward
        else:  # continuation
            if self.msg_size is None:
                out.append(head)
                return False
            self.msg_size += length
            if self.dropping:
                forward = False
            elif self.msg_size > self.limit:
                # websockets holds the start of this message: end it, and drop it.
                out.append(self._END_FRAGMENT)
                self.swallow_next = True
                self.dropping = True
                forward = False
        if forward:
            out.append(head)
        self.forwarding = forward
        if opcode < 8 and fin:
            self.notify_after = self.dropping
            if not self.dropping:
                self.msg_size = None
        return True

    def _flush(self, out: list[bytes | memoryview]) -> None:
        if out and not self.transport.is_closing():
            super().data_received(b"".join(out))
        out.clear()

    def _notify_oversized(self) -> None:
        size, self.msg_size = self.msg_size or 0, None
        self.dropping = self.notify_after = False
        if self.close_sent or self.transport.is_closing():
            return
        notice: Any = {
            "type": "websocket.receive",
            "text": None,
            "bytes": None,
            "topics.oversized": size,
            "topics.limit": self.limit,
        }
        self.queue.put_nowait(notice)
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def send_receive_event_to_app(self) -> None:
        if self.swallow_next:
            self.swallow_next = False
            self.frames = []
            return
        super().send_receive_event_to_app()


def guards_for(app: Any) -> Guards:
    """The :class:`Guards` of a :class:`~topics.http.app.TopicsApp` (from its config).

    ``TOPICS_HTTP_HEADER_TIMEOUT_MS`` (0 = none), ``TOPICS_MAX_CONNECTIONS``,
    ``TOPICS_MAX_CONNECTIONS_PER_IP`` (0 = no cap); WebSocket messages share the
    body limit ``TOPICS_MAX_BODY_BYTES`` (64 MiB when that is off).  Any other
    app gets the defaults.
    """
    cfg = getattr(app, "config", None)
    limits = getattr(cfg, "limits", None)
    if cfg is None or limits is None:
        return Guards()
    timeout_ms = getattr(cfg, "http_header_timeout_ms", HEADER_TIMEOUT_MS)
    return Guards(
        header_timeout=timeout_ms / 1000 if timeout_ms else None,
        max_connections=getattr(cfg, "max_connections", MAX_CONNECTIONS),
        max_connections_per_ip=getattr(cfg, "max_connections_per_ip", MAX_CONNECTIONS_PER_IP),
        ws_max_message=getattr(limits, "max_body_bytes", 0) or WS_MAX_MESSAGE,
    )


def build_config(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    guards: Guards | None = None,
    **extra: Any,
) -> uvicorn.Config:
    """The uvicorn Config for the topics HTTP server; ``extra`` overrides any option.

    ``guards`` defaults to :func:`guards_for(app) <guards_for>`; the protocols
    read it (and the shared :class:`ConnectionSlots`) from the config.
    """
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover
        loop = "asyncio"
    g = guards or guards_for(app)
    options: dict[str, Any] = {
        "loop": loop,
        "http": AutoProtocol,
        "ws": WSProtocol,
        "ws_max_size": g.ws_max_message,
        # Compressed frames would hide a message's size until inflated.
        "ws_per_message_deflate": False,
        "lifespan": "on",
        "interface": "asgi3",  # don't let uvicorn guess (a callable object may look like ASGI2)
        "access_log": False,
        "server_header": False,
        "date_header": True,
        "proxy_headers": False,  # no per-request X-Forwarded-* middleware
        "timeout_keep_alive": 75,
        "timeout_graceful_shutdown": 5,  # then still-running tasks (e.g. SSE) are cancelled
    }
    options.update(extra)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, **options)
    config.topics_guards = g  # type: ignore[attr-defined]
    slots = None
    if g.max_connections or g.max_connections_per_ip:
        slots = ConnectionSlots(g.max_connections, g.max_connections_per_ip)
    config.topics_slots = slots  # type: ignore[attr-defined]
    return config


def _raise_open_files_limit(connections: int) -> None:
    """Let the process hold `connections` sockets plus its files, if the hard limit allows."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 1024
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= want:
        return
    new = want if hard == inf else min(hard, want)
    if new > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):  # pragma: no cover
            return
    if new < want:
        logger.warning(
            "open-file limit %d is below TOPICS_MAX_CONNECTIONS=%d: connections past it "
            "will fail to be accepted",
            new,
            connections,
        )


class ServerHandle:
    """A listening uvicorn server on the current event loop: ``host``, ``port``, ``stop()``."""

    def __init__(self, server: uvicorn.Server) -> None:
        self.server = server
        self.host, self.port = server.servers[0].sockets[0].getsockname()[:2]
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        await self.server.main_loop()  # ticks every 0.1 s: date header, should_exit
        await self.server.shutdown()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), run lifespan shutdown.

        An app with a ``begin_shutdown()`` method is told first, so its open streams
        can send their closing frames before uvicorn waits for connections to end.
        """
        begin = getattr(self.server.config.app, "begin_shutdown", None)
        if callable(begin):
            begin()
        self.server.should_exit = True
        await self._task


async def start_server(
    app: Any, host: str, port: int, *, sockets: list[socket.socket] | None = None, **kw: Any
) -> ServerHandle:
    """Start serving ``app`` on the running loop and return once the socket is listening.

    ``port=0`` binds an ephemeral port (read ``handle.port``); ``kw`` goes to
    :func:`build_config`.  ``sockets``, when given, are already bound and
    listening TCP sockets to serve on instead of binding ``host:port`` (the
    caller reports bind errors itself; ``handle.port`` is the first one's).
    uvicorn's signal handlers are *not* installed: the caller owns process
    signals and calls ``stop()``.
    """
    config = build_config(app, host, port, **kw)
    guards = _guards(config)
    if guards.max_connections:
        _raise_open_files_limit(guards.max_connections)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    try:
        await server.startup(sockets=sockets)
    except SystemExit as exc:  # uvicorn exits on bind or lifespan-startup failure
        raise RuntimeError(
            f"HTTP server failed to start on {host}:{port} (exit code {exc.code})"
        ) from None
    await server.on_tick(0)  # fill in the date header before the first request
    return ServerHandle(server)
