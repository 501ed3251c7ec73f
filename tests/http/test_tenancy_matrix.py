"""Tenancy matrix: a key limited to the prefix `t1.` against every endpoint that names topics.

Each case runs on a fresh server (the production ASGI stack on a real socket,
127.0.0.1:<ephemeral>): the same request is made naming a `t2.` topic (refused
with the canonical `403 forbidden`, and the whole server state is compared
before and after: topics, their heads and configs, queue leases, routers,
watch sessions, streaming slots) and naming a `t1.` topic (allowed). Names are
checked wherever a request carries them: the path, write/PUT configs
(`dead_letter`), router `source`/`dest`, watch and WebSocket topic lists, and
topics a request would create or write as a side effect (router destinations,
a queue's dead-letter topic on claim).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tests.support.live import LiveServer, Sse, live_app
from tests.support.process import ServerProcess

from topics.http.app import TopicsApp

# Real sockets, every endpoint twice: the full tier (about 8 s).
pytestmark = pytest.mark.slow

KEYS = "root,ten::t1."
ROOT = {"authorization": "Bearer root"}
TEN = {"authorization": "Bearer ten"}

Call = Callable[[LiveServer, str], Awaitable[None]]


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        async with asyncio.timeout(25):
            await fn()

    asyncio.run(main())


# ---------------------------------------------------------------- state


def snapshot(app: TopicsApp) -> dict[str, Any]:
    """Everything a refused request must leave unchanged."""
    eng = app.engine
    now = eng.clock.now_ms()
    topics: dict[str, Any] = {}
    for name, t in sorted(eng.topics.items()):
        q = t.queue
        topics[name] = {
            "head": t.head_seq,
            "earliest": t.earliest_seq,
            "live": t.live_count,
            "config": t.config.to_wire(),
            "leases": None
            if q is None
            else sorted((s, ls.node, ls.lease_id, ls.deadline_ms) for s, ls in q.leases.items()),
            "deliveries": None if q is None else dict(q.deliveries),
            "counters": None if q is None else q.counters(t, now),
        }
    routers = {r.name: r.to_wire() for r in app.routers.routers()}
    return {
        "topics": topics,
        "routers": routers,
        "watch_sessions": sorted(app.watches.sessions),
        "sse_total": app.sse_total,
    }


async def seed(s: LiveServer) -> None:
    """Two logs and two queues per tenant prefix, written by the unrestricted key."""
    c = s.http
    for p in ("t1.", "t2."):
        r = await c.post(
            f"/v0/topics/{p}x", json={"records": [{"data": 1}, {"data": 2}]}, headers=ROOT
        )
        assert r.status_code == 201, r.text
        r = await c.put(f"/v0/topics/{p}q", json={"type": "queue"}, headers=ROOT)
        assert r.status_code == 201, r.text
        r = await c.post(
            f"/v0/topics/{p}q", json={"records": [{"data": "j1"}, {"data": "j2"}]}, headers=ROOT
        )
        assert r.status_code == 200, r.text
    # A lease held on each queue (by the root key), so ack/nack/extend have a target.
    for p in ("t1.", "t2."):
        r = await c.post(f"/v0/topics/{p}q/claim", json={"node": "n1"}, headers=ROOT)
        assert r.json()["count"] == 1, r.text


def forbidden(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 403, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == "forbidden" and isinstance(err["message"], str), err
    assert set(err) <= {"code", "message", "detail"}
    return dict(err)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert 200 <= r.status_code < 300, (r.status_code, r.text)
    return dict(r.json())


# ---------------------------------------------------------------- the cases
#
# Each case is an async function (server, prefix) making the request with the
# tenant key; `prefix` is "t2." for the refused run and "t1." for the allowed
# one. It returns the response (HTTP) or the WebSocket reply (dict).


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[LiveServer, str], Awaitable[Any]]
    check_ok: Callable[[Any, str], None] | None = None
    # detail.topic expected on the 403 (None: message only, the path allowlist).
    detail: Callable[[str], str | None] = lambda p: None
    # Done by the root key before the state snapshot (same prefix as the request).
    setup: Callable[[LiveServer, str], Awaitable[None]] | None = None


async def put_topic(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.put(f"/v0/topics/{p}new", json={}, headers=TEN)


async def get_topic(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.get(f"/v0/topics/{p}x", headers=TEN)


async def delete_topic(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.delete(f"/v0/topics/{p}x", headers=TEN)


async def append(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.post(f"/v0/topics/{p}x", json={"records": [{"data": 3}]}, headers=TEN)


async def append_create(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.post(f"/v0/topics/{p}new", json={"records": [{"data": 3}]}, headers=TEN)


async def append_config_dead_letter(s: LiveServer, p: str) -> httpx.Response:
    # The topic itself is always the tenant's; only the dead-letter name varies.
    body = {
        "records": [{"data": 3}],
        "config": {"type": "queue", "max_deliveries": 1, "dead_letter": f"{p}dlq"},
    }
    return await s.http.post("/v0/topics/t1.newq", json=body, headers=TEN)


async def diff(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.post(f"/v0/topics/{p}x/diff", json={"from_seq": 0}, headers=TEN)


async def delete_records(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.post(f"/v0/topics/{p}x/delete", json={"before_seq": 2}, headers=TEN)


async def put_queue_dead_letter(s: LiveServer, p: str) -> httpx.Response:
    body = {"type": "queue", "max_deliveries": 1, "dead_letter": f"{p}dlq"}
    return await s.http.put("/v0/topics/t1.q", json=body, headers=TEN)


async def router_dest(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.put(
        "/v0/routers/t1.r", json={"source": "t1.x", "dest": f"{p}dest"}, headers=TEN
    )


async def router_source(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.put(
        "/v0/routers/t1.r", json={"source": f"{p}src", "dest": "t1.dest"}, headers=TEN
    )


async def router_name(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.put(
        f"/v0/routers/{p}r", json={"source": "t1.x", "dest": "t1.dest"}, headers=TEN
    )


def rr(p: str) -> tuple[str, str]:
    """Name and dest of the root-made router of a case run (both inside `t1.`)."""
    return ("t1.rr", "t1.sink") if p == "t2." else ("t1.rr1", "t1.sink1")


async def root_router(s: LiveServer, p: str) -> None:
    """A router made by root from `{p}x` into a `t1.` topic (see :func:`rr`)."""
    name, dest = rr(p)
    r = await s.http.put(
        f"/v0/routers/{name}", json={"source": f"{p}x", "dest": dest}, headers=ROOT
    )
    assert r.status_code == 201, r.text


async def get_router(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.get(f"/v0/routers/{rr(p)[0]}", headers=TEN)


async def delete_router(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.delete(f"/v0/routers/{rr(p)[0]}", headers=TEN)


async def update_router(s: LiveServer, p: str) -> httpx.Response:
    """Re-PUT of an existing router: its stored source is checked, not just the body."""
    name, dest = rr(p)
    body = {"source": "t1.x", "dest": dest, "preserve_tag": False}
    return await s.http.put(f"/v0/routers/{name}", json=body, headers=TEN)


async def claim(s: LiveServer, p: str) -> httpx.Response:
    return await s.http.post(f"/v0/topics/{p}q/claim", json={"node": "n2"}, headers=TEN)


async def root_dead_letter(s: LiveServer, p: str) -> None:
    """Root points the tenant's queue at a dead-letter topic (created on demand)."""
    cfg = {"type": "queue", "max_deliveries": 1, "dead_letter": f"{p}dlq"}
    assert (await s.http.put("/v0/topics/t1.q", json=cfg, headers=ROOT)).status_code == 200


