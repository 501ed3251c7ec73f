"""Contract tests for queue claim/ack/nack/extend and the `/work` SSE push (API §10).

The request/response endpoints run through the in-process harness; `/work` is a
long-lived stream, which ASGITransport buffers, so the streaming tests serve the
app with uvicorn on an ephemeral port in the test's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from tests.support.harness import Harness, assert_error
from tests.support.live import Sse, live_app

from topics.http.app import TopicsApp

T0 = 1767225600000  # TestClock start


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def queue(h: Harness, name: str = "q", **cfg: Any) -> None:
    r = h.put(f"/v0/topics/{name}", {"type": "queue", **cfg})
    assert r.status_code in (200, 201), r.text


def claim(h: Harness, q: str = "q", **body: Any) -> dict[str, Any]:
    r = h.post(f"/v0/topics/{q}/claim", body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def op(h: Harness, name: str, q: str = "q", **body: Any) -> dict[str, Any]:
    r = h.post(f"/v0/topics/{q}/{name}", body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def counters(h: Harness, q: str = "q") -> dict[str, int]:
    r = h.get(f"/v0/topics/{q}?touch=false")
    assert r.status_code == 200, r.text
    return dict(r.json()["queue"])


# ---------------------------------------------------------------- shapes


def test_claim_response_and_job_shape(h: Harness) -> None:
    queue(h, lease_ms=45000)
    h.write("q", {"invoice": 77}, tag="inv:77", node="gw", meta={"trace": "t"})
    h.write("q", 2, 3)
    r = h.post("/v0/topics/q/claim", {"node": "w1", "max": 2})
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["topic", "claimed", "count", "ready", "performance"]
    assert body["topic"] == "q" and body["count"] == 2 and body["ready"] == 1
    j1, j2 = body["claimed"]
    assert list(j1) == ["$seq", "lease_id", "deadline", "$ts", "$tag", "deliveries", "data", "meta"]
    assert j1 == {
        "$seq": 1,
        "lease_id": "lease_1",
        "deadline": T0 + 45000,
        "$ts": T0,
        "$tag": "inv:77",
        "deliveries": 1,
        "data": {"invoice": 77},
        "meta": {"trace": "t"},
    }
    assert list(j2) == ["$seq", "lease_id", "deadline", "$ts", "deliveries", "data"]
    assert (j2["$seq"], j2["lease_id"], j2["data"]) == (2, "lease_2", 2)
    # default max is 1; `ready` counts what is left
    b = claim(h, node="w2")
    assert [j["$seq"] for j in b["claimed"]] == [3] and b["count"] == 1 and b["ready"] == 0
    # nothing left: an empty claim is not an error
    b = claim(h, node="w2", max=10)
    assert b["claimed"] == [] and b["count"] == 0 and b["ready"] == 0


def test_lease_ids_are_hex_and_max_and_lease_clamps(h: Harness) -> None:
    queue(h)
    h.write("q", *range(40))
    b = claim(h, node="w", max=0)  # 0 => 1
    assert b["count"] == 1 and b["claimed"][0]["deadline"] == T0 + 30000
    b = claim(h, node="w", max=30, lease_ms=5)  # lease clamped up to 100
    assert b["count"] == 30
    assert {j["deadline"] for j in b["claimed"]} == {T0 + 100}
    ids = [j["lease_id"] for j in b["claimed"]]
    assert ids[0] == "lease_2" and ids[8] == "lease_a" and ids[14] == "lease_10"
    assert ids[-1] == "lease_1f"
    b = claim(h, node="w", max=2**32 - 1, lease_ms=10**12)  # max clamped to 1000, lease to 1 day
    assert b["count"] == 9 and b["claimed"][0]["deadline"] == T0 + 86_400_000
    assert [j["$seq"] for j in b["claimed"]] == list(range(32, 41))
    # `max` is a u32: beyond that it is a type error
    assert_error(h.post("/v0/topics/q/claim", {"node": "w", "max": 2**32}), 400, "invalid_request")


def test_ack_nack_extend_shapes(h: Harness) -> None:
    queue(h, lease_ms=1000)
    h.write("q", 1, 2, 3, 4)
    jobs = claim(h, node="w", max=3)["claimed"]
    ids = [j["lease_id"] for j in jobs]
    h.clock.advance(500)
    r = h.post("/v0/topics/q/extend", {"node": "w", "seqs": [1, 9, 2], "lease_ms": 5000})
    assert r.status_code == 200
    b = r.json()
    assert list(b) == ["topic", "extended", "skipped", "deadlines", "performance"]
    assert b["extended"] == 2 and b["skipped"] == [9]
    assert b["deadlines"] == {"1": T0 + 5500, "2": T0 + 5500}  # set, not add
    r = h.post(
        "/v0/topics/q/ack", {"node": "w", "seqs": [1, 4, 2], "lease_ids": [ids[0], "", "lease_99"]}
    )
    assert r.status_code == 200
    b = r.json()
    assert list(b) == ["topic", "acked", "skipped", "ready", "in_flight", "performance"]
    assert b == {**b, "topic": "q", "acked": 1, "skipped": [4, 2], "ready": 1, "in_flight": 2}
    assert "fsync_ms" not in b["performance"]  # only when > 0
    r = h.post("/v0/topics/q/nack", {"node": "w", "seqs": [2, 3, 1]})
    assert r.status_code == 200
    b = r.json()
    assert list(b) == ["topic", "nacked", "skipped", "ready", "in_flight", "performance"]
    assert b == {**b, "topic": "q", "nacked": 2, "skipped": [1], "ready": 3, "in_flight": 0}
    # the acked job is gone from the topic; reclaimed jobs come back first, deliveries kept
    assert h.get("/v0/topics/q").json()["count"] == 3
    jobs = claim(h, node="w2", max=3)["claimed"]
    assert [(j["$seq"], j["deliveries"]) for j in jobs] == [(2, 2), (3, 2), (4, 1)]
    # ack/nack/extend of an empty seqs list is fine
    assert op(h, "ack", node="w2", seqs=[])["acked"] == 0
    assert op(h, "extend", node="w2", seqs=[], lease_ms=1)["deadlines"] == {}


def test_matching_rules_node_fence_and_idempotency(h: Harness) -> None:
    queue(h)
    h.write("q", 1, 2)
    j1, j2 = claim(h, node="w", max=2)["claimed"]
    # another node cannot touch the lease
    assert op(h, "ack", node="other", seqs=[1])["skipped"] == [1]
    assert op(h, "nack", node="other", seqs=[1])["skipped"] == [1]
    assert op(h, "extend", node="other", seqs=[1], lease_ms=100)["skipped"] == [1]
    # a stale fence token is skipped, the right one matches
    b = op(h, "ack", node="w", seqs=[1, 2], lease_ids=[j2["lease_id"], j2["lease_id"]])
    assert b["acked"] == 1 and b["skipped"] == [1]
    # acking again is idempotent
    b = op(h, "ack", node="w", seqs=[2, 2])
    assert b["acked"] == 0 and b["skipped"] == [2, 2]
    b = op(h, "ack", node="w", seqs=[1, 1])
    assert b["acked"] == 1 and b["skipped"] == [1]
    assert h.get("/v0/topics/q").json()["count"] == 0


# ------------------------------------------------------------ validation order


def test_missing_topic_404_and_log_topic_409(h: Harness) -> None:
    h.write("log", 1)
    bodies = {
        "claim": {"node": "w"},
        "ack": {"node": "w", "seqs": [1]},
        "nack": {"node": "w", "seqs": [1]},
        "extend": {"node": "w", "seqs": [1], "lease_ms": 1000},
    }
    for name, body in bodies.items():
        err = assert_error(h.post(f"/v0/topics/nope/{name}", body), 404, "topic_not_found")
        assert err["detail"] == {"topic": "nope"}
        err = assert_error(h.post(f"/v0/topics/log/{name}", body), 409, "not_a_queue")
        assert err["detail"] == {"topic": "log"}
    assert h.get("/v0/topics/nope").status_code == 404  # never auto-created


def test_claim_validation_order(h: Harness) -> None:
    queue(h)
    h.write("log", 1)
    # empty body => 400 (even without a content type), whatever the topic
    for t in ("q", "nope", "log"):
        err = assert_error(h.post(f"/v0/topics/{t}/claim", content=b""), 400, "invalid_request")
        assert "node" in err["message"]
        assert_error(
            h.post(
                f"/v0/topics/{t}/claim", content=b"  ", headers={"content-type": "application/json"}
            ),
            400,
            "invalid_request",
        )
    # a non-empty body needs the JSON content type
    assert_error(
        h.post("/v0/topics/q/claim", content=b'{"node":"w"}'), 415, "unsupported_media_type"
    )
    # type errors / missing node are 400 before the topic lookup
    for body in (
        {},
        {"node": None},
        {"node": 5},
        {"node": "w", "max": -1},
        {"node": "w", "max": "1"},
        {"node": "w", "lease_ms": 1.5},
        [],
        "w",
        None,
    ):
        for t in ("q", "nope", "log"):
            assert_error(
                h.post(
                    f"/v0/topics/{t}/claim",
                    content=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                ),
                400,
                "invalid_request",
            )
    # empty / oversize node: 404 and 409 win, then 400
    for node in ("", "n" * 129):
        assert_error(h.post("/v0/topics/nope/claim", {"node": node}), 404, "topic_not_found")
        assert_error(h.post("/v0/topics/log/claim", {"node": node}), 409, "not_a_queue")
        assert_error(h.post("/v0/topics/q/claim", {"node": node}), 400, "invalid_request")
    assert claim(h, node="n" * 128)["count"] == 0
    assert claim(h, node="é" * 64)["count"] == 0  # 128 bytes
    assert_error(h.post("/v0/topics/q/claim", {"node": "é" * 65}), 400, "invalid_request")


@pytest.mark.parametrize("name", ["ack", "nack", "extend"])
def test_batch_validation_order(h: Harness, name: str) -> None:
    queue(h)
    h.write("log", 1)
    extra: dict[str, Any] = {"lease_ms": 1000} if name == "extend" else {}
    many = list(range(1001))

    def post(t: str, **body: Any) -> httpx.Response:
        return h.post(f"/v0/topics/{t}/{name}", {**extra, **body})

    # type / required-field errors, before everything else
    for body in (
        {"seqs": [1]},
        {"node": "w"},
        {"node": 1, "seqs": [1]},
        {"node": "w", "seqs": 1},
        {"node": "w", "seqs": [-1]},
        {"node": "w", "seqs": [1.5]},
        {"node": "w", "seqs": [True]},
        {"node": "w", "seqs": [2**64]},
        {"node": "w", "seqs": [1], "lease_ids": "lease_1"},
        {"node": "w", "seqs": [1], "lease_ids": [1]},
    ):
        for t in ("q", "nope", "log"):
            assert_error(post(t, **body), 400, "invalid_request")
    if name == "extend":
        err = assert_error(
            h.post("/v0/topics/nope/extend", {"node": "w", "seqs": [1]}), 400, "invalid_request"
        )
        assert "lease_ms" in err["message"]
        assert_error(
            h.post("/v0/topics/q/extend", {"node": "w", "seqs": [], "lease_ms": -5}),
            400,
            "invalid_request",
        )
    if name == "nack":
        assert_error(post("q", node="w", seqs=[1], delay_ms=-1), 400, "invalid_request")
        assert_error(post("q", node="w", seqs=[1], delay_ms="5"), 400, "invalid_request")
    # 1. lease_ids entries: "" or lease_<hex>; wins over an empty node and a huge batch
    for bad_id in ("lease_", "lease_xyz", "1", "LEASE_1", "lease_1 ", "lease_" + "f" * 17):
        err = assert_error(
            post("nope", node="", seqs=many, lease_ids=[bad_id]), 400, "invalid_request"
        )
        assert "lease" in err["message"]
    # 2. empty node wins over the batch size
    err = assert_error(post("nope", node="", seqs=many), 400, "invalid_request")
    assert "node" in err["message"]
    # 3. > 1000 seqs, wins over a lease_ids length mismatch and the topic lookup
    for t in ("q", "nope", "log"):
        err = assert_error(
            post(t, node="w", seqs=many, lease_ids=["lease_1"]), 400, "batch_too_large"
        )
        assert err["detail"] == {"seqs": 1001, "max": 1000}
    # 4. lease_ids length mismatch, wins over 404/409
    for t in ("q", "nope", "log"):
        assert_error(post(t, node="w", seqs=[1, 2], lease_ids=["lease_1"]), 400, "invalid_request")
    # 5. then 404 / 409
    assert_error(post("nope", node="w", seqs=list(range(1000))), 404, "topic_not_found")
    assert_error(post("log", node="w", seqs=[1], lease_ids=[""]), 409, "not_a_queue")
    # valid edge cases: exactly 1000 seqs, empty lease_ids, "" entries, uppercase hex
    r = post("q", node="w", seqs=list(range(1000)), lease_ids=[])
    assert r.status_code == 200 and len(r.json()["skipped"]) == 1000
    r = post("q", node="w", seqs=[1, 2], lease_ids=["", "lease_AB"])
    assert r.status_code == 200 and r.json()["skipped"] == [1, 2]
    # empty body / content types
    assert_error(h.post(f"/v0/topics/q/{name}", content=b""), 415, "unsupported_media_type")
    assert_error(
        h.post(f"/v0/topics/q/{name}", content=b"", headers={"content-type": "application/json"}),
        400,
        "invalid_request",
    )


# ------------------------------------------------------- time, counters, DLQ


def test_expiry_and_redelivery(h: Harness) -> None:
    queue(h, lease_ms=1000)
    h.write("q", "job")
    j = claim(h, node="w1")["claimed"][0]
    assert j["deadline"] == T0 + 1000
    h.clock.advance(1000)  # now == deadline: still active
    assert claim(h, node="w2")["count"] == 0
    assert counters(h) == {"ready": 0, "in_flight": 1, "dead_lettered": 0}
    b = op(h, "extend", node="w1", seqs=[1], lease_ms=1000)
    assert b["deadlines"] == {"1": T0 + 2000}
    h.clock.advance(1001)  # past the extended deadline
    assert counters(h) == {"ready": 1, "in_flight": 0, "dead_lettered": 0}
    assert op(h, "extend", node="w1", seqs=[1], lease_ms=1000)["skipped"] == [1]
    j2 = claim(h, node="w2")["claimed"][0]
    assert (j2["$seq"], j2["deliveries"], j2["lease_id"]) == (1, 2, "lease_2")
    assert j2["deadline"] == T0 + 2001 + 1000
    # the expired holder's ack is skipped; the new holder's works
    assert op(h, "ack", node="w1", seqs=[1])["skipped"] == [1]
    assert op(h, "ack", node="w2", seqs=[1], lease_ids=[j2["lease_id"]])["acked"] == 1


def test_extend_clamps_lease(h: Harness) -> None:
    queue(h)
    h.write("q", 1)
    claim(h, node="w")
    assert op(h, "extend", node="w", seqs=[1], lease_ms=1)["deadlines"] == {"1": T0 + 100}
    b = op(h, "extend", node="w", seqs=[1], lease_ms=2**64 - 1)
    assert b["deadlines"] == {"1": T0 + 86_400_000}


def test_claim_sees_router_copies_at_once(h: Harness) -> None:
    queue(h)
    r = h.put("/v0/routers/feed", {"source": "orders", "dest": "q"})
    assert r.status_code == 201
    h.write("orders", {"o": 1}, node="gw", tag="o:1")
    jobs = claim(h, node="w")["claimed"]
    assert [(j["$seq"], j["data"], j["$tag"]) for j in jobs] == [(1, {"o": 1}, "o:1")]
    assert "$node" not in jobs[0]  # job objects carry no $node


def test_queue_counters_in_topic_state(h: Harness) -> None:
    queue(h)
    st = h.get("/v0/topics/q").json()
    assert st["type"] == "queue" and st["queue"] == {"ready": 0, "in_flight": 0, "dead_lettered": 0}
    h.write("q", 1, 2, 3, 4, 5)
    assert counters(h) == {"ready": 5, "in_flight": 0, "dead_lettered": 0}
    claim(h, node="w", max=3)
    assert counters(h) == {"ready": 2, "in_flight": 3, "dead_lettered": 0}
    op(h, "nack", node="w", seqs=[1], delay_ms=1000)
    op(h, "nack", node="w", seqs=[2])
    assert counters(h) == {"ready": 3, "in_flight": 1, "dead_lettered": 0}
    h.clock.advance(1000)  # the delayed nack matures
    assert counters(h) == {"ready": 4, "in_flight": 1, "dead_lettered": 0}
    op(h, "ack", node="w", seqs=[3])
    assert counters(h) == {"ready": 4, "in_flight": 0, "dead_lettered": 0}
    assert h.get("/v0/topics/q").json()["count"] == 4
    # delay is honoured by claims too
    op(h, "nack", node="w", seqs=[], delay_ms=5)
    j = claim(h, node="w", max=10)["claimed"]
    assert [x["$seq"] for x in j] == [1, 2, 4, 5]
    # log topics have no queue block
    h.write("log", 1)
    assert "queue" not in h.get("/v0/topics/log").json()


def test_nack_delay_is_clamped_and_delayed_jobs_wait(h: Harness) -> None:
    queue(h)
    h.write("q", 1)
    claim(h, node="w")
    op(h, "nack", node="w", seqs=[1], delay_ms=10**15)
    h.clock.advance(86_400_000 - 1)
    assert claim(h, node="w")["count"] == 0
    h.clock.advance(1)
    assert claim(h, node="w")["claimed"][0]["deliveries"] == 2


def test_dead_letter_copy_is_readable(h: Harness) -> None:
    queue(h, max_deliveries=2, dead_letter="q.dlq")
    h.write("q", {"job": 1}, tag="j:1", node="gw", meta={"trace": "t"})
    h.write("q", {"job": 2})
    for _ in range(2):
        jobs = claim(h, node="w", max=10)["claimed"]
        assert [j["$seq"] for j in jobs] == [1, 2]
        op(h, "nack", node="w", seqs=[1])
        op(h, "ack", node="w", seqs=[2]) if _ == 1 else op(h, "nack", node="w", seqs=[2])
    # third delivery of seq 1 would exceed max_deliveries: dead-lettered, not claimed
    b = claim(h, node="w", max=10)
    assert b["claimed"] == [] and b["ready"] == 0
    assert counters(h) == {"ready": 0, "in_flight": 0, "dead_lettered": 1}
    assert h.get("/v0/topics/q").json()["count"] == 0
    d = h.diff("q.dlq", include_tags=True)
    assert len(d["records"]) == 1
    rec = d["records"][0]
    assert rec["$seq"] == 1 and rec["$tag"] == "j:1" and rec["$node"] == "gw"
    assert rec["data"] == {"job": 1}
    assert rec["meta"] == {
        "trace": "t",
        "$dead_letter_from": "q",
        "$dead_letter_deliveries": "2",
        "$dead_letter_src_seq": "1",
    }
    st = h.get("/v0/topics/q.dlq").json()
    assert st["type"] == "log" and st["config"]["auto_create"] is True  # default config


def test_claim_jitter_cohort_is_one_round_robin_pass(h: Harness) -> None:
    queue(h, claim_jitter_ms=200)  # wide enough for all three to join under load
    h.write("q", *range(7))

    async def burst() -> list[httpx.Response]:
        calls = [
            h.client.post(
                "/v0/topics/q/claim", json={"node": f"w{i}", "max": 10, "lease_ms": 1000 * (i + 1)}
            )
            for i in range(3)
        ]
        return list(await asyncio.gather(*calls))

    rs = h.run(burst())
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    seqs = [[j["$seq"] for j in r.json()["claimed"]] for r in rs]
    # one pass served everyone, one job per claimer per turn
    assert sorted(s for ss in seqs for s in ss) == list(range(1, 8))
    assert sorted(len(s) for s in seqs) == [2, 2, 3]
    for ss in seqs:
        assert ss == sorted(ss)
        assert all(b - a == 3 for a, b in zip(ss, ss[1:], strict=False))
    # the leader's lease_ms applies to the whole cohort [src]
    deadlines = {j["deadline"] for r in rs for j in r.json()["claimed"]}
    assert deadlines == {T0 + 1000}
    assert all(r.json()["ready"] == 0 for r in rs)
    # every lease is held by its own claimer
    for i, r in enumerate(rs):
        ids = [j["lease_id"] for j in r.json()["claimed"]]
        b = op(
            h,
            "extend",
            node=f"w{i}",
            seqs=[j["$seq"] for j in r.json()["claimed"]],
            lease_ms=100,
            lease_ids=ids,
        )
        assert b["skipped"] == []
    # a lone claim still works after the window (its own cohort)
    h.write("q", "late")
    assert [j["$seq"] for j in claim(h, node="solo", max=5)["claimed"]] == [8]


def test_claim_jitter_validates_node_before_joining(h: Harness) -> None:
    queue(h, claim_jitter_ms=30)
    h.write("q", 1, 2)

    async def burst() -> list[httpx.Response]:
        return list(
            await asyncio.gather(
                h.client.post("/v0/topics/q/claim", json={"node": "w", "max": 5}),
                h.client.post("/v0/topics/q/claim", json={"node": ""}),
            )
        )

    ok, bad = h.run(burst())
    assert_error(bad, 400, "invalid_request")
    assert [j["$seq"] for j in ok.json()["claimed"]] == [1, 2]


def test_claim_jitter_cohort_survives_cancelled_members(h: Harness) -> None:
    queue(h, claim_jitter_ms=300)
    h.write("q", 1, 2, 3)

    def post(node: str) -> Any:
        return h.client.post("/v0/topics/q/claim", json={"node": node, "max": 1})

    async def members(n: int) -> None:
        # wait until `n` claimers have joined the open cohort (white-box, avoids timing)
        async with asyncio.timeout(5):
            while True:
                cohort = h.app.claim_cohorts.get("q")
                if cohort is not None and len(cohort.claimers) >= n:
                    return
                await asyncio.sleep(0.001)

    async def leader_cancelled() -> httpx.Response:
        leader = asyncio.ensure_future(post("w0"))
        await members(1)
        joiner = asyncio.ensure_future(post("w1"))
        await members(2)
        leader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leader
        return await joiner

    r = h.run(leader_cancelled())
    assert r.status_code == 200, r.text
    assert [j["$seq"] for j in r.json()["claimed"]] == [2]
    # the leader's job was released at once; the cohort is not stuck
    assert counters(h) == {"ready": 2, "in_flight": 1, "dead_lettered": 0}

    async def joiner_cancelled() -> httpx.Response:
        leader = asyncio.ensure_future(post("w2"))
        await members(1)
        joiner = asyncio.ensure_future(post("w3"))
        await members(2)
        joiner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await joiner
        return await leader

    r = h.run(joiner_cancelled())
    assert r.status_code == 200, r.text
    jobs = r.json()["claimed"]
    assert [(j["$seq"], j["deliveries"]) for j in jobs] == [(1, 2)]
    assert counters(h) == {"ready": 1, "in_flight": 2, "dead_lettered": 0}
    assert [j["$seq"] for j in claim(h, node="w4", max=5)["claimed"]] == [3]


def test_scopes() -> None:
    hk = Harness({"TOPICS_API_KEYS": "root,reader:r,writer:w,rw:rw,t1:rw:t1."})
    try:
        queue_r = hk.put("/v0/topics/q", {"type": "queue"}, headers=auth("root"))
        assert queue_r.status_code == 201
        hk.put("/v0/topics/t1.q", {"type": "queue"}, headers=auth("root"))
        hk.post("/v0/topics/q", {"records": [{"data": 1}, {"data": 2}]}, headers=auth("root"))
        for key in ("reader", "writer"):
            assert_error(
                hk.post("/v0/topics/q/claim", {"node": "w"}, headers=auth(key)), 403, "forbidden"
            )
            assert_error(hk.get("/v0/topics/q/work?node=w", headers=auth(key)), 403, "forbidden")
        assert_error(hk.post("/v0/topics/q/claim", {"node": "w"}), 401, "unauthorized")
        r = hk.post("/v0/topics/q/claim", {"node": "w", "max": 2}, headers=auth("rw"))
        assert r.status_code == 200 and r.json()["count"] == 2
        # ack / nack / extend need write only
        for name, extra in (("extend", {"lease_ms": 1000}), ("nack", {}), ("ack", {})):
            body = {"node": "w", "seqs": [1], **extra}
            assert_error(
                hk.post(f"/v0/topics/q/{name}", body, headers=auth("reader")), 403, "forbidden"
            )
            assert hk.post(f"/v0/topics/q/{name}", body, headers=auth("writer")).status_code == 200
        # scope is checked before the body (403 beats 400)
        assert_error(
            hk.post("/v0/topics/q/ack", content=b"{", headers=auth("reader")), 403, "forbidden"
        )
        # path allowlist
        assert_error(
            hk.post("/v0/topics/q/claim", {"node": "w"}, headers=auth("t1")), 403, "forbidden"
        )
        assert (
            hk.post("/v0/topics/t1.q/claim", {"node": "w"}, headers=auth("t1")).status_code == 200
        )
        # ?token= is not honoured on claim
        assert_error(hk.post("/v0/topics/q/claim?token=rw", {"node": "w"}), 401, "unauthorized")
    finally:
        hk.close()


def test_work_is_subject_to_the_inflight_cap_at_admission() -> None:
    # API §1.4 step 2: the in-flight cap applies to every authenticated request; for
    # /work the slot is released as soon as the stream starts.
    hk = Harness({"TOPICS_API_KEYS": "k", "TOPICS_MAX_INFLIGHT_PER_KEY": "1"})
    try:
        digest = hk.app.auth.authenticate("k").digest
        hk.app.inflight[digest] = 1  # one request of this key in flight
        # bad Accept so that, were the cap skipped, the answer is a 406 instead of a stream
        r = hk.get("/v0/topics/q/work?node=w", headers={**auth("k"), "accept": "x/y"})
        assert_error(r, 429, "throttled")
    finally:
        hk.close()


def test_work_checks_in_order(h: Harness) -> None:
    queue(h)
    h.write("log", 1)
    sse = {"accept": "text/event-stream"}
    # 406 first, whatever else is wrong
    for path in ("/v0/topics/q/work?node=w", "/v0/topics/nope/work", "/v0/topics/log/work?node="):
        assert_error(h.get(path, headers={"accept": "application/json"}), 406, "not_acceptable")
    # 400: node missing / empty / too long, before 404/409
    for path in (
        "/v0/topics/nope/work",
        "/v0/topics/log/work?node=",
        f"/v0/topics/nope/work?node={'n' * 129}",
    ):
        assert_error(h.get(path, headers=sse), 400, "invalid_request")
    err = assert_error(h.get("/v0/topics/nope/work?node=w", headers=sse), 404, "topic_not_found")
    assert err["detail"] == {"topic": "nope"}
    err = assert_error(h.get("/v0/topics/log/work?node=w"), 409, "not_a_queue")
    assert err["detail"] == {"topic": "log"}
    assert_error(h.post("/v0/topics/q/work?node=w"), 405, "method_not_allowed")


# ------------------------------------------------------- /work over a socket

Env = dict[str, str]


@contextlib.asynccontextmanager
async def serve(env: Env | None = None) -> AsyncIterator[tuple[TopicsApp, httpx.AsyncClient]]:
    """The real app on 127.0.0.1:<ephemeral> in this loop; yields it and a client."""
    async with live_app(env) as srv:
        yield srv.app, srv.http


def run(fn: Callable[[], Awaitable[None]], caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with asyncio.timeout(25):
            await fn()

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def eventually(cond: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.02)


async def awrite(c: httpx.AsyncClient, topic: str, *datas: Any, headers: Any = None) -> None:
    r = await c.post(
        f"/v0/topics/{topic}", json={"records": [{"data": d} for d in datas]}, headers=headers
    )
    assert r.status_code in (200, 201), r.text


@pytest.mark.timeout(30)
def test_work_stream_push_ack_refill_and_release(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serve() as (app, c):
            assert (
                await c.put("/v0/topics/q", json={"type": "queue", "lease_ms": 60000})
            ).status_code == 201
            await c.post(
                "/v0/topics/q",
                json={"records": [{"data": {"n": 1}, "tag": "t1"}, {"data": 2}, {"data": 3}]},
            )
            async with c.stream("GET", "/v0/topics/q/work?node=w1&max=2") as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                assert resp.headers["cache-control"] == "no-store"
                assert resp.headers["x-accel-buffering"] == "no"
                s = Sse(resp)
                assert await s.block() == {"retry": "2000"}
                e1, e2 = await s.event(), await s.event()
                assert (e1["event"], e1["id"], e2["id"]) == ("job", "1", "2")
                d = e1["data"]
                assert list(d) == [
                    "topic",
                    "$seq",
                    "lease_id",
                    "deadline",
                    "$ts",
                    "$tag",
                    "deliveries",
                    "data",
                ]
                assert (d["topic"], d["$seq"], d["$tag"], d["deliveries"], d["data"]) == (
                    "q",
                    1,
                    "t1",
                    1,
                    {"n": 1},
                )
                assert d["deadline"] - d["$ts"] >= 59000
                assert app.sse_total == 1
                st = (await c.get("/v0/topics/q?touch=false")).json()["queue"]
                assert st == {"ready": 1, "in_flight": 2, "dead_lettered": 0}
                # ack one => the stream refills up to max
                r = await c.post(
                    "/v0/topics/q/ack",
                    json={"node": "w1", "seqs": [1], "lease_ids": [d["lease_id"]]},
                )
                assert r.json()["acked"] == 1
                e3 = await s.event()
                assert e3["id"] == "3" and e3["data"]["$seq"] == 3
                # a new job is not pushed while max leases are outstanding ...
                await awrite(c, "q", 4)
                await asyncio.sleep(0.35)
                st = (await c.get("/v0/topics/q?touch=false")).json()["queue"]
                assert st == {"ready": 1, "in_flight": 2, "dead_lettered": 0}
                # ... but is after a nack frees a slot (the nacked job itself comes back first)
                await c.post("/v0/topics/q/nack", json={"node": "w1", "seqs": [2]})
                e4 = await s.event()
                assert (e4["data"]["$seq"], e4["data"]["deliveries"]) == (2, 2)
                # a POST claim by the same node is not part of the connection's leases
                r = await c.post("/v0/topics/q/claim", json={"node": "w1"})
                assert [j["$seq"] for j in r.json()["claimed"]] == [4]

            # disconnect: the stream's leases are released at once, POST leases are kept
            async def released() -> bool:
                st = (await c.get("/v0/topics/q?touch=false")).json()["queue"]
                return bool(st == {"ready": 2, "in_flight": 1, "dead_lettered": 0})

            await eventually(released)
            r = await c.post("/v0/topics/q/claim", json={"node": "w2", "max": 10})
            jobs = r.json()["claimed"]
            assert [(j["$seq"], j["deliveries"]) for j in jobs] == [(2, 3), (3, 2)]
            assert app.sse_total == 0
            assert not app.engine.topics["q"].listeners

    run(body, caplog)


@pytest.mark.timeout(30)
def test_work_stream_is_woken_by_publish_and_ends_on_topic_delete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/q", json={"type": "queue"})
            url = "/v0/topics/q/work?node=w&max=zz&lease_ms=-5"
            async with c.stream("GET", url, headers={"accept": "application/json, */*"}) as resp:
                assert resp.status_code == 200
                s = Sse(resp)
                assert await s.block() == {"retry": "2000"}
                await awrite(c, "q", "a", "b")
                e = await s.event()
                assert e["data"]["$seq"] == 1 and e["data"]["deadline"] - e["data"]["$ts"] >= 29000
                # max=zz => 1: seq 2 stays ready; lease_ms=-5 is unparsable => topic lease
                await asyncio.sleep(0.35)
                st = (await c.get("/v0/topics/q?touch=false")).json()["queue"]
                assert st["in_flight"] == 1 and st["ready"] == 1
                r = await c.delete("/v0/topics/q")
                assert r.json()["deleted"] is True
                e = await s.event()
                assert "id" not in e
                assert e["event"] == "error"
                assert e["data"] == {
                    "code": 409,
                    "error": "topic is no longer a queue",
                    "topic": "q",
                }
                assert await s.block() is None  # terminal
            await eventually(lambda: _const(app.sse_total == 0))
            # the server is still healthy
            assert (await c.get("/v0/health")).status_code == 200

    run(body, caplog)


async def _const(v: bool) -> bool:
    return v


@pytest.mark.timeout(30)
def test_work_stream_auth_token_query_and_sse_cap(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        env = {"TOPICS_API_KEYS": "root,rw:rw,reader:r", "TOPICS_MAX_SSE_CONNECTIONS": "1"}
        async with serve(env) as (app, c):
            await c.put("/v0/topics/q", json={"type": "queue"}, headers=auth("root"))
            r = await c.get("/v0/topics/q/work?node=w")
            assert r.status_code == 401
            r = await c.get("/v0/topics/q/work?node=w&token=reader")
            assert r.status_code == 403
            await awrite(c, "q", 1, headers=auth("rw"))
            async with c.stream("GET", "/v0/topics/q/work?node=w&token=rw") as resp:
                assert resp.status_code == 200
                s = Sse(resp)
                assert (await s.event())["data"]["$seq"] == 1
                # the global SSE cap applies to /work
                r = await c.get("/v0/topics/q/work?node=w2", headers=auth("rw"))
                assert r.status_code == 429
                err = r.json()["error"]
                assert err["code"] == "throttled" and r.headers["retry-after"] == "1"
                # the in-flight slot was released when the stream started
                assert not any(app.inflight.values())

            async def free() -> bool:
                return app.sse_total == 0

            await eventually(free)

    run(body, caplog)


@pytest.mark.timeout(30)
def test_work_stream_shutdown_frame(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serve() as (app, c):
            await c.put("/v0/topics/q", json={"type": "queue"})
            async with c.stream("GET", "/v0/topics/q/work?node=w") as resp:
                s = Sse(resp)
                assert await s.block() == {"retry": "2000"}
                app.begin_shutdown()
                e = await s.event()
                assert e["event"] == "error" and "id" not in e
                assert e["data"] == {
                    "code": "server_shutting_down",
                    "error": "server is shutting down; reconnect",
                    "topic": "q",
                }
                assert await s.block() is None

    run(body, caplog)
