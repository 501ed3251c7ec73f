"""The delivery worker: runs publications' delivery work on the loop, by priority.

A publication (records of a topic became visible) no longer wakes the topic's
listeners on the spot: the engine hands the topic to :meth:`Delivery.published`,
which queues it in a :class:`~topics.engine.scheduler.ReadySet` (at most once)
and serves the set from the event loop, highest band first by weighted
round-robin. Serving a topic wakes everything listening to it (SSE and
WebSocket streams through the app's fan-out, long-polls, queue waiters, the
Kafka listener), in one go, so the records that arrived meanwhile go out
together. Every :data:`~topics.engine.scheduler.AGE_TICK_MS` the waiting topics
age; every :data:`~topics.engine.scheduler.GOVERNOR_PERIOD_MS` the
:class:`~topics.engine.scheduler.Governor` recomputes pressure and the worker
applies the ladder: coalescing windows, the WAL's group-commit window, the
deferral of band B0 and of router forwarding. docs/SCHEDULER.md describes
what a client sees at each step.

While nothing is queued, one publication per loop turn is served inside the
publication itself, so an idle server delivers as soon as it
did without a scheduler. With `TOPICS_SCHEDULER=fifo` every publication is
served at once, in publication order, and the governor never presses.

Times come from the node's :class:`~topics.clock.Clock` (monotonic, in ms):
the loop's timers only decide when to look, so a test drives :meth:`tick`
and :meth:`drain` with a manual clock. The one exception is the loop's lag,
how late the tick's timer fires, which is read from the loop's own clock.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable
from typing import Any

from topics.clock import Clock
from topics.engine import scheduler as sched
from topics.engine.core import Engine
from topics.engine.scheduler import TOP_BAND, Governor, ReadySet, band_of
from topics.engine.topic import Topic

__all__ = ["Delivery", "LATENCY_BUCKETS_MS", "DRAIN_BUDGET_MS", "RouterWork"]

log = logging.getLogger("topics.delivery")

#: How long a publication of a higher band keeps lower-band writes paced (ms).
URGENT_MEMORY_MS = 1000.0
#: Longest a drain runs before it gives the loop back (ms): sockets are read and
#: commits land between two drains, so a long ready set never stalls the loop.
DRAIN_BUDGET_MS = 2.0
#: Upper bounds of the scheduling-latency histogram (ms, marked to served).
LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


class RouterWork:
    """The ready-set key of router forwarding while it is deferred a band."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: list[Callable[[], object]] = []

    def __repr__(self) -> str:
        return "RouterWork()"