async def claim_dead_letter(s: LiveServer, p: str) -> httpx.Response:
    """The claim could move a job to the dead-letter topic, so that name is checked."""
    return await s.http.post("/v0/topics/t1.q/claim", json={"node": "n2"}, headers=TEN)


async def work_dead_letter(s: LiveServer, p: str) -> Any:
    return await work_on(s, "t1.q")


def _lease_body(app: TopicsApp, topic: str, **extra: Any) -> dict[str, Any]:
    q = app.engine.topics[topic].queue
    assert q is not None
    seq, ls = next(iter(q.leases.items()))
    return {"node": ls.node, "seqs": [seq], "lease_ids": [f"lease_{ls.lease_id:x}"], **extra}


async def ack(s: LiveServer, p: str) -> httpx.Response:
    body = _lease_body(s.app, f"{p}q")
    return await s.http.post(f"/v0/topics/{p}q/ack", json=body, headers=TEN)


async def nack(s: LiveServer, p: str) -> httpx.Response:
    body = _lease_body(s.app, f"{p}q")
    return await s.http.post(f"/v0/topics/{p}q/nack", json=body, headers=TEN)


async def extend(s: LiveServer, p: str) -> httpx.Response:
    body = _lease_body(s.app, f"{p}q", lease_ms=60_000)
    return await s.http.post(f"/v0/topics/{p}q/extend", json=body, headers=TEN)


