"""Stateful property test: the real Engine versus the reference model.

One topic is created with a drawn config (TTL, record cap, byte cap, discard
policy, dedupe_node). Hypothesis then interleaves writes, clock advances,
`before_seq` deletes, tag deletes (Eq / Glob / bare forms, optionally AND-ed
with `before_seq`), arbitrary reads, and per-consumer cursor reads/drains.

Every engine response is compared EXACTLY with `tests.support.model.TopicModel`
(a literal transcription of SEMANTICS §5-8). On top of that the SEMANTICS §19
safety invariants are asserted independently of the model's read pipeline:
floors (§3, §19.6), exact count/bytes, and for every consumer read the fate of
every seq the cursor stepped over (§19.4 never silent involuntary loss, §19.5
deletes/node filtering silent, §9 a node never sees its own records, §19.7
`caught_up` reached within a bounded number of reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.support.clock import TestClock
from tests.support.model import ModelError, MRead, TopicModel
from topics.engine import topic as topic_module
from topics.engine.core import Engine
from topics.errors import TopicsError

TOPIC = "prop.t"
READ_CHUNK = topic_module.READ_CHUNK
NODES = ["a", "b", "c"]
TAGS = ["x", "x:1", "x:2", "y", "xy"]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-1000, max_value=1000)
    | st.text(alphabet='ab\u00e9"\\ ', max_size=5)
)
json_data = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="kv", max_size=2), inner, max_size=3)
    ),
    max_leaves=5,
)


@st.composite
def write_records(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {"data": draw(json_data)}
    node = draw(st.none() | st.sampled_from(NODES))
    if node is not None:
        rec["node"] = node
    tag = draw(st.none() | st.sampled_from(TAGS))
    if tag is not None:
        rec["tag"] = tag
    if draw(st.integers(0, 4)) == 0:
        rec["meta"] = {"m": draw(st.integers(0, 99))}
    return rec


# (wire `match` value, model kind, model value)
MATCHES: list[tuple[Any, str, str]] = (
    [(["tag", "Eq", t], "eq", t) for t in [*TAGS, "z"]]
    + [(["tag", "Glob", p + "*"], "prefix", p) for p in ["", "x", "x:", "y", "z"]]
    + [("x:1", "eq", "x:1"), ("y", "eq", "y"), ("x*", "prefix", "x"), ("*", "prefix", "")]
)

limits = st.sampled_from([0, 1, 2, 3, 5, 1000, 5000])
budgets = st.sampled_from([0, 1, 8, 20, 60])
node_filters = st.sampled_from([None, "a", ["a"], ["a", "b"], [], ["zz"], ["c", "zz"]])


configs = st.fixed_dictionaries(
    {
        "ttl_ms": st.sampled_from([0, 0, 5, 40]),
        "cap_records": st.sampled_from([0, 0, 1, 3, 7]),
        "cap_bytes": st.sampled_from([0, 0, 12, 40, 120]),
        "discard": st.sampled_from(["old", "old", "reject"]),
        "dedupe_node": st.booleans(),
    }
)


@dataclass
class Consumer:
    """A client-side cursor (SEMANTICS §10) with a node identity."""

    name: str
    nodes: list[str] | None
    cursor: int = 0
    reads: int = 0


def parse_records(raw: list[bytes]) -> list[list[tuple[str, Any]]]:
    """Engine records as ordered (key, value) lists (checks wire field order too)."""
    return [list(orjson.loads(b).items()) for b in raw]


class EngineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = TestClock()
        self.engine = Engine(clock=self.clock)
        self.model = TopicModel()
        self.consumers: list[Consumer] = []
        self.prev: dict[str, int] = {}

    # ------------------------------------------------------------------ setup

    @initialize(config=configs, chunk=st.sampled_from([READ_CHUNK, READ_CHUNK, 1, 2, 3]))
    def create(self, config: dict[str, Any], chunk: int) -> None:
        # The engine scans slots in numpy chunks of READ_CHUNK; tiny chunks make
        # small topics exercise the chunk-boundary paths of the limit/budget logic.
        topic_module.READ_CHUNK = chunk
        _, created = self.engine.put_topic(TOPIC, {**config, "durability": "ephemeral"})
        assert created
        self.model = TopicModel(**config)
        self.consumers = [
            Consumer("all", None),
            Consumer("node-a", ["a"]),
            Consumer("nodes-bc", ["b", "c"]),
        ]

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    @property
    def topic(self) -> Any:
        t = self.engine.get(TOPIC)
        assert t is not None
        return t

    # ------------------------------------------------------------------ rules

    @rule(
        records=st.lists(write_records(), min_size=1, max_size=5),
        batch_node=st.none() | st.sampled_from(NODES),
    )
    def write(self, records: list[dict[str, Any]], batch_node: str | None) -> None:
        body: dict[str, Any] = {"records": records}
        if batch_node is not None:
            body["node"] = batch_node
        expected: list[int] | ModelError
        lost_before = sum(1 for r in self.model.slots if r.lost == "cap")
        try:
            expected = self.model.write(records, self.now, batch_node)
        except ModelError as exc:
            expected = exc
        try:
            req = self.engine.parse_write(body, None)
            pw = self.engine.begin_write(TOPIC, req)
            assert not isinstance(pw, dict), "no idempotency key: never a replay"
            ack = self.engine.write_result(pw)  # type: ignore[arg-type]
        except TopicsError as exc:
            assert isinstance(expected, ModelError), (
                f"engine refused a write the spec admits: {exc.status} {exc.code}"
            )
            assert (exc.status, exc.code) == (expected.status, expected.code)
            event(f"write refused {exc.code}")
            return
        assert not isinstance(expected, ModelError), (
            f"engine admitted a write the spec refuses ({expected.status} {expected.code})"
        )
        assert ack["seqs"] == expected
        assert ack["first_seq"] == expected[0] and ack["last_seq"] == expected[-1]
        assert ack["head_seq"] == self.model.head_seq
        assert ack["count"] == len(records)
        if self.model.discard == "reject":
            # §19.11: a discard:"reject" topic never acks a record it later drops.
            assert sum(1 for r in self.model.slots if r.lost == "cap") == lost_before

    @rule(ms=st.sampled_from([0, 1, 2, 5, 6, 20, 41, 100]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(ms=st.sampled_from([1, 7, 50]))
    def step_back(self, ms: int) -> None:
        """A wall-clock step back: ts stays non-decreasing, nothing resurrects (§2, §18)."""
        self.clock.set(self.now - ms)

    @rule(config=configs)
    def reconfigure(self, config: dict[str, Any]) -> None:
        """A PUT replaces the config and applies retention at once (§5.3)."""
        _, created = self.engine.put_topic(TOPIC, {**config, "durability": "ephemeral"})
        assert not created
        m = self.model
        m.ttl_ms = config["ttl_ms"]
        m.cap_records = config["cap_records"]
        m.cap_bytes = config["cap_bytes"]
        m.discard = config["discard"]
        m.dedupe_node = config["dedupe_node"]
        m.apply_retention(self.now)
        event("reconfigured")

    @rule(data=st.data())
    def delete_before(self, data: st.DataObject) -> None:
        before = data.draw(st.integers(0, self.model.head_seq + 2), label="before_seq")
        expected = self.model.delete_before(before, self.now)
        got = self.engine.delete_records(TOPIC, {"before_seq": before})
        self._check_delete(got, expected)

    @rule(
        match=st.sampled_from(MATCHES),
        data=st.data(),
    )
    def delete_match(self, match: tuple[Any, str, str], data: st.DataObject) -> None:
        wire, kind, value = match
        before = data.draw(st.none() | st.integers(0, self.model.head_seq + 2), label="before_seq")
        body: dict[str, Any] = {"match": wire}
        if before is not None:
            body["before_seq"] = before
        if kind == "eq":
            expected = self.model.delete_tag_eq(value, self.now, before)
        else:
            expected = self.model.delete_tag_prefix(value, self.now, before)
        got = self.engine.delete_records(TOPIC, body)
        self._check_delete(got, expected)

    def _check_delete(self, got: dict[str, Any], expected: dict[str, Any]) -> None:
        assert got["topic"] == TOPIC
        got = {k: got[k] for k in expected}
        assert got == expected, f"delete response: engine {got} != spec {expected}"
        if got["deleted"]:
            event("delete removed records")

    @rule(
        data=st.data(),
        limit=limits,
        budget=budgets,
        nodes=node_filters,
        include_tags=st.booleans(),
        include_meta=st.booleans(),
    )
    def read(
        self,
        data: st.DataObject,
        limit: int,
        budget: int,
        nodes: Any,
        include_tags: bool,
        include_meta: bool,
    ) -> None:
        from_seq = data.draw(st.integers(0, self.model.head_seq + 3), label="from_seq")
        self._read(from_seq, limit, budget, nodes, include_tags, include_meta)

    @rule(i=st.integers(0, 2), limit=limits, budget=budgets)
    def consumer_read(self, i: int, limit: int, budget: int) -> None:
        self._consume(self.consumers[i], limit, budget)

    @rule(i=st.integers(0, 2), limit=st.sampled_from([1, 2, 0]), budget=budgets)
    def consumer_drain(self, i: int, limit: int, budget: int) -> None:
        """With no new writes, `caught_up` must come within head_seq + 2 reads (§19.7)."""
        c = self.consumers[i]
        bound = self.model.head_seq + 2
        for _ in range(bound):
            if self._consume(c, limit, budget).caught_up:
                return
        raise AssertionError(f"consumer {c.name} not caught up after {bound} reads")

    # ---------------------------------------------------------------- reading

    def _read(
        self,
        from_seq: int,
        limit: int,
        budget: int,
        nodes: Any,
        include_tags: bool = False,
        include_meta: bool = True,
    ) -> MRead:
        body: dict[str, Any] = {
            "from_seq": from_seq,
            "limit": limit,
            "max_batch_bytes": budget,
            "include_tags": include_tags,
            "include_meta": include_meta,
        }
        if nodes is not None:
            body["node"] = nodes
        node_list = [nodes] if isinstance(nodes, str) else nodes
        params = self.engine.parse_diff(body)
        _, r = self.engine.diff(TOPIC, params)
        m = self.model.read(
            from_seq,
            limit,
            node_list,
            budget,
            self.now,
            include_tags=include_tags,
            include_meta=include_meta,
        )
        ctx = f"read from_seq={from_seq} limit={limit} budget={budget} nodes={nodes!r}"
        got_records = parse_records(r.records)
        want_records = [list(d.items()) for d in m.records]
        assert got_records == want_records, f"{ctx}: records {got_records} != {want_records}"
        assert r.seqs == m.seqs, ctx
        got_tomb = None if r.tombstone is None else r.tombstone.to_wire()
        want_tomb = None if m.tombstone is None else m.tombstone.as_dict()
        assert got_tomb == want_tomb, f"{ctx}: tombstone {got_tomb} != {want_tomb}"
        got_marks = (r.next_from_seq, r.head_seq, r.earliest_seq, r.caught_up, r.lag)
        want_marks = (m.next_from_seq, m.head_seq, m.earliest_seq, m.caught_up, m.lag)
        assert got_marks == want_marks, (
            f"{ctx}: (next, head, earliest, caught_up, lag) {got_marks} != {want_marks}"
        )
        assert r.scanned == m.scanned, f"{ctx}: scanned {r.scanned} != {m.scanned}"
        if m.tombstone is not None:
            event(f"tombstone {m.tombstone.reason}")
        return m

    def _consume(self, c: Consumer, limit: int, budget: int) -> MRead:
        """One consumer read, compared with the model, plus the §19 cursor checks."""
        old = c.cursor
        m = self._read(old, limit, budget, c.nodes)
        c.reads += 1
        model = self.model
        H, F, E = m.head_seq, m.evict_floor, m.earliest_seq
        new = m.next_from_seq
        ctx = f"consumer {c.name} cursor {old}->{new} (H={H} E={E} F={F})"
        # Consumer cursors come from the server, and head never moves back.
        assert old <= H, ctx
        assert old <= new <= H, ctx
        assert m.caught_up == (new == H), ctx
        delivered = m.seqs
        assert delivered == sorted(set(delivered)), ctx
        assert all(old < s <= new for s in delivered), ctx
        tomb = m.tombstone
        # Exactly one tombstone iff involuntary loss crossed the cursor (§3.2).
        assert (tomb is not None) == (old + 1 < F), ctx
        if tomb is not None:
            event(f"consumer tombstone {tomb.reason}")
            assert tomb.reason in ("cap", "ttl", "mixed"), ctx
            assert (tomb.gap_from, tomb.gap_to) == (old + 1, F - 1), ctx
            assert tomb.gap_to <= new, ctx
            if not any(model.rec(s).lost for s in range(tomb.gap_from, tomb.gap_to + 1)):
                # Allowed by the [src] records-cap seq window (§5.2): the window can
                # pass seqs that were already deleted.
                event("tombstone over a purely deleted range")
        elif E > old + 1:
            event("silent deleted gap")
        filtering = bool(c.nodes) and model.dedupe_node
        delivered_set = set(delivered)
        for s in range(old + 1, new + 1):
            r = model.rec(s)
            own = filtering and r.node is not None and r.node in (c.nodes or [])
            covered = tomb is not None and tomb.gap_from <= s <= tomb.gap_to
            if s in delivered_set:
                assert r.live and not own and not covered, f"{ctx}: delivered {s} ({r})"
            elif r.lost is not None:
                assert covered, f"{ctx}: seq {s} lost to {r.lost} silently"
            elif r.live:
                assert own, f"{ctx}: live seq {s} skipped silently ({r})"
                event("consumer skipped own-node record")
            else:
                assert r.deleted
        if filtering:
            for rec in m.records:
                assert rec.get("$node") not in (c.nodes or []), f"{ctx}: own record {rec}"
        c.cursor = new
        return m

    def teardown(self) -> None:
        topic_module.READ_CHUNK = READ_CHUNK

    # ------------------------------------------------------------- invariants

    @invariant()
    def state_matches(self) -> None:
        if not self.consumers:
            return
        st_ = self.engine.topic_state(TOPIC, touch=False)
        want = self.model.state(self.now)
        got = {k: st_[k] for k in want}
        assert got == want, f"topic state: engine {got} != spec {want}"
        t = self.topic
        m = self.model
        floors = {
            "l_cap": t.l_cap,
            "l_ttl": t.l_ttl,
            "delete_below": t.delete_below,
            "evict_floor": t.evict_floor,
            "earliest_seq": t.earliest_seq,
        }
        want_floors = {
            "l_cap": m.l_cap,
            "l_ttl": m.l_ttl,
            "delete_below": m.delete_below,
            "evict_floor": m.evict_floor,
            "earliest_seq": m.earliest_seq,
        }
        assert floors == want_floors, f"floors: engine {floors} != spec {want_floors}"
        # §19.6: evict_floor <= earliest_seq <= head_seq + 1, all monotonic.
        assert 1 <= t.evict_floor <= t.earliest_seq <= t.head_seq + 1
        floors["head_seq"] = t.head_seq
        for k, v in floors.items():
            assert v >= self.prev.get(k, 0), f"{k} went backwards: {self.prev[k]} -> {v}"
        self.prev = floors
        assert t.live_count == m.live_count and t.live_bytes == m.live_bytes


BASE_SETTINGS = settings(
    max_examples=150,  # the quick tier; test_engine_state_machine_slow runs 1500
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestEngineStateMachine = EngineVsModel.TestCase
TestEngineStateMachine.settings = BASE_SETTINGS


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_engine_state_machine_slow() -> None:
    run_state_machine_as_test(
        EngineVsModel,
        settings=settings(
            BASE_SETTINGS,
            max_examples=1500,
            stateful_step_count=60,
        ),
    )
