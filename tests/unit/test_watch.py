"""Watch sessions and push delivery (engine.watch): validation order, cursors, frames."""

from __future__ import annotations

import base64
import random
import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from tests.support.clock import TestClock

from topics.config import Limits
from topics.engine import watch as watch_module
from topics.engine.core import Engine
from topics.engine.watch import (
    SESSION_TTL_MS,
    Delivery,
    Event,
    ReadOpts,
    WatchRegistry,
    WatchSession,
    WatchStream,
    clamp_heartbeat,
    composite_id_of,
    decode_composite_id,
    drain_step,
    encode_composite_id,
    render_sse,
    render_ws,
)
from topics.errors import TopicsError


def mk(**limits: Any) -> tuple[Engine, WatchRegistry, TestClock]:
    clock = TestClock()
    eng = Engine(clock=clock, limits=Limits(**limits))
    return eng, WatchRegistry(eng), clock


def write(eng: Engine, name: str, *vals: Any, node: str | None = None) -> None:
    recs: list[dict[str, Any]] = [{"data": v} for v in vals]
    if node is not None:
        for r in recs:
            r["node"] = node
    res = eng.begin_write(name, eng.parse_write({"records": recs}, None))
    assert not isinstance(res, dict)


def err(fn: Any, *a: Any, **kw: Any) -> TopicsError:
    with pytest.raises(TopicsError) as ei:
        fn(*a, **kw)
    return ei.value


def session(reg: WatchRegistry, body: dict[str, Any], **kw: Any) -> WatchSession:
    out = reg.create(body, kw.pop("digest", None), kw.pop("bound", False), kw.pop("lenient", False))
    s = reg.get(out["wid"])
    assert s is not None
    return s


def drain(ws: WatchStream) -> list[tuple[str, dict[str, Any], dict[str, int]]]:
    """One full stream pass: every topic in name order drained to head."""
    frames = []
    for name in ws.names():
        while True:
            res = ws.pass_topic(name)
            for f in res.frames:
                ids = decode_composite_id(f.id)
                assert ids is not None
                frames.append((f.event, f.to_dict(), ids))
            if res.drained:
                break
    return frames


# ----------------------------------------------------------------- POST /v0/watch


def test_create_returns_wid_and_resolved_cursors() -> None:
    eng, reg, _ = mk()
    eng.put_topic("orders", {})
    eng.put_topic("sensor.temp", {})
    write(eng, "orders", 1, 2, 3)
    write(eng, "sensor.temp", 1, 2)
    out = reg.create(
        {"topics": {"orders": {"from_seq": 1}, "sensor.temp": {"tail": True, "from_seq": 0}}},
        None,
        False,
        False,
    )
    assert re.fullmatch(r"wid_[A-Za-z0-9_-]{22}", out["wid"])
    assert len(out["wid"]) == 26
    assert out["stream_url"] == "/v0/watch/" + out["wid"]
    assert out["session_ttl_ms"] == SESSION_TTL_MS == 300000
    assert out["topics"] == {
        "orders": {"from_seq": 1, "head_seq": 3, "earliest_seq": 1},
        "sensor.temp": {"from_seq": 2, "head_seq": 2, "earliest_seq": 1},
    }
    s = reg.get(out["wid"])
    assert s is not None and s.cursors == {"orders": 1, "sensor.temp": 2}
    assert s.opts == ReadOpts(None, 256, 262144, True, False, True)
    assert s.heartbeat_ms == 15000 and not s.bound and s.creator is None
    assert len(reg) == 1


def test_create_options_are_normalised() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s = session(
        reg,
        {
            "topics": {"a": {}},
            "node": ["n1", "n2"],
            "limit": 5000,
            "max_batch_bytes": 0,
            "include_meta": False,
            "include_tags": True,
            "include_data": False,
            "consistency": "strong",
            "heartbeat_ms": 10,
        },
    )
    assert s.opts == ReadOpts(["n1", "n2"], 1000, 1048576, False, True, False)
    assert s.heartbeat_ms == 10
    assert clamp_heartbeat(s.heartbeat_ms) == 1000
    assert clamp_heartbeat(10**9) == 60000
    s = session(reg, {"topics": {"a": None}, "limit": 0, "max_batch_bytes": 10**12})
    assert s.opts.limit == 256 and s.opts.budget == 8388608