async def work(s: LiveServer, p: str) -> Any:
    return await work_on(s, f"{p}q")


async def work_on(s: LiveServer, topic: str) -> Any:
    """`GET .../work`: the error response, or the first SSE event of the stream."""
    url = f"/v0/topics/{topic}/work?node=n3"
    async with s.http.stream("GET", url, headers={**TEN, "accept": "text/event-stream"}) as r:
        if r.status_code != 200:
            await r.aread()
            return r
        ev = await Sse(r).event()
        return ev


async def work_token(s: LiveServer, p: str) -> Any:
    """The same through the `?token=` fallback of the SSE GETs."""
    url = f"/v0/topics/{p}q/work?node=n3&token=ten"
    async with s.http.stream("GET", url) as r:
        if r.status_code != 200:
            await r.aread()
            return r
        return await Sse(r).event()


async def watch(s: LiveServer, p: str) -> httpx.Response:
    body = {"topics": {"t1.x": {}, f"{p}x": {}}}
    return await s.http.post("/v0/watch", json=body, headers=TEN)


async def watch_lenient(s: LiveServer, p: str) -> httpx.Response:
    body = {"topics": {f"{p}absent": {}}}
    return await s.http.post("/v0/watch?lenient=true", json=body, headers=TEN)


async def _ws(s: LiveServer, **cmd: Any) -> dict[str, Any]:
    async with s.ws("ten") as ws:
        await ws.send(orjson.dumps({"request_id": 1, **cmd}).decode())
        async with asyncio.timeout(5):
            msg = await ws.recv()
        out: dict[str, Any] = orjson.loads(msg)
        return out


async def ws_subscribe(s: LiveServer, p: str) -> dict[str, Any]:
    return await _ws(s, op="subscribe", topics={"t1.x": {}, f"{p}x": {}})


async def ws_publish(s: LiveServer, p: str) -> dict[str, Any]:
    return await _ws(s, op="publish", topic=f"{p}new", records=[{"data": 1}])


async def ws_publish_config(s: LiveServer, p: str) -> dict[str, Any]:
    cfg = {"type": "queue", "max_deliveries": 1, "dead_letter": f"{p}dlq"}
    return await _ws(s, op="publish", topic="t1.newq", records=[{"data": 1}], config=cfg)


def created(code: int) -> Callable[[Any, str], None]:
    def check(r: Any, _p: str) -> None:
        assert r.status_code == code, r.text

    return check


def is_job(ev: Any, _p: str) -> None:
    assert ev["event"] == "job" and ev["data"]["topic"].startswith("t1."), ev


