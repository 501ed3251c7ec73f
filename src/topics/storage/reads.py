"""Reads whose segment bytes come from a thread pool, never from the event loop.

A read of the engine (a diff pass, an SSE or WebSocket drain step, a Kafka
fetch pass) is synchronous and walks loop-owned state. Run through
:meth:`ReadPool.run`, it executes on the loop with
:data:`~topics.engine.frames.read_ahead` set: the first time it needs bytes of
a segment file it stops with :class:`~topics.engine.frames.ColdRead` before
changing anything, one of the pool's threads reads the span (`pread` releases
the GIL while the disk answers), and the read runs again with those bytes at
hand. Records still in memory never leave the loop. A client scanning cold
history therefore costs the loop only the rendering, the same as a warm read
(docs/ARCHITECTURE.md, "The read path").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from topics.engine.frames import ColdRead, FrameSource, ReadAhead, read_ahead

__all__ = [
    "READ_THREADS",
    "ReadPool",
    "read_pool",
    "read_in_memory",
    "HistoryGate",
    "history_gate",
]

log = logging.getLogger("topics.storage")

T = TypeVar("T")

#: Threads reading segment files for reads off the loop (at most this many preads at once).
READ_THREADS = 4
#: Threads reading segments of the cold tier (a slow store keeps these waiting,
#: never the ones that read hot segments; docs/ARCHITECTURE.md, "The read path").
COLD_READ_THREADS = 8
#: Least bytes one fetch reads: a whole diff page at the largest budget (1 MiB) in one
#: trip to the pool, so the slices after the first find their bytes at hand.
READ_AHEAD_BYTES = 1024 * 1024 + 64 * 1024
#: Most bytes one :meth:`ReadPool.warm` reads ahead of a read in place, by default.
MAX_WARM_BYTES = 8 * 1024 * 1024
#: The same for a rebuild of a topic's tag index (it reads every tagged record).
MAX_WARM_TAG_BYTES = 256 * 1024 * 1024
#: Fetches one read may need before it runs with blocking reads on the loop instead
#: (a read touches one span per segment it crosses; this is far above that).
MAX_FETCHES = 64


def read_in_memory(read: Callable[[], T]) -> T | None:
    """`read()` on the loop if it needs no segment bytes, else None (and nothing changed).

    For work that must not wait (a live delivery from a publication): a read
    that would need a segment span raises ColdRead before changing anything,
    and the caller hands it to :meth:`ReadPool.run` instead. `read` must not
    return None itself.
    """
    token = read_ahead.set(ReadAhead())
    try:
        return read()
    except ColdRead:
        return None
    finally:
        read_ahead.reset(token)


class ReadPool:
    """A bounded pool of threads that fetch segment spans for reads on the loop.

    Spans of cold-tier segments (a source whose `cold` is true) are fetched by
    a second set of `cold_threads` threads: a cold store that answers slowly
    keeps those waiting, while hot segments are still read at disk speed, and
    their waits are not work the governor should make room for.

    Thread-safe to create; :meth:`run` must be called from the event loop.
    Counters: `fetches` (spans read), `fetched_bytes`, `cold_fetches`; `busy` is
    the number of hot fetches in flight (the delivery governor's pool signal,
    docs/SCHEDULER.md), `cold_busy` the same for cold ones.
    """

    def __init__(self, threads: int = READ_THREADS, cold_threads: int = COLD_READ_THREADS) -> None:
        self.threads = max(1, threads)
        self.cold_threads = max(1, cold_threads)
        self._pool: ThreadPoolExecutor | None = None
        self._cold_pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.fetches = 0
        self.fetched_bytes = 0
        self.cold_fetches = 0
        self.busy = 0
        self.cold_busy = 0

    def busy_share(self) -> float:
        """Fetches in flight per thread (0..1)."""
        return min(self.busy / self.threads, 1.0)

    async def _fetch(self, src: FrameSource, lo: int, hi: int) -> bytes:
        loop = asyncio.get_running_loop()
        if getattr(src, "cold", False):
            self.cold_busy += 1
            try:
                buf = await loop.run_in_executor(self._cold_executor(), src.fetch, lo, hi)
            finally:
                self.cold_busy -= 1
            self.cold_fetches += 1
        else:
            self.busy += 1
            try:
                buf = await loop.run_in_executor(self._executor(), src.fetch, lo, hi)
            finally:
                self.busy -= 1
        self.fetches += 1
        self.fetched_bytes += len(buf)
        return buf

    def _executor(self) -> ThreadPoolExecutor:
        return self._pool or self._start("_pool", self.threads, "topics-read")

    def _cold_executor(self) -> ThreadPoolExecutor:
        return self._cold_pool or self._start("_cold_pool", self.cold_threads, "topics-read-cold")

    def _start(self, attr: str, threads: int, prefix: str) -> ThreadPoolExecutor:
        """The pool in attribute `attr`, started now unless another thread just did."""
        with self._lock:
            pool: ThreadPoolExecutor | None = getattr(self, attr)
            if pool is None:
                pool = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
                setattr(self, attr, pool)
            return pool

    async def run(self, read: Callable[[], T], ahead: ReadAhead | None = None) -> T:
        """`read()` on the loop, its segment bytes fetched on the pool first.

        `read` must change nothing before it raises (engine reads raise
        ColdRead before touching state). A fetch reads at least
        :data:`READ_AHEAD_BYTES` from where the read needs bytes; pass the same
        `ahead` to the reads of one page (its slices) so later ones find them.
        Returns what `read` returns; raises what it raises, and OSError when a
        fetch fails.
        """
        if ahead is None:
            ahead = ReadAhead()
        for _ in range(MAX_FETCHES):
            token = read_ahead.set(ahead)
            try:
                return read()
            except ColdRead as need:
                # Keep the span, not the exception: its traceback holds this frame,
                # a cycle only the garbage collector would free.
                src, lo, need_hi = need.source, need.lo, need.hi
            finally:
                read_ahead.reset(token)
            hi = max(need_hi, lo + READ_AHEAD_BYTES)  # short at the end of the file
            ahead.add(src, lo, await self._fetch(src, lo, hi))
        log.warning("a read needed more than %d segment fetches; reading on the loop", MAX_FETCHES)
        return read()

    async def warm(
        self, spans: Iterable[tuple[FrameSource, int, int]], limit: int = MAX_WARM_BYTES
    ) -> None:
        """Read `spans` (`(source, lo, hi)` of blocking sources) on the pool, bytes dropped.

        For work that reads segments in place because it changes state as it
        reads (queue claims, router forwarding): once the page cache holds the
        spans, that read does not wait for the disk. At most `limit` bytes
        (:data:`MAX_WARM_BYTES`); errors are left to the read in place.
        """
        budget = limit
        for src, lo, hi in spans:
            hi = min(hi, lo + budget)
            if hi <= lo:
                break
            budget -= hi - lo
            try:
                await self._fetch(src, lo, hi)
            except OSError:
                return

    def close(self) -> None:
        """Stop the threads (waits for running fetches); a later run starts new ones."""
        with self._lock:
            pools = (self._pool, self._cold_pool)
            self._pool = self._cold_pool = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True)


#: The pool every read of this process uses.
read_pool = ReadPool()


#: Longest a historical read step waits for writes in flight (s): writes keep priority
#: without starving a scan when they never stop.
HISTORY_MAX_WAIT_S = 0.002
#: A lane held longer than this (s) without its holder's next turn counts as free:
#: a holder that went quiet (a stream caught up) never wedges the others.
HISTORY_LANE_MAX_S = 0.005


class HistoryGate:
    """Historical reads take turns in one lane, after live work (docs/ARCHITECTURE.md).

    A read catching up on history (a diff page far behind the head, an SSE or
    WebSocket catch-up, a Kafka fetch of old offsets) calls :meth:`turn` before
    each step: a slice of records, a piece of a response. Steps of all such
    reads pass one at a time, in arrival order, so between two of them the loop
    runs everything else that is ready: a live request waits behind one step at
    most, never behind one step of each scanning client.

    A write (HTTP, WebSocket or Kafka produce) holds :meth:`write` while it
    waits for its commit point; while any is in flight the next step waits
    (at most :data:`HISTORY_MAX_WAIT_S`), so the loop is free when the commit
    lands. A step ends at its task's next :meth:`turn`, when the task ends, or
    after :data:`HISTORY_LANE_MAX_S`. Reads at the head never call it.
    Loop-only, like the engine.
    """

    def __init__(self) -> None:
        self.writes = 0
        self._idle: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._holder: asyncio.Task[object] | None = None
        self._started = 0.0  # loop time the holder's step began
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._watched: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Held by a write while it waits for its commit point."""
        self.writes += 1
        try:
            yield
        finally:
            self.writes -= 1
            if not self.writes and self._idle is not None:
                self._idle.set()

    def _release(self) -> None:
        self._holder = None
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _holder_done(self, task: asyncio.Task[object]) -> None:
        if self._holder is task:
            self._release()

    async def turn(self) -> None:
        """Before a historical read step: wait for writes in flight, then for the lane."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        if me is not None and self._holder is me:
            self._release()
        await asyncio.sleep(0)  # always yield: what is ready runs first
        if self.writes:
            await self._wait_writes(loop)
        while True:
            h = self._holder
            if h is None or h is me or h.done():
                break
            left = self._started + HISTORY_LANE_MAX_S - loop.time()
            if left <= 0:
                break  # the holder went quiet: its step counts as over
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, left)
            except TimeoutError:
                pass
        if me is not None and self._holder is not me:
            self._holder = me
            if me not in self._watched:
                self._watched.add(me)
                me.add_done_callback(self._holder_done)
        self._started = loop.time()

    async def _wait_writes(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._idle is None or self._loop is not loop:
            self._idle, self._loop = asyncio.Event(), loop
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), HISTORY_MAX_WAIT_S)
        except TimeoutError:
            pass


#: The gate every shell of this process uses.
history_gate = HistoryGate()
