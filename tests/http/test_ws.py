"""WebSocket data plane over a real socket (API §9): the app served by uvicorn in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from tests.support.live import LiveServer, live_app
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from topics.http.ws import OUTBOX_SLOTS, Outbox

Env = dict[str, str]


Srv = LiveServer


@contextlib.asynccontextmanager
async def serve(env: Env | None = None) -> AsyncIterator[Srv]:
    """The real app on 127.0.0.1:<ephemeral> in this loop."""
    async with live_app(env) as srv:
        yield srv


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        async with asyncio.timeout(25):
            await fn()

    asyncio.run(main())


async def send(ws: ClientConnection, **cmd: Any) -> None:
    await ws.send(orjson.dumps(cmd).decode())


async def recv(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(5):
        msg = await ws.recv()
    assert isinstance(msg, str)
    out: dict[str, Any] = orjson.loads(msg)
    return out


async def recv_n(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    return [await recv(ws) for _ in range(n)]


async def until(ws: ClientConnection, op: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read until a message with `op`; returns it and the messages before it."""
    seen: list[dict[str, Any]] = []
    while True:
        m = await recv(ws)
        if m["op"] == op:
            return m, seen
        seen.append(m)


async def nothing_pending(ws: ClientConnection) -> None:
    """A ping round trip: the next message must be the pong."""
    await send(ws, op="ping", request_id="sync")
    assert await recv(ws) == {"op": "pong", "request_id": "sync"}