def ws_ok(op: str) -> Callable[[Any, str], None]:
    def check(m: Any, _p: str) -> None:
        assert m["op"] == op, m

    return check


def topic_of(suffix: str) -> Callable[[str], str]:
    return lambda p: f"{p}{suffix}"


CASES = [
    Case("put_topic", put_topic, created(201)),
    Case("get_topic", get_topic),
    Case("delete_topic", delete_topic),
    Case("append", append),
    Case("append_autocreate", append_create, created(201)),
    Case("append_config_dead_letter", append_config_dead_letter, created(201), topic_of("dlq")),
    Case("diff", diff),
    Case("delete_records", delete_records),
    Case("put_queue_dead_letter", put_queue_dead_letter, None, topic_of("dlq")),
    Case("router_dest", router_dest, created(201), topic_of("dest")),
    Case("router_source", router_source, created(201), topic_of("src")),
    Case("router_name", router_name, created(201)),
    Case("router_get_existing", get_router, None, topic_of("x"), root_router),
    Case("router_delete_existing", delete_router, None, topic_of("x"), root_router),
    Case("router_update_existing", update_router, None, topic_of("x"), root_router),
    Case("claim", claim),
    Case("claim_dead_letter", claim_dead_letter, None, topic_of("dlq"), root_dead_letter),
    Case("work_dead_letter", work_dead_letter, is_job, topic_of("dlq"), root_dead_letter),
    Case("ack", ack),
    Case("nack", nack),
    Case("extend", extend),
    Case("work", work, is_job),
    Case("work_token", work_token, is_job),
    Case("watch", watch, None, topic_of("x")),
    Case("watch_lenient", watch_lenient, None, topic_of("absent")),
    Case("ws_subscribe", ws_subscribe, ws_ok("subscribed")),
    Case("ws_publish", ws_publish, ws_ok("ack")),
    Case("ws_publish_config_dead_letter", ws_publish_config, ws_ok("ack")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_refused_outside_prefix_allowed_inside(case: Case) -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            await seed(s)
            if case.setup is not None:
                await case.setup(s, "t2.")
            before = snapshot(s.app)
            got = await case.call(s, "t2.")
            if isinstance(got, dict) and "op" in got:  # WebSocket reply
                assert (got["op"], got["code"]) == ("error", "forbidden"), got
                assert "t2." in got["message"]
            else:
                err = forbidden(got)
                want = case.detail("t2.")
                if want is not None:
                    assert err.get("detail") == {"topic": want}, err
            assert snapshot(s.app) == before
            # The same request inside the prefix (the refusal changed nothing, so
            # this is as good as a fresh server).
            if case.setup is not None:
                await case.setup(s, "t1.")
            got = await case.call(s, "t1.")
            if case.check_ok is not None:
                case.check_ok(got, "t1.")
            elif isinstance(got, httpx.Response):
                ok(got)
            else:
                assert got.get("op") != "error", got

    run(body)


# ---------------------------------------------------------------- beyond the matrix


def test_listings_are_filtered_to_the_prefix() -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            await seed(s)
            await root_router(s, "t2.")  # t1.rr: t2.x -> t1.sink (not fully the tenant's)
            r = await s.http.put(
                "/v0/routers/t1.mine", json={"source": "t1.x", "dest": "t1.copy"}, headers=TEN
            )
            assert r.status_code == 201, r.text
            names = [t["topic"] for t in ok(await s.http.get("/v0/topics", headers=TEN))["topics"]]
            assert names and all(n.startswith("t1.") for n in names), names
            routers = ok(await s.http.get("/v0/routers", headers=TEN))["routers"]
            assert [x["router"] for x in routers] == ["t1.mine"]

    run(body)


def test_metrics_show_a_restricted_key_only_its_own_topics() -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            await seed(s)
            r = await s.http.put(
                "/v0/routers/t2.r", json={"source": "t2.x", "dest": "t2.copy"}, headers=ROOT
            )
            assert r.status_code == 201
            r = await s.http.put(
                "/v0/routers/t1.r", json={"source": "t1.x", "dest": "t1.copy"}, headers=TEN
            )
            assert r.status_code == 201
            ok(await s.http.post("/v0/watch", json={"topics": {"t2.x": {}}}, headers=ROOT))
            ok(await s.http.post("/v0/watch", json={"topics": {"t1.x": {}}}, headers=TEN))
            js = {"accept": "application/json"}

            mine = ok(await s.http.get("/v0/metrics", headers={**TEN, **js}))
            assert mine["topics"] == 3  # t1.x, t1.q, t1.copy
            assert mine["topics_disk"] == 3
            assert mine["queue_topics"] == 1 and mine["queue_leases_in_flight"] == 1
            assert mine["records_live"] == 4  # two in t1.x, two jobs in t1.q
            assert mine["routers"] == 1 and mine["watch_sessions"] == 1
            assert "wal" not in mine and "storage" not in mine

            every = ok(await s.http.get("/v0/metrics", headers={**ROOT, **js}))
            assert every["topics"] == 6
            assert every["queue_topics"] == 2 and every["queue_leases_in_flight"] == 2
            assert every["records_live"] == 8
            assert every["routers"] == 2 and every["watch_sessions"] == 2
            assert "storage" in every

            r = await s.http.get("/v0/metrics", headers=TEN)
            assert r.headers["content-type"].startswith("text/plain")
            text = r.text
            assert "t2." not in text
            assert 'topics_topic_head_seq{topic="t1.x"} 2' in text
            assert 'topics_topic_queue_in_flight{topic="t1.q"} 1' in text
            assert "\ntopics_topics 3\n" in text and "\ntopics_routers 1\n" in text
            assert "topics_index_bytes" not in text
            text = (await s.http.get("/v0/metrics", headers=ROOT)).text
            assert 'topics_topic_head_seq{topic="t2.x"} 2' in text
            assert "\ntopics_topics 6\n" in text and "topics_index_bytes" in text

    run(body)


def test_router_conflicts_do_not_name_other_tenants_topics() -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            c = s.http
            # Root: ops.feed feeds t1.in from t2.secret; and t1.b -> t2.hop -> t1.a.
            for src, dst, rname in (
                ("t2.secret", "t1.in", "ops.feed"),
                ("t1.b", "t2.hop", "ops.out"),
                ("t2.hop", "t1.a", "ops.back"),
            ):
                r = await c.put(
                    f"/v0/routers/{rname}", json={"source": src, "dest": dst}, headers=ROOT
                )
                assert r.status_code == 201, r.text
            before = snapshot(s.app)
            r = await c.put(
                "/v0/routers/t1.r", json={"source": "t1.other", "dest": "t1.in"}, headers=TEN
            )
            assert r.status_code == 409
            err = r.json()["error"]
            assert err["detail"] == {"topic": "t1.in", "reason": "router_dest_fan_in"}
            assert "t2." not in r.text and "ops." not in r.text
            r = await c.put(
                "/v0/routers/t1.cyc", json={"source": "t1.a", "dest": "t1.b"}, headers=TEN
            )
            assert r.status_code == 409
            err = r.json()["error"]
            assert err["code"] == "router_cycle"
            assert err["detail"]["cycle"] == ["t1.a", "t1.b", "<hidden>", "t1.a"]
            assert "t2." not in r.text
            assert snapshot(s.app) == before
            # The unrestricted key still gets the full story.
            r = await c.put(
                "/v0/routers/t1.cyc", json={"source": "t1.a", "dest": "t1.b"}, headers=ROOT
            )
            assert r.json()["error"]["detail"]["cycle"] == ["t1.a", "t1.b", "t2.hop", "t1.a"]

    run(body)


def test_delete_topic_names_only_the_keys_routers() -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            await seed(s)
            await root_router(s, "t2.")  # t1.rr: t2.x -> t1.sink
            r = await s.http.put(
                "/v0/routers/ops.tap", json={"source": "t1.sink", "dest": "ops.log"}, headers=ROOT
            )
            assert r.status_code == 201
            r = await s.http.put(
                "/v0/routers/t1.fwd", json={"source": "t1.sink", "dest": "t1.copy"}, headers=TEN
            )
            assert r.status_code == 201
            out = ok(await s.http.delete("/v0/topics/t1.sink", headers=TEN))
            assert out["deleted"] is True
            assert out["routers_removed"] == ["t1.fwd", "t1.rr"]  # not ops.tap

    run(body)


def test_work_stream_ends_when_the_dead_letter_leaves_the_prefix() -> None:
    async def body() -> None:
        async with live_app({"TOPICS_API_KEYS": KEYS}) as s:
            await seed(s)
            url = "/v0/topics/t1.q/work?node=n3&max=5"
            async with s.http.stream("GET", url, headers=TEN) as r:
                assert r.status_code == 200
                sse = Sse(r)
                assert (await sse.event())["event"] == "job"
                cfg = {"type": "queue", "max_deliveries": 1, "dead_letter": "t2.dlq"}
                r2 = await s.http.put("/v0/topics/t1.q", json=cfg, headers=ROOT)
                assert r2.status_code == 200
                ev = await sse.event()
                assert ev["event"] == "error" and ev["data"]["code"] == 403, ev
                assert await sse.block() is None  # the stream ended
            assert "t2.dlq" not in s.app.engine.topics
            assert s.app.sse_total == 0

    run(body)


@pytest.mark.e2e
def test_real_server_refusals_leave_nothing_behind_across_a_restart(tmp_path: Path) -> None:
    """`topics serve` with a data dir: refused requests log nothing that recovery brings back."""
    env = {"TOPICS_API_KEYS": KEYS}
    srv = ServerProcess(tmp_path, env)
    try:
        with httpx.Client(base_url=srv.base, timeout=10) as c:
            assert c.put("/v0/topics/t1.q", json={"type": "queue"}, headers=TEN).status_code == 201
            refused = [
                c.put(
                    "/v0/topics/t1.q", json={"type": "queue", "dead_letter": "t2.dlq"}, headers=TEN
                ),
                c.post(
                    "/v0/topics/t1.w",
                    json={"records": [{"data": 1}], "config": {"dead_letter": "t2.dlq"}},
                    headers=TEN,
                ),
                c.put("/v0/routers/t1.r", json={"source": "t1.q", "dest": "t2.out"}, headers=TEN),
                c.put("/v0/routers/t1.r", json={"source": "t2.in", "dest": "t1.out"}, headers=TEN),
                c.post("/v0/topics/t2.x", json={"records": [{"data": 1}]}, headers=TEN),
            ]
            for r in refused:
                forbidden(r)
            js = {"accept": "application/json"}
            mine = c.get("/v0/metrics", headers={**TEN, **js}).json()
            every = c.get("/v0/metrics", headers={**ROOT, **js}).json()
            assert mine["topics"] == 1 and "wal" not in mine
            assert every["topics"] == 1 and "wal" in every
            assert "topics_wal_frames_total" not in c.get("/v0/metrics", headers=TEN).text
            assert "topics_wal_frames_total" in c.get("/v0/metrics", headers=ROOT).text
    finally:
        assert srv.stop() == 0
    srv = ServerProcess(tmp_path, env)
    try:
        with httpx.Client(base_url=srv.base, timeout=10) as c:
            names = [t["topic"] for t in c.get("/v0/topics", headers=ROOT).json()["topics"]]
            assert names == ["t1.q"]
            assert c.get("/v0/routers", headers=ROOT).json()["routers"] == []
            cfg = c.get("/v0/topics/t1.q", headers=ROOT).json()["config"]
            assert cfg["dead_letter"] is None
    finally:
        assert srv.stop() == 0
