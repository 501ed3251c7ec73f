"""Stateful property test: push delivery through the scheduler never loses a record silently.

The invariant (docs/SCHEDULER.md: "Nothing on this page ever loses or reorders
a record"): every acknowledged record is delivered to every live watcher in
order, or the watcher gets a tombstone for exactly what the topic lost.

A real :class:`~topics.delivery.Delivery` serves a real engine (memory journal:
a write is published at once) on a real asyncio loop whose time is the
:class:`~tests.support.clock.TestClock` (:class:`ClockLoop`), so the
Delivery's own timers fire by the Clock and every run replays exactly. A
*watcher* does what a push consumer does: it registers a listener on its topic
and, when woken by the Delivery's service of the topic, reads with `diff` from
its cursor until caught up (inside the wake-up, or on a later loop turn like a
stream task). A *stalled* watcher ignores wake-ups (a full socket) and, when
resumed, catches up from its cursor, as an SSE stream does.

Hypothesis interleaves topic creation (priorities in all five bands, some with
small `cap_records` or a TTL so records are lost), writes, watchers coming,
stalling and resuming, priority changes, pressure (`pool_busy` sampled by the
governor as the Clock runs and `tick()` is called), time passing with the loop
running, the loop blocked while the Clock moves, loop turns and drains.

After every step, without disturbing anything:

* each watcher's history is exactly its topic's seqs from its start cursor to
  its cursor: strictly increasing deliveries of the records as written, plus
  tombstone gaps that lie below the topic's evict floor and overlap no delivery;
* a topic the Delivery holds no work for (neither queued nor held by a
  coalescing window) has woken its watchers: every one not stalled and with no
  read pending is at the head;
* while the governor defers B0, a B0 topic's records all read back with `diff`.

The `settle` rule drives the server idle through its inputs only (`pool_busy`
0, the Clock running with the loop, `tick()`, full drains) until deferral has
ended and nothing is queued, then checks that every watcher not stalled is at
its topic's head, within the bound aging gives (SETTLE_MAX_TICKS). Settling is
a rule rather than part of every step so that deferral and coalescing windows
carry over from one step to the next (deferral needs DEFER_SAMPLES samples in
a row).

The two tests at the end pin two scheduler bugs found while building this
machine (xfail, strict): a stale latency EWMA keeps B0 deferred on an idle
server, and `Delivery.stop()` does not serve a topic whose coalescing window is
open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.support.clock import TestClock
from topics.delivery import Delivery
from topics.engine.core import Engine
from topics.engine.scheduler import (
    AGE_CAP_MS,
    AGE_TICK_MS,
    DEFER_SAMPLES,
    GOVERNOR_PERIOD_MS,
    RESUME_AT,
    band_of,
)
from topics.engine.topic import Topic

MAX_TOPICS = 6
MAX_WATCHERS = 10
#: How many aging ticks `settle` may take: a B0 topic deferred at -1000 needs
#: AGE_CAP_MS of aging to reach B1; the latency EWMA its long wait leaves then
#: decays by a fifth per governor period (from 10 s to under 3 ms in ~3.7 s).
SETTLE_MAX_TICKS = (AGE_CAP_MS + 6_000) // AGE_TICK_MS

#: Priorities at and around every band edge, plus any value, plus none (auto).
priorities = (
    st.sampled_from([-1000, -501, -1, 0, 1, 249, 250, 499, 500, 749, 750, 1000])
    | st.integers(-1000, 1000)
    | st.integers(-1000, -1)
    | st.none()
)
configs = st.fixed_dictionaries(
    {
        "cap_records": st.sampled_from([0, 0, 0, 1, 3, 8]),
        "ttl_ms": st.sampled_from([0, 0, 0, 0, 400, 3000]),
    }
)
busy_levels = st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 0.85, 0.95, 1.0]) | st.floats(0.0, 1.0)


@dataclass(eq=False)
class Watcher:
    """A push consumer of one topic: a cursor and everything it was told."""

    wid: int
    topic: str
    start: int
    limit: int
    #: Reads on a later loop turn (like a stream task woken by an event) instead
    #: of inside the wake-up itself.
    deferred: bool
    cursor: int = 0
    stalled: bool = False
    scheduled: bool = False
    received: list[int] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    listener: Callable[[Topic], None] | None = None

    def __repr__(self) -> str:
        return (
            f"Watcher(w{self.wid} on {self.topic}, start={self.start}, cursor={self.cursor}, "
            f"stalled={self.stalled}, limit={self.limit}, deferred={self.deferred})"
        )


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is the TestClock's.

    The Delivery arms loop timers (its 50 ms aging tick, which also measures
    the loop's lag against the Clock, and the coalescing release): on this loop
    they fire on the first loop turn after the Clock has passed them, never by
    wall time, so a run replays exactly.
    """

    def __init__(self, clock: TestClock) -> None:
        super().__init__()
        self.test_clock = clock

    def time(self) -> float:
        return self.test_clock.monotonic()


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _elapse(clock: TestClock, ms: int) -> None:
    """Time passes while the loop keeps up: a loop turn every millisecond."""
    for _ in range(ms):
        clock.advance(1)
        await asyncio.sleep(0)


