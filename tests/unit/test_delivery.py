"""The delivery worker on a real engine and loop, with a test clock (docs/SCHEDULER.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.clock import TestClock

from topics.delivery import Delivery
from topics.engine.core import Engine
from topics.engine.scheduler import AGE_TICK_MS, DEFER_SAMPLES, GOVERNOR_PERIOD_MS
from topics.engine.topic import Topic


class Rig:
    """An engine whose publications go through a started Delivery; records who was served."""

    def __init__(self, *, fifo: bool = False) -> None:
        self.clock = TestClock()
        self.engine = Engine(clock=self.clock)
        self.busy = 0.0
        self.windows: list[float] = []
        self.d = Delivery(
            self.engine,
            self.clock,
            fifo=fifo,
            pool_busy=lambda: self.busy,
            set_commit_window=self.windows.append,
        )
        self.served: list[str] = []

    def topic(self, name: str, priority: int | None = None) -> Topic:
        t, _ = self.engine.put_topic(name, {} if priority is None else {"priority": priority})
        t.listeners.add(lambda tt: self.served.append(tt.name))
        return t

    def write(self, name: str, data: Any = 1) -> None:
        req = self.engine.parse_write({"records": [{"data": data}]}, None)
        self.engine.begin_write(name, req)

    def govern(self, busy: float, times: int = 1) -> None:
        self.busy = busy
        for _ in range(times):
            self.clock.advance(GOVERNOR_PERIOD_MS)
            self.d.tick()


def run(body: Callable[[Rig], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        rig = Rig(**kw)
        rig.d.start(asyncio.get_running_loop())
        try:
            await body(rig)
        finally:
            rig.d.stop()

    asyncio.run(main())


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_an_idle_server_serves_a_publication_inside_it() -> None:
    async def body(r: Rig) -> None:
        r.topic("a")
        r.write("a")
        assert r.served == ["a"] and r.d.inline == 1

    run(body)


def test_queued_topics_are_served_by_band_not_by_arrival() -> None:
    async def body(r: Rig) -> None:
        for i in range(6):
            r.topic(f"low{i}", -100)
        r.topic("mid", 300)
        r.topic("high", 900)
        # One loop step publishes them all: the first is served inline, the urgent
        # band at once whatever waits, the rest queue.
        for i in range(6):
            r.write(f"low{i}")
        r.write("mid")
        r.write("high")
        assert r.served == ["low0", "high"]
        await turns()
        assert r.served[:3] == ["low0", "high", "mid"]
        assert sorted(r.served[3:]) == [f"low{i}" for i in range(1, 6)]
        assert r.served[3:] == [f"low{i}" for i in range(1, 6)]  # FIFO within the band

    run(body)


def test_a_topic_is_queued_once_however_often_it_publishes() -> None:
    async def body(r: Rig) -> None:
        r.topic("first")
        r.topic("busy")
        r.write("first")
        for i in range(50):
            r.write("busy", i)
        await turns()
        assert r.served == ["first", "busy"]
        assert r.d.ready.coalesced == 49
        assert r.engine.topics["busy"].head_seq == 50

    run(body)


def test_fifo_serves_every_publication_at_once_and_never_presses() -> None:
    async def body(r: Rig) -> None:
        r.topic("low", -500)
        r.topic("high", 900)
        r.write("low")
        r.write("high")
        r.write("low")
        assert r.served == ["low", "high", "low"]
        r.govern(1.0, times=10)
        assert r.d.governor.pressure == 0.0 and not r.d.governor.deferring

    run(body, fifo=True)


def test_coalescing_holds_a_topic_for_its_window_by_the_clock() -> None:
    async def body(r: Rig) -> None:
        r.topic("t", -100)  # B0: the whole window
        r.govern(0.6)  # coalescing window: 20 ms * (0.6 - 0.2) / 0.8 = 10 ms
        assert abs(r.d.governor.coalesce_ms - 10.0) < 1e-9
        r.write("t", 1)
        await turns()
        assert r.served == ["t"]
        r.write("t", 2)
        r.write("t", 3)
        await turns()
        assert r.served == ["t"] and r.d.held == 1  # held: served 0 ms ago
        r.clock.advance(9)
        assert r.d.release_due() == 0
        r.clock.advance(1)
        assert r.d.release_due() == 1
        await turns()
        assert r.served == ["t", "t"]  # records 2 and 3 in one service

    run(body)


def test_the_urgent_band_is_never_coalesced_and_the_window_shrinks_by_band() -> None:
    async def body(r: Rig) -> None:
        r.topic("urgent", 900)
        r.topic("mid", 300)
        r.govern(1.0)
        g = r.d.governor
        assert [g.coalesce_ms_for(b) for b in range(5)] == [20.0, 15.0, 10.0, 5.0, 0.0]
        for i in range(3):
            r.write("urgent", i)
            await turns()
        assert r.served == ["urgent"] * 3
        r.write("mid", 1)
        await turns()
        r.write("mid", 2)
        await turns()
        assert r.served.count("mid") == 1 and r.d.held == 1

    run(body)


def test_b0_is_deferred_under_sustained_pressure_but_stays_readable() -> None:
    async def body(r: Rig) -> None:
        r.topic("filler")
        r.topic("low", -100)
        r.topic("high", 900)
        r.govern(0.9, times=DEFER_SAMPLES)
        assert r.d.governor.deferring and r.d.ready.defer_b0
        r.write("filler")
        r.write("low", "kept")
        r.write("high")
        await turns()
        assert "low" not in r.served and "high" in r.served
        # Only the push waits: the records are there for a diff.
        _t, res = r.engine.diff("low", r.engine.parse_diff({"from_seq": 0}))
        assert len(res.records) == 1
        r.govern(0.7)  # between the thresholds: still deferred
        await turns()
        assert "low" not in r.served
        r.govern(0.5)
        await turns()
        assert "low" in r.served and not r.d.governor.deferring

    run(body)


def test_the_commit_window_follows_pressure() -> None:
    async def body(r: Rig) -> None:
        r.govern(0.3)
        assert r.windows == []
        r.govern(1.0)
        assert r.windows == [0.01]
        r.govern(0.0)
        assert r.windows == [0.01, 0.0]

    run(body)


def test_a_waiting_topic_ages_into_a_higher_band() -> None:
    async def body(r: Rig) -> None:
        r.topic("first")
        r.topic("low", 0)
        r.write("first")
        r.write("low")
        assert r.d.ready.band(r.engine.topics["low"]) == 1
        for _ in range(int(2600 / AGE_TICK_MS)):
            r.clock.advance(AGE_TICK_MS)
            r.d.ready.age(r.d._now())
        assert r.d.ready.band(r.engine.topics["low"]) == 2  # 0 + 260 after 2.6 s

    run(body)


def test_a_deleted_topic_is_not_served_again() -> None:
    async def body(r: Rig) -> None:
        r.topic("first")
        r.topic("gone")
        r.write("first")
        r.write("gone")
        r.engine.delete_topic("gone")  # wakes its listeners itself
        assert r.served == ["first", "gone"]
        await turns()
        assert r.served == ["first", "gone"]  # the queued service finds it gone

    run(body)


def test_stop_serves_what_is_queued_and_hands_delivery_back() -> None:
    async def main() -> None:
        r = Rig()
        r.d.start(asyncio.get_running_loop())
        r.topic("a")
        r.topic("b")
        r.write("a")
        r.write("b")
        assert r.served == ["a"]
        r.d.stop()
        assert r.served == ["a", "b"]
        r.write("b")
        assert r.served == ["a", "b", "b"]  # no scheduler: at once

    asyncio.run(main())
