"""Real-socket tests for topics.http.server: HTTP/1.1, h2c prior knowledge and WebSocket on one port."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import orjson
import pytest
import uvloop
import websockets.asyncio.client

from topics.http.server import H2Protocol, ServerHandle, start_server

BIG_SIZE = 3 * 1024 * 1024
MAX_WINDOW = 2**31 - 1


class State:
    """What the toy app saw, for assertions."""

    def __init__(self) -> None:
        self.chunks_sent = 0
        self.disconnected = asyncio.Event()
        self.lifespan: list[str] = []


def make_app(state: State) -> Callable[..., Awaitable[None]]:
    async def read_body(receive: Any) -> bytes:
        body = bytearray()
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                return bytes(body)

    async def respond(
        send: Any, status: int, body: bytes, ctype: bytes = b"application/json"
    ) -> None:
        headers = [(b"content-type", ctype), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                state.lifespan.append(msg["type"])
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            while (msg := await receive())["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": "echo:" + msg["text"]})
            return
        path, query = scope["path"], scope["query_string"].decode()
        if path.startswith("/echo"):
            body = await read_body(receive)
            if query.startswith("delay="):
                await asyncio.sleep(float(query[6:]))
            out = {
                "json": orjson.loads(body) if body else None,
                "http_version": scope["http_version"],
                "client_port": scope["client"][1],
                "path": scope["path"],
                "host": dict(scope["headers"]).get(b"host", b"").decode(),
            }
            await respond(send, 200, orjson.dumps(out))
        elif path == "/upload":
            body = await read_body(receive)
            out = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            await respond(send, 200, orjson.dumps(out))
        elif path == "/big":
            size = int(query.removeprefix("mb=")) << 20 if query else BIG_SIZE
            await respond(send, 200, b"x" * size, b"application/octet-stream")
        elif path == "/stream":
            n = int(query.removeprefix("n=") or "5")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(n):
                state.chunks_sent += 1
                await send(
                    {"type": "http.response.body", "body": b"chunk%d\n" % i, "more_body": True}
                )
                await asyncio.sleep(0.02)
            await send({"type": "http.response.body", "body": b""})
        elif path == "/watch":  # SSE-like: one frame, then wait for the client to go away
            await read_body(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"data: hi\n\n", "more_body": True})
            assert (await receive())["type"] == "http.disconnect"
            state.disconnected.set()
        elif path == "/boom":
            raise RuntimeError("boom from the app")
        else:
            await respond(send, 404, b"{}")

    return app


def run(test: Callable[[ServerHandle, State], Awaitable[None]], loop: str = "uvloop") -> None:
    """Run ``test(handle, state)`` against a fresh server on a fresh event loop."""

    async def main() -> None:
        state = State()
        handle = await start_server(make_app(state), "127.0.0.1", 0)
        try:
            await asyncio.wait_for(test(handle, state), 8)
        finally:
            await handle.stop()
        assert state.lifespan == ["lifespan.startup", "lifespan.shutdown"]
        assert not handle.server.server_state.connections

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def h2_client(handle: ServerHandle) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{handle.port}", http1=False, http2=True)


class RawH2:
    """Minimal h2 client over a raw socket, for resets and connection drops."""

    async def open(self, port: int, huge_window: bool = False) -> RawH2:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
        if huge_window:  # let the server send without waiting for WINDOW_UPDATEs
            initial = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: MAX_WINDOW}
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=initial)
        self.conn.initiate_connection()
        if huge_window:
            self.conn.increment_flow_control_window(MAX_WINDOW - 65535)
        self.flush()
        return self

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def request(self, path: bytes, port: int) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(b":method", b"GET"), (b":path", path), (b":scheme", b"http")]
        self.conn.send_headers(
            sid, [*headers, (b":authority", b"127.0.0.1:%d" % port)], end_stream=True
        )
        self.flush()
        return sid

    async def until(self, sid: int, kind: type) -> list[Any]:
        seen: list[Any] = []
        while not any(isinstance(e, kind) and e.stream_id == sid for e in seen):
            data = await self.reader.read(65536)
            assert data, "server closed the connection"
            seen += self.conn.receive_data(data)
            self.flush()
        return seen


@pytest.mark.timeout(15)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_http11_keepalive_and_h2c_on_same_port(loop: str) -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        payload = {"key": "k1", "value": "hello world", "n": 42}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{handle.port}") as c:
            r1 = await c.post("/echo", json=payload)
            r2 = await c.post("/echo", json=payload)
        assert r1.http_version == "HTTP/1.1" and r1.status_code == 200
        assert r1.json()["json"] == payload and r1.json()["http_version"] == "1.1"
        assert r1.json()["client_port"] == r2.json()["client_port"]  # keep-alive reused
        async with h2_client(handle) as c:
            r3 = await c.post("/echo%20x?q=1", json=payload)
        assert r3.http_version == "HTTP/2" and r3.status_code == 200
        body = r3.json()
        assert body["json"] == payload and body["http_version"] == "2"
        assert body["path"] == "/echo x"  # percent-decoded
        assert body["host"] == f"127.0.0.1:{handle.port}"  # :authority -> host
        assert "date" in r3.headers and "server" not in r3.headers

    run(test, loop)


@pytest.mark.timeout(15)
def test_h2_twenty_concurrent_streams_one_connection() -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        async with h2_client(handle) as c:
            t0 = asyncio.get_running_loop().time()
            rs = await asyncio.gather(
                *(c.post("/echo?delay=0.1", json={"i": i}) for i in range(20))
            )
            elapsed = asyncio.get_running_loop().time() - t0
        assert [r.json()["json"]["i"] for r in rs] == list(range(20))
        assert {r.http_version for r in rs} == {"HTTP/2"}
        assert len({r.json()["client_port"] for r in rs}) == 1  # multiplexed on one connection
        assert elapsed < 1.0  # served concurrently, not 20 x 0.1 s

    run(test)


@pytest.mark.timeout(15)
def test_h2_large_upload_and_download_flow_control() -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        blob = bytes(range(256)) * (5 * 1024 * 1024 // 256)
        async with h2_client(handle) as c:
            r = await c.post("/upload", content=blob)
            assert r.json() == {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            big = await c.get("/big")
            assert big.http_version == "HTTP/2" and len(big.content) == BIG_SIZE

    run(test)


@pytest.mark.timeout(15)
def test_h2_slow_reader_only_blocks_its_own_connection() -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        slow = await RawH2().open(handle.port, huge_window=True)
        sid = slow.request(b"/big?mb=32", handle.port)  # ...and then do not read
        conns = handle.server.server_state.connections
        for _ in range(200):  # the server's send() hits transport backpressure
            if any(isinstance(c, H2Protocol) and not c.writable.is_set() for c in conns):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("transport never paused writing")
        async with h2_client(handle) as c:  # other connections are unaffected
            r = await asyncio.wait_for(c.post("/echo", json={"x": 1}), 1)
            assert r.json()["json"] == {"x": 1}
        events = await slow.until(sid, h2.events.StreamEnded)
        received = sum(len(e.data) for e in events if isinstance(e, h2.events.DataReceived))
        assert received == 32 << 20
        slow.writer.close()

    run(test)


@pytest.mark.timeout(15)
def test_h2_streamed_response_arrives_chunk_by_chunk() -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        sent_when_received: list[int] = []
        async with h2_client(handle) as c, c.stream("GET", "/stream?n=6") as r:
            assert r.http_version == "HTTP/2"
            lines = []
            async for line in r.aiter_lines():
                sent_when_received.append(state.chunks_sent)
                lines.append(line)
        assert lines == [f"chunk{i}" for i in range(6)]
        assert sent_when_received[0] < 6  # first frame flushed before the last was produced

    run(test)


@pytest.mark.timeout(15)
def test_h2_stream_reset_and_connection_drop_deliver_disconnect() -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        client = await RawH2().open(handle.port)
        sid = client.request(b"/watch", handle.port)
        await client.until(sid, h2.events.DataReceived)
        client.conn.reset_stream(sid)  # RST_STREAM(CANCEL-like NO_ERROR) from the client
        client.flush()
        await asyncio.wait_for(state.disconnected.wait(), 2)
        # The connection survives the reset: another stream still works.
        sid2 = client.request(b"/echo", handle.port)
        events = await client.until(sid2, h2.events.StreamEnded)
        resp = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
        assert dict(resp.headers)[b":status"] == b"200"
        # Dropping the whole connection mid-stream also reaches the app.
        state.disconnected.clear()
        sid3 = client.request(b"/watch", handle.port)
        await client.until(sid3, h2.events.DataReceived)
        client.writer.close()
        await asyncio.wait_for(state.disconnected.wait(), 2)

    run(test)


@pytest.mark.timeout(15)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_websocket_echo_over_http11(loop: str) -> None:
    async def test(handle: ServerHandle, state: State) -> None:
        async with websockets.asyncio.client.connect(f"ws://127.0.0.1:{handle.port}/ws") as ws:
            for text in ("a", "hello", "x" * 10000):
                await ws.send(text)
                assert await ws.recv() == "echo:" + text

    run(test, loop)


@pytest.mark.timeout(15)
def test_app_exception_is_500_and_connection_survives() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    uv_logger = logging.getLogger("uvicorn.error")

    async def test(handle: ServerHandle, state: State) -> None:
        uv_logger.addHandler(handler)
        async with h2_client(handle) as c:
            before = (await c.get("/echo")).json()["client_port"]
            streaming = asyncio.ensure_future(c.get("/stream?n=4"))
            boom = await c.get("/boom")
            assert boom.status_code == 500 and boom.http_version == "HTTP/2"
            assert boom.text == "Internal Server Error"  # no traceback leaked
            assert (await streaming).status_code == 200  # sibling stream unaffected
            assert (await c.get("/echo")).json()["client_port"] == before  # same connection
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{handle.port}") as c:
            assert (await c.get("/boom")).status_code == 500
            assert (await c.get("/echo")).status_code == 200

    try:
        run(test)
    finally:
        uv_logger.removeHandler(handler)
    assert any("Exception in ASGI application" in r.getMessage() for r in records)


@pytest.mark.timeout(15)
def test_stop_is_graceful_for_inflight_h2_stream() -> None:
    async def main() -> None:
        state = State()
        handle = await start_server(make_app(state), "127.0.0.1", 0)
        _, silent = await asyncio.open_connection("127.0.0.1", handle.port)  # still sniffing
        _, partial = await asyncio.open_connection("127.0.0.1", handle.port)
        partial.write(b"PRI * HT")  # a prefix of the h2 preface: sniffer keeps waiting
        async with h2_client(handle) as c:
            await c.get("/echo")  # an idle h2 connection must not hold up shutdown
            async with c.stream("GET", "/stream?n=5") as r:
                lines = r.aiter_lines()
                assert await anext(lines) == "chunk0"
                stopping = asyncio.ensure_future(handle.stop())
                rest = [line async for line in lines]
            assert rest == [f"chunk{i}" for i in range(1, 5)]  # finished after GOAWAY
        await asyncio.wait_for(stopping, 3)
        silent.close()
        partial.close()
        assert state.lifespan == ["lifespan.startup", "lifespan.shutdown"]
        assert not handle.server.server_state.connections
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as c:
                await c.get(f"http://127.0.0.1:{handle.port}/echo")

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
