"""Queue lease model (SEMANTICS §15, API §10): pure engine tests with a TestClock."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from tests.support.clock import TestClock

from topics.config import Limits
from topics.engine.core import Engine
from topics.engine.events import Event, LeaseChanged, RecordsAppended, SeqsDeleted
from topics.engine.journal import DONE, Handle, MemoryJournal
from topics.engine.queues import (
    Claimer,
    Queues,
    QueueState,
    lease_wire,
    parse_lease_id,
)
from topics.engine.topic import PendingWrite, Topic
from topics.errors import TopicsError

T0 = 1_767_225_600_000


# ---------------------------------------------------------------- helpers


class Env:
    def __init__(
        self,
        limits: Limits | None = None,
        journal: Any = None,
        **cfg: Any,
    ) -> None:
        self.clock = TestClock(T0)
        self.engine = Engine(clock=self.clock, limits=limits, journal=journal)
        self.qs = Queues(self.engine)
        self.engine.put_topic("q", {"type": "queue", **cfg})

    @property
    def q(self) -> Topic:
        return self.engine.topics["q"]

    def write(
        self, n: int = 0, records: list[dict[str, Any]] | None = None, name: str = "q"
    ) -> PendingWrite:
        if records is None:
            records = [{"data": {"i": i}} for i in range(n)]
        pw = self.engine.begin_write(name, self.engine.parse_write({"records": records}, None))
        assert isinstance(pw, PendingWrite) and pw.ok
        return pw

    def claim(
        self, node: str = "w1", max: int = 1, lease_ms: int | None = None, **kw: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = wire(self.qs.claim("q", node, max, lease_ms, **kw))
        return body

    def seqs(self, body: dict[str, Any]) -> list[int]:
        return [j["$seq"] for j in body["claimed"]]

    def counters(self) -> dict[str, int]:
        c: dict[str, int] = self.engine.topic_state("q")["queue"]
        return c

    def read_all(self, name: str) -> list[dict[str, Any]]:
        p = self.engine.parse_diff({"include_tags": True, "limit": 1000})
        _, r = self.engine.diff(name, p)
        return [orjson.loads(b) for b in r.records]


def wire(body: Any) -> Any:
    """Round-trip through orjson (splices the Fragment data/meta)."""
    return orjson.loads(orjson.dumps(body))


def err(fn: Any, *args: Any) -> TopicsError:
    with pytest.raises(TopicsError) as ei:
        fn(*args)
    return ei.value


# ------------------------------------------------------------------ claim


def test_claim_ascending_hex_lease_ids_and_deadline() -> None:
    env = Env()
    env.write(20)
    body = env.claim(max=17)
    assert body["topic"] == "q"
    assert body["count"] == 17
    assert env.seqs(body) == list(range(1, 18))
    assert [j["lease_id"] for j in body["claimed"]][9:12] == ["lease_a", "lease_b", "lease_c"]
    assert body["claimed"][16]["lease_id"] == "lease_11"
    for j in body["claimed"]:
        assert j["deadline"] == T0 + 30_000
        assert j["$ts"] == T0
        assert j["deliveries"] == 1
    assert body["claimed"][0]["data"] == {"i": 0}
    assert body["ready"] == 3
    nxt = env.claim(max=5)
    assert env.seqs(nxt) == [18, 19, 20]
    assert nxt["claimed"][0]["lease_id"] == "lease_12"
    assert nxt["ready"] == 0


def test_job_field_order_and_raw_fragments() -> None:
    env = Env()
    env.write(
        records=[
            {"data": {"b": 1, "a": [1.5, "x"]}, "tag": "inv:1", "node": "gw", "meta": {"k": "v"}},
            {"data": None},
        ]
    )
    raw = env.qs.claim("q", "w1", 2, None)
    job = raw["claimed"][0]
    assert isinstance(job["data"], orjson.Fragment)
    assert isinstance(job["meta"], orjson.Fragment)
    assert list(job) == [
        "$seq",
        "lease_id",
        "deadline",
        "$ts",
        "$tag",
        "deliveries",
        "data",
        "meta",
    ]
    assert list(raw["claimed"][1]) == ["$seq", "lease_id", "deadline", "$ts", "deliveries", "data"]
    assert list(raw) == ["topic", "claimed", "count", "ready"]
    text = orjson.dumps(raw)
    assert b'"data":{"b":1,"a":[1.5,"x"]},"meta":{"k":"v"}' in text
    assert b"$node" not in text
    assert wire(raw)["claimed"][1]["data"] is None


def test_claim_max_and_lease_clamps() -> None:
    env = Env()
    env.write(1100)
    assert env.claim(max=0)["count"] == 1
    assert env.claim(max=5000)["count"] == 1000
    env2 = Env(lease_ms=5000)
    env2.write(3)
    assert env2.claim()["claimed"][0]["deadline"] == T0 + 5000
    assert env2.claim(lease_ms=100)["claimed"][0]["deadline"] == T0 + 100
    node, n, lease = env2.qs.parse_claim({"node": "a", "max": 0, "lease_ms": 5})
    assert (node, n, lease) == ("a", 1, 100)
    assert env2.qs.parse_claim({"node": "a", "max": 10**6, "lease_ms": 10**12})[1:] == (
        1000,
        86_400_000,
    )
    assert env2.qs.parse_claim({"node": "a"}) == ("a", 1, None)
    # claim_pass clamps an out-of-range override itself
    jobs = env2.qs.claim_pass("q", [Claimer("w", 1)], 1)[0]
    assert jobs[0]["deadline"] == T0 + 100


def test_parse_claim_respects_limits_max_claim() -> None:
    env = Env(limits=Limits(max_claim=7))
    env.write(20)
    assert env.qs.parse_claim({"node": "a", "max": 100})[1] == 7
    assert env.claim(max=100)["count"] == 7


def test_empty_queue_claim_is_not_an_error() -> None:
    env = Env()
    body = env.claim(max=10)
    assert body == {"topic": "q", "claimed": [], "count": 0, "ready": 0}


def test_expired_lease_redelivered_reclaimed_first() -> None:
    env = Env()
    env.write(5)
    first = env.claim(max=2, lease_ms=1000)
    assert env.seqs(first) == [1, 2]
    env.clock.advance(1000)  # now == deadline: still active
    assert env.seqs(env.claim(max=1)) == [3]
    env.clock.advance(1)  # now > deadline: expired
    body = env.claim(max=3)
    assert env.seqs(body) == [1, 2, 4]
    assert [j["deliveries"] for j in body["claimed"]] == [2, 2, 1]
    assert body["claimed"][0]["lease_id"] == "lease_4"


def test_round_robin_even_split() -> None:
    env = Env()
    env.write(50)
    claimers = [Claimer(f"w{i}", 10) for i in range(10)]
    out = env.qs.claim_pass("q", claimers, None)
    assert [len(x) for x in out] == [5] * 10
    for i, jobs in enumerate(out):
        assert [j["$seq"] for j in jobs] == [i + 1 + 10 * k for k in range(5)]
    assert sorted(j["$seq"] for jobs in out for j in jobs) == list(range(1, 51))


def test_round_robin_uneven_max() -> None:
    env = Env()
    env.write(10)
    out = env.qs.claim_pass("q", [Claimer("a", 1), Claimer("b", 3), Claimer("c", 2)], None)
    assert [[j["$seq"] for j in jobs] for jobs in out] == [[1], [2, 4, 6], [3, 5]]
    assert env.qs.claim_pass("q", [], None) == []


def test_claim_skips_deleted_and_expired_jobs() -> None:
    env = Env(ttl_ms=10_000)
    env.write(3)
    env.clock.advance(5_000)
    env.write(3)
    env.engine.delete_records("q", {"before_seq": 2})
    env.clock.advance(6_000)  # seqs 1-3 expired by TTL
    assert env.seqs(env.claim(max=10)) == [4, 5, 6]


# -------------------------------------------------------------------- ack


def test_ack_deletes_and_never_redelivers() -> None:
    env = Env()
    env.write(4)
    body = env.claim(max=2, lease_ms=1000)
    ids = [j["lease_id"] for j in body["claimed"]]
    res = env.qs.ack("q", {"node": "w1", "seqs": [1, 2], "lease_ids": ids})
    assert res == {"topic": "q", "acked": 2, "skipped": [], "ready": 2, "in_flight": 0}
    assert env.q.live_count == 2
    env.clock.advance(5_000)
    assert env.seqs(env.claim(max=10)) == [3, 4]
    # acking again is idempotent: skipped
    again = env.qs.ack("q", {"node": "w1", "seqs": [1, 2]})
    assert again["acked"] == 0 and again["skipped"] == [1, 2]


def test_ack_wrong_node_stale_fence_and_never_claimed_skipped() -> None:
    env = Env()
    env.write(3)
    body = env.claim(node="w1", max=2, lease_ms=1000)
    old = body["claimed"][0]["lease_id"]
    res = env.qs.ack("q", {"node": "w2", "seqs": [1, 2, 3]})
    assert res["acked"] == 0 and res["skipped"] == [1, 2, 3]
    # expire, then the same node re-claims seq 1: the old fence token is stale
    env.clock.advance(1001)
    again = env.claim(node="w1", max=1)
    assert env.seqs(again) == [1]
    new = again["claimed"][0]["lease_id"]
    assert new != old
    res = env.qs.ack("q", {"node": "w1", "seqs": [1], "lease_ids": [old]})
    assert res["skipped"] == [1] and res["acked"] == 0
    res = env.qs.ack("q", {"node": "w1", "seqs": [1], "lease_ids": [new]})
    assert res["acked"] == 1 and res["in_flight"] == 0


def test_ack_empty_fence_entry_means_node_only() -> None:
    env = Env()
    env.write(2)
    body = env.claim(max=2)
    ids = [j["lease_id"] for j in body["claimed"]]
    res = env.qs.ack("q", {"node": "w1", "seqs": [2, 1], "lease_ids": ["", ids[0]]})
    assert res["acked"] == 2 and res["skipped"] == []


def test_ack_after_expiry_skipped_even_if_unclaimed() -> None:
    env = Env()
    env.write(1)
    env.claim(lease_ms=500)
    env.clock.advance(501)
    res = env.qs.ack("q", {"node": "w1", "seqs": [1]})
    assert res == {"topic": "q", "acked": 0, "skipped": [1], "ready": 1, "in_flight": 0}
    assert env.q.live_count == 1


def test_ack_skipped_in_request_order_and_duplicates() -> None:
    env = Env()
    env.write(3)
    env.claim(max=2)
    res = env.qs.ack("q", {"node": "w1", "seqs": [9, 2, 2, 7, 1]})
    assert res["acked"] == 2
    assert res["skipped"] == [9, 2, 7]


def test_ack_and_nack_notify_listeners() -> None:
    env = Env()
    env.write(2)
    env.claim(max=2)
    woken: list[str] = []
    env.q.listeners.add(lambda t: woken.append(t.name))
    env.qs.ack("q", {"node": "w1", "seqs": [1]})
    assert woken == ["q"]
    env.qs.nack("q", {"node": "w1", "seqs": [2]})
    assert woken == ["q", "q"]
    env.qs.ack("q", {"node": "w1", "seqs": [1]})  # nothing matched: no wake-up
    assert woken == ["q", "q"]


# ------------------------------------------------------------------- nack


def test_nack_immediate_and_delayed() -> None:
    env = Env()
    env.write(3)
    env.claim(max=3)
    res = env.qs.nack("q", {"node": "w1", "seqs": [1]})
    assert res == {"topic": "q", "nacked": 1, "skipped": [], "ready": 1, "in_flight": 2}
    res = env.qs.nack("q", {"node": "w1", "seqs": [2, 5], "delay_ms": 5_000})
    assert res["nacked"] == 1 and res["skipped"] == [5]
    assert res["ready"] == 1 and res["in_flight"] == 1
    body = env.claim(max=10)
    assert env.seqs(body) == [1]
    assert body["claimed"][0]["deliveries"] == 2
    env.clock.advance(4_999)
    assert env.claim(max=10)["count"] == 0
    env.clock.advance(1)
    body = env.claim(max=10)
    assert env.seqs(body) == [2] and body["claimed"][0]["deliveries"] == 2


def test_nack_delay_clamped() -> None:
    env = Env()
    env.write(1)
    env.claim()
    env.qs.nack("q", {"node": "w1", "seqs": [1], "delay_ms": 10**12})
    env.clock.advance(86_400_000 - 1)
    assert env.claim()["count"] == 0
    env.clock.advance(1)
    assert env.claim()["count"] == 1


# ----------------------------------------------------------------- extend


def test_extend_sets_not_adds() -> None:
    env = Env()
    env.write(2)
    body = env.claim(max=2)  # deadline T0 + 30000
    env.clock.advance(10_000)
    res = env.qs.extend("q", {"node": "w1", "seqs": [2, 1, 3], "lease_ms": 1_000})
    assert res == {
        "topic": "q",
        "extended": 2,
        "skipped": [3],
        "deadlines": {"2": T0 + 11_000, "1": T0 + 11_000},
    }
    assert body["claimed"][0]["deliveries"] == 1
    env.clock.advance(1_001)  # past the *shortened* deadline
    res = env.qs.extend("q", {"node": "w1", "seqs": [1], "lease_ms": 60_000})
    assert res["extended"] == 0 and res["skipped"] == [1] and res["deadlines"] == {}
    again = env.claim(node="w2", max=2)
    assert env.seqs(again) == [1, 2]
    assert [j["deliveries"] for j in again["claimed"]] == [2, 2]


def test_extend_lengthens_and_clamps() -> None:
    env = Env()
    env.write(1)
    env.claim(lease_ms=1_000)
    res = env.qs.extend("q", {"node": "w1", "seqs": [1], "lease_ms": 10})
    assert res["deadlines"] == {"1": T0 + 100}
    res = env.qs.extend("q", {"node": "w1", "seqs": [1], "lease_ms": 10**12})
    assert res["deadlines"] == {"1": T0 + 86_400_000}
    env.clock.advance(50_000)
    assert env.claim(node="w2")["count"] == 0
    res = env.qs.extend("q", {"node": "w1", "seqs": [1], "lease_ms": 5_000})
    assert res["deadlines"] == {"1": T0 + 55_000}
    env.clock.advance(5_001)
    assert env.seqs(env.claim(node="w2")) == [1]


# --------------------------------------------------------------- counters


def test_counters_in_topic_state() -> None:
    env = Env(max_deliveries=1, dead_letter="dlq")
    env.write(10)
    assert env.counters() == {"ready": 10, "in_flight": 0, "dead_lettered": 0}
    env.claim(max=4, lease_ms=1_000)
    assert env.counters() == {"ready": 6, "in_flight": 4, "dead_lettered": 0}
    env.qs.nack("q", {"node": "w1", "seqs": [1], "delay_ms": 500})
    assert env.counters() == {"ready": 6, "in_flight": 3, "dead_lettered": 0}
    env.qs.ack("q", {"node": "w1", "seqs": [2]})
    assert env.counters() == {"ready": 6, "in_flight": 2, "dead_lettered": 0}
    env.clock.advance(1_001)  # leases 3,4 expired; nack of 1 matured
    assert env.counters() == {"ready": 9, "in_flight": 0, "dead_lettered": 0}
    # 1, 3, 4 already had their one delivery: they go to the dead-letter topic
    body = env.claim(max=2)
    assert env.seqs(body) == [5, 6]
    assert env.counters() == {"ready": 4, "in_flight": 2, "dead_lettered": 3}
    # a leased job deleted behind the queue's back no longer counts as in flight
    env.engine.delete_records("q", {"before_seq": 6})
    assert env.counters() == {"ready": 4, "in_flight": 1, "dead_lettered": 3}


# ------------------------------------------------------------ dead letter


def _deliver(env: Env, times: int, lease_ms: int = 100) -> list[dict[str, Any]]:
    bodies = []
    for _ in range(times):
        bodies.append(env.claim(max=10, lease_ms=lease_ms))
        env.clock.advance(lease_ms + 1)
    return bodies


def test_dead_letter_after_max_deliveries() -> None:
    env = Env(max_deliveries=2, dead_letter="dlq")
    env.write(
        records=[
            {"data": {"job": 1}, "tag": "t1", "node": "gw", "meta": {"trace": "x"}},
            {"data": [2], "meta": ["not", "an", "object"]},
            {"data": "three"},
        ]
    )
    bodies = _deliver(env, 2)
    assert [j["deliveries"] for j in bodies[1]["claimed"]] == [2, 2, 2]
    assert "dlq" not in env.engine.topics
    env.write(records=[{"data": "fresh"}])
    body = env.claim(max=10)
    assert env.seqs(body) == [4]  # the three exhausted jobs were diverted
    assert body["claimed"][0]["deliveries"] == 1
    assert env.q.live_count == 1
    assert env.counters()["dead_lettered"] == 3
    assert "dlq" in env.engine.topics
    dlq = env.engine.topics["dlq"]
    assert dlq.config.type == "log"
    recs = env.read_all("dlq")
    assert [r["$seq"] for r in recs] == [1, 2, 3]
    assert recs[0]["data"] == {"job": 1}
    assert recs[0]["$tag"] == "t1"
    assert recs[0]["$node"] == "gw"
    assert recs[0]["meta"] == {
        "trace": "x",
        "$dead_letter_from": "q",
        "$dead_letter_deliveries": "2",
        "$dead_letter_src_seq": "1",
    }
    assert recs[1]["meta"] == {
        "$dead_letter_original_meta": ["not", "an", "object"],
        "$dead_letter_from": "q",
        "$dead_letter_deliveries": "2",
        "$dead_letter_src_seq": "2",
    }
    assert recs[2]["meta"] == {
        "$dead_letter_from": "q",
        "$dead_letter_deliveries": "2",
        "$dead_letter_src_seq": "3",
    }
    assert "$tag" not in recs[2] and "$node" not in recs[2]
    # never delivered again from the queue
    env.clock.advance(60_000)
    assert env.seqs(env.claim(max=10)) == [4]


def test_dead_letter_into_existing_queue_topic() -> None:
    env = Env(max_deliveries=1, dead_letter="dlq")
    env.engine.put_topic("dlq", {"type": "queue"})
    env.write(1)
    _deliver(env, 1)
    assert env.claim()["count"] == 0
    assert isinstance(env.engine.topics["dlq"].queue, QueueState)
    dl = wire(env.qs.claim("dlq", "ops", 1, None))
    assert dl["claimed"][0]["data"] == {"i": 0}
    assert dl["claimed"][0]["meta"]["$dead_letter_src_seq"] == "1"


def test_no_dead_letter_without_target_or_threshold() -> None:
    for cfg in ({"max_deliveries": 2}, {"dead_letter": "dlq"}):
        env = Env(**cfg)
        env.write(1)
        bodies = _deliver(env, 5)
        assert [b["claimed"][0]["deliveries"] for b in bodies] == [1, 2, 3, 4, 5]
        assert "dlq" not in env.engine.topics
        assert env.counters()["dead_lettered"] == 0


def test_dead_letter_auto_create_failure_requeues() -> None:
    env = Env(limits=Limits(max_topics=1), max_deliveries=1, dead_letter="dlq")
    env.write(2)
    env.claim(lease_ms=100)  # seq 1 delivered once
    env.clock.advance(101)
    body = env.claim(max=1)
    # seq 1 could not be dead-lettered (topic cap): it stays in the queue,
    # the counter is undone and the claimer still got a job
    assert env.seqs(body) == [2]
    assert "dlq" not in env.engine.topics
    assert env.q.live_count == 2
    assert env.counters() == {"ready": 1, "in_flight": 1, "dead_lettered": 0}
    # it is retried on every pass (still exhausted, still failing)
    assert env.claim(max=5)["count"] == 0
    assert env.q.queue.deliveries[1] == 1


def test_dead_letter_reject_full_requeues() -> None:
    env = Env(max_deliveries=1, dead_letter="dlq")
    env.engine.put_topic("dlq", {"cap_records": 1, "discard": "reject"})
    env.write(name="dlq", records=[{"data": 0}])
    env.write(1)
    _deliver(env, 1)
    assert env.claim()["count"] == 0
    assert env.q.live_count == 1
    assert env.counters()["dead_lettered"] == 0
    env.engine.delete_records("dlq", {"before_seq": 100})
    assert env.claim()["count"] == 0
    assert env.q.live_count == 0
    assert env.counters()["dead_lettered"] == 1


class DeferredJournal(MemoryJournal):
    """Holds writes to chosen topics until released (an async WAL stand-in)."""

    def __init__(self, hold: set[str]) -> None:
        self.hold = hold
        self.held: list[Handle] = []

    def log(self, event: Event) -> Handle:
        if isinstance(event, RecordsAppended) and event.write.topic.name in self.hold:
            h = Handle()
            self.held.append(h)
            return h
        return DONE

    def release(self, ok: bool) -> None:
        held, self.held = self.held, []
        for h in held:
            h.settle(ok)


@pytest.mark.parametrize("ok", [True, False])
def test_dead_letter_async_commit(ok: bool) -> None:
    j = DeferredJournal({"dlq"})
    env = Env(journal=j, max_deliveries=1, dead_letter="dlq")
    env.write(2)
    env.claim(max=2, lease_ms=100)
    env.clock.advance(101)
    assert env.claim(max=5)["count"] == 0
    assert len(j.held) == 1
    # in limbo: neither claimable nor ready
    assert env.counters() == {"ready": 0, "in_flight": 0, "dead_lettered": 2}
    assert env.claim(max=5)["count"] == 0
    j.release(ok)
    if ok:
        assert env.q.live_count == 0
        assert env.counters() == {"ready": 0, "in_flight": 0, "dead_lettered": 2}
    else:
        assert env.q.live_count == 2
        assert env.counters() == {"ready": 2, "in_flight": 0, "dead_lettered": 0}


# ------------------------------------------------------------- validation


def test_claim_validation_order() -> None:
    env = Env()
    env.engine.put_topic("log", {})
    qs = env.qs
    e = err(qs.parse_claim, None)
    assert (e.status, e.code, e.message) == (400, "invalid_request", "claim requires a node")
    e = err(qs.parse_claim, {})
    assert (e.status, e.message) == (400, "claim requires a node")
    assert err(qs.parse_claim, {"node": None}).status == 400
    assert err(qs.parse_claim, {"node": 5}).status == 400
    assert err(qs.parse_claim, []).status == 400
    assert err(qs.parse_claim, {"node": "a", "max": "3"}).status == 400
    assert err(qs.parse_claim, {"node": "a", "max": -1}).status == 400
    assert err(qs.parse_claim, {"node": "a", "lease_ms": 1.5}).status == 400
    # empty node parses; it is rejected after 404/409
    assert qs.parse_claim({"node": ""})[0] == ""
    e = err(qs.claim, "missing", "", 1, None)
    assert (e.status, e.code, e.detail) == (404, "topic_not_found", {"topic": "missing"})
    e = err(qs.claim, "log", "", 1, None)
    assert (e.status, e.code, e.detail) == (409, "not_a_queue", {"topic": "log"})
    e = err(qs.claim, "q", "", 1, None)
    assert (e.status, e.code) == (400, "invalid_request")
    e = err(qs.claim, "q", "n" * 129, 1, None)
    assert (e.status, e.code) == (400, "invalid_request")
    qs.validate_node("n" * 128)
    assert err(qs.validate_node, "é" * 65).status == 400  # 130 bytes


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
def test_batch_validation_order(op: str) -> None:
    env = Env()
    env.engine.put_topic("log", {})
    fn = getattr(env.qs, op)
    base: dict[str, Any] = {"lease_ms": 1000} if op == "extend" else {}
    many = list(range(1001))

    def call(name: str, **body: Any) -> TopicsError:
        return err(fn, name, {**base, **body})

    # type errors / missing required fields
    assert call("missing", seqs=[1]).status == 400  # node missing
    assert call("missing", node="a").status == 400  # seqs missing
    assert call("missing", node=1, seqs=[1]).status == 400
    assert call("missing", node="a", seqs=[-1]).status == 400
    assert call("missing", node="a", seqs=[True]).status == 400
    assert call("missing", node="a", seqs="1").status == 400
    assert call("missing", node="a", seqs=[1], lease_ids=[1]).status == 400
    assert err(fn, "missing", None).status == 400
    # 1. lease id format beats empty node, batch size and length mismatch
    for bad in ("lease_", "lease_xyz", "LEASE_1", "lease_-1", "1", " lease_1"):
        e = call("missing", node="", seqs=many, lease_ids=[bad])
        assert (e.status, e.code) == (400, "invalid_request"), bad
    # 2. empty node beats batch size
    e = call("missing", node="", seqs=many)
    assert (e.status, e.code) == (400, "invalid_request")
    # 3. batch size beats length mismatch
    e = call("missing", node="a", seqs=many, lease_ids=["lease_1"])
    assert (e.status, e.code, e.detail) == (400, "batch_too_large", {"seqs": 1001, "max": 1000})
    # 4. length mismatch beats 404
    e = call("missing", node="a", seqs=[1, 2], lease_ids=["lease_1"])
    assert (e.status, e.code) == (400, "invalid_request")
    # 5. 404 / 409
    e = call("missing", node="a", seqs=[1], lease_ids=["lease_1"])
    assert (e.status, e.code, e.detail) == (404, "topic_not_found", {"topic": "missing"})
    e = call("log", node="a", seqs=[1])
    assert (e.status, e.code, e.detail) == (409, "not_a_queue", {"topic": "log"})
    # exactly 1000 seqs and mixed-case hex / empty fences are fine
    res = fn("q", {**base, "node": "a", "seqs": many[:1000]})
    assert len(res["skipped"]) == 1000
    res = fn("q", {**base, "node": "a", "seqs": [1, 2], "lease_ids": ["lease_2F", ""]})
    assert res["skipped"] == [1, 2]


def test_extend_requires_lease_ms_before_lookup() -> None:
    env = Env()
    e = err(env.qs.extend, "missing", {"node": "a", "seqs": [1]})
    assert (e.status, e.code) == (400, "invalid_request")
    assert err(env.qs.extend, "q", {"node": "a", "seqs": [1], "lease_ms": "1"}).status == 400
    assert err(env.qs.nack, "q", {"node": "a", "seqs": [1], "delay_ms": -5}).status == 400


def test_log_topic_is_not_a_queue() -> None:
    env = Env()
    env.engine.put_topic("log", {})
    env.write(name="log", records=[{"data": 1}])
    for fn, args in (
        (env.qs.check_queue, ("log",)),
        (env.qs.claim_pass, ("log", [Claimer("a", 1)], None)),
        (env.qs.ack, ("log", {"node": "a", "seqs": [1]})),
        (env.qs.nack, ("log", {"node": "a", "seqs": [1]})),
        (env.qs.extend, ("log", {"node": "a", "seqs": [1], "lease_ms": 100})),
        (env.qs.ready, ("log",)),
    ):
        e = err(fn, *args)
        assert (e.status, e.code, e.detail) == (409, "not_a_queue", {"topic": "log"})
    assert env.engine.topics["log"].queue is None
    assert "queue" not in env.engine.topic_state("log")
    with pytest.raises(TopicsError):
        env.qs.state(env.engine.topics["log"])


def test_lease_id_helpers() -> None:
    assert lease_wire(1) == "lease_1"
    assert lease_wire(0x2F) == "lease_2f"
    assert parse_lease_id("lease_2f") == 0x2F
    assert parse_lease_id("lease_2F") == 0x2F
    assert parse_lease_id("lease_") is None
    assert parse_lease_id("lease_1 ") is None
    assert parse_lease_id("lease_" + "f" * 17) is None


# ---------------------------------------------------------------- /work


def test_release_conn_makes_jobs_claimable_at_once() -> None:
    env = Env()
    env.write(6)
    qs = env.qs
    c1, c2 = qs.new_conn_id(), qs.new_conn_id()
    assert c1 != c2
    a = env.claim(node="w", max=2, conn=c1)
    b = env.claim(node="w", max=2, conn=c2)
    p = env.claim(node="w", max=1)  # a POST claim by the same node
    assert env.seqs(a) == [1, 2] and env.seqs(b) == [3, 4] and env.seqs(p) == [5]
    assert qs.conn_leases("q", c1) == 2
    assert qs.conn_leases("q", c2) == 2
    woken: list[str] = []
    env.q.listeners.add(lambda t: woken.append(t.name))
    assert qs.release_conn("q", c1) == 2
    assert woken == ["q"]
    assert qs.conn_leases("q", c1) == 0
    assert qs.conn_leases("q", c2) == 2
    body = env.claim(node="x", max=10)
    assert env.seqs(body) == [1, 2, 6]
    assert [j["deliveries"] for j in body["claimed"]] == [2, 2, 1]
    # the POST lease and the other connection are untouched
    res = qs.ack("q", {"node": "w", "seqs": [5, 3, 4]})
    assert res["acked"] == 3
    assert qs.conn_leases("q", c2) == 0
    assert qs.release_conn("q", c1) == 0


def test_conn_leases_counts_only_unexpired_and_tolerates_missing_topic() -> None:
    env = Env()
    env.write(3)
    c = env.qs.new_conn_id()
    env.claim(max=3, lease_ms=1000, conn=c)
    env.qs.ack("q", {"node": "w1", "seqs": [1]})
    assert env.qs.conn_leases("q", c) == 2
    env.clock.advance(1001)
    assert env.qs.conn_leases("q", c) == 0
    assert env.qs.conn_leases("nope", c) == 0
    assert env.qs.release_conn("nope", c) == 0
    env.engine.put_topic("log", {})
    assert env.qs.conn_leases("log", c) == 0


# ------------------------------------------------------------ lifecycle


def test_queue_state_for_every_queue_topic() -> None:
    clock = TestClock(T0)
    eng = Engine(clock=clock)
    eng.put_topic("early", {"type": "queue"})
    seen: list[str] = []
    eng.on_topic_created = lambda t: seen.append(t.name)
    qs = Queues(eng)
    assert vars(eng)["queues"] is qs
    assert isinstance(eng.topics["early"].queue, QueueState)
    eng.put_topic("late", {"type": "queue"})
    assert isinstance(eng.topics["late"].queue, QueueState)
    assert seen == ["late"]  # the previous hook still runs
    req = eng.parse_write({"records": [{"data": 1}], "config": {"type": "queue"}}, None)
    eng.begin_write("auto", req)
    assert isinstance(eng.topics["auto"].queue, QueueState)
    eng.put_topic("plain", {})
    assert eng.topics["plain"].queue is None
    st = eng.topic_state("auto")
    assert st["queue"] == {"ready": 1, "in_flight": 0, "dead_lettered": 0}


def test_recreated_queue_starts_fresh() -> None:
    env = Env()
    env.write(2)
    env.claim(max=2)
    env.engine.delete_topic("q")
    env.engine.put_topic("q", {"type": "queue"})
    env.write(1)
    body = env.claim()
    assert body["claimed"][0]["lease_id"] == "lease_1"
    assert body["claimed"][0]["deliveries"] == 1
    e = err(env.qs.claim_pass, "gone", [Claimer("a", 1)], None)
    assert e.status == 404


# ---------------------------------------------------------------- journal


class LeaseJournal(MemoryJournal):
    def __init__(self, fail_deletes: bool = False) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.deleted: list[tuple[str, list[int]]] = []
        self.fail_deletes = fail_deletes

    def log(self, event: Event) -> Handle:
        if isinstance(event, LeaseChanged):
            e = event
            self.events.append(
                (e.topic_id, e.kind, e.seq, e.node, e.lease_id, e.deadline_ms, e.deliveries)
            )
        elif isinstance(event, SeqsDeleted):
            if self.fail_deletes:
                raise OSError("disk on fire")
            self.deleted.append((event.topic_id, list(event.seqs)))
        return DONE


def test_lease_events_logged_when_durable() -> None:
    j = LeaseJournal()
    env = Env(journal=j, leases_durable=True)
    env.write(3)
    c = env.qs.new_conn_id()
    env.claim(max=3, conn=c)
    env.clock.advance(10)
    env.qs.extend("q", {"node": "w1", "seqs": [1], "lease_ms": 1000})
    env.qs.nack("q", {"node": "w1", "seqs": [2], "delay_ms": 50})
    env.qs.ack("q", {"node": "w1", "seqs": [1]})
    env.qs.release_conn("q", c)
    q = env.q.topic_id
    assert j.events == [
        (q, "claimed", 1, "w1", 1, T0 + 30_000, 1),
        (q, "claimed", 2, "w1", 2, T0 + 30_000, 1),
        (q, "claimed", 3, "w1", 3, T0 + 30_000, 1),
        (q, "extended", 1, "w1", 1, T0 + 1_010, 1),
        (q, "released", 2, "w1", 2, T0 + 60, 1),
        (q, "acked", 1, "w1", 1, T0 + 1_010, 1),
        (q, "released", 3, "w1", 3, 0, 1),
    ]
    assert j.deleted == [(q, [1])]


@pytest.mark.parametrize(
    "cfg", [{"leases_durable": False}, {"leases_durable": True, "durability": "ephemeral"}]
)
def test_lease_events_not_logged(cfg: dict[str, Any]) -> None:
    j = LeaseJournal()
    env = Env(journal=j, **cfg)
    env.write(1)
    env.claim()
    env.qs.ack("q", {"node": "w1", "seqs": [1]})
    assert j.events == []


def test_fsync_ack_log_failure_is_500_and_requeues() -> None:
    j = LeaseJournal(fail_deletes=True)
    env = Env(journal=j, durability="fsync")
    env.write(3)
    env.claim(max=3)
    e = err(env.qs.ack, "q", {"node": "w1", "seqs": [1, 2]})
    assert (e.status, e.code) == (500, "internal")
    assert env.q.live_count == 3
    body = env.claim(node="w2", max=5)
    assert env.seqs(body) == [1, 2]
    assert [j["deliveries"] for j in body["claimed"]] == [2, 2]


def test_non_fsync_ack_log_failure_is_ignored() -> None:
    j = LeaseJournal(fail_deletes=True)
    env = Env(journal=j, durability="disk")
    env.write(1)
    env.claim()
    assert env.qs.ack("q", {"node": "w1", "seqs": [1]})["acked"] == 1
    assert env.q.live_count == 0


def test_replay_lease_events() -> None:
    st = QueueState()
    st.replay("claimed", 5, "w", 7, T0 + 100, 2)
    assert st.leases[5].lease_id == 7 and st.deliveries[5] == 2
    assert st.claim_cursor == 6 and st.next_lease_id == 8
    st.replay("extended", 5, "w", 6, T0 + 999, 2)  # stale id: ignored
    assert st.leases[5].deadline_ms == T0 + 100
    st.replay("extended", 5, "w", 7, T0 + 500, 2)
    assert st.leases[5].deadline_ms == T0 + 500
    st.replay("released", 5, "w", 7, 0, 2)
    assert 5 not in st.leases and st.reclaim == [5]
    st.replay("claimed", 5, "w", 9, T0 + 100, 3)
    st.replay("acked", 5, "w", 9, T0 + 100, 3)
    assert 5 not in st.leases and 5 not in st.deliveries
    assert st.next_lease_id == 10


def test_sweep_prunes_state_for_removed_jobs() -> None:
    env = Env()
    env.write(200)
    env.claim(max=200, lease_ms=100)
    env.clock.advance(101)
    env.claim(max=200, lease_ms=100)  # every job delivered twice
    env.clock.advance(101)
    env.engine.delete_records("q", {"before_seq": 201})
    st = env.q.queue
    assert env.counters() == {"ready": 0, "in_flight": 0, "dead_lettered": 0}
    assert len(st.deliveries) == 0
    assert env.claim(max=10)["count"] == 0
    assert len(st.expiry) <= 64