def test_heartbeat_floor_is_read_when_clamping(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests that need fast heartbeats lower the floor in-process (test_watch_sse.py).
    monkeypatch.setattr(watch_module, "HEARTBEAT_MIN_MS", 5)
    assert clamp_heartbeat(10) == 10
    assert clamp_heartbeat(1) == 5
    assert clamp_heartbeat(10**9) == 60000


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {},
        {"topics": []},
        {"topics": {}},
        {"topics": {"a": 5}},
        {"topics": {"a": {"from_seq": -1}}},
        {"topics": {"a": {"tail": "yes"}}},
        {"topics": {"a": {}}, "node": 5},
        {"topics": {"a": {}}, "limit": "x"},
        {"topics": {"a": {}}, "include_data": 1},
        {"topics": {"a": {}}, "consistency": "linearizable"},
    ],
)
def test_create_400(body: Any) -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    e = err(reg.create, body, None, False, False)
    assert (e.status, e.code) == (400, "invalid_request")


def test_create_validation_order() -> None:
    eng, reg, _ = mk(max_watch_topics=2, max_watch_sessions=1)
    eng.put_topic("ok.1", {})
    allow = lambda n: n.startswith("ok.")  # noqa: E731
    # count (400) before allowlist (403)
    e = err(reg.create, {"topics": {"bad": {}, "ok.1": {}, "ok.2": {}}}, None, False, False, allow)
    assert e.status == 400
    # allowlist (403, detail topic) before resolution (404)
    e = err(reg.create, {"topics": {"ok.missing": {}, "zz": {}}}, None, False, False, allow)
    assert (e.status, e.code, e.detail) == (403, "forbidden", {"topic": "zz"})
    # resolution (404) before the session cap (429)
    reg.create({"topics": {"ok.1": {}}}, None, False, False, allow)
    e = err(reg.create, {"topics": {"ok.missing": {}}}, None, False, False, allow)
    assert (e.status, e.code, e.detail) == (404, "topic_not_found", {"topic": "ok.missing"})
    e = err(reg.create, {"topics": {"ok.1": {}}}, None, False, False, allow)
    assert (e.status, e.code) == (429, "throttled")
    assert e.detail == {"limit": "max_watch_sessions", "max": 1}


def test_create_lenient_drops_unknown_topics() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    out = reg.create({"topics": {"a": {}, "nope": {"from_seq": 3}}}, None, False, True)
    assert list(out["topics"]) == ["a"]


def test_idle_gc_runs_before_the_cap_and_spares_open_streams() -> None:
    eng, reg, clock = mk(max_watch_sessions=2)
    eng.put_topic("a", {})
    s1 = session(reg, {"topics": {"a": {}}})
    s2 = session(reg, {"topics": {"a": {}}})
    s1.open_streams = 1
    clock.advance(SESSION_TTL_MS + 1)
    s3 = session(reg, {"topics": {"a": {}}})  # s2 was idle => collected, freeing a slot
    assert reg.get(s2.wid) is None
    assert reg.get(s1.wid) is s1 and reg.get(s3.wid) is s3
    s1.open_streams = 0  # stream close stamps last access
    s1.last_access_ms = clock.now_ms()
    clock.advance(SESSION_TTL_MS)
    assert reg.gc(clock.now_ms()) == 0  # exactly TTL idle is still alive
    clock.advance(1)
    assert reg.gc(clock.now_ms()) == 2 and len(reg) == 0


def test_bound_session_remembers_the_creator() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s = session(reg, {"topics": {"a": {}}}, digest=b"k" * 32, bound=True)
    assert s.bound and s.creator == b"k" * 32


# ------------------------------------------------------------------ composite ids


