"""Engine facade with a journal that commits later: the two-phase write shape.

This is the seam durable storage plugs into: writes are staged (seqs assigned,
invisible), committed by the journal in any order, and published strictly in seq
order; a failed commit becomes silent holes and a 500 for its writer.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from tests.support.clock import TestClock

from topics.engine.core import Engine, Replay, WriteRequest
from topics.engine.events import Event, RecordsAppended
from topics.engine.journal import DONE, Handle, MemoryJournal
from topics.engine.records import NewRecord
from topics.engine.topic import PendingWrite
from topics.errors import TopicsError
from topics.format.frame import encode_batch


class DeferredJournal(MemoryJournal):
    """Holds staged writes until the test commits them."""

    def __init__(self) -> None:
        self.staged: list[PendingWrite] = []

    def log(self, event: Event) -> Handle:
        if isinstance(event, RecordsAppended):
            self.staged.append(event.write)
            return Handle()  # never completes: the test publishes by hand
        return DONE


def write(eng: Engine, name: str, *vals: object, key: str | None = None) -> object:
    body = {"records": [{"data": v} for v in vals]}
    if key:
        body["idempotency_key"] = key
    return eng.begin_write(name, eng.parse_write(body, None))


def test_staged_writes_are_invisible_until_committed_in_order() -> None:
    j = DeferredJournal()
    eng = Engine(clock=TestClock(), journal=j)
    a = write(eng, "t", 1)
    b = write(eng, "t", 2, 3)
    assert isinstance(a, PendingWrite) and isinstance(b, PendingWrite)
    assert (a.first_seq, b.first_seq, b.last_seq) == (1, 2, 3)
    t = eng.require("t")
    assert t.head_seq == 0 and t.live_count == 0
    t.complete(b, True)
    assert t.head_seq == 0  # b waits for a
    t.complete(a, True)
    assert t.head_seq == 3 and a.published and b.published
    assert eng.write_result(b)["head_seq"] == 3


def test_failed_commit_is_a_silent_hole_and_a_500() -> None:
    j = DeferredJournal()
    eng = Engine(clock=TestClock(), journal=j)
    a = write(eng, "t", 1)
    b = write(eng, "t", 2)
    t = eng.require("t")
    assert isinstance(a, PendingWrite) and isinstance(b, PendingWrite)
    t.complete(a, False)
    t.complete(b, True)
    with pytest.raises(TopicsError) as e:
        eng.write_result(a)
    assert e.value.status == 500 and e.value.code == "internal"
    _, r = eng.diff("t", eng.parse_diff({}))
    assert r.seqs == [2] and r.tombstone is None
    c = write(eng, "t", 3)
    assert isinstance(c, PendingWrite) and c.first_seq == 3  # seqs are never reused


def test_same_key_write_in_flight_replays_the_first() -> None:
    j = DeferredJournal()
    eng = Engine(clock=TestClock(), journal=j)
    write(eng, "t", 0)
    j.staged[0].topic.complete(j.staged[0], True)
    first = write(eng, "t", 1, key="k")
    second = write(eng, "t", 9, key="k")
    assert isinstance(first, PendingWrite) and isinstance(second, Replay)
    assert second.pending is first
    first.topic.complete(first, True)
    replay = eng.replay_result(second.pending)
    assert replay["deduped"] is True and replay["seqs"] == [2]
    third = write(eng, "t", 5, key="k")
    assert isinstance(third, dict) and third["seqs"] == [2]
    assert eng.require("t").head_seq == 2


def test_reject_admission_counts_staged_records() -> None:
    j = DeferredJournal()
    eng = Engine(clock=TestClock(), journal=j)
    eng.put_topic("r", {"cap_records": 2, "discard": "reject"})
    write(eng, "r", 1, 2)
    with pytest.raises(TopicsError) as e:
        write(eng, "r", 3)  # staged but unpublished records still take capacity
    assert e.value.status == 422


def test_rejected_write_to_new_topic_creates_nothing() -> None:
    eng = Engine(clock=TestClock())
    body = {"records": [{"data": 1}] * 3, "config": {"cap_records": 2, "discard": "reject"}}
    with pytest.raises(TopicsError) as e:
        eng.begin_write("n", eng.parse_write(body, None))
    assert e.value.code == "record_too_large"
    assert eng.get("n") is None and eng.next_topic_id == 1


def _big_request(eng: Engine, n: int = 40, **fields: object) -> WriteRequest:
    """A write of `n` ~30 KiB records (over the 1 MiB prepare floor), tagged."""
    recs = [{"data": {"i": i, "s": "x" * 30_000}, "tag": f"t{i}"} for i in range(n)]
    return eng.parse_write({"records": recs, **fields}, None)


def _drain(steps: Iterator[None]) -> int:
    return sum(1 for _ in steps)


def test_prepare_lays_out_a_large_write_in_steps_and_staging_seals_it_in_place() -> None:
    j = DeferredJournal()
    eng = Engine(clock=TestClock(), journal=j)
    write(eng, "t", 0)
    req = _big_request(eng)
    assert _drain(eng.prepare_write("t", req)) >= 1  # the loop runs between pieces
    layout = req.layout
    assert layout is not None and not layout.sealed and layout.records is req.records
    # Another write is staged in between: the layout holds no seqs, only records.
    write(eng, "t", 1)
    pw = eng.begin_write("t", req)
    assert isinstance(pw, PendingWrite) and layout.sealed
    assert pw.frames is layout.buf  # sealed in place: no copy
    assert (pw.first_seq, pw.last_seq) == (3, 42)
    want, sizes = encode_batch(pw.topic.topic_id, 3, pw.ts, req.records, False)
    assert pw.frames[:] == want and pw.sizes == sizes
    t = eng.require("t")
    for p in list(j.staged):
        t.complete(p, True)
    got = t.read(39, 3, 1 << 20, now=eng.clock.now_ms(), include_tags=True)
    assert [orjson.loads(r)["$tag"] for r in got.records] == ["t37", "t38", "t39"]
    assert orjson.loads(got.records[0])["data"]["i"] == 37
    # A layout is used once: the same request staged again is encoded afresh.
    again = eng.begin_write("t", req)
    assert isinstance(again, PendingWrite) and again.frames is not layout.buf
    assert isinstance(again.frames, bytes) and again.first_seq == 43


def test_prepare_skips_small_writes_and_writes_that_will_be_refused() -> None:
    eng = Engine(clock=TestClock())
    small = eng.parse_write({"records": [{"data": 1}]}, None)
    assert _drain(eng.prepare_write("t", small)) == 0 and small.layout is None
    for fields in ({"create": False}, {"config": {"auto_create": False}}):
        req = _big_request(eng, **fields)  # type: ignore[arg-type]
        assert _drain(eng.prepare_write("absent", req)) == 0 and req.layout is None
        with pytest.raises(TopicsError) as err:
            eng.begin_write("absent", req)
        assert err.value.status == 404
    req = _big_request(eng)
    _drain(eng.prepare_write("new", req))  # a write that creates its topic is laid out
    assert req.layout is not None
    assert isinstance(eng.begin_write("new", req), PendingWrite)


def test_a_record_that_cannot_be_laid_out_is_refused_by_begin_write_in_its_turn() -> None:
    eng = Engine(clock=TestClock())
    data = b'"' + b"x" * (1 << 20) + b'"'
    req = WriteRequest([NewRecord(data, None, None, "\ud800", len(data))], None, None, None, False)
    _drain(eng.prepare_write("t", req))
    assert req.layout is None
    with pytest.raises(TopicsError) as err:
        eng.begin_write("t", req)
    assert err.value.status == 400 and "cannot be stored" in err.value.message
    assert "t" not in eng.topics