async def eventually(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


# ------------------------------------------------------------------------ tests


@pytest.mark.timeout(30)
def test_subscribe_publish_ack_and_node_filter() -> None:
    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/room:lobby")
            async with s.ws() as me, s.ws() as other:
                await send(
                    me,
                    op="subscribe",
                    request_id=7,
                    topic="room:lobby",
                    tail=True,
                    node="u-81",
                    include_meta=False,
                )
                assert await recv(me) == {
                    "op": "subscribed",
                    "request_id": 7,
                    "topics": {"room:lobby": {"from_seq": 0, "head_seq": 0, "earliest_seq": 1}},
                }
                assert await recv(me) == {"op": "caught_up", "topic": "room:lobby", "head_seq": 0}
                await send(other, op="subscribe", topics={"room:lobby": {}})
                sub = await recv(other)
                assert sub["op"] == "subscribed" and sub["request_id"] is None
                assert (await recv(other))["op"] == "caught_up"
                await send(
                    me,
                    op="publish",
                    request_id="p-1",
                    topic="room:lobby",
                    records=[{"node": "u-81", "data": {"msg": "hi"}, "meta": {"k": 1}}],
                )
                ack = await recv(me)
                perf = ack.pop("performance")
                assert ack == {
                    "op": "ack",
                    "request_id": "p-1",
                    "topic": "room:lobby",
                    "first_seq": 1,
                    "last_seq": 1,
                    "seqs": [1],
                    "head_seq": 1,
                    "count": 1,
                    "created": False,
                    "deduped": False,
                }
                assert {"server_total_ms", "wal_append_ms", "fsync_ms"} <= set(perf)
                # the other subscriber sees it; the sender's own record is node-filtered
                rec, cu = await recv_n(other, 2)
                assert rec["op"] == "record" and rec["topic"] == "room:lobby"
                assert (rec["from_seq"], rec["to_seq"], rec["head_seq"]) == (0, 1, 1)
                assert rec["records"][0]["data"] == {"msg": "hi"}
                assert rec["records"][0]["meta"] == {"k": 1}
                assert rec["records"][0]["$node"] == "u-81"
                assert cu == {"op": "caught_up", "topic": "room:lobby", "head_seq": 1}
                await nothing_pending(me)
                # a record from someone else reaches `me`, without meta
                await send(
                    other,
                    op="publish",
                    request_id=2,
                    topic="room:lobby",
                    records=[{"data": 2, "meta": {"k": 2}}],
                    node="u-2",
                    return_seqs=False,
                    idempotency_key="k1",
                )
                ack, _ = await until(other, "ack")
                assert ack["seqs"] is None and ack["first_seq"] == 2
                rec, cu = await recv_n(me, 2)
                assert rec["op"] == "record" and rec["from_seq"] == 1 and rec["to_seq"] == 2
                assert rec["records"] == [
                    {"$seq": 2, "$ts": rec["records"][0]["$ts"], "$node": "u-2", "data": 2}
                ]
                assert cu["op"] == "caught_up"
                # dedupe replay: same key, nothing appended
                await send(
                    other,
                    op="publish",
                    request_id=3,
                    topic="room:lobby",
                    records=[{"data": 2}],
                    idempotency_key="k1",
                )
                ack, _ = await until(other, "ack")
                assert ack["deduped"] is True and ack["seqs"] == [2] and ack["created"] is False
                assert "performance" in ack

    run(body)


@pytest.mark.timeout(30)
def test_history_batches_tombstone_and_unsubscribe() -> None:
    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/c", json={"cap_records": 3})
            r = await s.http.post("/v0/topics/c", json={"records": [{"data": i} for i in range(6)]})
            assert r.status_code == 200
            async with s.ws() as ws:
                await send(ws, op="subscribe", request_id=1, topic="c", from_seq=0, limit=2)
                sub = await recv(ws)
                assert sub["topics"] == {"c": {"from_seq": 0, "head_seq": 6, "earliest_seq": 4}}
                tomb, r1, r2, cu = await recv_n(ws, 4)
                # the engine reason, never from_seq_too_old, and no missed_estimate
                assert tomb == {
                    "op": "tombstone",
                    "topic": "c",
                    "reason": "cap",
                    "gap_from": 1,
                    "gap_to": 3,
                    "earliest_seq": 4,
                    "head_seq": 6,
                }
                assert [x["$seq"] for x in r1["records"]] == [4, 5]
                assert (r1["from_seq"], r1["to_seq"]) == (3, 5)
                assert [x["$seq"] for x in r2["records"]] == [6]
                assert cu == {"op": "caught_up", "topic": "c", "head_seq": 6}
                # re-subscribing replaces the cursor
                await send(ws, op="subscribe", request_id=2, topic="c", from_seq=5)
                assert (await recv(ws))["topics"]["c"]["from_seq"] == 5
                rec, cu = await recv_n(ws, 2)
                assert [x["$seq"] for x in rec["records"]] == [6] and cu["op"] == "caught_up"
                await send(ws, op="unsubscribe", request_id=3, topics=["c"])
                assert await recv(ws) == {"op": "unsubscribed", "request_id": 3, "topics": ["c"]}
                await s.http.post("/v0/topics/c", json={"records": [{"data": 9}]})
                await nothing_pending(ws)
                await send(ws, op="unsubscribe", request_id=4, topic="zz")
                assert (await recv(ws))["topics"] == ["zz"]
                await eventually(lambda: not s.app.engine.topics["c"].listeners)

    run(body)


@pytest.mark.timeout(30)
def test_topic_deleted_removes_the_subscription() -> None:
    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/a")
            async with s.ws() as ws:
                await send(ws, op="subscribe", topic="a")
                assert [m["op"] for m in await recv_n(ws, 2)] == ["subscribed", "caught_up"]
                await s.http.delete("/v0/topics/a")
                assert await recv(ws) == {
                    "op": "topic_deleted",
                    "topic": "a",
                    "head_seq": 0,
                    "reason": "deleted",
                }
                await s.http.post("/v0/topics/a", json={"records": [{"data": 1}]})
                await nothing_pending(ws)

    run(body)


@pytest.mark.timeout(30)
def test_errors_ping_and_lenient() -> None:
    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/a")
            async with s.ws() as ws:
                await ws.ping()  # protocol-level ping is answered
                await send(ws, op="ping", request_id={"any": ["json"]})
                assert await recv(ws) == {"op": "pong", "request_id": {"any": ["json"]}}
                await send(ws, op="ping")
                assert await recv(ws) == {"op": "pong", "request_id": None}
                await ws.send("{not json")
                e = await recv(ws)
                assert (e["op"], e["request_id"], e["code"]) == ("error", None, "invalid_json")
                assert isinstance(e["message"], str)
                await send(ws, op="dance", request_id=5)
                e = await recv(ws)
                assert (e["request_id"], e["code"]) == (5, "invalid_json")
                await ws.send("[1,2]")
                assert (await recv(ws))["code"] == "invalid_json"
                await ws.send(b"\x00\x01")
                e = await recv(ws)
                assert (e["op"], e["code"]) == ("error", "unsupported_message")
                await send(ws, op="subscribe", request_id=6)
                assert (await recv(ws))["code"] == "invalid_request"
                await send(ws, op="unsubscribe", request_id=6)
                assert (await recv(ws))["code"] == "invalid_request"
                await send(ws, op="subscribe", request_id=7, topic=5)
                assert (await recv(ws))["code"] == "invalid_json"
                await send(ws, op="subscribe", request_id=7, topic="a", limit="many")
                assert (await recv(ws))["code"] == "invalid_json"
                await send(ws, op="subscribe", request_id=8, topic="nope")
                e = await recv(ws)
                assert (e["request_id"], e["code"]) == (8, "topic_not_found")
                await send(ws, op="subscribe", request_id=9, topics={"nope": {}}, lenient=True)
                assert await recv(ws) == {"op": "subscribed", "request_id": 9, "topics": {}}
                await send(ws, op="publish", request_id=10, topic="a")
                assert (await recv(ws))["code"] == "invalid_json"
                await send(ws, op="publish", request_id=11, topic="a", records=[])
                assert (await recv(ws))["code"] == "invalid_request"
                await send(
                    ws, op="publish", request_id=12, topic="b", records=[{"data": 1}], create=False
                )
                assert (await recv(ws))["code"] == "topic_not_found"
                await s.http.put("/v0/topics/full", json={"cap_records": 1, "discard": "reject"})
                await send(ws, op="publish", request_id=13, topic="full", records=[{"data": 1}])
                assert (await recv(ws))["op"] == "ack"
                await send(ws, op="publish", request_id=14, topic="full", records=[{"data": 1}])
                assert (await recv(ws))["code"] == "topic_full"
                await send(ws, op="publish", request_id=15, topic="new", records=[{"data": 1}])
                ack = await recv(ws)
                assert ack["created"] is True and ack["seqs"] == [1]

    run(body)


@pytest.mark.timeout(30)
def test_upgrade_auth_and_per_command_scopes() -> None:
    async def body() -> None:
        async with serve({"TOPICS_API_KEYS": "root,reader:r:ok.,writer:w,wa:w+a"}) as s:
            with pytest.raises(InvalidStatus) as ei:
                async with s.ws():
                    pass
            assert ei.value.response.status_code == 401
            with pytest.raises(InvalidStatus) as ei:
                async with s.ws(query="?token=root"):  # ?token= is never accepted here
                    pass
            assert ei.value.response.status_code == 401
            with pytest.raises(InvalidStatus):
                async with s.ws("bad"):
                    pass
            await s.http.put("/v0/topics/ok.a", headers={"authorization": "Bearer root"})
            await s.http.put("/v0/topics/zz", headers={"authorization": "Bearer root"})
            async with s.ws("reader") as ws:
                await send(ws, op="subscribe", request_id=1, topics={"ok.a": {}, "zz": {}})
                e = await recv(ws)
                assert (e["op"], e["request_id"], e["code"]) == ("error", 1, "forbidden")
                await send(ws, op="publish", request_id=2, topic="ok.a", records=[{"data": 1}])
                assert (await recv(ws))["code"] == "forbidden"
                await send(ws, op="subscribe", request_id=3, topic="ok.a")
                assert (await recv(ws))["op"] == "subscribed"
            async with s.ws("writer") as ws:
                await send(ws, op="subscribe", request_id=1, topic="ok.a")
                assert (await recv(ws))["code"] == "forbidden"
                await send(
                    ws, op="publish", request_id=2, topic="ok.a", records=[{"data": 1}], config={}
                )
                assert (await recv(ws))["code"] == "forbidden"  # config needs admin, always
                await send(ws, op="publish", request_id=3, topic="ok.a", records=[{"data": 1}])
                assert (await recv(ws))["op"] == "ack"
                await send(ws, op="unsubscribe", request_id=4, topic="ok.a")  # no auth needed
                assert (await recv(ws))["op"] == "unsubscribed"
            async with s.ws("wa") as ws:
                await send(
                    ws,
                    op="publish",
                    request_id=1,
                    topic="cfg",
                    records=[{"data": 1}],
                    config={"cap_records": 5},
                )
                ack = await recv(ws)
                assert ack["op"] == "ack" and ack["created"] is True
            r = await s.http.get("/v0/topics/cfg", headers={"authorization": "Bearer root"})
            assert r.json()["config"]["cap_records"] == 5

    run(body)


@pytest.mark.timeout(30)
def test_connection_cap_429_before_upgrade_and_slot_release() -> None:
    async def body() -> None:
        async with serve({"TOPICS_MAX_SSE_CONNECTIONS": "1"}) as s:
            async with s.ws() as ws:
                await nothing_pending(ws)
                assert s.app.sse_total == 1
                with pytest.raises(InvalidStatus) as ei:
                    async with s.ws():
                        pass
                assert ei.value.response.status_code == 429
                assert orjson.loads(ei.value.response.body)["error"]["code"] == "throttled"
            await eventually(lambda: s.app.sse_total == 0)
            async with s.ws() as ws:
                await nothing_pending(ws)

    run(body)


@pytest.mark.timeout(30)
def test_shutdown_error_then_close() -> None:
    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/a")
            async with s.ws() as ws:
                await send(ws, op="subscribe", topic="a")
                await recv_n(ws, 2)
                assert s.app.shutting_down is not None
                s.app.shutting_down.set()
                e = await recv(ws)
                assert e == {
                    "op": "error",
                    "request_id": None,
                    "code": "server_shutting_down",
                    "message": "server is shutting down; reconnect",
                }
                with pytest.raises(ConnectionClosed):
                    await recv(ws)
            await eventually(lambda: s.app.sse_total == 0)
            assert not s.app.engine.topics["a"].listeners

    run(body)


@pytest.mark.timeout(30)
def test_outbox_holds_at_most_four_messages() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        sent: list[str] = []

        async def slow_send(msg: dict[str, Any]) -> None:
            await gate.wait()
            sent.append(msg["text"])

        ob = Outbox(slow_send)
        assert OUTBOX_SLOTS == 4
        writer = asyncio.create_task(ob.run())
        for i in range(4):
            await ob.put(b'{"i":%d}' % i)
        blocked = asyncio.create_task(ob.put(b'{"i":4}'))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # the fifth producer waits: nothing piles up
        gate.set()
        await blocked
        await ob.flushed()
        assert sent == [f'{{"i":{i}}}' for i in range(5)]
        writer.cancel()

    run(body)


@pytest.mark.timeout(30)
def test_slow_reader_gets_everything_in_order() -> None:
    async def body() -> None:
        async with serve() as s:
            blob = "y" * 8000
            for _ in range(40):
                r = await s.http.post("/v0/topics/big", json={"records": [{"data": blob}] * 25})
                assert r.status_code in (200, 201)
            async with s.ws() as ws:
                await send(ws, op="subscribe", topic="big", max_batch_bytes=65536)
                await asyncio.sleep(0.3)  # the client does not read: the server backs off
                await send(ws, op="ping", request_id="late")
                msgs: list[dict[str, Any]] = []
                while not any(m["op"] == "caught_up" for m in msgs) or not any(
                    m["op"] == "pong" for m in msgs
                ):
                    msgs.append(await recv(ws))
                recs = [m for m in msgs if m["op"] == "record"]
                seqs = [x["$seq"] for m in recs for x in m["records"]]
                assert seqs == list(range(1, 1001))
                assert all(len(m["records"]) <= 9 for m in recs)
                assert [
                    (a["to_seq"], b["from_seq"]) for a, b in zip(recs, recs[1:], strict=False)
                ] == [(a["to_seq"], a["to_seq"]) for a in recs[:-1]]

    run(body)


def test_outbox_direct_sends_keep_the_order_of_queued_messages() -> None:
    """A message sent from the producer's task goes out at once only when nothing is queued
    or being sent; otherwise it waits its turn, and the slots all come back."""

    async def body() -> None:
        gate = asyncio.Event()
        sent: list[str] = []

        async def slow_send(msg: dict[str, Any]) -> None:
            if not gate.is_set():
                await gate.wait()
            sent.append(msg["text"])

        ob = Outbox(slow_send)
        writer = asyncio.create_task(ob.run())
        await ob.reserve()
        first = asyncio.create_task(ob.send(b"a"))  # idle: sent from this task
        await asyncio.sleep(0)
        await ob.put(b"b")  # a reply while "a" is in flight: queued
        await ob.reserve()
        await ob.send(b"c")  # behind "b": queued, returns at once
        assert not first.done() and sent == []
        gate.set()
        await first
        await ob.flushed()
        assert sent == ["a", "b", "c"]
        await ob.reserve()
        await ob.send(b"d")  # idle again: direct
        assert sent == ["a", "b", "c", "d"]
        for _ in range(OUTBOX_SLOTS):  # every slot is free again
            await asyncio.wait_for(ob.reserve(), 1)
        writer.cancel()

    run(body)


@pytest.mark.timeout(30)
def test_publications_reach_parked_sockets_through_the_fanout() -> None:
    """Parked subscribers get each publication from the shared fan-out, written to the
    socket directly, in order; the outbox accounting is untouched (a ping still answers)."""

    async def body() -> None:
        async with serve() as s:
            await s.http.put("/v0/topics/fan")
            async with contextlib.AsyncExitStack() as stack:
                socks = [await stack.enter_async_context(s.ws()) for _ in range(12)]
                for ws in socks:
                    await send(ws, op="subscribe", topic="fan")
                    assert (await recv(ws))["op"] == "subscribed"
                    assert (await recv(ws))["op"] == "caught_up"
                await asyncio.sleep(0.05)  # every delivery task parks
                fan = s.app.fanout()
                writes0 = fan.writes
                for i in range(1, 6):
                    r = await s.http.post("/v0/topics/fan", json={"records": [{"data": i}]})
                    assert r.status_code == 200
                    for ws in socks:
                        rec, cu = await recv_n(ws, 2)
                        assert rec["op"] == "record" and [x["data"] for x in rec["records"]] == [i]
                        assert (rec["from_seq"], rec["to_seq"]) == (i - 1, i)
                        assert cu == {"op": "caught_up", "topic": "fan", "head_seq": i}
                assert fan.writes - writes0 == 5 * len(socks)
                for ws in socks:
                    await nothing_pending(ws)

    run(body)