def test_composite_id_matches_the_spec_example() -> None:
    cid = encode_composite_id({"sensor.temp": 9133, "orders": 90})
    assert cid == "eyJvcmRlcnMiOjkwLCJzZW5zb3IudGVtcCI6OTEzM30"
    assert decode_composite_id(cid) == {"orders": 90, "sensor.temp": 9133}
    padded = base64.urlsafe_b64encode(b'{"a":1}').decode()
    assert padded.endswith("=")
    assert decode_composite_id(padded) == {"a": 1}
    assert decode_composite_id("!!!") is None
    assert decode_composite_id(base64.urlsafe_b64encode(b"[1]").decode()) is None
    assert decode_composite_id(encode_composite_id({"a": -1, "b": 2})) == {"b": 2}


def test_last_event_id_only_rewinds_known_topics() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    eng.put_topic("b", {})
    s = session(reg, {"topics": {"a": {"from_seq": 10}, "b": {"from_seq": 5}}})
    s.rewind(encode_composite_id({"a": 3, "b": 9, "zzz": 0}))
    assert s.cursors == {"a": 3, "b": 5}
    s.rewind("not base64 at all ***")
    s.rewind("")
    s.rewind(None)
    assert s.cursors == {"a": 3, "b": 5}


# ----------------------------------------------------------------------- frames


def test_stream_pass_records_then_caught_up_with_composite_ids() -> None:
    eng, reg, _ = mk()
    eng.put_topic("b", {})
    eng.put_topic("a", {})
    write(eng, "a", {"x": 1}, {"x": 2})
    s = session(reg, {"topics": {"b": {}, "a": {}}})
    ws = WatchStream(eng, s)
    frames = drain(ws)
    assert [(e, d["topic"]) for e, d, _ in frames] == [
        ("record", "a"),
        ("caught-up", "a"),
        ("caught-up", "b"),
    ]
    _, rec, ids = frames[0]
    assert list(rec) == ["topic", "from_seq", "head_seq", "records", "to_seq"]
    assert rec["from_seq"] == 0 and rec["to_seq"] == 2 and rec["head_seq"] == 2
    assert [r["data"] for r in rec["records"]] == [{"x": 1}, {"x": 2}]
    assert ids == {"a": 2, "b": 0}
    assert frames[1][1] == {"topic": "a", "head_seq": 2}
    assert s.cursors == {"a": 2, "b": 0}
    # nothing new: a pass produces nothing
    assert drain(ws) == []
    # new data: record + caught-up again, only for that topic
    write(eng, "b", 7)
    frames = drain(ws)
    assert [(e, d["topic"]) for e, d, _ in frames] == [("record", "b"), ("caught-up", "b")]
    assert frames[0][1]["from_seq"] == 0 and frames[0][1]["to_seq"] == 1
    assert frames[1][2] == {"a": 2, "b": 1}


def test_limit_and_budget_split_batches_caught_up_only_at_head() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    write(eng, "a", *range(5))
    s = session(reg, {"topics": {"a": {}}, "limit": 2})
    frames = drain(WatchStream(eng, s))
    kinds = [e for e, _, _ in frames]
    assert kinds == ["record", "record", "record", "caught-up"]
    assert [(d["from_seq"], d["to_seq"]) for _, d, _ in frames[:3]] == [(0, 2), (2, 4), (4, 5)]
    assert [f[2]["a"] for f in frames] == [2, 4, 5, 5]
    # byte budget: every record is ~20 bytes; a 1-byte budget still delivers one each
    s = session(reg, {"topics": {"a": {}}, "max_batch_bytes": 1})
    frames = drain(WatchStream(eng, s))
    assert [len(d.get("records", [])) for _, d, _ in frames] == [1, 1, 1, 1, 1, 0]