class Delivery:
    """Serves the publications of one engine on its event loop (loop-only).

    `pool_busy()` gives the busy share (0..1) of the blocking pools: the read
    pool's threads and the WAL shards' ingest queues. `set_commit_window(s)` is
    called with the group-commit window the ladder asks for (seconds; 0 =
    none). `fifo` turns scheduling off (docs/SCHEDULER.md, "Turning it off").

    Counters: `inline` (publications served inside themselves),
    `held` (services put off by a coalescing window), `paced` (writes the node
    made wait under pressure), `latency_counts`
    (histogram over :data:`LATENCY_BUCKETS_MS`, last bucket: above), `rejected`
    (writes the node refused with 429).
    """

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        *,
        fifo: bool = False,
        pool_busy: Callable[[], float] = lambda: 0.0,
        set_commit_window: Callable[[float], None] = lambda s: None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.fifo = fifo
        self.pool_busy = pool_busy
        self.set_commit_window = set_commit_window
        self.governor = Governor(workers=1, enabled=not fifo)
        self.ready: ReadySet[Topic | RouterWork] = ReadySet(self._priority)
        self.routers = RouterWork()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._inline_used = False
        self._last_served: dict[Topic, float] = {}
        # Topics served less than a coalescing window ago, and when each may be
        # served again (monotonic ms); one loop timer wakes :meth:`release_due`.
        self._held: dict[Topic, float] = {}
        self._release_timer: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._stopping = False
        # When a topic of each band last published under pressure (monotonic ms).
        self._band_seen = [-1e18] * (TOP_BAND + 1)
        self._resumed_ms = 0.0  # when band B0 was last let go after a deferral
        self._last_age = 0.0
        self._last_govern = 0.0
        self._window_s = 0.0
        self.inline = 0
        self.held = 0
        self.rejected = 0
        self.paced = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.latency_sum_ms = 0.0

    # ----------------------------------------------------------- lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take over the engine's publications and start the aging/governor timer."""
        self._loop = loop
        self.engine.deliver = self.published
        now = self._now()
        self._last_age = self._last_govern = now
        if not self.fifo:
            self._arm_timer(loop)

    def stop(self) -> None:
        """Serve what is queued, stop the timers and hand publications back to the engine."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        held, self._held = list(self._held), {}
        self.engine.deliver = Topic.notify
        self.ready.defer_b0 = False
        self._stopping = True  # no coalescing window holds anything back now
        try:
            for t in held:
                self.ready.mark(t, self._now())
            self.drain(budget_ms=None)
        finally:
            self._stopping = False
        self._apply_window(0.0)

    def _now(self) -> float:
        return self.clock.monotonic() * 1000.0

    def _priority(self, key: Topic | RouterWork) -> float:
        eng = self.engine
        if isinstance(key, RouterWork):
            # Forwarding serves the sources that published: the most urgent one counts.
            srcs = eng.routers.dirty_sources() if eng.routers is not None else ()
            prios = [eng.effective_priority(t, eng.clock.now_ms()) for t in srcs]
            return max(prios, default=0)
        return eng.effective_priority(key, eng.clock.now_ms())

    def band(self, t: Topic) -> int:
        """The band `t` is scheduled in (by its effective priority, without aging)."""
        return band_of(self._priority(t))

    # ---------------------------------------------------------- publications

    def published(self, t: Topic) -> None:
        """The engine's delivery hook: `t` has records its listeners have not seen."""
        if self.fifo:
            t.notify()
            return
        if not t.listeners:
            return  # nobody to wake: a stream or poll that starts later reads from its cursor
        if t in self._held or t in self.ready:
            self.ready.coalesced += 1
            return
        if self._loop is None:
            self.ready.mark(t, self._now())
            return
        band = self.band(t) if self.governor.pace else None
        if band is not None:
            self.saw_band(band)  # pacing protects the bands that publish while it is on
        if not self._inline_used and not self.ready:
            # Nothing waits: serve it inside the publication (the first of a loop
            # turn; a burst of them queues and goes by band). A coalescing window
            # still applies (in _serve).
            self._inline_used = True
            self._drain_soon()  # its turn ends there
            self.inline += 1
            self._serve(t, 0.0, 0.0)
            return
        now = self._now()
        if band is None:
            band = self.band(t)
        if band == TOP_BAND:
            # The urgent band goes first anyway, and a queued service would
            # wait for every callback the loop has ready (requests included).
            self.inline += 1
            self._serve(t, now, 0.0)
            return
        self.ready.mark(t, now)
        self._drain_soon()

    def saw_band(self, band: int, now_ms: float | None = None) -> None:
        """Note that a topic of `band` published while writes are paced (now, by default)."""
        self._band_seen[band] = self._now() if now_ms is None else now_ms

    def urgent_above(self, band: int) -> bool:
        """True when a topic of a band above `band` published while writes were paced,
        within the last second: only then is there anything to pace writes for."""
        since = self._now() - URGENT_MEMORY_MS
        return any(at >= since for at in self._band_seen[band + 1 :])

    def defer_routers(self, run: Callable[[], object]) -> bool:
        """Queue a forwarding pass one band below its sources while B0 is deferred.

        Returns False (the caller runs it as usual) when nothing is deferred.
        """
        if self.fifo or not self.governor.deferring:
            return False
        self.routers.runs.append(run)
        self.ready.mark(self.routers, self._now(), demoted=True)
        self._drain_soon()
        return True

    # ---------------------------------------------------------------- service

    def _drain_soon(self) -> None:
        """Run :meth:`_drain_cb` on the loop's next turn (once, however often asked)."""
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._drain_cb)

    def _drain_cb(self) -> None:
        # A new loop turn: it may serve one publication inside itself again.
        self._scheduled = self._inline_used = False
        self.drain()
        if self.ready.servable():
            self._drain_soon()

    def drain(self, budget_ms: float | None = DRAIN_BUDGET_MS) -> int:
        """Serve queued keys in DWRR order for at most `budget_ms` (None: until
        nothing servable is left); returns how many were served."""
        start = self._now()
        served = 0
        while True:
            now = self._now()
            if budget_ms is not None and served and now - start >= budget_ms:
                break
            key = self.ready.pop()
            if key is None:
                break
            served += 1
            since = self.ready.last_enqueued_ms
            if self.ready.last_band == 0:
                since = max(since, self._resumed_ms)  # a deferred wait is not a backlog
            waited = now - since
            if isinstance(key, RouterWork):
                runs, key.runs = key.runs, []
                for run in runs:
                    run()
                self._observe(waited)
            else:
                self._serve(key, now, waited)
        return served

    def _serve(self, t: Topic, now: float, waited: float) -> None:
        if not t.alive:
            self._last_served.pop(t, None)
            return
        window = 0.0 if self._stopping else self.governor.coalesce_ms
        if window > 0:
            window = self.governor.coalesce_ms_for(self.band(t))
            now = now or self._now()
            last = self._last_served.get(t)
            if last is not None and now - last < window:
                # Coalescing: the topic was served less than a window ago; what it
                # publishes meanwhile goes out together when the window ends.
                self.held += 1
                due = last + window
                self._held[t] = due
                self._wake_at(due, now)
                return
            self._last_served[t] = now
        self._observe(waited)
        try:
            t.notify()
        except Exception:  # pragma: no cover - a listener's bug must not stop delivery
            log.exception("delivery to the listeners of %s failed", t.name)

    def _wake_at(self, due: float, now: float) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._release_timer is not None:
            if self._release_timer.when() <= loop.time() + (due - now) / 1000:
                return  # an earlier wake-up is armed; it re-arms for the rest
            self._release_timer.cancel()
        self._release_timer = loop.call_later(max(due - now, 0.0) / 1000, self._on_release)

    def _on_release(self) -> None:
        self._release_timer = None
        self.release_due()

    def release_due(self) -> int:
        """Queue the held topics whose coalescing window is over (by the Clock);
        returns how many. Re-arms the wake-up for the rest."""
        now = self._now()
        due = [t for t, at in self._held.items() if at <= now]
        for t in due:
            del self._held[t]
            self._last_served.pop(t, None)  # the window is over
            self.ready.mark(t, now)
        if due:
            self._drain_soon()
        if self._held:
            self._wake_at(min(self._held.values()), now)
        return len(due)

    def _observe(self, waited: float) -> None:
        self.governor.observe(waited)
        self.latency_sum_ms += waited
        # The first bucket whose bound is >= waited; past the last: the overflow one.
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_MS, waited)] += 1

    # ---------------------------------------------------------- aging, governor

    def _on_timer(self) -> None:
        loop = self._loop
        if loop is None:
            return
        # How late this timer fired: the loop's lag, a pressure signal.
        # Lag is the loop's own affair: measured by its clock, not the node's.
        self.governor.observe_lag((loop.time() - self._timer_due) * 1000)
        try:
            self.tick()
        finally:
            self._arm_timer(loop)

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer_due = loop.time() + sched.AGE_TICK_MS / 1000
        self._timer = loop.call_at(self._timer_due, self._on_timer)

    def tick(self) -> None:
        """The aging tick, and the governor's sample when its period is due."""
        now = self._now()
        if self._held:
            self.release_due()
        if now - self._last_age >= sched.AGE_TICK_MS:
            self._last_age = now
            self.ready.age(now)
        if now - self._last_govern >= sched.GOVERNOR_PERIOD_MS:
            self._last_govern = now
            self.govern()

    def govern(self) -> float:
        """Sample the governor and apply the ladder; returns the pressure."""
        # Deferred B0 topics wait on purpose: they are not a backlog.
        depth = len(self.ready) - (self.ready.depth()[0] if self.ready.defer_b0 else 0)
        p = self.governor.sample(depth, self.pool_busy())
        if self.ready.defer_b0 and not self.governor.deferring:
            self._resumed_ms = self._now()
        self.ready.defer_b0 = self.governor.deferring
        if self.governor.coalesce_ms == 0.0:
            self._last_served.clear()  # only a coalescing window needs them
        self._apply_window(self.governor.commit_window_ms / 1000)
        if not self.governor.deferring and self.routers.runs:
            self.ready.discard(self.routers)
            runs, self.routers.runs = self.routers.runs, []
            for run in runs:
                run()
        if len(self.ready):
            self._drain_soon()
        return p

    def _apply_window(self, seconds: float) -> None:
        if seconds != self._window_s:
            self._window_s = seconds
            self.set_commit_window(seconds)

    # ----------------------------------------------------------------- metrics

    def stats(self) -> dict[str, Any]:
        """Figures for `/v0/metrics` (docs/API.md, "15.3 `GET /v0/metrics`")."""
        g = self.governor
        depth = self.ready.depth()
        return {
            "mode": "fifo" if self.fifo else "priority",
            "pressure": round(g.pressure, 4),
            "pressure_terms": {
                "depth": round(g.terms[0], 4),
                "latency": round(g.terms[1], 4),
                "pool": round(g.terms[2], 4),
            },
            "latency_ewma_ms": round(g.latency_ewma_ms, 4),
            "loop_lag_ms": round(g.loop_lag_ms, 4),
            "ingest_wait_ms": round(g.ingest_ms, 4),
            "ready": _by_band(depth),
            "served": _by_band(self.ready.served),
            "inline": self.inline,
            "coalesced": self.ready.coalesced + self.held,
            "deferring": g.deferring,
            "deferrals": g.deferrals,
            "commit_window_ms": round(self._window_s * 1000, 3),
            "coalesce_window_ms": round(g.coalesce_ms, 3),
            "pace": round(g.pace, 3),
            "rejected": self.rejected,
            "paced": self.paced,
            "latency_ms": {
                "buckets": list(LATENCY_BUCKETS_MS),
                "counts": list(self.latency_counts),
                "sum": round(self.latency_sum_ms, 3),
            },
        }


def _by_band(values: list[int]) -> dict[str, int]:
    """Per-band figures keyed B4 first."""
    return {sched.BAND_NAMES[b]: values[b] for b in range(TOP_BAND, -1, -1)}
