"""Serve the ASGI app over HTTP/1.1, WebSocket and cleartext HTTP/2 on one port.

uvicorn (uvloop + httptools) handles HTTP/1.1 and WebSocket upgrades; it is the
fastest stack measured for single-connection latency.  uvicorn has no usable
HTTP/2, so :class:`AutoProtocol` sniffs the first bytes of every connection:
the HTTP/2 connection preface (prior-knowledge "h2c", no Upgrade dance) hands
the connection to :class:`H2Protocol`, a small ``h2``-based HTTP/2 -> ASGI
bridge; anything else goes to uvicorn's own HTTP/1.1 protocol.  Either way the
chosen protocol replaces the sniffer with ``transport.set_protocol`` so there
is no per-call delegation afterwards.

:func:`start_server` runs uvicorn inside the *current* event loop (the engine
lives there too) and returns a :class:`ServerHandle` with the bound port and an
awaitable graceful ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import uvicorn
import uvicorn.config
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from uvicorn.server import ServerState

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Http1Protocol
except ImportError:  # pragma: no cover - httptools is a hard dependency
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Http1Protocol  # type: ignore[assignment]

__all__ = ["AutoProtocol", "H2Protocol", "ServerHandle", "build_config", "start_server"]

logger = logging.getLogger("uvicorn.error")

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# RFC 9113 8.2.2: connection-specific headers must not appear in HTTP/2.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
STREAM_WINDOW = 256 * 1024  # per-stream receive window we advertise
CONNECTION_WINDOW = 1024 * 1024  # connection-level receive window
MAX_CONCURRENT_STREAMS = 128
SHUTDOWN_GRACE = 5.0  # seconds in-flight h2 streams get after GOAWAY (if no graceful timeout)
_500_HEADERS = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")]


class AutoProtocol(asyncio.Protocol):
    """Per-connection sniffer: HTTP/2 preface -> :class:`H2Protocol`, else uvicorn HTTP/1.1.

    Constructed by uvicorn exactly like its own protocols:
    ``AutoProtocol(config=..., server_state=..., app_state=..., _loop=...)``.
    Cleartext only (no TLS/ALPN).
    """

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
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self.timer = self.loop.call_later(self.config.timeout_keep_alive, transport.close)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data
        if len(buf) < len(H2_PREFACE) and H2_PREFACE.startswith(buf):
            self.buffer = buf  # could still be the h2 preface: wait for more
            return
        self._forget()
        cls = H2Protocol if buf.startswith(H2_PREFACE) else _Http1Protocol
        proto = cls(  # type: ignore[call-arg]
            config=self.config,
            server_state=self.server_state,
            app_state=self.app_state,
            _loop=self.loop,
        )
        transport = self.transport
        assert transport is not None
        # Swap first: the HTTP/1.1 protocol may itself swap in a WebSocket protocol
        # while handling the bytes below, and that must win.
        transport.set_protocol(proto)
        proto.connection_made(transport)
        proto.data_received(buf)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def shutdown(self) -> None:
        """Called by uvicorn on graceful shutdown: nothing in flight yet, just close."""
        if self.transport is not None:
            self.transport.close()

    def _forget(self) -> None:
        self.server_state.connections.discard(self)  # type: ignore[arg-type]
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _wake(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class _Stream:
    """One HTTP/2 request/response exchange, exposed to the app as ASGI receive/send."""

    def __init__(self, proto: H2Protocol, stream_id: int, scope: dict[str, Any]) -> None:
        self.proto = proto
        self.sid = stream_id
        self.scope = scope
        self.chunks: list[bytes] = []
        self.unacked = 0  # flow-controlled bytes received but not yet handed to the app
        self.more_body = True  # client has not ended its side yet
        self.body_done = False  # final http.request message delivered
        self.disconnected = False
        self.started = False
        self.complete = False
        self.rx: asyncio.Future[None] | None = None  # receive() waiting for data
        self.tx: asyncio.Future[None] | None = None  # send() waiting for window

    def disconnect(self) -> None:
        self.disconnected = True
        _wake(self.rx)
        _wake(self.tx)

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:  # e.g. graceful-shutdown timeout
            if not self.complete:
                self.proto.reset(self.sid, ErrorCodes.CANCEL)
            raise
        except Exception as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._send_500()
            elif not self.complete:
                self.proto.reset(self.sid, ErrorCodes.INTERNAL_ERROR)
        else:
            if not self.started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.proto.reset(self.sid, ErrorCodes.INTERNAL_ERROR)
        finally:
            self.proto.stream_done(self)

    async def _send_500(self) -> None:
        try:
            await self.send({"type": "http.response.start", "status": 500, "headers": _500_HEADERS})
            await self.send({"type": "http.response.body", "body": b"Internal Server Error"})
        except Exception:
            self.proto.reset(self.sid, ErrorCodes.INTERNAL_ERROR)

    async def receive(self) -> dict[str, Any]:
        """ASGI receive: request body chunks, then ``http.disconnect`` once done or gone."""
        while True:
            if self.disconnected or self.complete:
                return {"type": "http.disconnect"}
            if self.chunks or (not self.more_body and not self.body_done):
                body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
                self.chunks = []
                self.body_done = not self.more_body
                if self.unacked:
                    self.proto.ack(self.sid, self.unacked)
                    self.unacked = 0
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            self.rx = self.proto.loop.create_future()
            await self.rx

    async def send(self, message: dict[str, Any]) -> None:
        """ASGI send: headers are flushed with the first body frame (or on the next loop turn)."""
        if self.disconnected:
            return
        kind = message["type"]
        proto = self.proto
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            headers = [(b":status", b"%d" % message["status"]), *proto.server_state.default_headers]
            for name, value in message.get("headers", ()):
                name = name.lower()
                if name not in HOP_BY_HOP:
                    headers.append((name, value))
            self.started = True
            try:
                proto.conn.send_headers(self.sid, headers)
            except h2.exceptions.StreamClosedError:
                self.disconnect()
                return
            proto.schedule_flush()
        elif not self.complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                body = b""
            try:
                await proto.send_data(self, body, end=not more)
            finally:
                if not more:
                    self.complete = True
                    _wake(self.rx)
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )


class H2Protocol(asyncio.Protocol):
    """Cleartext HTTP/2 server connection bridging each stream to an ASGI app task.

    Same constructor as uvicorn's protocols; normally created by :class:`AutoProtocol`
    after it has seen the connection preface.
    """

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
        self.app = config.loaded_app
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.streams: dict[int, _Stream] = {}
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.writable = asyncio.Event()
        self.writable.set()
        self.closing = False
        self.flush_scheduled = False
        self.timer: asyncio.TimerHandle | None = None  # idle keep-alive or shutdown grace

    # -- asyncio.Protocol -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self.server = get_local_addr(transport)
        self.client = get_remote_addr(transport)
        Setting = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                Setting.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._arm_idle()
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()  # h2 has queued a GOAWAY
            self.transport.close()
            return
        E = h2.events
        for ev in events:
            if isinstance(ev, E.RequestReceived):
                self._on_request(ev)
            elif isinstance(ev, E.DataReceived):
                s = self.streams.get(ev.stream_id)
                if s is None or s.complete or s.disconnected:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                else:
                    s.chunks.append(ev.data)
                    s.unacked += ev.flow_controlled_length
                    _wake(s.rx)
            elif isinstance(ev, E.StreamEnded):
                if (s := self.streams.get(ev.stream_id)) is not None:
                    s.more_body = False
                    _wake(s.rx)
            elif isinstance(ev, E.StreamReset):
                if (s := self.streams.get(ev.stream_id)) is not None:
                    s.disconnect()
            elif isinstance(ev, E.WindowUpdated) and ev.stream_id:
                if (s := self.streams.get(ev.stream_id)) is not None:
                    _wake(s.tx)
            elif isinstance(ev, E.WindowUpdated | E.RemoteSettingsChanged):
                for s in self.streams.values():
                    _wake(s.tx)
            elif isinstance(ev, E.ConnectionTerminated):
                self.flush()
                self.transport.close()  # h2 can send nothing more after a GOAWAY
                return
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)  # type: ignore[arg-type]
        self._cancel_timer()
        self.writable.set()
        for s in list(self.streams.values()):
            s.disconnect()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def shutdown(self) -> None:
        """Graceful shutdown (called by uvicorn): GOAWAY now, close once streams finish."""
        if self.closing:
            return
        self.closing = True
        self.flush()
        if not self.transport.is_closing():
            # Written by hand: after h2's close_connection() it refuses to send anything,
            # but in-flight streams must still be able to finish.
            last = self.conn.highest_inbound_stream_id
            self.transport.write(GoAwayFrame(0, last_stream_id=last).serialize())
        if not self.streams:
            self.close()
        else:
            self._cancel_timer()
            grace = self.config.timeout_graceful_shutdown
            self.timer = self.loop.call_later(
                SHUTDOWN_GRACE if grace is None else grace, self.close
            )

    # -- stream plumbing ----------------------------------------------------------
    def _on_request(self, ev: h2.events.RequestReceived) -> None:
        sid = ev.stream_id
        if self.closing:
            self.conn.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        self._cancel_timer()
        method = path = authority = b""
        headers: list[tuple[bytes, bytes]] = []
        has_host = False
        for name, value in ev.headers or ():
            if name[:1] == b":":
                if name == b":method":
                    method = value
                elif name == b":path":
                    path = value
                elif name == b":authority":
                    authority = value
            else:
                has_host = has_host or name == b"host"
                headers.append((name, value))
        if authority and not has_host:
            headers.insert(0, (b"host", authority))
        raw_path, _, query = path.partition(b"?")
        text_path = raw_path.decode("latin-1")
        if "%" in text_path:
            text_path = unquote(text_path)
        root = self.config.root_path
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": method.decode("ascii"),
            "scheme": "http",
            "path": root + text_path,
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
        coro = stream.run(self.app)
        if self.config.reset_contextvars:
            task = self.loop.create_task(coro, context=contextvars.Context())
        else:
            task = self.loop.create_task(coro)
        self.server_state.tasks.add(task)
        task.add_done_callback(self.server_state.tasks.discard)

    def stream_done(self, s: _Stream) -> None:
        """The app task of stream ``s`` has finished (successfully or not)."""
        self.streams.pop(s.sid, None)
        self.server_state.total_requests += 1
        if s.unacked:
            self.ack(s.sid, s.unacked)
            s.unacked = 0
        if s.complete and s.more_body and not s.disconnected:
            # Full response sent before the request body ended: ask the client to stop.
            self.reset(s.sid, ErrorCodes.NO_ERROR)
        s.disconnect()
        self.flush()
        if not self.streams:
            if self.closing:
                self.close()
            else:
                self._arm_idle()

    async def send_data(self, s: _Stream, data: bytes, end: bool) -> None:
        """Send ``data`` on stream ``s`` honouring transport backpressure and h2 windows."""
        conn = self.conn
        offset, total = 0, len(data)
        while not s.disconnected:
            if not self.writable.is_set():
                await self.writable.wait()  # this connection's reader is slow
                continue
            try:
                window = min(conn.local_flow_control_window(s.sid), conn.max_outbound_frame_size)
                if total - offset <= window:
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
            await s.tx  # WINDOW_UPDATE, reset or connection loss wakes us

    def ack(self, stream_id: int, size: int) -> None:
        """Return ``size`` consumed bytes to the peer's send window."""
        self.conn.acknowledge_received_data(size, stream_id)
        self.schedule_flush()

    def reset(self, stream_id: int, code: ErrorCodes) -> None:
        """Send RST_STREAM, ignoring streams that are already closed."""
        try:
            self.conn.reset_stream(stream_id, code)
        except h2.exceptions.H2Error:
            pass
        self.flush()

    def flush(self) -> None:
        """Write whatever h2 has queued to the transport right away."""
        data = self.conn.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def schedule_flush(self) -> None:
        """Flush on the next loop turn, so headers + first body frame go out in one write."""
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self.flush_scheduled = False
        self.flush()

    def close(self) -> None:
        """Send a final GOAWAY and close the transport."""
        self._cancel_timer()
        if self.transport.is_closing():
            return
        try:
            self.conn.close_connection()
        except h2.exceptions.H2Error:
            pass
        self.flush()
        self.transport.close()

    def _arm_idle(self) -> None:
        self._cancel_timer()
        self.timer = self.loop.call_later(self.config.timeout_keep_alive, self.close)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def build_config(
    app: Any, host: str, port: int, *, log_level: str = "warning", **extra: Any
) -> uvicorn.Config:
    """uvicorn Config for the topics HTTP server; ``extra`` overrides any option."""
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover
        loop = "asyncio"
    ws = "websockets-sansio" if "websockets-sansio" in uvicorn.config.WS_PROTOCOLS else "websockets"
    options: dict[str, Any] = {
        "loop": loop,
        "http": AutoProtocol,
        "ws": ws,
        "lifespan": "on",
        "interface": "asgi3",  # never guess (a callable object could be taken for ASGI2)
        "access_log": False,
        "server_header": False,
        "date_header": True,
        "proxy_headers": False,  # no per-request X-Forwarded-* middleware
        "timeout_keep_alive": 75,
        "timeout_graceful_shutdown": 5,  # then in-flight tasks (e.g. SSE) are cancelled
    }
    options.update(extra)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, **options)


class ServerHandle:
    """A started uvicorn server living on the current event loop."""

    def __init__(self, server: uvicorn.Server) -> None:
        self.server = server
        sock = server.servers[0].sockets[0]
        self.host: str = sock.getsockname()[0]
        self.port: int = sock.getsockname()[1]
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        await self.server.main_loop()  # ticks every 0.1 s (date header, exit flag)
        await self.server.shutdown()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), run lifespan shutdown."""
        self.server.should_exit = True
        await self._task


async def start_server(app: Any, host: str, port: int, **kw: Any) -> ServerHandle:
    """Start serving ``app`` on the running loop; returns once the socket is listening.

    ``port=0`` binds an ephemeral port (see ``handle.port``).  ``kw`` goes to
    :func:`build_config`.  uvicorn's signal handlers are *not* installed: the
    caller owns process signals and calls ``stop()``.
    """
    config = build_config(app, host, port, **kw)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    try:
        await server.startup()
    except SystemExit as exc:  # uvicorn exits on bind / lifespan startup failure
        raise RuntimeError(
            f"HTTP server failed to start on {host}:{port} (exit {exc.code})"
        ) from None
    await server.on_tick(0)  # populate the date header before the first request
    return ServerHandle(server)