def test_first_tombstone_is_relabelled_later_ones_carry_the_engine_reason() -> None:
    eng, reg, _ = mk()
    eng.put_topic("c", {"cap_records": 3})
    write(eng, "c", *range(10))  # live 8..10
    s = session(reg, {"topics": {"c": {}}})
    ws = WatchStream(eng, s)
    frames = drain(ws)
    assert [e for e, _, _ in frames] == ["tombstone", "record", "caught-up"]
    tomb = frames[0][1]
    assert tomb == {
        "topic": "c",
        "reason": "from_seq_too_old",
        "gap_from": 1,
        "gap_to": 7,
        "earliest_seq": 8,
        "head_seq": 10,
    }
    assert frames[0][2] == {"c": 7}  # cursor set to gap_to
    assert frames[1][1]["from_seq"] == 7 and frames[1][1]["to_seq"] == 10
    # the cursor falls behind a second eviction: engine reason this time
    s.cursors["c"] = 10
    write(eng, "c", *range(10))  # head 20, live 18..20
    frames = drain(ws)
    assert [e for e, _, _ in frames] == ["tombstone", "record", "caught-up"]
    assert frames[0][1]["reason"] == "cap"
    assert (frames[0][1]["gap_from"], frames[0][1]["gap_to"]) == (11, 17)
    # a new connection relabels again
    s.cursors["c"] = 0
    frames = drain(WatchStream(eng, s))
    assert frames[0][1]["reason"] == "from_seq_too_old"


def test_drain_step_without_relabel_and_recreated_cursor() -> None:
    eng, _, _ = mk()
    t, _ = eng.put_topic("c", {"cap_records": 2})
    write(eng, "c", 1, 2, 3, 4)
    d = Delivery("c", t)
    step = drain_step(eng, d, 0, ReadOpts(), relabel_first=False)
    assert [e.kind for e in step.events] == ["tombstone", "record", "caught-up"]
    assert step.events[0].reason == "cap" and step.cursor == 4 and step.drained
    # cursor beyond head (delete + recreate): "recreated", reading resumes at earliest
    d = Delivery("c", t)
    step = drain_step(eng, d, 99, ReadOpts(), relabel_first=False)
    tomb, rec = step.events[0], step.events[1]
    assert (tomb.reason, tomb.gap_from, tomb.gap_to, tomb.cursor) == ("recreated", 1, 4, 4)
    assert [orjson.loads(r)["$seq"] for r in rec.records] == [3, 4]
    assert step.cursor == 4


def test_node_filter_advances_the_cursor_silently() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s = session(reg, {"topics": {"a": {}}, "node": "me"})
    ws = WatchStream(eng, s)
    assert [e for e, _, _ in drain(ws)] == ["caught-up"]
    write(eng, "a", 1, 2, node="me")
    assert drain(ws) == []  # own records: no frame, no second caught-up
    assert s.cursors["a"] == 2
    write(eng, "a", 3, node="other")
    frames = drain(ws)
    assert [e for e, _, _ in frames] == ["record", "caught-up"]
    assert frames[0][1]["from_seq"] == 2
    assert [r["$node"] for r in frames[0][1]["records"]] == ["other"]


def test_include_flags_shape_record_objects() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    res = eng.begin_write(
        "a",
        eng.parse_write({"records": [{"data": 1, "tag": "t1", "meta": {"m": 1}}]}, None),
    )
    assert not isinstance(res, dict)
    s = session(
        reg,
        {"topics": {"a": {}}, "include_data": False, "include_tags": True, "include_meta": False},
    )
    rec = drain(WatchStream(eng, s))[0][1]["records"][0]
    assert set(rec) == {"$seq", "$ts", "$tag"} and rec["$tag"] == "t1"
    s = session(reg, {"topics": {"a": {}}})
    rec = drain(WatchStream(eng, s))[0][1]["records"][0]
    assert set(rec) == {"$seq", "$ts", "data", "meta"}


def test_topic_deleted_once_then_stream_is_over() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    eng.put_topic("b", {})
    s = session(reg, {"topics": {"a": {}, "b": {}}})
    ws = WatchStream(eng, s)
    drain(ws)
    eng.delete_topic("a")
    frames = drain(ws)
    assert [(e, d) for e, d, _ in frames] == [
        ("topic-deleted", {"topic": "a", "head_seq": 0, "reason": "deleted"})
    ]
    assert frames[0][2] == {"a": 0, "b": 0}
    assert ws.names() == ["b"] and not ws.all_deleted
    eng.put_topic("a", {})  # a recreated instance is not followed by this connection
    write(eng, "a", 1)
    assert drain(ws) == []
    eng.delete_topic("b")
    assert [e for e, _, _ in drain(ws)] == ["topic-deleted"]
    assert ws.all_deleted and ws.names() == []


