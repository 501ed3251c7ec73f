"""Multiplexed SSE watch over a real socket (API §8): the app served by uvicorn in-process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from tests.support.live import Sse, live_app

from topics.engine import watch as watch_module
from topics.http.app import TopicsApp
from topics.http.watch import Waker

Env = dict[str, str]


@pytest.fixture
def fast_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let watches ask for heartbeats down to 50 ms (the served app runs in this process)."""
    monkeypatch.setattr(watch_module, "HEARTBEAT_MIN_MS", 50)


@contextlib.asynccontextmanager
async def serve(env: Env | None = None) -> AsyncIterator[tuple[TopicsApp, httpx.AsyncClient]]:
    """The real app on 127.0.0.1:<ephemeral> in this loop; yields it and a client."""
    async with live_app(env) as srv:
        yield srv.app, srv.http


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        async with asyncio.timeout(25):
            await fn()

    asyncio.run(main())


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def write(c: httpx.AsyncClient, topic: str, *datas: Any, **kw: Any) -> dict[str, Any]:
    headers = kw.pop("headers", None)
    recs = [{"data": d, **kw} for d in datas]
    r = await c.post(f"/v0/topics/{topic}", json={"records": recs}, headers=headers)
    assert r.status_code in (200, 201), r.text
    return dict(r.json())


async def watch(c: httpx.AsyncClient, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    r = await c.post("/v0/watch", json=body, **kw)
    assert r.status_code == 200, r.text
    return dict(r.json())


def decode_id(i: str) -> dict[str, int]:
    out: dict[str, int] = orjson.loads(base64.urlsafe_b64decode(i + "=" * (-len(i) % 4)))
    return out


@contextlib.asynccontextmanager
async def stream(
    c: httpx.AsyncClient, wid: str, headers: dict[str, str] | None = None, query: str = ""
) -> AsyncIterator[Sse]:
    async with c.stream("GET", f"/v0/watch/{wid}{query}", headers=headers) as resp:
        assert resp.status_code == 200, (resp.status_code, await resp.aread())
        yield Sse(resp)


def kinds(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["data"].get("topic", "")) for e in evs]


