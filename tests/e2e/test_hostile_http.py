"""Hostile clients against the real `topics serve` process, over real sockets.

Covers the connection layer (docs/HTTP_INPUT.md "Connections", "Request heads",
"WebSocket"): unknown and lower-case methods, over-long request targets and
header blocks over HTTP/1.1 and h2c, hostile WebSocket messages, the request
head timeout (slowloris) and the per-process / per-address connection caps.
Every refusal must carry the canonical error body (API §1.7) where the protocol
allows a body, and none may disturb the other connections.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ERROR_KEYS = {"code", "message", "detail"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("hostile"), {"TOPICS_MAX_BODY_BYTES": "65536"})
    yield s
    assert s.stop() == 0, s.log_text()


# ------------------------------------------------------------------ helpers


class Raw:
    """One raw HTTP/1.1 exchange over a plain socket."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=(source, 0)
        )
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """Read one response with a content-length body."""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before a response head: {self.buf!r}"
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(rest) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "closed inside a response body"
            rest += chunk
        self.buf = rest[n:]
        return status, headers, rest[:n]

    def closed(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the connection (EOF or reset)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def get(path: str = "/v0/health", method: str = "GET", extra: bytes = b"") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\n".encode() + extra + b"\r\n"


def assert_canonical(
    status: int, headers: dict[str, str], body: bytes, want: int, code: str
) -> dict:
    assert status == want, (status, body)
    assert headers.get("content-type", "").startswith("application/json"), headers
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"], err
    assert set(err) <= ERROR_KEYS, err
    if want in (429, 503):
        assert headers.get("retry-after") == "1", headers
    return dict(err)


def exchange(
    port: int, data: bytes, wait_close: bool = True
) -> tuple[int, dict[str, str], bytes, bool]:
    """Send `data` on a fresh connection: the response and whether the server then closed."""
    c = Raw(port)
    try:
        c.send(data)
        status, headers, body = c.response()
        return status, headers, body, wait_close and c.closed()
    finally:
        c.close()


class H2Client:
    """A minimal h2c (prior knowledge) client that can send any header block."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        cfg = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(cfg)
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def request(
        self, headers: list[tuple[bytes, bytes]], body: bytes | None = None
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status, got, data = 0, {}, b""
        while True:
            chunk = self.sock.recv(65536)
            assert chunk, "h2 connection closed"
            for e in self.conn.receive_data(chunk):
                if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid:
                    got = dict(e.headers)
                    status = int(got[b":status"])
                elif isinstance(e, h2.events.DataReceived) and e.stream_id == sid:
                    data += e.data
                    self.conn.acknowledge_received_data(e.flow_controlled_length, sid)
                elif isinstance(e, h2.events.StreamEnded) and e.stream_id == sid:
                    self.sock.sendall(self.conn.data_to_send())
                    return status, got, data
                elif isinstance(e, h2.events.StreamReset) and e.stream_id == sid:
                    raise AssertionError(f"stream reset: {e.error_code}")
                elif isinstance(e, h2.events.ConnectionTerminated):
                    raise AssertionError(f"GOAWAY: {e.error_code}")
            self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        self.sock.close()


def h2_headers(
    method: bytes, path: bytes, *extra: tuple[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", method),
        (b":scheme", b"http"),
        (b":authority", b"127.0.0.1"),
        (b":path", path),
        *extra,
    ]


def h2_canonical(resp: tuple[int, dict[bytes, bytes], bytes], want: int, code: str) -> dict:
    status, headers, body = resp
    hs = {k.decode(): v.decode() for k, v in headers.items() if not k.startswith(b":")}
    return assert_canonical(status, hs, body, want, code)


# ------------------------------------------------------------------ methods


@pytest.mark.parametrize("method", ["get", "FOO", "Get", "PROPFIND", "PATCH", "post"])
def test_unknown_and_lower_case_methods_are_405_over_http1(
    server: ServerProcess, method: str
) -> None:
    known = method in ("PROPFIND", "PATCH")  # the parser knows these: the app answers
    status, headers, body, closed = exchange(server.port, get("/v0/topics/x", method), not known)
    err = assert_canonical(status, headers, body, 405, "method_not_allowed")
    assert method in err["message"]
    if not known:  # the parser could not go on: the connection is closed
        assert closed


@pytest.mark.parametrize(
    "line",
    [
        b"\x00\x01\x02 / HTTP/1.1\r\n\r\n",
        b"GET\t/ HTTP/1.1\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"\xff\xfe\r\n\r\n",
    ],
)
def test_malformed_request_lines_are_400(server: ServerProcess, line: bytes) -> None:
    status, headers, body, closed = exchange(server.port, line)
    assert_canonical(status, headers, body, 400, "invalid_request")
    assert closed


def test_unknown_methods_over_h2c_are_405_and_bad_ones_400(server: ServerProcess) -> None:
    c = H2Client(server.port)
    try:
        for method in (b"get", b"FOO", b"PATCH", b"delete"):
            h2_canonical(c.request(h2_headers(method, b"/v0/topics/x")), 405, "method_not_allowed")
        for method in (b"G T", b"GET\x01", b""):
            h2_canonical(c.request(h2_headers(method, b"/v0/health")), 400, "invalid_request")
        # the connection still serves well-formed requests
        status, _, body = c.request(h2_headers(b"GET", b"/v0/health"))
        assert status == 200 and json.loads(body)["status"] == "ok"
    finally:
        c.close()


# ------------------------------------------------------------------ URL and header limits


def test_long_url_is_414_and_large_headers_431_over_http1(server: ServerProcess) -> None:
    port = server.port
    status, headers, body, closed = exchange(port, get("/v0/topics/" + "a" * 9000))
    assert_canonical(status, headers, body, 414, "uri_too_long")
    assert closed
    status, headers, body, _ = exchange(port, get("/v0/health?q=" + "b" * 100_000))
    assert_canonical(status, headers, body, 414, "uri_too_long")
    big = b"x-big: " + b"v" * 40_000 + b"\r\n"
    status, headers, body, closed = exchange(port, get(extra=big))
    assert_canonical(status, headers, body, 431, "headers_too_large")
    assert closed
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(150))
    status, headers, body, _ = exchange(port, get(extra=many))
    assert_canonical(status, headers, body, 431, "headers_too_large")
    # a header line that never ends is refused once it is too long, not buffered forever
    c = Raw(port)
    try:
        c.send(b"GET /v0/health HTTP/1.1\r\nhost: x\r\nx-endless: ")
        for _ in range(40):
            try:
                c.send(b"z" * 4096)
            except (BrokenPipeError, ConnectionResetError):
                break
        status, headers, body = c.response()
        assert_canonical(status, headers, body, 431, "headers_too_large")
        assert c.closed()
    finally:
        c.close()
    # limits that are not exceeded change nothing
    status, _, body, _ = exchange(
        port,
        get("/v0/health?q=" + "c" * 8000, extra=b"x-a: " + b"v" * 20_000 + b"\r\n"),
        wait_close=False,
    )
    assert status == 200, body


def test_pipelined_requests_after_a_large_body_are_not_taken_for_a_large_head(
    server: ServerProcess,
) -> None:
    records = json.dumps({"records": [{"data": "p" * 50_000}]}).encode()
    post = (
        b"POST /v0/topics/pipe HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(records)
    ) + records
    c = Raw(server.port)
    try:
        # One write holding the body and the start of the next head, then the rest.
        nxt = get("/v0/topics/pipe")
        c.send(post + nxt[:20])
        time.sleep(0.2)
        c.send(nxt[20:] + get())
        assert c.response()[0] == 201
        status, _, body = c.response()
        assert status == 200 and json.loads(body)["head_seq"] == 1
        assert c.response()[0] == 200
    finally:
        c.close()


def test_long_url_is_414_and_large_headers_431_over_h2c(server: ServerProcess) -> None:
    c = H2Client(server.port)
    try:
        h2_canonical(
            c.request(h2_headers(b"GET", b"/v0/topics/" + b"a" * 9000)), 414, "uri_too_long"
        )
        many = [(b"x-h%d" % i, b"v") for i in range(150)]
        h2_canonical(c.request(h2_headers(b"GET", b"/v0/health", *many)), 431, "headers_too_large")
        big = (b"x-big", b"v" * 40_000)
        h2_canonical(c.request(h2_headers(b"GET", b"/v0/health", big)), 431, "headers_too_large")
        # a rejected request with a body: answered, nothing written
        body = json.dumps({"records": [{"data": 1}]}).encode()
        resp = c.request(
            h2_headers(
                b"POST", b"/v0/topics/h2.t?" + b"q" * 9000, (b"content-type", b"application/json")
            ),
            body,
        )
        h2_canonical(resp, 414, "uri_too_long")
        status, _, _ = c.request(h2_headers(b"GET", b"/v0/topics/h2.t"))
        assert status == 404
        status, _, _ = c.request(h2_headers(b"GET", b"/v0/health"))
        assert status == 200
    finally:
        c.close()


# ------------------------------------------------------------------ WebSocket


def test_hostile_websocket_messages_get_error_messages_and_the_socket_stays_open(
    server: ServerProcess,
) -> None:
    deep = "[" * 1100 + "]" * 1100
    too_deep_to_echo = "[" * 300 + "]" * 300
    hostile = {
        "deep": ('{"op":"ping","request_id":' + deep + "}", "invalid_json"),
        "deep publish data": (
            '{"op":"publish","topic":"ws.h","records":[{"data":' + too_deep_to_echo + "}]}",
            "invalid_request",
        ),
        "request_id too deep to echo": (
            '{"op":"ping","request_id":' + too_deep_to_echo + "}",
            "invalid_json",
        ),
        "op too deep to print": ('{"op":' + "[" * 990 + "]" * 990 + "}", "invalid_json"),
        "lone surrogate": ('{"op":"ping","request_id":"\\ud800"}', "invalid_json"),
        "lone surrogate in a topic": ('{"op":"subscribe","topic":"\\udfff"}', "invalid_json"),
        "lone surrogate in data": (
            '{"op":"publish","topic":"ws.h","records":[{"data":"x\\udc00"}]}',
            "invalid_json",
        ),
        "lone surrogate in a tag": (
            '{"op":"publish","topic":"ws.h","records":[{"data":1,"tag":"\\ud83d"}]}',
            "invalid_json",
        ),
        "1e400": ('{"op":"ping","request_id":1e400}', "invalid_json"),
        "-1e400 in data": (
            '{"op":"publish","topic":"ws.h","records":[{"data":-1e400}]}',
            "invalid_json",
        ),
        "huge integer": ('{"op":"ping","request_id":' + "9" * 400 + "}", "invalid_json"),
        "oversized": ('{"op":"ping","request_id":"' + "x" * 100_000 + '"}', "payload_too_large"),
        "not JSON": ("{", "invalid_json"),
        "not an object": ("[1,2]", "invalid_json"),
    }

    async def main() -> None:
        url = f"ws://127.0.0.1:{server.port}/v0/ws"
        async with connect(url, max_size=None, compression=None) as ws:
            for name, (text, code) in hostile.items():
                await ws.send(text)
                reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert reply["op"] == "error", (name, reply)
                assert reply["code"] == code, (name, reply)
                assert isinstance(reply["message"], str) and reply["message"], (name, reply)
                assert reply["request_id"] is None, (name, reply)
            # a message cut into fragments that crosses the limit part way through
            await ws.send(['{"op":"ping","request_id":"', "y" * 40_000, "y" * 40_000, '"}'])
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert reply["op"] == "error" and reply["code"] == "payload_too_large", reply
            await ws.send(b"\x00binary")
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert reply["code"] == "unsupported_message", reply
            # nothing was stored, and the socket still works
            await ws.send(json.dumps({"op": "ping", "request_id": "after"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {
                "op": "pong",
                "request_id": "after",
            }
            pub = {"op": "publish", "request_id": 1, "topic": "ws.h", "records": [{"data": "ok"}]}
            for _ in range(50):  # a machine busy with other tests may make the server shed load
                await ws.send(json.dumps(pub))
                ack = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if ack.get("code") != "throttled":
                    break
                await asyncio.sleep(0.1)
            assert ack["op"] == "ack" and ack["seqs"] == [1], ack
            # a message just under the limit is still read
            await ws.send(json.dumps({"op": "ping", "request_id": "z" * 60_000}))
            pong = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert pong["op"] == "pong" and len(pong["request_id"]) == 60_000
            assert ws.close_code is None

    asyncio.run(main())
    assert "Traceback" not in server.log_text()


# ------------------------------------------------------------------ head timeout


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path, {"TOPICS_HTTP_HEADER_TIMEOUT_MS": "500"})
    yield s
    assert s.stop() == 0, s.log_text()


def _time_to_close(c: Raw, limit: float = 5.0) -> float:
    t0 = time.monotonic()
    assert c.closed(limit), "the server kept a slow connection open"
    return time.monotonic() - t0


def test_slow_request_heads_are_cut_off(impatient: ServerProcess) -> None:
    port = impatient.port
    # 1. a connection that never sends anything
    idle = Raw(port)
    t0 = time.monotonic()
    assert idle.closed(5.0)
    assert 0.3 < time.monotonic() - t0 < 3.0
    idle.close()

    # 2. a slowloris: the head trickles in, a header line every 100 ms, forever
    slow = Raw(port)
    t0 = time.monotonic()
    slow.send(b"GET /v0/health HTTP/1.1\r\nhost: x\r\n")
    closed_after = None
    for i in range(60):
        try:
            slow.send(b"x-slow-%d: 1\r\n" % i)
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - t0
            break
        slow.sock.settimeout(0.1)
        try:
            if slow.sock.recv(1) == b"":
                closed_after = time.monotonic() - t0
                break
        except TimeoutError:
            pass
        except ConnectionResetError:  # closed with a reset rather than a FIN
            closed_after = time.monotonic() - t0
            break
    slow.close()
    assert closed_after is not None and closed_after < 3.0, closed_after

    # 3. an h2c preface and then nothing
    h2 = Raw(port)
    h2.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert _time_to_close(h2) < 3.0
    h2.close()

    # 4. a sniffer-sized fragment trickled byte by byte
    frag = Raw(port)
    t0 = time.monotonic()
    try:
        for b in b"PRI * HTTP/2.0":
            frag.send(bytes([b]))
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert frag.closed(3.0) and time.monotonic() - t0 < 3.0
    frag.close()

    # 5. a kept-alive connection may idle past the head timeout between requests,
    #    but its next head is timed too
    ka = Raw(port)
    try:
        ka.send(get())
        assert ka.response()[0] == 200
        time.sleep(1.0)
        ka.send(get())
        assert ka.response()[0] == 200
        ka.send(b"GET /v0/health HTTP/1.1\r\n")
        assert _time_to_close(ka) < 3.0
    finally:
        ka.close()

    # a request that arrives promptly is served, whatever the others did
    with httpx.Client(base_url=impatient.base) as client:
        assert client.get("/v0/health").status_code == 200


# ------------------------------------------------------------------ connection caps


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(
        tmp_path, {"TOPICS_MAX_CONNECTIONS": "10", "TOPICS_MAX_CONNECTIONS_PER_IP": "6"}
    )
    yield s
    assert s.stop() == 0, s.log_text()


def _keepalive(port: int, source: str) -> Raw:
    c = Raw(port, source)
    c.send(get())
    status, _, _ = c.response()
    assert status == 200
    return c


def _refused(port: int, source: str, limit: str, cap: int) -> None:
    c = Raw(port, source)
    try:
        c.send(get())
        status, headers, body = c.response()
        err = assert_canonical(status, headers, body, 503, "too_many_connections")
        assert err["detail"] == {"limit": limit, "max": cap}, err
        assert c.closed()
    finally:
        c.close()


def _eventually(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_connection_floods_are_refused_while_open_connections_keep_working(
    capped: ServerProcess,
) -> None:
    port = capped.port
    mine = [_keepalive(port, "127.0.0.1") for _ in range(6)]
    try:
        # a flood from the same address: every extra connection gets one 503 and is closed
        for _ in range(30):
            _refused(port, "127.0.0.1", "max_connections_per_ip", 6)
        # ...and an h2c client from there too
        with httpx.Client(base_url=capped.base, http1=False, http2=True) as h2c:
            r = h2c.get("/v0/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        # the connections already open are unaffected
        for c in mine:
            c.send(get())
            assert c.response()[0] == 200
        # another address still gets in, up to the process-wide cap
        others = [_keepalive(port, "127.0.0.2") for _ in range(4)]
        _refused(port, "127.0.0.3", "max_connections", 10)
        for c in others:
            c.close()
        # closing connections frees their slots
        for c in mine[:2]:
            c.close()
        del mine[:2]
        _eventually(lambda: _keepalive(port, "127.0.0.1").close())
    finally:
        for c in mine:
            c.close()


def test_websocket_connections_hold_and_release_slots(capped: ServerProcess) -> None:
    async def main() -> None:
        url = f"ws://127.0.0.1:{capped.port}/v0/ws"
        sockets = [await connect(url, compression=None) for _ in range(6)]
        try:
            for ws in sockets:
                await ws.send('{"op":"ping","request_id":1}')
                assert json.loads(await ws.recv())["op"] == "pong"
            await asyncio.to_thread(_refused, capped.port, "127.0.0.1", "max_connections_per_ip", 6)
            # an upgrade over the cap is refused like any request
            with pytest.raises(InvalidStatus) as refused:
                await connect(url, compression=None)
            assert refused.value.response.status_code == 503
            doc = json.loads(refused.value.response.body)
            assert doc["error"]["code"] == "too_many_connections"
        finally:
            for ws in sockets:
                await ws.close()

    asyncio.run(main())

    def six_fit() -> None:
        conns: list[Raw] = []
        try:
            for _ in range(6):
                conns.append(_keepalive(capped.port, "127.0.0.1"))
        finally:
            for c in conns:
                c.close()

    _eventually(six_fit)
