"""Routers: control plane (API §7) and forwarding passes (SEMANTICS §12)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from tests.support.clock import TestClock

from topics.config import Limits
from topics.engine.core import Engine, encode_cursor
from topics.engine.routers import MAX_HOPS, PASS_MAX_SEQS, Router, RouterSet
from topics.engine.topic import PendingWrite, Topic
from topics.errors import TopicsError

# ------------------------------------------------------------------ helpers


def make(**limits: Any) -> tuple[Engine, RouterSet, TestClock]:
    clock = TestClock()
    eng = Engine(clock=clock, limits=Limits(**limits))
    return eng, RouterSet(eng), clock


def write(eng: Engine, name: str, *recs: Any, node: str | None = None) -> None:
    body: dict[str, Any] = {
        "records": [r if isinstance(r, dict) and "data" in r else {"data": r} for r in recs]
    }
    if node is not None:
        body["node"] = node
    res = eng.begin_write(name, eng.parse_write(body, None))
    assert isinstance(res, PendingWrite)
    assert res.ok


def read(eng: Engine, name: str, from_seq: int = 0, **kw: Any) -> tuple[list[dict[str, Any]], Any]:
    body = {"from_seq": from_seq, "include_tags": True, "limit": 1000, **kw}
    _, r = eng.diff(name, eng.parse_diff(body))
    return [orjson.loads(b) for b in r.records], r


def put(rs: RouterSet, name: str, source: str, dest: str, **kw: Any) -> dict[str, Any]:
    out, _ = rs.put(name, {"source": source, "dest": dest, **kw}, None)
    return out


def err(fn: Any, *args: Any, **kw: Any) -> TopicsError:
    with pytest.raises(TopicsError) as ei:
        fn(*args, **kw)
    return ei.value


def topic(eng: Engine, name: str) -> Topic:
    t = eng.get(name)
    assert t is not None
    return t


def router(rs: RouterSet, name: str) -> Router:
    r = rs.by_name(name)
    assert r is not None
    return r


# ------------------------------------------------------------ installation


def test_installs_hooks_and_chains_on_published() -> None:
    clock = TestClock()
    eng = Engine(clock=clock)
    seen: list[str] = []
    eng.on_published = lambda t: seen.append(t.name)
    rs = RouterSet(eng)
    assert eng.routers is rs
    assert eng.drain_into == rs.drain_into
    assert eng.on_topic_deleted == rs.remove_touching
    put(rs, "r", "a", "b")
    write(eng, "a", 1)
    assert seen == ["a"]
    assert rs.drain_dirty() is True
    assert seen == ["a", "b"]  # the derived append is published too
    assert len(rs) == 1 and rs.names() == ["r"] and "r" in rs


# ---------------------------------------------------------------- put: create


def test_create_response_and_defaults() -> None:
    eng, rs, _ = make()
    out, created = rs.put("clicks->warehouse", {"source": "clicks", "dest": "warehouse"}, None)
    assert created is True
    assert out == {
        "router": "clicks->warehouse",
        "created": True,
        "source": "clicks",
        "dest": "warehouse",
        "preserve_node": True,
        "preserve_tag": True,
        "filter": None,
        "allow_cycle": False,
        "guarantee": "at_least_once",
    }
    assert list(out)[:2] == ["router", "created"]
    # Both topics are auto-created with the default config.
    assert topic(eng, "clicks").config.discard == "old"
    assert topic(eng, "warehouse").head_seq == 0


def test_no_backfill_forwards_only_after_create() -> None:
    eng, rs, _ = make()
    write(eng, "a", "old1", "old2")
    write(eng, "b", "direct")
    put(rs, "r", "a", "b")
    r = router(rs, "r")
    assert (r.cursor, r.dest_base, r.forwarded_total) == (2, 1, 0)
    write(eng, "a", "new")
    recs, res = read(eng, "b")
    assert [x["data"] for x in recs] == ["direct", "new"]
    assert recs[1]["$seq"] == 2
    assert res.head_seq == 2
    assert router(rs, "r").forwarded_total == 1


def test_read_your_writes_through_drain_into_chain() -> None:
    eng, rs, _ = make()
    put(rs, "ab", "a", "b")
    put(rs, "bc", "b", "c")
    write(eng, "a", {"data": {"x": 1}, "meta": {"m": 1}})
    # No background drain ran: the read of `c` pulls a -> b -> c first.
    recs, _ = read(eng, "c")
    assert [(x["data"], x["meta"]) for x in recs] == [({"x": 1}, {"m": 1})]
    assert topic(eng, "b").head_seq == 1
    st = eng.topic_state("b")
    assert st["count"] == 1


def test_drain_dirty_background_driver() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    assert rs.drain_dirty() is False
    write(eng, "a", 1, 2, 3)
    assert topic(eng, "b").head_seq == 0  # asynchronous: nothing on the ack path
    assert rs.drain_dirty() is True
    assert topic(eng, "b").head_seq == 3
    assert rs.drain_dirty() is False
    # A write into an unrelated topic does not mark anything dirty.
    write(eng, "zzz", 1)
    assert rs.drain_dirty() is False


def test_drain_all_for_shutdown() -> None:
    eng, rs, _ = make()
    put(rs, "ab", "a", "b")
    put(rs, "bc", "b", "c")
    write(eng, "a", 1, 2)
    assert rs.drain_all() == 4
    assert topic(eng, "c").head_seq == 2
    assert rs.drain_all() == 0


# ------------------------------------------------------------ copy contents


def test_node_preserved_by_default_and_stripped_on_request() -> None:
    eng, rs, _ = make()
    put(rs, "keep", "a", "b")
    put(rs, "strip", "a", "c", preserve_node=False)
    write(eng, "a", {"data": 1, "node": "n1"}, 2)
    b, _ = read(eng, "b")
    c, _ = read(eng, "c")
    assert [x.get("$node") for x in b] == ["n1", None]
    assert [x.get("$node") for x in c] == [None, None]
    # Node loop prevention still works on the copy.
    b2, res = read(eng, "b", node="n1")
    assert [x["data"] for x in b2] == [2]
    assert res.next_from_seq == 2


def test_tag_preserved_or_stripped() -> None:
    eng, rs, _ = make()
    put(rs, "keep", "a", "b")
    put(rs, "strip", "a", "c", preserve_tag=False)
    write(eng, "a", {"data": 1, "tag": "eu:1"})
    b, _ = read(eng, "b")
    c, _ = read(eng, "c")
    assert b[0]["$tag"] == "eu:1"
    assert "$tag" not in c[0]
    # The stripped copy is untagged in the dest's tag index too.
    assert topic(eng, "c").tags.eq("eu:1", 100) == []


@pytest.mark.parametrize(
    ("flt", "wire", "expected"),
    [
        (["tag", "Eq", "eu:1"], ["tag", "Eq", "eu:1"], ["eu:1"]),
        (["tag", "Glob", "eu:*"], ["tag", "Glob", "eu:*"], ["eu:1", "eu:2"]),
        ("eu:2", ["tag", "Eq", "eu:2"], ["eu:2"]),
        ("eu*", ["tag", "Glob", "eu*"], ["eu:1", "eu:2"]),
        (["tag", "Glob", "*"], ["tag", "Glob", "*"], ["eu:1", "us:1", "eu:2"]),
    ],
)
def test_filter(flt: Any, wire: list[str], expected: list[str]) -> None:
    eng, rs, _ = make()
    out = put(rs, "r", "a", "b", filter=flt)
    assert out["filter"] == wire
    write(
        eng,
        "a",
        {"data": 1, "tag": "eu:1"},
        {"data": 2, "tag": "us:1"},
        {"data": 3},  # untagged never matches
        {"data": 4, "tag": "eu:2"},
    )
    recs, _ = read(eng, "b")
    assert [x["$tag"] for x in recs] == expected
    r = router(rs, "r")
    assert r.cursor == 4  # filtered records are consumed
    assert r.forwarded_total == len(expected)


def test_deleted_source_records_are_skipped() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    write(eng, "a", {"data": 1, "tag": "x"}, {"data": 2, "tag": "y"}, {"data": 3, "tag": "x"})
    eng.delete_records("a", {"match": ["tag", "Eq", "x"]})
    recs, res = read(eng, "b")
    assert [x["data"] for x in recs] == [2]
    assert res.tombstone is None
    assert router(rs, "r").cursor == 3


def test_copy_gets_fresh_seq_and_ts_and_hops() -> None:
    eng, rs, clock = make()
    write(eng, "b", "direct")
    put(rs, "r", "a", "b")
    write(eng, "a", "x")
    clock.advance(500)
    recs, _ = read(eng, "b")
    assert recs[1]["$seq"] == 2
    assert recs[1]["$ts"] == clock.now_ms()  # time of forwarding
    got = topic(eng, "b").get_record(2)
    assert got is not None and got[1] == 1  # hops = source hops + 1


# ------------------------------------------------------------- put: errors


def test_put_body_type_errors() -> None:
    _, rs, _ = make()
    bad: list[Any] = [
        None,
        [],
        {"dest": "b"},
        {"source": "a"},
        {"source": 1, "dest": "b"},
        {"source": "a", "dest": "b", "preserve_node": "yes"},
        {"source": "a", "dest": "b", "preserve_tag": 0},
        {"source": "a", "dest": "b", "create_dest": "no"},
        {"source": "a", "dest": "b", "allow_cycle": 1},
        {"source": "a", "dest": "b", "guarantee": "at_most_once"},
        {"source": "a", "dest": "b", "guarantee": 1},
        {"source": "a", "dest": "b", "filter": ["tag", "Glob", "eu"]},
        {"source": "a", "dest": "b", "filter": ["tag", "Eq"]},
        {"source": "a", "dest": "b", "filter": 7},
    ]
    for body in bad:
        e = err(rs.put, "r", body, None)
        assert (e.status, e.code) == (400, "invalid_request"), body
    assert len(rs) == 0


def test_put_processing_order() -> None:
    eng, rs, _ = make()

    def allow(n: str) -> bool:
        return not n.startswith("secret")

    # Body types beat the allowlist.
    e = err(rs.put, "r", {"source": "secret", "dest": 5}, allow)
    assert e.status == 400
    # Allowlist (source first, then dest) beats the router name check.
    e = err(rs.put, "bad name", {"source": "secret1", "dest": "secret2"}, allow)
    assert (e.status, e.code, e.detail) == (403, "forbidden", {"topic": "secret1"})
    e = err(rs.put, "bad name", {"source": "a", "dest": "secret2"}, allow)
    assert (e.status, e.detail) == (403, {"topic": "secret2"})
    # Router name charset beats source == dest.
    e = err(rs.put, "bad name", {"source": "a", "dest": "a"}, allow)
    assert e.status == 400 and "router name" in e.message
    # source == dest beats the topic-name charset.
    e = err(rs.put, "r", {"source": "bad name", "dest": "bad name"}, allow)
    assert e.status == 400 and "differ" in e.message
    e = err(rs.put, "r", {"source": "a", "dest": "bad name"}, allow)
    assert e.status == 400 and "topic name" in e.message
    # `>` is legal in router names only.
    put(rs, "a->b", "a", "b")
    e = err(rs.put, "r", {"source": "a", "dest": "x>y"}, None)
    assert e.status == 400
    assert sorted(eng.topics) == ["a", "b"]


def test_create_dest_false_requires_existing_dest() -> None:
    eng, rs, _ = make()
    e = err(rs.put, "r", {"source": "a", "dest": "b", "create_dest": False}, None)
    assert (e.status, e.code, e.detail) == (404, "topic_not_found", {"topic": "b"})
    assert eng.topics == {}  # the source was not auto-created either
    write(eng, "b", 1)
    out = put(rs, "r", "a", "b", create_dest=False)
    assert out["created"] is True and "create_dest" not in out
    assert "a" in eng.topics


def test_fan_in_rejected_but_same_source_allowed() -> None:
    _, rs, _ = make()
    put(rs, "r1", "a", "d")
    put(rs, "r2", "a", "d")  # several routers with the same source and dest are fine
    e = err(rs.put, "r3", {"source": "b", "dest": "d"}, None)
    assert (e.status, e.code) == (409, "topic_exists_incompatible")
    assert e.detail == {"topic": "d", "reason": "router_dest_fan_in"}
    assert rs.names() == ["r1", "r2"]


def test_repoint_rejected() -> None:
    _, rs, _ = make()
    put(rs, "r", "a", "b")
    for body in ({"source": "a", "dest": "c"}, {"source": "c", "dest": "b"}):
        e = err(rs.put, "r", body, None)
        assert (e.status, e.code) == (409, "topic_exists_incompatible")
        assert e.detail == {
            "router": "r",
            "reason": "router_repoint_forbidden",
            "existing_source": "a",
            "existing_dest": "b",
        }


def test_fan_in_checked_before_repoint() -> None:
    _, rs, _ = make()
    put(rs, "r1", "a", "d")
    put(rs, "r2", "x", "y")
    e = err(rs.put, "r2", {"source": "b", "dest": "d"}, None)
    assert e.detail is not None and e.detail["reason"] == "router_dest_fan_in"


def test_update_keeps_cursor_and_totals() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    write(eng, "a", {"data": 1, "tag": "eu:1"}, {"data": 2, "tag": "us:1"})
    rs.drain_dirty()
    before = router(rs, "r")
    assert (before.cursor, before.forwarded_total) == (2, 2)
    out, created = rs.put(
        "r",
        {
            "source": "a",
            "dest": "b",
            "filter": ["tag", "Glob", "eu:*"],
            "preserve_node": False,
            "preserve_tag": False,
            "allow_cycle": True,
            "guarantee": "exactly_once",
        },
        None,
    )
    assert created is False and out["created"] is False
    assert out["filter"] == ["tag", "Glob", "eu:*"]
    assert out["guarantee"] == "exactly_once"
    r = router(rs, "r")
    assert r is before
    assert (r.cursor, r.forwarded_total, r.dest_base) == (2, 2, 0)
    write(eng, "a", {"data": 3, "tag": "us:2"}, {"data": 4, "tag": "eu:2", "node": "n"})
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == [1, 2, 4]
    assert "$tag" not in recs[2] and "$node" not in recs[2]
    assert "_topics_router" in recs[2]["meta"]


# ----------------------------------------------------------------- cycles


def test_cycle_path_exact() -> None:
    _, rs, _ = make()
    put(rs, "bc", "b", "c")
    put(rs, "ca", "c", "a")
    e = err(rs.put, "ab", {"source": "a", "dest": "b"}, None)
    assert (e.status, e.code) == (409, "router_cycle")
    assert e.detail == {"cycle": ["a", "b", "c", "a"]}
    assert "ab" not in rs


def test_cycle_two_node_and_own_edge_excluded() -> None:
    _, rs, _ = make()
    put(rs, "ab", "a", "b")
    e = err(rs.put, "ba", {"source": "b", "dest": "a"}, None)
    assert e.detail == {"cycle": ["b", "a", "b"]}
    # Re-PUTting the same router does not see its own edge as a cycle.
    out, created = rs.put("ab", {"source": "a", "dest": "b"}, None)
    assert created is False and out["router"] == "ab"


def test_cycle_edges_of_allow_cycle_routers_participate() -> None:
    _, rs, _ = make()
    put(rs, "xy", "x", "y", allow_cycle=True)
    e = err(rs.put, "yx", {"source": "y", "dest": "x"}, None)
    assert e.code == "router_cycle"
    out = put(rs, "yx", "y", "x", allow_cycle=True)
    assert out["allow_cycle"] is True


def test_cycle_deep_branching_graph() -> None:
    _, rs, _ = make()
    put(rs, "r1", "s", "t1")
    put(rs, "r2", "s", "t2")
    put(rs, "r3", "t2", "t3")
    put(rs, "r4", "t3", "u")
    e = err(rs.put, "back", {"source": "u", "dest": "s"}, None)
    assert e.detail == {"cycle": ["u", "s", "t2", "t3", "u"]}


def test_allow_cycle_hop_cap_terminates() -> None:
    eng, rs, _ = make()
    put(rs, "ab", "a", "b", allow_cycle=True)
    put(rs, "ba", "b", "a", allow_cycle=True)
    write(eng, "a", {"data": "ping", "node": "origin"})
    assert rs.drain_dirty() is True
    a, b = topic(eng, "a"), topic(eng, "b")
    # a holds hops 0,2,4,6,8; b holds 1,3,5,7; hop 8 is never forwarded again.
    assert a.head_seq == 5 and b.head_seq == 4
    hops_a = [rec[1] for s in range(1, 6) if (rec := a.get_record(s)) is not None]
    hops_b = [rec[1] for s in range(1, 5) if (rec := b.get_record(s)) is not None]
    assert hops_a == [0, 2, 4, 6, MAX_HOPS]
    assert hops_b == [1, 3, 5, 7]
    assert rs.drain_dirty() is False
    # Reading either side is also bounded and the node survives every hop.
    recs, _ = read(eng, "a")
    assert {x["$node"] for x in recs} == {"origin"}
    assert len(recs) == 5
    assert router(rs, "ab").cursor == 5 and router(rs, "ab").forwarded_total == 4


# ------------------------------------------------------------------- caps


def test_router_cap() -> None:
    eng, rs, _ = make(max_routers=1)
    put(rs, "r1", "a", "b")
    e = err(rs.put, "r2", {"source": "x", "dest": "y"}, None)
    assert (e.status, e.code, e.detail) == (429, "throttled", {"limit": "max_routers", "max": 1})
    assert e.retry_after == 1
    assert "x" not in eng.topics and "y" not in eng.topics  # checked before auto-create
    # The cap check comes before the cycle check.
    e = err(rs.put, "r2", {"source": "b", "dest": "a"}, None)
    assert e.code == "throttled"
    # Updates of an existing router work at capacity.
    out, created = rs.put("r1", {"source": "a", "dest": "b", "preserve_tag": False}, None)
    assert created is False and out["preserve_tag"] is False


def test_topic_cap_rolls_back_auto_created_topics() -> None:
    eng, rs, _ = make(max_topics=2)
    write(eng, "a", 1)
    e = err(rs.put, "r", {"source": "x", "dest": "y"}, None)
    assert (e.status, e.code, e.detail) == (429, "throttled", {"limit": "max_topics", "max": 2})
    assert sorted(eng.topics) == ["a"]
    assert len(rs) == 0
    # One missing topic still fits.
    put(rs, "r", "a", "y")
    assert sorted(eng.topics) == ["a", "y"]


def test_auto_create_failure_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    eng, rs, _ = make()
    real = eng.ensure_topic
    calls: list[str] = []

    def flaky(name: str) -> tuple[Topic, bool]:
        calls.append(name)
        if len(calls) == 2:
            raise TopicsError(500, "internal", "boom")
        return real(name)

    monkeypatch.setattr(eng, "ensure_topic", flaky)
    e = err(rs.put, "r", {"source": "x", "dest": "y"}, None)
    assert e.code == "internal"
    assert eng.topics == {} and len(rs) == 0


# ---------------------------------------------------------- exactly-once


def test_exactly_once_meta_and_dedupe_while_live() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b", guarantee="exactly_once")
    write(eng, "a", {"data": 1}, {"data": 2, "meta": {"k": "v"}})
    recs, _ = read(eng, "b")
    src = topic(eng, "a")
    key1 = f"router:r:{src.topic_id}:1:1"
    assert recs[0]["meta"] == {
        "_topics_router": {
            "idempotency_key": key1,
            "router": "r",
            "source_topic": "a",
            "source_topic_id": src.topic_id,
            "source_epoch": 1,
            "source_seq": 1,
        }
    }
    assert recs[1]["meta"]["k"] == "v"
    assert recs[1]["meta"]["_topics_router"]["source_seq"] == 2
    dest = topic(eng, "b")
    assert dest.router_keys[key1] == 1
    # Re-running the pass from an earlier cursor does not duplicate live copies.
    r = router(rs, "r")
    r.cursor = 0
    assert rs.advance(r) == 2
    assert dest.head_seq == 2
    assert (r.cursor, r.forwarded_total) == (2, 4)
    # Once the copies are gone the evidence is gone too.
    eng.delete_records("b", {"before_seq": 2})
    r.cursor = 0
    assert rs.advance(r) == 2
    assert dest.head_seq == 3
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == [2, 1]


def test_exactly_once_keys_pruned_after_dest_eviction() -> None:
    eng, rs, _ = make()
    eng.put_topic("b", {"cap_records": 2})
    put(rs, "r", "a", "b", guarantee="exactly_once")
    write(eng, "a", 1, 2, 3, 4, 5)
    rs.drain_dirty()
    dest = topic(eng, "b")
    assert sorted(dest.router_keys.values()) == [4, 5]


@pytest.mark.parametrize(
    ("meta", "wrapped"),
    [
        ([1, 2], True),
        ("text", True),
        (7, True),
        ({f"k{i}": i for i in range(64)}, True),
        ({f"k{i}": i for i in range(63)}, False),
        ({"_topics_router": "old", **{f"k{i}": i for i in range(63)}}, False),
    ],
)
def test_exactly_once_meta_wrapping(meta: Any, wrapped: bool) -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b", guarantee="exactly_once")
    write(eng, "a", {"data": 0, "meta": meta})
    recs, _ = read(eng, "b")
    got = recs[0]["meta"]
    assert got["_topics_router"]["source_seq"] == 1
    if wrapped:
        assert got == {"_topics_router": got["_topics_router"], "_topics_original_meta": meta}
    else:
        assert len(got) <= 64 and "_topics_original_meta" not in got
        assert {k: v for k, v in got.items() if k != "_topics_router"} == {
            k: v for k, v in meta.items() if k != "_topics_router"
        }


def test_exactly_once_oversize_copy_stops() -> None:
    eng, rs, _ = make(max_record_bytes=200)
    put(rs, "r", "a", "b", guarantee="exactly_once")
    write(eng, "a", "x" * 150, "small")  # fits the source, not with router meta
    r = router(rs, "r")
    assert rs.advance(r) == 0
    assert r.cursor == 0 and topic(eng, "b").head_seq == 0
    assert rs.drain_dirty() is False


def test_at_least_once_oversize_copy_is_dropped() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    write(eng, "a", "x" * 150, "small")
    eng.limits = Limits(max_record_bytes=100)  # e.g. restarted with a lower limit
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == ["small"]
    assert router(rs, "r").cursor == 2


# ----------------------------------------------- back-pressure and source trim


def test_reject_dest_back_pressure_then_resume() -> None:
    eng, rs, _ = make()
    eng.put_topic("b", {"cap_records": 2, "discard": "reject"})
    put(rs, "r", "a", "b")
    write(eng, "a", 1, 2, 3)
    assert rs.drain_dirty() is True
    r = router(rs, "r")
    assert (r.cursor, r.forwarded_total) == (2, 2)
    # Stalled: retried on every drain, no loss, no progress.
    assert rs.drain_dirty() is False
    assert rs.drain_dirty() is False
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == [1, 2]
    # Draining the dest lets forwarding resume where it stopped.
    eng.delete_records("b", {"before_seq": 3})
    assert rs.drain_dirty() is True
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == [3]
    assert r.cursor == 3


def test_reject_dest_cap_bytes_back_pressure() -> None:
    eng, rs, _ = make()
    eng.put_topic("b", {"cap_bytes": 10, "discard": "reject"})
    put(rs, "r", "a", "b")
    write(eng, "a", "aaa", "bbb", "ccc")  # 5 bytes each
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == ["aaa", "bbb"]
    assert router(rs, "r").cursor == 2


def test_source_trim_holes_and_tombstone() -> None:
    eng, rs, _ = make()
    eng.put_topic("a", {"cap_records": 3})
    # A byte cap (not a seq window, which would count the holes) holding one record.
    eng.put_topic("b", {"cap_bytes": 1, "discard": "reject"})
    put(rs, "r", "a", "b")
    write(eng, "a", 1)
    assert rs.drain_dirty() is True  # dest now full
    write(eng, "a", 2, 3, 4, 5, 6)  # source keeps 4..6; 2..3 are lost unforwarded
    src = topic(eng, "a")
    assert src.evict_floor == 4
    rs.drain_dirty()
    dest = topic(eng, "b")
    r = router(rs, "r")
    # Holes for source seqs 2,3 (dest seqs 2,3), then copy of 4, then stall at 5.
    assert dest.l_trim == 3
    assert dest.head_seq == 4
    assert (r.cursor, r.forwarded_total) == (4, 4)
    recs, res = read(eng, "b", from_seq=1)
    assert res.tombstone is not None
    assert res.tombstone.to_wire() == {
        "gap_from": 2,
        "gap_to": 3,
        "reason": "source_trim",
        "missed_estimate": 2,
        "earliest_seq": 4,
        "head_seq": 4,
    }
    assert [x["data"] for x in recs] == [4]
    # L_trim is a floor: everything at or below it is involuntary loss.
    _, res0 = read(eng, "b", from_seq=0)
    assert res0.tombstone is not None
    assert (res0.tombstone.gap_from, res0.tombstone.reason) == (1, "source_trim")
    st = eng.topic_state("b")
    assert (st["count"], st["earliest_seq"]) == (1, 4)


def test_source_ttl_expiry_becomes_source_trim() -> None:
    eng, rs, clock = make()
    eng.put_topic("a", {"ttl_ms": 1000})
    put(rs, "r", "a", "b")
    write(eng, "a", 1, 2)
    clock.advance(1001)
    recs, res = read(eng, "b")
    assert recs == []
    assert res.tombstone is not None and res.tombstone.reason == "source_trim"
    assert (res.tombstone.gap_from, res.tombstone.gap_to) == (1, 2)
    assert router(rs, "r").cursor == 2


def test_trim_holes_propagate_downstream() -> None:
    eng, rs, _ = make()
    eng.put_topic("a", {"cap_records": 1})
    put(rs, "ab", "a", "b")
    put(rs, "bc", "b", "c")
    write(eng, "a", 1, 2, 3)  # seqs 1, 2 evicted before forwarding
    recs, res = read(eng, "c")
    assert [x["data"] for x in recs] == [3]
    assert res.tombstone is not None and res.tombstone.reason == "source_trim"
    assert (res.tombstone.gap_from, res.tombstone.gap_to) == (1, 2)


def test_pass_bound_is_1024_seqs() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    write(eng, "a", *range(3000))
    r = router(rs, "r")
    assert rs.advance(r) == PASS_MAX_SEQS == 1024
    assert topic(eng, "b").head_seq == 1024
    assert rs.advance(r) == 1024
    assert rs.advance(r) == 3000 - 2048
    assert rs.advance(r) == 0
    assert r.forwarded_total == 3000


# ------------------------------------------------------ get / list / delete


def test_get_drives_router_and_404() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b", filter="x*")
    write(eng, "a", {"data": 1, "tag": "x1"}, 2)
    out = rs.get("r")
    assert out == {
        "router": "r",
        "source": "a",
        "dest": "b",
        "preserve_node": True,
        "preserve_tag": True,
        "filter": ["tag", "Glob", "x*"],
        "allow_cycle": False,
        "guarantee": "at_least_once",
        "forwarded_total": 1,
    }
    assert topic(eng, "b").head_seq == 1
    e = err(rs.get, "nope")
    assert (e.status, e.code, e.detail) == (404, "router_not_found", {"router": "nope"})


def test_delete_router_stops_forwarding_copies_stay() -> None:
    eng, rs, _ = make()
    put(rs, "r", "a", "b")
    write(eng, "a", 1)
    read(eng, "b")
    assert rs.delete("r") == {"router": "r", "deleted": True}
    assert rs.delete("r") == {"router": "r", "deleted": False}
    write(eng, "a", 2)
    assert rs.drain_dirty() is False
    recs, _ = read(eng, "b")
    assert [x["data"] for x in recs] == [1]
    # The dest can now take a router from another source.
    put(rs, "r2", "c", "b")


def test_deleting_a_topic_removes_its_routers() -> None:
    eng, rs, _ = make()
    put(rs, "a->b", "a", "b")
    put(rs, "a->c", "a", "c")
    put(rs, "x->a", "x", "a")
    put(rs, "x->y", "x", "y")
    write(eng, "a", 1)
    assert rs.drain_dirty() is True
    out = eng.delete_topic("a")
    assert out["routers_removed"] == ["a->b", "a->c", "x->a"]
    assert rs.names() == ["x->y"]
    assert rs.drain_dirty() is False
    # Recreating the name does not revive anything.
    write(eng, "a", 1)
    assert rs.drain_dirty() is False
    assert topic(eng, "b").head_seq == 1


def test_deleting_reject_dest_removes_stalled_router() -> None:
    eng, rs, _ = make()
    eng.put_topic("b", {"cap_records": 1, "discard": "reject"})
    put(rs, "r", "a", "b")
    write(eng, "a", 1, 2)
    rs.drain_dirty()
    assert eng.delete_topic("b")["routers_removed"] == ["r"]
    assert rs.drain_dirty() is False
    assert len(rs) == 0


def test_list_paging_filters_and_allow() -> None:
    eng, rs, _ = make()
    put(rs, "r3", "s", "d3")
    put(rs, "r1", "s", "d1", guarantee="exactly_once")
    put(rs, "r2", "s", "d2")
    put(rs, "q1", "t", "e1")
    put(rs, "r4", "t", "e2")
    write(eng, "s", 1)
    rs.get("r1")
    page = rs.list(page_size=2)
    assert [x["router"] for x in page["routers"]] == ["q1", "r1"]
    assert page["routers"][1] == {
        "router": "r1",
        "source": "s",
        "dest": "d1",
        "guarantee": "exactly_once",
        "forwarded_total": 1,
    }
    assert page["next_cursor"] == encode_cursor("r1")
    page2 = rs.list(page_size=2, cursor=page["next_cursor"])
    assert [x["router"] for x in page2["routers"]] == ["r2", "r3"]
    page3 = rs.list(page_size=2, cursor=page2["next_cursor"])
    assert [x["router"] for x in page3["routers"]] == ["r4"]
    assert "next_cursor" not in page3
    assert [x["router"] for x in rs.list(prefix="r")["routers"]] == ["r1", "r2", "r3", "r4"]
    assert [x["router"] for x in rs.list(source="t")["routers"]] == ["q1", "r4"]
    assert [x["router"] for x in rs.list(dest="d2")["routers"]] == ["r2"]
    assert "next_cursor" not in rs.list()
    # The allowlist applies to name, source and dest, before paging.
    allowed = rs.list(page_size=1, allow=lambda n: n not in ("r1", "d3", "e1"))
    assert [x["router"] for x in allowed["routers"]] == ["r2"]
    nxt = rs.list(page_size=1, cursor=allowed["next_cursor"], allow=lambda n: n != "d3")
    assert [x["router"] for x in nxt["routers"]] == ["r4"]
    assert "next_cursor" not in nxt
    e = err(rs.list, cursor="!!!not-base64")
    assert e.status == 400
    assert rs.list(cursor="")["routers"][0]["router"] == "q1"


def test_publication_schedules_forwarding_whoever_wrote() -> None:
    """A write to a router source asks the loop owner to forward (once per burst), so
    records written by any shell (HTTP, WebSocket, Kafka) move without a timer."""
    eng, rs, _clock = make()
    calls: list[Any] = []
    rs.schedule = calls.append
    put(rs, "r", "src", "dst")
    write(eng, "src", {"data": 1})
    write(eng, "src", {"data": 2})
    assert len(calls) == 1, "one scheduled drain per burst of publications"
    assert topic(eng, "dst").head_seq == 0  # nothing forwarded until the drain runs
    calls.pop()()
    assert topic(eng, "dst").head_seq == 2
    got, _ = read(eng, "dst")
    assert [r["data"] for r in got] == [1, 2]
    write(eng, "src", {"data": 3})
    assert len(calls) == 1  # scheduled again after the drain ran
    write(eng, "other", {"data": 0})  # not a router source: nothing scheduled
    assert len(calls) == 1