class DeliveryMachine(RuleBasedStateMachine):
    """Writers, watchers and pressure around one Delivery; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = TestClock()
        self.loop = ClockLoop(self.clock)
        self.engine = Engine(clock=self.clock)
        self.busy = 0.0
        self.delivery = Delivery(self.engine, self.clock, pool_busy=lambda: self.busy)
        self.delivery.start(self.loop)
        self.topics: list[str] = []
        self.configs: dict[str, dict[str, Any]] = {}
        # Every acknowledged record: topic -> seq -> the data written.
        self.written: dict[str, dict[int, Any]] = {}
        self.watchers: list[Watcher] = []
        self.uid = 0
        # Failures inside wake-ups: Delivery._serve logs and swallows a listener's
        # exception, and the loop does the same for a callback's; the
        # `no_failure_inside_wakeups` invariant raises them again.
        self.failures: list[BaseException] = []

    def teardown(self) -> None:
        # Cleanup only (an assertion here would mask the failure being shrunk).
        for w in self.watchers:
            t = self.engine.get(w.topic)
            if t is not None and w.listener is not None:
                t.listeners.discard(w.listener)
        try:
            self.delivery.stop()
        finally:
            self.loop.close()

    # ------------------------------------------------------------ helpers

    def topic(self, name: str) -> Topic:
        t = self.engine.get(name)
        assert t is not None, f"topic {name} is gone"
        return t

    def turns(self, n: int) -> None:
        self.loop.run_until_complete(_turns(n))

    def elapse(self, ms: int) -> None:
        """`ms` of Clock time pass with the loop running, then `tick()`."""
        self.loop.run_until_complete(_elapse(self.clock, ms))
        self.delivery.tick()

    def is_b0(self, t: Topic) -> bool:
        return band_of(self.engine.effective_priority(t, self.clock.now_ms())) == 0

    def on_wake(self, w: Watcher) -> Callable[[Topic], None]:
        def listener(_t: Topic) -> None:
            if w.stalled:
                return  # a full socket: the stream keeps only its cursor
            if not w.deferred:
                self.catch_up(w)
            elif not w.scheduled:
                w.scheduled = True
                self.loop.call_soon(self.pump, w)

        return listener

    def pump(self, w: Watcher) -> None:
        w.scheduled = False
        if not w.stalled:
            self.catch_up(w)

    def catch_up(self, w: Watcher) -> None:
        try:
            self._catch_up(w)
        except BaseException as exc:
            self.failures.append(exc)
            raise

    def _catch_up(self, w: Watcher) -> None:
        """Read with `diff` from the cursor until caught up, checking every pass."""
        written = self.written[w.topic]
        for _ in range(self.topic(w.topic).head_seq + 2):
            old = w.cursor
            t, r = self.engine.diff(
                w.topic, self.engine.parse_diff({"from_seq": old, "limit": w.limit})
            )
            ctx = f"{w!r}: read from {old} (head {r.head_seq}, floor {t.evict_floor})"
            lo = old
            tomb = r.tombstone
            if tomb is not None:
                event("watcher got a tombstone")
                # Exactly what the topic lost: from the cursor to just below the floor.
                assert tomb.reason in ("cap", "ttl", "mixed"), f"{ctx}: {tomb}"
                assert (tomb.gap_from, tomb.gap_to) == (old + 1, t.evict_floor - 1), (
                    f"{ctx}: {tomb}"
                )
                w.gaps.append((tomb.gap_from, tomb.gap_to))
                lo = tomb.gap_to
            # No deletes and no node filter: everything past the gap up to the new
            # cursor is live, so it is all delivered, in order, as written.
            assert r.seqs == list(range(lo + 1, r.next_from_seq + 1)), f"{ctx}: seqs {r.seqs}"
            assert len(r.records) == len(r.seqs), ctx
            for raw, seq in zip(r.records, r.seqs, strict=True):
                rec = orjson.loads(raw)
                assert rec["$seq"] == seq, f"{ctx}: {rec}"
                assert seq in written, f"{ctx}: seq {seq} was never written"
                assert rec["data"] == written[seq], f"{ctx}: {rec} != {written[seq]}"
            w.received.extend(r.seqs)
            w.cursor = r.next_from_seq
            if r.caught_up:
                return
        raise AssertionError(f"{w!r} did not catch up within head + 2 reads")

    def drained_and_quiet(self) -> bool:
        self.turns(3)
        self.delivery.drain(budget_ms=None)
        self.turns(3)
        if self.delivery.governor.deferring or len(self.delivery.ready):
            return False
        return all(w.stalled or w.cursor == self.topic(w.topic).head_seq for w in self.watchers)

    # ------------------------------------------------------------ topics

    def _create(self, priority: int | None, config: dict[str, Any]) -> None:
        name = f"t{len(self.topics)}"
        cfg = {**config, "priority": priority}
        _, created = self.engine.put_topic(name, cfg)
        assert created
        self.topics.append(name)
        self.configs[name] = cfg
        self.written[name] = {}

    @initialize(priority=priorities, config=configs, deferred=st.booleans())
    def first_topic(self, priority: int | None, config: dict[str, Any], deferred: bool) -> None:
        self._create(priority, config)
        self._watch(self.topics[0], 0, 1000, deferred)

    @precondition(lambda self: len(self.topics) < MAX_TOPICS)
    @rule(priority=priorities, config=configs)
    def create_topic(self, priority: int | None, config: dict[str, Any]) -> None:
        self._create(priority, config)

    @rule(data=st.data(), priority=priorities)
    def reprioritize(self, data: st.DataObject, priority: int | None) -> None:
        """A PUT with another priority (it wakes the topic's listeners itself)."""
        name = data.draw(st.sampled_from(self.topics), label="topic")
        cfg = {**self.configs[name], "priority": priority}
        _, created = self.engine.put_topic(name, cfg)
        assert not created
        self.configs[name] = cfg

    # ------------------------------------------------------------ writes

    def _write(self, name: str, n: int) -> None:
        t = self.topic(name)
        first = t.head_seq + 1
        seqs = list(range(first, first + n))
        datas = []
        for seq in seqs:
            self.uid += 1
            datas.append({"u": self.uid})
            # Known before the ack: the batch is published (and may be served
            # inline) inside begin_write.
            self.written[name][seq] = datas[-1]
        req = self.engine.parse_write({"records": [{"data": d} for d in datas]}, None)
        pw = self.engine.begin_write(name, req)
        assert not isinstance(pw, dict)
        ack = self.engine.write_result(pw)  # type: ignore[arg-type]
        assert ack["seqs"] == seqs, ack
        if self.delivery.governor.deferring and self.is_b0(t):
            event("B0 write while deferring")

    @rule(data=st.data(), n=st.integers(1, 4))
    def write(self, data: st.DataObject, n: int) -> None:
        self._write(data.draw(st.sampled_from(self.topics), label="topic"), n)

    @rule(data=st.data())
    def write_burst(self, data: st.DataObject) -> None:
        """Many publications close together: the first may go inline, the rest queue,
        and a loop turn between two lets a drain serve (and a window hold) a topic."""
        writes = data.draw(
            st.lists(
                st.tuples(st.sampled_from(self.topics), st.sampled_from([0, 0, 1, 2])),
                min_size=2,
                max_size=12,
            ),
            label="writes",
        )
        for name, turns in writes:
            self._write(name, 1)
            self.turns(turns)

    # ------------------------------------------------------------ watchers

    @precondition(lambda self: len(self.watchers) < MAX_WATCHERS)
    @rule(
        data=st.data(),
        limit=st.sampled_from([1, 2, 3, 1000]),
        deferred=st.booleans(),
    )
    def add_watcher(self, data: st.DataObject, limit: int, deferred: bool) -> None:
        name = data.draw(st.sampled_from(self.topics), label="topic")
        head = self.topic(name).head_seq
        start = data.draw(st.integers(0, head) | st.just(head), label="from_seq")
        self._watch(name, start, limit, deferred)

    def _watch(self, name: str, start: int, limit: int, deferred: bool) -> None:
        w = Watcher(len(self.watchers), name, start, limit, deferred, cursor=start)
        w.listener = self.on_wake(w)
        self.topic(name).listeners.add(w.listener)
        self.watchers.append(w)
        self.catch_up(w)  # a stream's first pass reads what is there already

    @precondition(lambda self: any(not w.stalled for w in self.watchers))
    @rule(data=st.data())
    def stall(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from([w for w in self.watchers if not w.stalled]))
        w.stalled = True

    @precondition(lambda self: any(w.stalled for w in self.watchers))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        """The socket drained: the stream reads on from its cursor."""
        w = data.draw(st.sampled_from([w for w in self.watchers if w.stalled]))
        w.stalled = False
        self.catch_up(w)

    # ------------------------------------------------------------ scheduler

    @rule(busy=busy_levels, samples=st.integers(1, DEFER_SAMPLES + 1))
    def pressure(self, busy: float, samples: int) -> None:
        """The blocking pools report `busy`; the governor samples it `samples` times."""
        self.busy = busy
        for _ in range(samples):
            self.elapse(GOVERNOR_PERIOD_MS)
        if self.delivery.governor.deferring:
            event("governor deferring B0")
        if self.delivery.governor.coalesce_ms > 0:
            event("coalescing window open")

    @rule(ms=st.sampled_from([1, 2, 5, 10, 20, 49, 50, 100]))
    def advance(self, ms: int) -> None:
        self.elapse(ms)

    @rule(ms=st.sampled_from([3, 10, 30, 100, 300]))
    def stall_loop(self, ms: int) -> None:
        """A callback blocks the loop for `ms`: the Clock moves with no loop turn
        (queued topics wait that long; the next aging timer fires late)."""
        self.clock.advance(ms)
        self.delivery.tick()

    @rule(n=st.integers(1, 4))
    def run_loop(self, n: int) -> None:
        self.turns(n)

    @rule()
    def drain(self) -> None:
        self.delivery.drain(budget_ms=None)

    @rule()
    def settle(self) -> None:
        """Drive the server idle through its inputs, then every live watcher is at head."""
        self.busy = 0.0
        ticks = 0
        while not self.drained_and_quiet():
            if ticks == SETTLE_MAX_TICKS:
                late = [
                    w
                    for w in self.watchers
                    if not w.stalled and w.cursor != self.topic(w.topic).head_seq
                ]
                raise AssertionError(
                    f"not settled after {ticks} aging ticks with pool_busy 0: "
                    f"{self.delivery.governor!r}, ready={len(self.delivery.ready)}, "
                    f"monotonic={self.clock.monotonic()}, behind={late}"
                )
            self.elapse(AGE_TICK_MS)
            ticks += 1
        if ticks > 2 * GOVERNOR_PERIOD_MS // AGE_TICK_MS:
            event("settle took more than two governor periods")
        for w in self.watchers:
            if not w.stalled:
                head = self.topic(w.topic).head_seq
                assert w.cursor == head, f"{w!r} not at head {head} after settling"

    # ------------------------------------------------------------ invariants

    @invariant()
    def no_failure_inside_wakeups(self) -> None:
        if self.failures:
            raise self.failures[0]

    @invariant()
    def watcher_histories_are_exact(self) -> None:
        """Deliveries plus gaps are exactly start+1..cursor; gaps lie below the floor."""
        for w in self.watchers:
            t = self.topic(w.topic)
            got = w.received
            assert all(a < b for a, b in zip(got, got[1:], strict=False)), f"{w!r}: {got}"
            covered: set[int] = set()
            prev_to = w.start
            for gap_from, gap_to in w.gaps:
                assert prev_to < gap_from <= gap_to, f"{w!r}: gaps {w.gaps}"
                assert gap_to < t.evict_floor, f"{w!r}: gap {gap_from}..{gap_to} not lost"
                covered.update(range(gap_from, gap_to + 1))
                prev_to = gap_to
            assert not covered.intersection(got), f"{w!r}: a gap covers a delivery"
            assert len(got) + len(covered) == w.cursor - w.start, f"{w!r}"
            assert covered.union(got) == set(range(w.start + 1, w.cursor + 1)), (
                f"{w!r}: received {got}, gaps {w.gaps}"
            )
            assert w.cursor <= t.head_seq

    @invariant()
    def idle_topics_have_woken_their_watchers(self) -> None:
        """Between steps, without settling: a topic the Delivery holds no work for
        (not queued, not held by a coalescing window) has woken its watchers, so
        each one that is not stalled and has no read pending is at the head."""
        pending = self.delivery._held  # read only: which topics a window holds
        for w in self.watchers:
            t = self.topic(w.topic)
            if w.stalled or w.scheduled or t in self.delivery.ready or t in pending:
                continue
            assert w.cursor == t.head_seq, (
                f"{w!r} behind head {t.head_seq}, yet its topic is neither queued nor held"
            )

    @invariant()
    def b0_stays_readable_while_deferred(self) -> None:
        """Deferral holds back pushes only: a `diff` reads all of a B0 topic."""
        if not self.delivery.governor.deferring:
            return
        for name in self.topics:
            t = self.topic(name)
            if not self.is_b0(t):
                continue
            if t in self.delivery.ready:
                event("B0 topic queued while deferring")
            cursor, seqs = 0, []
            for _ in range(t.head_seq + 2):
                _, r = self.engine.diff(name, self.engine.parse_diff({"from_seq": cursor}))
                for raw, seq in zip(r.records, r.seqs, strict=True):
                    assert orjson.loads(raw)["data"] == self.written[name][seq]
                seqs.extend(r.seqs)
                cursor = r.next_from_seq
                if r.caught_up:
                    break
            assert seqs == list(range(t.earliest_seq, t.head_seq + 1)), (
                f"{name}: read {seqs} while deferring, head {t.head_seq}"
            )


SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_delivery_state_machine() -> None:
    """The quick tier (about a second)."""
    run_state_machine_as_test(
        DeliveryMachine,
        settings=settings(SETTINGS, max_examples=50, stateful_step_count=40),
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_delivery_state_machine_slow() -> None:
    """The full tier (about half a minute)."""
    run_state_machine_as_test(
        DeliveryMachine,
        settings=settings(SETTINGS, max_examples=1000, stateful_step_count=60),
    )


# ----------------------------------------------------------------- known bugs


def _on_clock_loop(clock: TestClock, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = ClockLoop(clock)
    try:
        loop.run_until_complete(body())
    finally:
        loop.close()


def test_deferral_ends_once_the_server_is_idle() -> None:
    clock = TestClock()
    engine = Engine(clock=clock)
    d = Delivery(engine, clock)  # pool_busy stays 0: only scheduling latency presses

    def write(name: str) -> None:
        engine.begin_write(name, engine.parse_write({"records": [{"data": 1}]}, None))

    async def body() -> None:
        d.start(asyncio.get_running_loop())
        try:
            engine.put_topic("warm", {"priority": 600})  # B3: queued, not served on the spot
            engine.put_topic("low", {"priority": -1000})
            for name in ("warm", "low"):  # someone listens: there is delivery work
                engine.topics[name].listeners.add(lambda t: None)
            # A latency spike: the loop is blocked 100 ms at a time with work queued,
            # until the governor defers B0.
            for _ in range(2 * DEFER_SAMPLES):
                write("warm")
                write("low")
                clock.advance(GOVERNOR_PERIOD_MS)
                d.tick()
                d.drain(budget_ms=None)
                if d.governor.deferring:
                    break
            write("low")
            assert d.governor.deferring and d.ready.band(engine.topics["low"]) == 0
            # The spike is over: the loop runs freely and nothing else happens for 1 s.
            await _elapse(clock, 1000)
            d.tick()
            assert d.governor.pressure < RESUME_AT, d.stats()
            assert not d.governor.deferring, d.stats()
        finally:
            d.stop()

    _on_clock_loop(clock, body)


def test_stop_serves_a_topic_inside_its_coalescing_window() -> None:
    clock = TestClock()
    engine = Engine(clock=clock)
    d = Delivery(engine, clock, pool_busy=lambda: 0.6)  # a 10 ms window for B0
    seen: list[int] = []

    def write() -> None:
        engine.begin_write("t", engine.parse_write({"records": [{"data": 1}]}, None))

    async def body() -> None:
        d.start(asyncio.get_running_loop())
        t, _ = engine.put_topic("t", {"priority": -100})
        t.listeners.add(lambda tt: seen.append(tt.head_seq))
        clock.advance(GOVERNOR_PERIOD_MS)
        d.tick()
        assert d.governor.coalesce_ms > 0
        write()
        await _turns(3)
        assert seen == [1]
        write()  # queued: its service comes less than a window after the first
        d.stop()  # "Serve what is queued, stop the timers and hand publications back"
        assert seen[-1:] == [2], f"listeners saw heads {seen}, head is {t.head_seq}"

    _on_clock_loop(clock, body)