def test_topic_deleted_before_the_stream_opened() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s = session(reg, {"topics": {"a": {"from_seq": 4}}})
    eng.delete_topic("a")
    ws = WatchStream(eng, s)
    frames = drain(ws)
    assert frames == [
        ("topic-deleted", {"topic": "a", "head_seq": 0, "reason": "deleted"}, {"a": 4})
    ]
    assert ws.all_deleted


def test_renderers() -> None:
    eng, _, _ = mk()
    t, _ = eng.put_topic("a", {})
    write(eng, "a", 1)
    step = drain_step(eng, Delivery("a", t), 0, ReadOpts(), relabel_first=True)
    rec, cu = step.events
    sse = render_sse(rec, "ID")
    assert sse.startswith(b"id: ID\nevent: record\ndata: {") and sse.endswith(b"}\n\n")
    assert sse.count(b"\n") == 4
    assert render_sse(cu, None) == b'event: caught-up\ndata: {"topic":"a","head_seq":1}\n\n'
    msg = orjson.loads(render_ws(rec))
    assert msg["op"] == "record" and msg["to_seq"] == 1 and msg["records"][0]["data"] == 1
    assert orjson.loads(render_ws(cu)) == {"op": "caught_up", "topic": "a", "head_seq": 1}
    eng.delete_topic("a")
    d = Delivery("a", t)
    gone = drain_step(eng, d, 1, ReadOpts(), relabel_first=False).events[0]
    assert orjson.loads(render_ws(gone)) == {
        "op": "topic_deleted",
        "topic": "a",
        "head_seq": 0,
        "reason": "deleted",
    }
    assert drain_step(eng, d, 1, ReadOpts(), relabel_first=False).events == []


def test_shutdown_frame_carries_the_composite_id() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s = session(reg, {"topics": {"a": {"from_seq": 3}}})
    f = WatchStream(eng, s).shutdown_frame()
    assert f.event == "error" and decode_composite_id(f.id) == {"a": 3}
    assert f.to_dict() == {
        "code": "server_shutting_down",
        "message": "server is shutting down; reconnect",
    }


# ------------------------------------------------------------ shared tail reads


def _reference_step(
    eng: Engine, d: Delivery, cursor: int, opts: ReadOpts, *, relabel_first: bool
) -> tuple[list[tuple[str, bytes]], int, bool]:
    """drain_step as it was before reads were shared: a fresh `Topic.read` every time."""
    t = d.topic
    assert t is not None and t.alive and not d.deleted
    now = eng.prepare_read(t)
    r = t.read_opts(cursor, opts, now=now)
    out: list[tuple[str, bytes]] = []
    cur = cursor
    tomb = r.tombstone
    if tomb is not None:
        reason = "from_seq_too_old" if (relabel_first and d.first_read) else tomb.reason
        cur = tomb.gap_to
        ev = Event(
            "tombstone",
            t.name,
            t.name_json,
            cur,
            tomb.head_seq,
            reason=reason,
            gap_from=tomb.gap_from,
            gap_to=tomb.gap_to,
            earliest_seq=tomb.earliest_seq,
        )
        out.append((ev.kind, ev.data()))
        d.pending_caught_up = True
    d.first_read = False
    if r.records:
        ev = Event(
            "record",
            t.name,
            t.name_json,
            r.next_from_seq,
            r.head_seq,
            from_seq=cur,
            records=tuple(r.records),
        )
        out.append((ev.kind, ev.data()))
        d.pending_caught_up = True
    cur = r.next_from_seq
    drained = r.caught_up
    if drained and d.pending_caught_up:
        out.append(("caught-up", Event("caught-up", t.name, t.name_json, cur, r.head_seq).data()))
        d.pending_caught_up = False
    if not drained and not r.records and tomb is None and r.next_from_seq == cursor:
        drained = True
    return out, cur, drained


