"""Engine facade with a journal that commits later: the two-phase write shape.

This is the seam durable storage plugs into: writes are staged (seqs assigned,
invisible), committed by the journal in any order, and published strictly in seq
order; a failed commit becomes silent holes and a 500 for its writer.
"""

from __future__ import annotations

import pytest

from topics.clock import TestClock
from topics.engine.core import Engine, Replay
from topics.engine.journal import MemoryJournal
from topics.engine.topic import PendingWrite
from topics.errors import TopicsError


class DeferredJournal(MemoryJournal):
    """Holds staged writes until the test commits them."""

    def __init__(self) -> None:
        self.staged: list[PendingWrite] = []

    def submit_write(self, pw: PendingWrite) -> None:
        self.staged.append(pw)


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
