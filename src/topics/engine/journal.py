"""What the engine needs from durable storage: the journal seam.

The engine hands every mutation to a :class:`Journal` as one typed event
(:mod:`topics.engine.events`) before (or, for staged writes, instead of) making
it visible: `journal.log(event)` returns a :class:`Handle` that completes once
the event is durable for its topic's durability class (README "Durability and
the data directory"), reporting success or failure. :class:`MemoryJournal` is
the in-memory implementation: it keeps nothing and completes every handle at
once. The WAL-backed journal (sharded, group-committed; docs/ARCHITECTURE.md,
"The write path") implements the same protocol and completes handles from its
writer threads through the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from topics.engine.events import Event
    from topics.errors import TopicsError

__all__ = ["Journal", "MemoryJournal", "Handle", "DONE", "NOT_LOGGED"]


class Handle:
    """The completion of one logged event.

    `done` turns True once the event is durable for its class (`ok` True) or can
    no longer become durable (`ok` False; `error` may say why better than
    "500 internal", e.g. `507` when the disk is full). `fsync_ms` is the
    duration of the `fdatasync` that made an fsync-class batch durable (ms, 0
    otherwise); `throttle_ms` is how long the event waited for a commit window
    the delivery governor widened (ms, docs/SCHEDULER.md). Callbacks run on the event loop, in the order they were added,
    when the handle completes (at once when it already has).
    """

    __slots__ = ("done", "ok", "error", "fsync_ms", "throttle_ms", "_callbacks")

    def __init__(self, done: bool = False, ok: bool = False) -> None:
        self.done = done
        self.ok = ok
        self.error: TopicsError | None = None
        self.fsync_ms = 0.0
        self.throttle_ms = 0.0
        self._callbacks: list[Callable[[bool], None]] | None = None

    def add_done_callback(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(ok)` once the handle completes (now, when it already has)."""
        if self.done:
            fn(self.ok)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def settle(self, ok: bool, error: TopicsError | None = None, fsync_ms: float = 0.0) -> None:
        """Complete the handle (the journal's side; a second call does nothing).

        The callbacks run here, in order; an exception from one propagates
        after the handle is marked done (the rest are skipped).
        """
        if self.done:
            return
        self.done = True
        self.ok = ok
        self.error = error
        self.fsync_ms = fsync_ms
        cbs, self._callbacks = self._callbacks, None
        if cbs:
            for fn in cbs:
                fn(ok)


#: A handle that completed successfully: what a journal returns for an event it
#: made durable at once (or that its class never logs). Shared; never settled.
DONE = Handle(True, True)
#: A completed, failed handle: an event a journal could not log and whose
#: refusal it does not raise (the best-effort floors and leases log).
NOT_LOGGED = Handle(True, False)


class Journal(Protocol):
    """Durable log of engine mutations (the WAL, or nothing for memory mode)."""

    def log(self, event: Event) -> Handle:
        """Log `event`; the handle completes when it is durable for its class.

        Raises TopicsError when the log refuses the event outright (nothing is
        logged then), e.g. `429 throttled` (the log's queue is full), `507
        insufficient_storage` (its disk is full), `413` (a batch larger than a
        WAL file), `500` (read-only log).
        """
        ...


class MemoryJournal:
    """No durability: every event is done at once."""

    def log(self, event: Event) -> Handle:
        return DONE