@pytest.mark.parametrize("seed", range(25))
def test_shared_reads_match_fresh_reads(seed: int) -> None:
    """Randomised: readers sharing a topic's tail read see exactly what a fresh read gives.

    Writes (nodes, tags, meta), deletes by tag and by seq, TTL expiry, cap eviction and
    config changes are interleaved with groups of readers at the same cursor.
    """
    rng = random.Random(seed)
    eng, _, clock = mk()
    t, _ = eng.put_topic("a", {})
    opts_pool: list[Callable[[], dict[str, Any]]] = [
        lambda: {},
        lambda: {"limit": rng.randint(1, 4)},
        lambda: {"budget": rng.choice([1, 40, 100])},
        lambda: {"nodes": ["n1"]},
        lambda: {"nodes": ["n1", "n2"], "limit": 3},
        lambda: {"include_tags": True, "include_meta": False},
        lambda: {"include_data": False, "include_tags": True},
    ]
    for _ in range(300):
        op = rng.random()
        if op < 0.3:
            recs: list[dict[str, Any]] = []
            for _ in range(rng.randint(1, 4)):
                rec: dict[str, Any] = {"data": rng.randint(0, 99)}
                if rng.random() < 0.4:
                    rec["node"] = rng.choice(["n1", "n2", "n3"])
                if rng.random() < 0.4:
                    rec["tag"] = rng.choice(["x", "y"])
                if rng.random() < 0.3:
                    rec["meta"] = {"m": 1}
                recs.append(rec)
            res = eng.begin_write("a", eng.parse_write({"records": recs}, None))
            assert not isinstance(res, dict)
        elif op < 0.37:
            eng.delete_records("a", {"match": rng.choice(["x", "y"])})
        elif op < 0.41 and t.head_seq:
            eng.delete_records("a", {"before_seq": rng.randint(1, t.head_seq)})
        elif op < 0.5:
            clock.advance(rng.randint(0, 40))
        elif op < 0.55:
            cfg = rng.choice(
                [{}, {"ttl_ms": 60}, {"cap_records": 8}, {"dedupe_node": False}, {"cap_bytes": 200}]
            )
            eng.put_topic("a", cfg)
        else:
            cursor = rng.randint(max(0, t.head_seq - 6), t.head_seq + 1)
            kw = rng.choice(opts_pool)()
            relabel = rng.random() < 0.5
            for _ in range(rng.randint(1, 4)):
                first, pending = rng.random() < 0.3, rng.random() < 0.5
                # equal but not identical options across the readers of a group
                fresh: dict[str, Any] = {k: list(v) if k == "nodes" else v for k, v in kw.items()}
                opts = ReadOpts(**fresh)
                d = Delivery("a", t, first_read=first, pending_caught_up=pending)
                ref = Delivery("a", t, first_read=first, pending_caught_up=pending)
                step = drain_step(eng, d, cursor, opts, relabel_first=relabel)
                want = _reference_step(eng, ref, cursor, opts, relabel_first=relabel)
                got = ([(e.kind, e.data()) for e in step.events], step.cursor, step.drained)
                assert got == want
                assert (d.first_read, d.pending_caught_up) == (
                    ref.first_read,
                    ref.pending_caught_up,
                )


def test_streams_at_the_same_cursor_share_one_read_and_its_events() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    streams = [WatchStream(eng, session(reg, {"topics": {"a": {"tail": True}}})) for _ in range(3)]
    for ws in streams:
        assert ws.pass_sse("a", [])
    write(eng, "a", 1)
    t = eng.get("a")
    assert t is not None
    reads = 0
    orig = t.read

    def counting(*a: Any, **kw: Any) -> Any:
        nonlocal reads
        reads += 1
        return orig(*a, **kw)

    t.read = counting  # type: ignore[method-assign]
    outs: list[list[bytes]] = []
    for ws in streams:
        out: list[bytes] = []
        assert ws.pass_sse("a", out)
        outs.append(out)
    assert reads == 1
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 2
    assert outs[0][0] is outs[1][0]  # the rendered frame itself is shared
    assert outs[0][0].startswith(b"id: " + encode_composite_id({"a": 1}).encode())
    # a delete below the head changes what the same cursor reads: no stale share
    write(eng, "a", 2, 3)
    first: list[bytes] = []
    streams[0].pass_sse("a", first)
    assert b'"to_seq":3' in first[0] and reads == 2
    eng.delete_records("a", {"before_seq": 3})
    streams[1].pass_sse("a", out := [])
    assert reads == 3
    assert b'"$seq":2' not in out[0] and b'"$seq":3' in out[0]


