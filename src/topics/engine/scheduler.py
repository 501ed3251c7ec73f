"""Delivery scheduling: which dirty topic is served next, and how pressed the server is.

Pure and synchronous like the rest of the engine; every instant is a value the
caller reads from its :class:`~topics.clock.Clock` (milliseconds of the
monotonic reading), so tests drive windows, ticks and deadlines without
sleeping. The loop-side worker that uses both classes is
:mod:`topics.delivery`. Behaviour: docs/SCHEDULER.md.

* :class:`ReadySet` holds the topics with delivery work (watchers to wake,
  router forwarding to run), each at most once, in five priority bands drawn
  by deficit weighted round-robin, FIFO by `enqueued_at` within a band, with
  aging: a waiting topic gains up to +1000 within :data:`AGE_CAP_MS`, so one
  at priority 0 or above reaches the top band, and every band with topics
  is served every round whatever its priority.
* :class:`Governor` turns three signals (ready-set depth, the EWMA of
  scheduling latency, the busy share of the blocking pools) into `pressure`
  in [0, 1] every :data:`GOVERNOR_PERIOD_MS` and derives the ladder from it:
  the coalescing window, the group-commit window, deferral of the lowest band
  (with hysteresis) and whether a write may be refused with `429`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "AGE_CAP_MS",
    "AGE_RATE_PER_S",
    "AGE_TICK_MS",
    "BAND_FLOORS",
    "BAND_NAMES",
    "BAND_WEIGHTS",
    "COALESCE_AT",
    "COALESCE_MAX_MS",
    "COMMIT_WINDOW_AT",
    "COMMIT_WINDOW_MAX_MS",
    "COMMIT_WINDOW_MIN_MS",
    "DEFER_AT",
    "DEFER_SAMPLES",
    "DEPTH_FULL",
    "GOVERNOR_PERIOD_MS",
    "LATENCY_CEILING_MS",
    "PACE_DOWN",
    "PACE_MAX_MS",
    "PACE_UP",
    "REJECT_AT",
    "RESUME_AT",
    "TOP_BAND",
    "Governor",
    "ReadySet",
    "band_of",
]

K = TypeVar("K", bound=Hashable)

#: Lowest effective priority of bands B4, B3, B2 and B1; below the last is B0.
BAND_FLOORS = (750, 500, 250, 0)
#: DWRR weights, indexed by band number (B0 .. B4): services per round.
BAND_WEIGHTS = (1, 1, 2, 4, 8)
BAND_NAMES = ("B0", "B1", "B2", "B3", "B4")
#: The urgent band: served on the spot, never coalesced, paced or refused.
TOP_BAND = len(BAND_WEIGHTS) - 1
#: Aging: a queued topic gains this much priority per second of waiting ...
AGE_RATE_PER_S = 100
#: ... for at most this long (so at most +1000).
AGE_CAP_MS = 10_000
#: How often queued topics are moved to the band their aged priority reached.
AGE_TICK_MS = 50

#: The governor samples its signals this often.
GOVERNOR_PERIOD_MS = 100
#: Scheduling latency (dirty to served) that counts as full pressure.
LATENCY_CEILING_MS = 5.0
#: Queued topics per worker that count as full pressure.
DEPTH_FULL = 64
#: Weight of the newest latency sample in the EWMA.
LATENCY_EWMA_ALPHA = 0.2
#: Above this pressure a topic's records are coalesced: it is served at most
#: once per coalescing window, which grows from 0 to COALESCE_MAX_MS with pressure.
COALESCE_AT = 0.2
COALESCE_MAX_MS = 20.0
#: Above this pressure the group-commit window widens from ..._MIN_MS to ..._MAX_MS.
COMMIT_WINDOW_AT = 0.4
COMMIT_WINDOW_MIN_MS = 0.5
COMMIT_WINDOW_MAX_MS = 10.0
#: Deferral starts after DEFER_SAMPLES samples in a row above DEFER_AT, and ends
#: at the first sample below RESUME_AT.
DEFER_AT = 0.8
DEFER_SAMPLES = 3
RESUME_AT = 0.6
#: What an average keeps per sample period in which it saw nothing.
IDLE_DECAY = 0.5
#: Write pacing: the longest wait (B0, full pace), and the pace's steps per sample.
PACE_MAX_MS = 20.0
PACE_UP = 0.25
PACE_DOWN = 0.05
#: With the WAL ingest queue full, writes are refused at or above this pressure.
REJECT_AT = 0.95


def band_of(priority: float) -> int:
    """The band number (0 = B0 .. 4 = B4) of an effective priority."""
    for i, floor in enumerate(BAND_FLOORS):
        if priority >= floor:
            return TOP_BAND - i
    return 0


def _below_top(band: int) -> float:
    """1 for B0, a quarter less per band above, 0 for the top band."""
    return (TOP_BAND - min(max(band, 0), TOP_BAND)) / TOP_BAND


def age_boost(waited_ms: float) -> float:
    """Priority a topic gains by waiting `waited_ms` (+100/s, at most +1000)."""
    return AGE_RATE_PER_S * min(max(waited_ms, 0.0), AGE_CAP_MS) / 1000.0


@dataclass(slots=True, eq=False)
class _Entry(Generic[K]):
    key: K
    enqueued_ms: float
    order: int
    demoted: bool
    band: int = 0


class ReadySet(Generic[K]):
    """Keys with delivery work, each at most once, drawn by banded DWRR.

    `priority(key)` gives a key's effective priority (docs/API.md, "Topic
    state": `effective_priority`) without aging; it is read when the key is
    marked and again at every aging tick. A *demoted* key (router forwarding
    while the lowest band is deferred) sits one band lower than its priority
    says. While :attr:`defer_b0` is set, band B0 receives no credit: its keys
    stay queued, in order, and are served once it is cleared.

    Counters: `served` per band, `coalesced` (marks of a key already queued).
    """

    def __init__(self, priority: Callable[[K], float]) -> None:
        self._priority = priority
        self._entries: dict[K, _Entry[K]] = {}
        self._heaps: list[list[tuple[float, int, _Entry[K]]]] = [[] for _ in BAND_WEIGHTS]
        self._live = [0] * len(BAND_WEIGHTS)
        self._credit = [0] * len(BAND_WEIGHTS)
        self._order = 0
        self.defer_b0 = False
        self.served = [0] * len(BAND_WEIGHTS)
        self.coalesced = 0
        #: When the key :meth:`pop` returned last was queued (monotonic ms), and its band.
        self.last_enqueued_ms = 0.0
        self.last_band = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def depth(self) -> list[int]:
        """Queued keys per band, indexed by band number (B0 .. B4)."""
        return list(self._live)

    def servable(self) -> bool:
        """True when :meth:`pop` would return a key (B0 alone does not count while deferred)."""
        live = self._live
        return any(live[1:]) or (live[0] > 0 and not self.defer_b0)

    def band(self, key: K) -> int | None:
        """The band `key` is queued in, or None."""
        e = self._entries.get(key)
        return None if e is None else e.band

    def enqueued_ms(self, key: K) -> float | None:
        """When `key` was queued (monotonic ms), or None."""
        e = self._entries.get(key)
        return None if e is None else e.enqueued_ms

    def mark(self, key: K, now_ms: float, *, demoted: bool = False) -> bool:
        """Queue `key` unless it is queued already (then nothing changes: its
        `enqueued_at` keeps aging). Returns True when it was inserted."""
        if key in self._entries:
            self.coalesced += 1
            return False
        self._order += 1
        e = _Entry(key, now_ms, self._order, demoted)
        e.band = self._band_for(e, now_ms)
        self._entries[key] = e
        self._push(e)
        return True

    def discard(self, key: K) -> None:
        """Forget `key` (its topic is gone); a no-op when it is not queued."""
        e = self._entries.pop(key, None)
        if e is not None:
            self._live[e.band] -= 1

    def pop(self) -> K | None:
        """The next key to serve (removed from the set), or None when no band with
        keys may be served (empty, or only B0 while it is deferred).

        Deficit round-robin with unit cost: a round gives each band with keys
        its weight in credit; bands are served from B4 down while they have
        credit, so per round B4 gets up to 8 services for each one of B0.
        """
        for _ in range(2):
            for b in range(len(BAND_WEIGHTS) - 1, -1, -1):
                if self._credit[b] > 0 and self._live[b] > 0:
                    e = self._take(b)
                    if e is not None:
                        self._credit[b] -= 1
                        self.served[b] += 1
                        self.last_enqueued_ms = e.enqueued_ms
                        self.last_band = b
                        return e.key
            # A new round: credit for every band that has keys and may be served.
            started = False
            for b, w in enumerate(BAND_WEIGHTS):
                ok = self._live[b] > 0 and not (b == 0 and self.defer_b0)
                self._credit[b] = w if ok else 0
                started = started or ok
            if not started:
                return None
        return None  # pragma: no cover - a started round always serves

    def age(self, now_ms: float) -> int:
        """The aging tick: move every key whose aged priority reached another band.

        A key keeps its `enqueued_at`, so it lands in its new band's FIFO by
        how long it has waited. Returns how many keys moved.
        """
        moved = 0
        for e in list(self._entries.values()):
            b = self._band_for(e, now_ms)
            if b != e.band:
                self._live[e.band] -= 1
                e.band = b
                self._push(e)
                moved += 1
        return moved

    def _band_for(self, e: _Entry[K], now_ms: float) -> int:
        b = band_of(self._priority(e.key) + age_boost(now_ms - e.enqueued_ms))
        return max(b - 1, 0) if e.demoted else b

    def _push(self, e: _Entry[K]) -> None:
        heapq.heappush(self._heaps[e.band], (e.enqueued_ms, e.order, e))
        self._live[e.band] += 1

    def _take(self, b: int) -> _Entry[K] | None:
        heap = self._heaps[b]
        while heap:
            _, _, e = heapq.heappop(heap)
            # Heaps keep stale items of keys that moved, were served or discarded.
            if e.band == b and self._entries.get(e.key) is e:
                del self._entries[e.key]
                self._live[b] -= 1
                return e
        self._live[b] = 0  # pragma: no cover - counts and heaps agree
        return None  # pragma: no cover


def _lerp(a: float, b: float, x: float) -> float:
    return a + (b - a) * min(max(x, 0.0), 1.0)


@dataclass(slots=True)
class Governor:
    """Pressure in [0, 1] from three signals, and the ladder it drives.

    Call :meth:`observe` with each service's scheduling latency (ms from
    marked to served) and :meth:`sample` every :data:`GOVERNOR_PERIOD_MS`.
    The ladder (docs/SCHEDULER.md, "The ladder"): above :data:`COALESCE_AT`
    a topic is served at most once per :attr:`coalesce_ms`; above
    :data:`COMMIT_WINDOW_AT` the group-commit window is :attr:`commit_window_ms`;
    after :data:`DEFER_SAMPLES` samples above :data:`DEFER_AT`, :attr:`deferring`
    holds until a sample below :data:`RESUME_AT`; :meth:`refuse_write` is true
    when the WAL ingest queue is full at :data:`REJECT_AT` or more.

    `enabled=False` keeps pressure at 0: plain FIFO service, nothing deferred.
    """

    workers: int = 1
    enabled: bool = True
    pressure: float = 0.0
    latency_ewma_ms: float = 0.0
    #: EWMA of the event loop's lag: how late its timers fire (ms).
    loop_lag_ms: float = 0.0
    #: EWMA of how long requests wait for the loop once their bytes are read (ms).
    ingest_ms: float = 0.0
    deferring: bool = False
    #: Parts of the last sample: depth, latency and pool terms.
    terms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: Samples that started or ended deferral.
    deferrals: int = 0
    #: How hard writes below the top band are paced, 0..1: up by PACE_UP per
    #: sample above COMMIT_WINDOW_AT, down by PACE_DOWN per sample at or below
    #: COALESCE_AT (slow, so pacing that works does not switch itself off at once).
    pace: float = 0.0
    _above: int = field(default=0, repr=False)
    # Observations since the last sample: a signal that saw none decays toward 0.
    _lat_seen: int = field(default=0, repr=False)
    _ingest_seen: int = field(default=0, repr=False)

    def observe(self, latency_ms: float) -> None:
        """Fold one service's scheduling latency into the EWMA."""
        a = LATENCY_EWMA_ALPHA
        self.latency_ewma_ms += a * (latency_ms - self.latency_ewma_ms)
        self._lat_seen += 1

    def observe_ingest(self, waited_ms: float) -> None:
        """Fold one request's wait for the loop (read to handled) into its EWMA."""
        a = LATENCY_EWMA_ALPHA
        self.ingest_ms += a * (max(waited_ms, 0.0) - self.ingest_ms)
        self._ingest_seen += 1

    def observe_lag(self, lag_ms: float) -> None:
        """Fold one reading of the loop's lag (how late a timer fired) into its EWMA.

        On one event loop every piece of work, a request as much as a delivery,
        waits for the callbacks ahead of it: a saturated loop shows here before
        any topic waits in the ready set."""
        a = LATENCY_EWMA_ALPHA
        self.loop_lag_ms += a * (max(lag_ms, 0.0) - self.loop_lag_ms)

    def sample(self, depth: int, pool_busy: float) -> float:
        """Recompute pressure from the ready-set depth and the busy share of the
        blocking pools (0..1); returns it. Call every GOVERNOR_PERIOD_MS."""
        # Nothing served or nothing read in the period: nothing waited either,
        # and the average halves (a spike is forgotten within a second).
        if not self._lat_seen:
            self.latency_ewma_ms *= IDLE_DECAY
        if not self._ingest_seen:
            self.ingest_ms *= IDLE_DECAY
        self._lat_seen = self._ingest_seen = 0
        if not self.enabled:
            self.pressure = self.pace = 0.0
            return 0.0
        d = min(max(depth - self.workers, 0) / (DEPTH_FULL * self.workers), 1.0)
        behind = max(self.latency_ewma_ms, self.loop_lag_ms, self.ingest_ms)
        lat = min(behind / LATENCY_CEILING_MS, 1.0)
        pool = min(max(pool_busy, 0.0), 1.0)
        self.terms = (d, lat, pool)
        p = max(d, lat, pool)
        self.pressure = p
        if p > COMMIT_WINDOW_AT:
            self.pace = min(1.0, self.pace + PACE_UP)
        elif p <= COALESCE_AT:
            self.pace = max(0.0, self.pace - PACE_DOWN)
        if self.deferring:
            if p < RESUME_AT:
                self.deferring = False
                self._above = 0
                self.deferrals += 1
        else:
            self._above = self._above + 1 if p > DEFER_AT else 0
            if self._above >= DEFER_SAMPLES:
                self.deferring = True
                self.deferrals += 1
        return p

    @property
    def coalesce_ms(self) -> float:
        """Least time between two services of one topic of band B0 (0: serve at once);
        see :meth:`coalesce_ms_for` for the other bands."""
        p = self.pressure
        if p <= COALESCE_AT:
            return 0.0
        return _lerp(0.0, COALESCE_MAX_MS, (p - COALESCE_AT) / (1.0 - COALESCE_AT))

    def coalesce_ms_for(self, band: int) -> float:
        """The coalescing window of a topic in `band`: the full window in B0, a
        quarter less per band above, none in B4 (the urgent band keeps a frame
        per publication)."""
        return self.coalesce_ms * _below_top(band)

    @property
    def commit_window_ms(self) -> float:
        """How long the WAL writer gathers a batch before committing (0: not at all)."""
        p = self.pressure
        if p <= COMMIT_WINDOW_AT:
            return 0.0
        return _lerp(COMMIT_WINDOW_MIN_MS, COMMIT_WINDOW_MAX_MS, p)

    def pace_ms_for(self, band: int) -> float:
        """How long a write to a topic of `band` waits before it is staged (ms):
        up to PACE_MAX_MS in B0, a quarter less per band above, never in B4."""
        return PACE_MAX_MS * self.pace * _below_top(band)

    def refuse_write(self, queue_full: bool) -> bool:
        """True when a write should get `429 throttled`: an ingest queue is full,
        pressure is at REJECT_AT or more and has been high long enough to defer
        (a burst never refuses writes). The caller honours `disable_backpressure`."""
        return queue_full and self.enabled and self.deferring and self.pressure >= REJECT_AT
