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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

from topics.engine.frames import ColdRead, ReadAhead, read_ahead

__all__ = ["READ_THREADS", "ReadPool", "read_pool", "HistoryGate", "history_gate"]

log = logging.getLogger("topics.storage")

T = TypeVar("T")

#: Threads reading segment files for reads off the loop (at most this many preads at once).
READ_THREADS = 4
#: Least bytes one fetch reads (a page of small records in one trip to the pool).
READ_AHEAD_BYTES = 256 * 1024
#: Fetches one read may need before it runs with blocking reads on the loop instead
#: (a read touches one span per segment it crosses; this is far above that).
MAX_FETCHES = 64


class ReadPool:
    """A bounded pool of threads that fetch segment spans for reads on the loop.

    Thread-safe to create; :meth:`run` must be called from the event loop.
    Counters: `fetches` (spans read), `fetched_bytes`.
    """

    def __init__(self, threads: int = READ_THREADS) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.fetches = 0
        self.fetched_bytes = 0

    def _executor(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._lock:
                pool = self._pool
                if pool is None:
                    pool = self._pool = ThreadPoolExecutor(
                        self.threads, thread_name_prefix="topics-read"
                    )
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
        loop = asyncio.get_running_loop()
        for _ in range(MAX_FETCHES):
            token = read_ahead.set(ahead)
            try:
                return read()
            except ColdRead as need:
                miss = need
            finally:
                read_ahead.reset(token)
            hi = max(miss.hi, miss.lo + READ_AHEAD_BYTES)  # short at the end of the file
            buf = await loop.run_in_executor(self._executor(), miss.source.fetch, miss.lo, hi)
            self.fetches += 1
            self.fetched_bytes += len(buf)
            ahead.add(miss.source, miss.lo, buf)
        log.warning("a read needed more than %d segment fetches; reading on the loop", MAX_FETCHES)
        return read()

    def close(self) -> None:
        """Stop the threads (waits for running fetches); a later run starts new ones."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


#: The pool every read of this process uses.
read_pool = ReadPool()


#: Longest a historical read step waits for writes in flight (s): writes keep priority
#: without starving a scan when they never stop.
HISTORY_MAX_WAIT_S = 0.002


#: A historical step shorter than this (s) is not paced, only yielded after.
HISTORY_PACE_MIN_S = 0.0002
#: When the current task's historical step began (loop time), for pacing.
_step_started: ContextVar[float | None] = ContextVar("topics_history_step", default=None)


class HistoryGate:
    """Historical reads give way to writes waiting for their commit.

    A write (HTTP, WebSocket or Kafka produce) holds :meth:`write` while it waits
    for its commit point; a read catching up on history calls :meth:`turn` before
    each slice after the first. While any write is in flight the slice waits until
    none is (at most :data:`HISTORY_MAX_WAIT_S`), so the loop is free when the
    commit lands and the ack goes out at once; otherwise it only yields to the
    loop. Reads at the head never wait (docs/ARCHITECTURE.md, "The read path").
    Loop-only, like the engine.
    """

    def __init__(self) -> None:
        self.writes = 0
        self._idle: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

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

    async def turn(self) -> None:
        """Before a historical read step: yield, and wait while writes are in flight.

        Paced too: a step that kept the loop busy for `t` seconds is followed by a
        pause of `t` (once it exceeds :data:`HISTORY_PACE_MIN_S`), so history takes
        at most about half of the loop while live work is waiting for the rest.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = _step_started.get()
        if last is not None and now - last > HISTORY_PACE_MIN_S:
            await asyncio.sleep(now - last)
        try:
            await self._wait_writes(loop)
        finally:
            _step_started.set(loop.time())

    async def _wait_writes(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.writes:
            await asyncio.sleep(0)
            return
        if self._idle is None or self._loop is not loop:
            self._idle, self._loop = asyncio.Event(), loop
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), HISTORY_MAX_WAIT_S)
        except TimeoutError:
            pass


#: The gate every shell of this process uses.
history_gate = HistoryGate()
