"""Serve the ASGI app over HTTP/1.1, WebSocket and cleartext HTTP/2 on one port.

uvicorn (uvloop + httptools) handles HTTP/1.1 and WebSocket upgrades: it is the
fastest stack measured for single-connection latency, but it has no usable
HTTP/2.  :class:`AutoProtocol` therefore sniffs the first bytes of every
connection: the HTTP/2 connection preface (prior-knowledge "h2c", no Upgrade)
hands the connection to :class:`H2Protocol`, a small ``h2``-based HTTP/2 ->
ASGI bridge; anything else goes to uvicorn's own HTTP/1.1 protocol.  Either way
the chosen protocol replaces the sniffer via ``transport.set_protocol``, so
there is no per-call delegation afterwards.

:func:`start_server` runs uvicorn inside the *current* event loop (the engine
lives there too) and returns a :class:`ServerHandle` with the bound port and an
awaitable graceful ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events as ev
import h2.exceptions
import h2.settings
import uvicorn
import uvicorn.config
from h2.errors import ErrorCodes
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from uvicorn.server import ServerState

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Http1Protocol
except ImportError:  # pragma: no cover - httptools is a declared dependency
    from uvicorn.protocols.http.h11_impl import H11Protocol as Http1Protocol  # type: ignore[assignment]

__all__ = ["AutoProtocol", "H2Protocol", "ServerHandle", "build_config", "start_server"]

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

    def _set_timer(self, delay: float | None, callback: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None if delay is None else self.loop.call_later(delay, callback)


class AutoProtocol(_Connection):
    """Per-connection sniffer: HTTP/2 preface -> :class:`H2Protocol`, else uvicorn HTTP/1.1.

    uvicorn builds it like its own protocols:
    ``AutoProtocol(config=config, server_state=server_state, app_state=app_state, _loop=loop)``.
    Cleartext only (no TLS / ALPN).
    """

    buffer = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self._set_timer(self.config.timeout_keep_alive, transport.close)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data
        if len(buf) < len(H2_PREFACE) and H2_PREFACE.startswith(buf):
            self.buffer = buf  # may still become the h2 preface: wait for more bytes
            return
        self.connection_lost(None)  # forget the sniffer; the real protocol registers itself
        cls = H2Protocol if buf.startswith(H2_PREFACE) else Http1Protocol
        proto = cls(self.config, self.server_state, self.app_state, self.loop)
        # Swap *before* feeding: the HTTP/1.1 protocol may swap in a WebSocket
        # protocol while handling these bytes, and that one must win.
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        proto.data_received(buf)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)  # type: ignore[arg-type]
        self._set_timer(None, None)

    def shutdown(self) -> None:
        """Graceful shutdown (called by uvicorn): nothing is in flight yet, just close."""
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
    once it has seen the connection preface.
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
        self.server_state.connections.discard(self)  # type: ignore[arg-type]
        self._set_timer(None, None)
        self.writable.set()
        for s in list(self.streams.values()):
            s.disconnect()

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
        for name, value in event.headers or ():
            if name[:1] == b":":
                pseudo[name] = value
            else:
                headers.append((name, value))
        if b":authority" in pseudo and not any(name == b"host" for name, _ in headers):
            headers.insert(0, (b"host", pseudo[b":authority"]))
        raw_path, _, query = pseudo.get(b":path", b"").partition(b"?")
        path = raw_path.decode("latin-1")
        root = self.config.root_path
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": pseudo.get(b":method", b"").decode("ascii"),
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
        task = self.loop.create_task(stream.run(self.app), context=context)
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


def build_config(
    app: Any, host: str, port: int, *, log_level: str = "warning", **extra: Any
) -> uvicorn.Config:
    """The uvicorn Config for the topics HTTP server; ``extra`` overrides any option."""
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover
        loop = "asyncio"
    options: dict[str, Any] = {
        "loop": loop,
        "http": AutoProtocol,
        # websockets' sans-I/O implementation where uvicorn has it (0.35+).
        "ws": "websockets-sansio"
        if "websockets-sansio" in uvicorn.config.WS_PROTOCOLS
        else "websockets",
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
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, **options)


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
