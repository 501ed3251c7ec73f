"""Topic instance: staging/publication order, floors, retention, read pipeline, deletes."""

from __future__ import annotations

import orjson

from topics.engine.records import NewRecord
from topics.engine.topic import NodeInterner, Topic, Totals
from topics.engine.topic_config import TopicConfig

NOW = 1_000_000


def mk(**cfg: object) -> Topic:
    return Topic("t", 1, TopicConfig(**cfg), NOW, Totals(), NodeInterner())  # type: ignore[arg-type]


def rec(v: object, node: str | None = None, tag: str | None = None) -> NewRecord:
    data = orjson.dumps(v)
    return NewRecord(data, None, node, tag, len(data))


def put(t: Topic, *vals: object, now: int = NOW, **kw: str) -> None:
    pw = t.stage([rec(v, **kw) for v in vals], now, None)
    t.complete(pw, True)


def seqs(t: Topic, from_seq: int = 0, **kw: object) -> list[int]:
    r = t.read(from_seq, 1000, 1 << 20, now=NOW, **kw)  # type: ignore[arg-type]
    return r.seqs


def test_publication_is_in_seq_order_and_failures_become_holes() -> None:
    t = mk()
    a = t.stage([rec(1)], NOW, None)
    b = t.stage([rec(2), rec(3)], NOW, None)
    c = t.stage([rec(4)], NOW, None)
    t.complete(c, True)
    assert t.head_seq == 0  # c waits for a and b
    t.complete(b, False)
    assert t.head_seq == 0
    t.complete(a, True)
    assert t.head_seq == 4 and t.live_count == 2
    assert seqs(t) == [1, 4]
    r = t.read(0, 1000, 1 << 20, now=NOW)
    assert r.tombstone is None and r.next_from_seq == 4  # holes are silent


def test_ts_is_non_decreasing() -> None:
    t = mk()
    put(t, 1, now=NOW)
    put(t, 2, now=NOW - 500)  # clock stepped back
    ts = list(t.index.view()["ts"])
    assert ts == [NOW, NOW]


def test_cap_bytes_walks_oldest_live_bytes() -> None:
    t = mk(cap_bytes=10)
    put(t, "aaa", "bbb", "ccc")  # 5 bytes each
    t.apply_retention(NOW)
    assert t.live_bytes == 10 and t.l_cap == 1 and t.earliest_seq == 2
    t.delete_seqs([2])
    put(t, "ddd")
    t.apply_retention(NOW)
    # Seq 2 was deleted (voluntary): earliest moves past it, evict_floor does not.
    assert t.live_bytes == 10 and t.earliest_seq == 3 and t.evict_floor == 2


def test_ttl_prefix_counts_deleted_slots_by_ts() -> None:
    t = mk(ttl_ms=100)
    put(t, 1, 2, now=NOW)
    put(t, 3, now=NOW + 50)
    t.delete_seqs([2])
    t.apply_retention(NOW + 101)
    assert t.l_ttl == 2 and t.earliest_seq == 3
    r = t.read(0, 10, 1 << 20, now=NOW + 101)
    assert r.tombstone is not None and r.tombstone.reason == "ttl"
    assert (r.tombstone.gap_from, r.tombstone.gap_to) == (1, 2)


def test_deleted_gap_above_evict_floor_is_silent() -> None:
    t = mk(cap_records=8)
    put(t, *range(10))  # L_cap = 2
    t.apply_retention(NOW)
    t.delete_range(6)  # deletes 3..5
    t.delete_below = 6
    r = t.read(0, 10, 1 << 20, now=NOW)
    assert r.tombstone is not None and (r.tombstone.gap_from, r.tombstone.gap_to) == (1, 2)
    assert r.tombstone.earliest_seq == 3  # the involuntary floor, not earliest_seq
    assert r.seqs[0] == 6
    r = t.read(3, 10, 1 << 20, now=NOW)
    assert r.tombstone is None and r.seqs[0] == 6