async def eventually(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


# ------------------------------------------------------------------------ tests


@pytest.mark.timeout(30)
def test_frames_headers_and_order() -> None:
    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/b")
            await write(c, "a", {"x": 1}, {"x": 2}, node="gw")
            w = await watch(c, {"topics": {"a": {}, "b": {"tail": True}}})
            assert w["topics"] == {
                "a": {"from_seq": 0, "head_seq": 2, "earliest_seq": 1},
                "b": {"from_seq": 0, "head_seq": 0, "earliest_seq": 1},
            }
            assert "server_total_ms" in w["performance"]
            async with c.stream("GET", w["stream_url"]) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                assert resp.headers["cache-control"] == "no-store"
                assert resp.headers["x-accel-buffering"] == "no"
                s = Sse(resp)
                assert await s.block() == {"retry": "2000"}
                evs = await s.events(3)
                assert kinds(evs) == [("record", "a"), ("caught-up", "a"), ("caught-up", "b")]
                rec = evs[0]["data"]
                assert list(rec) == ["topic", "from_seq", "head_seq", "records", "to_seq"]
                assert (rec["from_seq"], rec["to_seq"], rec["head_seq"]) == (0, 2, 2)
                assert [r["data"] for r in rec["records"]] == [{"x": 1}, {"x": 2}]
                assert rec["records"][0]["$node"] == "gw" and "$seq" in rec["records"][0]
                assert decode_id(evs[0]["id"]) == {"a": 2, "b": 0}
                assert evs[1]["data"] == {"topic": "a", "head_seq": 2}
                assert decode_id(evs[2]["id"]) == {"a": 2, "b": 0}
                # a publish wakes the parked stream
                await write(c, "b", "hello")
                evs = await s.events(2)
                assert kinds(evs) == [("record", "b"), ("caught-up", "b")]
                assert evs[0]["data"]["records"][0]["data"] == "hello"
                assert decode_id(evs[1]["id"]) == {"a": 2, "b": 1}
                assert app.sse_total == 1
            # disconnect: slot released, listeners removed, stream count back to 0
            session = app.watches.get(w["wid"])
            assert session is not None
            await eventually(lambda: app.sse_total == 0 and session.open_streams == 0)
            assert not app.engine.topics["a"].listeners
            r = await c.get("/v0/metrics", headers={"accept": "application/json"})
            assert r.json()["watch_sessions"] == 1

    run(body)


@pytest.mark.timeout(30)
def test_reconnect_resumes_and_last_event_id_rewinds() -> None:
    async def body() -> None:
        async with serve() as (_app, c):
            await write(c, "a", 1, 2, 3)
            w = await watch(c, {"topics": {"a": {}}, "limit": 1})
            async with stream(c, w["wid"]) as s:
                evs = await s.events(4)
            assert [e["event"] for e in evs] == ["record"] * 3 + ["caught-up"]
            first_id = evs[0]["id"]
            assert decode_id(first_id) == {"a": 1}
            await write(c, "a", 4)
            # no header: resumes from the last produced frame
            async with stream(c, w["wid"]) as s:
                evs = await s.events(2)
            assert [e["data"]["records"][0]["data"] for e in evs[:1]] == [4]
            # Last-Event-ID rewinds to what the client processed
            async with stream(c, w["wid"], headers={"last-event-id": first_id}) as s:
                evs = await s.events(4)
            assert [e["event"] for e in evs] == ["record"] * 3 + ["caught-up"]
            assert [e["data"]["records"][0]["$seq"] for e in evs[:3]] == [2, 3, 4]
            # it can only rewind: a later id and garbage are ignored
            later = base64.urlsafe_b64encode(b'{"a":99,"zz":1}').decode().rstrip("=")
            for hdr in (later, "%%%"):
                async with stream(c, w["wid"], headers={"last-event-id": hdr}) as s:
                    ev = await s.event()
                assert ev["event"] == "caught-up" and decode_id(ev["id"]) == {"a": 4}

    run(body)


@pytest.mark.timeout(30)
def test_heartbeat_when_idle(fast_heartbeats: None) -> None:
    async def body() -> None:
        async with serve() as (_app, c):
            await c.put("/v0/topics/a")
            w = await watch(c, {"topics": {"a": {}}, "heartbeat_ms": 100})
            loop = asyncio.get_running_loop()
            async with stream(c, w["wid"]) as s:
                assert (await s.event())["event"] == "caught-up"
                t0 = loop.time()
                hbs = []
                for _ in range(3):
                    b = await s.block()
                    assert b == {"comment": "hb"}, b
                    hbs.append(loop.time())
                assert hbs[-1] - t0 < 2.0
                # a frame resets the heartbeat clock; the next block is the frame
                await write(c, "a", 1)
                while True:
                    b = await s.block()
                    assert b is not None
                    if "event" in b:
                        assert b["event"] == "record"
                        break

    run(body)


@pytest.mark.timeout(30)
def test_post_validation_over_http() -> None:
    async def body() -> None:
        async with serve(
            {"TOPICS_API_KEYS": "root,ten::ok.", "TOPICS_MAX_WATCH_SESSIONS": "1"}
        ) as (
            _app,
            c,
        ):
            root = auth("root")
            await write(c, "ok.a", 1, headers=root)
            await write(c, "zz", 1, headers=root)
            r = await c.post("/v0/watch", json={"topics": {}}, headers=root)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
            r = await c.post(
                "/v0/watch", json={"topics": {"ok.a": {}, "zz": {}}}, headers=auth("ten")
            )
            assert r.status_code == 403
            assert r.json()["error"]["detail"] == {"topic": "zz"}
            r = await c.post("/v0/watch", json={"topics": {"ok.nope": {}}}, headers=root)
            assert r.status_code == 404 and r.json()["error"]["code"] == "topic_not_found"
            r = await c.post(
                "/v0/watch?lenient=true", json={"topics": {"ok.a": {}, "ok.nope": {}}}, headers=root
            )
            assert r.status_code == 200 and list(r.json()["topics"]) == ["ok.a"]
            r = await c.post("/v0/watch", json={"topics": {"ok.a": {}}}, headers=root)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["detail"] == {"limit": "max_watch_sessions", "max": 1}

    run(body)


@pytest.mark.timeout(30)
def test_stream_checks_406_404_401_429_in_order() -> None:
    async def body() -> None:
        env = {"TOPICS_API_KEYS": "ka,kb", "TOPICS_MAX_SSE_CONNECTIONS": "1"}
        async with serve(env) as (app, c):
            await write(c, "a", 1, headers=auth("ka"))
            w = await watch(c, {"topics": {"a": {}}}, headers=auth("ka"))
            wid = w["wid"]
            r = await c.get("/v0/watch/wid_nope", headers={"accept": "application/json"})
            assert r.status_code == 406 and r.json()["error"]["code"] == "not_acceptable"
            r = await c.get("/v0/watch/wid_nope")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            for hdrs, q in (({}, ""), (auth("kb"), ""), (auth("bad"), ""), ({}, "?token=kb")):
                r = await c.get(f"/v0/watch/{wid}{q}", headers=hdrs)
                assert r.status_code == 401, (hdrs, q)
                assert r.json()["error"]["code"] == "unauthorized"
            # the creating key, by header or ?token= (header wins)
            async with stream(c, wid, headers={**auth("ka"), "accept": "*/*"}) as s:
                assert (await s.event())["event"] == "record"
                assert app.sse_total == 1
                r = await c.get(f"/v0/watch/{wid}?token=ka")
                assert r.status_code == 429 and r.json()["error"]["code"] == "throttled"
                assert r.headers["retry-after"] == "1"
            await eventually(lambda: app.sse_total == 0)
            async with stream(c, wid, query="?token=ka") as s:
                assert (await s.event())["event"] == "caught-up"
            async with stream(
                c, wid, headers={**auth("ka"), "accept": "text/event-stream"}, query="?token=kb"
            ) as s:
                assert (await s.event())["event"] == "caught-up"

    run(body)


@pytest.mark.timeout(30)
def test_tombstone_relabel_then_engine_reason() -> None:
    async def body() -> None:
        async with serve() as (_app, c):
            await c.put("/v0/topics/c", json={"cap_records": 3})
            await write(c, "c", *range(10))
            w = await watch(c, {"topics": {"c": {}}})
            async with stream(c, w["wid"]) as s:
                evs = await s.events(3)
                assert [e["event"] for e in evs] == ["tombstone", "record", "caught-up"]
                assert evs[0]["data"] == {
                    "topic": "c",
                    "reason": "from_seq_too_old",
                    "gap_from": 1,
                    "gap_to": 7,
                    "earliest_seq": 8,
                    "head_seq": 10,
                }
                assert decode_id(evs[0]["id"]) == {"c": 7}
                assert [r["$seq"] for r in evs[1]["data"]["records"]] == [8, 9, 10]

    run(body)


@pytest.mark.timeout(30)
def test_topic_deleted_frames_and_stream_end() -> None:
    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/a")
            await c.put("/v0/topics/b")
            w = await watch(c, {"topics": {"a": {}, "b": {}}})
            async with stream(c, w["wid"]) as s:
                assert [e["event"] for e in await s.events(2)] == ["caught-up"] * 2
                assert (await c.delete("/v0/topics/a")).json()["deleted"] is True
                ev = await s.event()
                assert ev["event"] == "topic-deleted"
                assert ev["data"] == {"topic": "a", "head_seq": 0, "reason": "deleted"}
                assert decode_id(ev["id"]) == {"a": 0, "b": 0}
                await c.put("/v0/topics/a")  # recreated: not followed by this stream
                await write(c, "a", 1)
                await write(c, "b", 2)
                evs = await s.events(2)
                assert kinds(evs) == [("record", "b"), ("caught-up", "b")]
                await c.delete("/v0/topics/b")
                ev = await s.event()
                assert ev["event"] == "topic-deleted" and ev["data"]["topic"] == "b"
                assert await s.block() is None  # every topic gone: the stream ends
            await eventually(lambda: app.sse_total == 0)

    run(body)


@pytest.mark.timeout(30)
def test_shutdown_sends_error_frame_and_ends() -> None:
    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/a")
            w = await watch(c, {"topics": {"a": {"from_seq": 0}}})
            async with stream(c, w["wid"]) as s:
                assert (await s.event())["event"] == "caught-up"
                assert app.shutting_down is not None
                app.shutting_down.set()
                ev = await s.event()
                assert ev["event"] == "error"
                assert ev["data"] == {
                    "code": "server_shutting_down",
                    "message": "server is shutting down; reconnect",
                }
                assert decode_id(ev["id"]) == {"a": 0}
                assert await s.block() is None

    run(body)


@pytest.mark.timeout(30)
def test_include_flags_and_node_filter() -> None:
    async def body() -> None:
        async with serve() as (_app, c):
            await c.put("/v0/topics/a")
            w = await watch(
                c,
                {
                    "topics": {"a": {}},
                    "node": "me",
                    "include_data": False,
                    "include_tags": True,
                    "include_meta": False,
                },
            )
            async with stream(c, w["wid"]) as s:
                assert (await s.event())["event"] == "caught-up"
                await write(c, "a", 1, node="me", tag="t")
                await write(c, "a", 2, node="you", tag="t", meta={"m": 1})
                evs = await s.events(2)
                assert [e["event"] for e in evs] == ["record", "caught-up"]
                (rec,) = evs[0]["data"]["records"]
                assert rec == {"$seq": 2, "$ts": rec["$ts"], "$node": "you", "$tag": "t"}
                assert evs[0]["data"]["from_seq"] == 1

    run(body)


@pytest.mark.timeout(30)
def test_slow_consumer_does_not_delay_a_fast_one() -> None:
    async def body() -> None:
        async with serve() as (app, c):
            blob = "x" * 8000
            for _ in range(100):
                await write(c, "big", *([blob] * 30))  # 3000 records, ~24 MB
            head = 3000
            slow_w = await watch(c, {"topics": {"big": {}}})
            fast_w = await watch(c, {"topics": {"big": {}}})
            # The slow consumer: a raw socket with a tiny receive buffer that never reads.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            port = int(str(c.base_url).rsplit(":", 1)[1].rstrip("/"))
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(f"GET {slow_w['stream_url']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            slow = app.watches.get(slow_w["wid"])
            assert slow is not None
            await eventually(lambda: slow.open_streams == 1)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            async with stream(c, fast_w["wid"]) as s:
                got = 0
                while True:
                    ev = await s.event()
                    if ev["event"] == "record":
                        got += len(ev["data"]["records"])
                    if ev["event"] == "caught-up":
                        break
            assert got == head and ev["data"]["head_seq"] == head
            assert loop.time() - t0 < 10
            # the slow stream is parked on its own socket, far from head, nothing buffered
            assert slow.cursors["big"] < head
            assert app.sse_total == 2 or app.sse_total == 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            await eventually(lambda: app.sse_total == 0 and slow.open_streams == 0)
            assert not app.engine.topics["big"].listeners

    run(body)


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The body chunks of a chunked HTTP/1.1 response, one per server write."""
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


@pytest.mark.timeout(30)
def test_frames_of_one_pass_share_one_write(fast_heartbeats: None) -> None:
    async def body() -> None:
        async with serve() as (_app, c):
            await c.put("/v0/topics/a")
            await c.put("/v0/topics/b")
            w = await watch(c, {"topics": {"a": {}, "b": {}}, "heartbeat_ms": 300})
            port = int(str(c.base_url).rsplit(":", 1)[1].rstrip("/"))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {w['stream_url']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            chunks = _chunks(reader)
            assert await anext(chunks) == b"retry: 2000\n\n"
            first = await anext(chunks)  # both topics' caught-up frames, one write
            assert first.count(b"event: caught-up\n") == 2
            # one publish: record + caught-up go out together, nothing held back
            await write(c, "a", 1)
            chunk = await anext(chunks)
            assert chunk.count(b"\n\n") == 2
            assert chunk.startswith(b"id: ") and b"event: record\n" in chunk
            assert chunk.index(b"event: record") < chunk.index(b"event: caught-up")
            # frames flowing more often than the heartbeat interval: no heartbeat
            for i in range(12):
                await write(c, "b", i)
                got = await anext(chunks)
                assert b"event: record" in got and b": hb" not in got
                await asyncio.sleep(0.05)
            # idle: the heartbeat timer fires
            assert await anext(chunks) == b": hb\n\n"
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    run(body)


@pytest.mark.timeout(30)
def test_publication_served_to_parked_streams_by_one_callback() -> None:
    """Parked streams get a publication from the shared fan-out, written directly, in order."""

    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/fan")
            port = int(str(c.base_url).rsplit(":", 1)[1].rstrip("/"))
            streams = []
            for _ in range(20):
                w = await watch(c, {"topics": {"fan": {}}})
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET {w['stream_url']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                chunks = _chunks(reader)
                assert await anext(chunks) == b"retry: 2000\n\n"
                assert b"event: caught-up" in await anext(chunks)
                streams.append((writer, chunks))
            fan = app.fanout()
            runs0, writes0 = fan.runs, fan.writes
            for i in range(1, 11):
                await write(c, "fan", i)
                for _writer, chunks in streams:
                    got = await anext(chunks)
                    frames = [f for f in got.split(b"\n\n") if f]
                    assert [f.split(b"\n")[1] for f in frames] == [
                        b"event: record",
                        b"event: caught-up",
                    ]
                    rec = orjson.loads(frames[0].split(b"\n")[2][len(b"data: ") :])
                    assert rec["from_seq"] == i - 1 and rec["to_seq"] == i
                    assert [r["data"] for r in rec["records"]] == [i]
            # every delivery went out from the fan-out, one batch per publication
            # (right after the write's response), one write per stream each
            assert fan.writes - writes0 == 200
            assert fan.runs - runs0 == 10
            for writer, _ in streams:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    run(body)


def test_waker() -> None:
    async def body() -> None:
        w = Waker(asyncio.get_running_loop())
        w.set()
        await w.wait()  # already set: no parking
        w.clear()
        assert not w.is_set()
        task = asyncio.create_task(w.wait())
        await asyncio.sleep(0.01)
        assert not task.done()
        asyncio.get_running_loop().call_soon(w.set)
        await asyncio.wait_for(task, 1)
        assert w.is_set()
        w.clear()
        task = asyncio.create_task(w.wait())
        await asyncio.sleep(0)
        task.cancel()  # a cancelled wait leaves the waker usable
        with contextlib.suppress(asyncio.CancelledError):
            await task
        w.set()
        await asyncio.wait_for(w.wait(), 1)

    run(body)