def test_composite_id_cache_follows_cursor_changes() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    eng.put_topic("b", {})
    s = session(reg, {"topics": {"a": {}, "b": {}}})
    one, two = WatchStream(eng, s), WatchStream(eng, s)
    assert one.composite_id() == encode_composite_id({"a": 0, "b": 0})
    write(eng, "a", 1, 2)
    drain(two)  # the other stream on the same wid moves the shared cursors
    assert one.composite_id() == encode_composite_id({"a": 2, "b": 0})
    s.rewind(encode_composite_id({"a": 1}))
    assert one.composite_id() == encode_composite_id({"a": 1, "b": 0}) == s.composite_id()
    assert composite_id_of({"x": 5}) == encode_composite_id({"x": 5})
    big = {f"t{i:02d}": i for i in range(40)}
    assert composite_id_of(big) == encode_composite_id(big)
    # an empty session (every topic dropped by `lenient`) still gets a valid id
    empty = WatchSession("wid_x", {}, ReadOpts(), 1000, None, False, 0)
    assert WatchStream(eng, empty).composite_id() == encode_composite_id({}) == "e30"


def test_render_memo_is_per_id() -> None:
    eng, _, _ = mk()
    t, _ = eng.put_topic("a", {})
    write(eng, "a", 1)
    rec = drain_step(eng, Delivery("a", t), 0, ReadOpts(), relabel_first=True).events[0]
    x1, y1, x2 = render_sse(rec, "X"), render_sse(rec, "Y"), render_sse(rec, "X")
    assert x1 == x2 and x1.startswith(b"id: X\n") and y1.startswith(b"id: Y\n")
    assert x1[6:] == y1[6:]
    assert render_ws(rec) is render_ws(rec)
    assert rec == Event(
        "record", "a", rec.name_json, 1, 1, from_seq=0, records=rec.records
    )  # memo slots take no part in equality


def test_equal_read_options_are_one_instance() -> None:
    eng, reg, _ = mk()
    eng.put_topic("a", {})
    s1 = session(reg, {"topics": {"a": {}}, "node": ["n1"], "limit": 5})
    s2 = session(reg, {"topics": {"a": {}}, "node": ["n1"], "limit": 5})
    s3 = session(reg, {"topics": {"a": {}}, "node": ["n2"], "limit": 5})
    assert s1.opts is s2.opts and s1.opts == ReadOpts(["n1"], 5)
    assert s3.opts is not s1.opts and s3.opts.nodes == ["n2"]


def test_shared_read_is_dropped_on_config_change_and_ttl_cutoff() -> None:
    eng, _, clock = mk()
    t, _ = eng.put_topic("a", {})
    write(eng, "a", 1, 2, node="n1")
    opts = ReadOpts(nodes=["n1"])
    step = drain_step(eng, Delivery("a", t), 0, opts, relabel_first=False)
    assert [e.kind for e in step.events] == ["caught-up"]  # own records are skipped
    eng.put_topic("a", {"dedupe_node": False})  # same head, same records: new config
    step = drain_step(eng, Delivery("a", t), 0, opts, relabel_first=False)
    assert [e.kind for e in step.events] == ["record", "caught-up"]
    assert len(step.events[0].records) == 2
    # TTL: a cursor read again after expiry sees the eviction, not the earlier result
    eng.put_topic("a", {"dedupe_node": False, "ttl_ms": 100})
    step = drain_step(eng, Delivery("a", t), 0, ReadOpts(), relabel_first=False)
    assert [e.kind for e in step.events] == ["record", "caught-up"]
    clock.advance(101)
    step = drain_step(eng, Delivery("a", t), 0, ReadOpts(), relabel_first=False)
    assert [e.kind for e in step.events] == ["tombstone", "caught-up"]
    assert step.events[0].reason == "ttl"