def test_budget_stop_does_not_step_over_blocked_record() -> None:
    t = mk()
    put(t, "x" * 10, 1, "y" * 10, node=None)
    r = t.read(0, 10, 14, now=NOW)  # 12 + 1 fit, 12 more does not
    assert r.seqs == [1, 2] and r.next_from_seq == 2
    r = t.read(0, 10, 1, now=NOW)  # a single oversized record is still delivered
    assert r.seqs == [1] and r.next_from_seq == 1


def test_limit_stop_does_not_consume_trailing_skips() -> None:
    t = mk()
    put(t, 1, node="a")
    put(t, 2, node="b")
    put(t, 3, node="b")
    r = t.read(0, 1, 1 << 20, now=NOW, nodes=["b"])
    assert r.seqs == [1] and r.next_from_seq == 1 and r.scanned == 1
    r = t.read(1, 1, 1 << 20, now=NOW, nodes=["b"])
    assert r.seqs == [] and r.next_from_seq == 3 and r.caught_up and r.scanned == 2


def test_read_spans_chunks() -> None:
    t = mk()
    put(t, *range(5000))
    r = t.read(10, 1000, 1 << 30, now=NOW)
    assert r.seqs == list(range(11, 1011))
    r = t.read(0, 1000, 1 << 30, now=NOW, nodes=["nobody"])
    assert len(r.seqs) == 1000


def test_source_trim_reason_and_holes() -> None:
    t = mk()
    put(t, 1)
    t.append_holes(3, NOW)
    t.l_trim = 4
    assert t.head_seq == 4 and t.next_seq == 5
    assert t.reason_for(2) == "source_trim"
    r = t.read(0, 10, 1 << 20, now=NOW)
    assert r.tombstone is not None and r.tombstone.reason == "source_trim"
    assert (r.tombstone.gap_from, r.tombstone.gap_to) == (1, 4)
    put(t, 9)
    assert t.head_seq == 5 and seqs(t, 4) == [5]


def test_recreated_cursor_beyond_head() -> None:
    t = mk()
    put(t, 1, 2)
    r = t.read(10, 10, 1 << 20, now=NOW)
    assert r.tombstone is not None and r.tombstone.reason == "recreated"
    assert (r.tombstone.gap_from, r.tombstone.gap_to, r.tombstone.missed_estimate) == (1, 2, 2)
    assert r.seqs == [1, 2]


def test_tag_postings_follow_eviction() -> None:
    t = mk(cap_records=2)
    put(t, 1, tag="x")
    put(t, 2, tag="x")
    put(t, 3, tag="x")
    t.apply_retention(NOW)
    assert t.tags.eq("x", 100) == [2, 3]
    assert t.delete_seqs(t.tags.prefix("", 100)) == 2
    assert t.live_count == 0 and t.earliest_seq == 4


def test_totals_track_live_bytes() -> None:
    totals = Totals()
    t = Topic("t", 1, TopicConfig(cap_records=1), NOW, totals, NodeInterner())
    put(t, "ab", "cd")
    t.apply_retention(NOW)
    assert (totals.records, totals.bytes) == (1, 4)
    t.drop_all()
    assert (totals.records, totals.bytes) == (0, 0)


def test_read_fields_returns_raw_parts_and_seq_for_ts_searches_the_ts_column() -> None:
    t = mk()
    put(t, {"a": 1}, now=NOW)
    put(t, "b", now=NOW + 10, node="n1", tag="x")
    put(t, 3, now=NOW + 20)
    t.delete_seqs([3])
    r = t.read(0, 10, 1 << 20, now=NOW + 20, fields=True)
    assert r.records == [
        (1, NOW, None, None, b'{"a":1}', None),
        (2, NOW + 10, "n1", "x", b'"b"', None),
    ]
    assert t.seq_for_ts(0) == 1 and t.seq_for_ts(NOW + 5) == 2
    assert t.seq_for_ts(NOW + 20) == 3  # deleted: readers go on from there
    assert t.seq_for_ts(NOW + 21) == 4  # head + 1
