"""The loop's fan-out: live deliveries of the publications, run together.

When a topic publishes, the listener of each parked stream (SSE watch streams,
WebSocket subscriptions) hands its delivery to :class:`Fanout` instead of waking
the stream's task (docs/ARCHITECTURE.md, "Live delivery"). The first
:data:`INLINE_STREAMS` deliveries of a loop turn run at once, inside the
publication: a record reaches a few subscribers without waiting for anything.
The rest run in one go right after the response of the request that published
(the HTTP app calls :meth:`Fanout.flush` once it has written it), or, for a
publication with no HTTP response (Kafka produce, WebSocket publish, a router
forward, a commit that completes later), from one `call_soon` callback. So a
write with many subscribers is acknowledged after a bounded number of
deliveries, and any number of parked streams cost no task wake-up at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["Fanout", "INLINE_STREAMS"]

#: Deliveries a loop turn runs inside the publication itself (about 14 µs each).
INLINE_STREAMS = 16

#: A stream's delivery of a publication on a topic: True when it wrote to its socket.
Delivery = Callable[[Any], bool]


class Fanout:
    """Deliveries due on one event loop (loop-only; the HTTP app holds one).

    Counters: `runs` (batches of queued deliveries run), `writes` (deliveries
    that wrote to their socket, inline or queued).
    """

    __slots__ = ("_loop", "_due", "_scheduled", "_inline", "runs", "writes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[tuple[Delivery, Any]] = []
        self._scheduled = False
        self._inline = 0  # deliveries run inside publications since the last turn
        self.runs = 0
        self.writes = 0

    def add(self, deliver: Delivery, topic: Any) -> None:
        """Run `deliver(topic)` now (within the turn's inline budget), else queue it
        for the next :meth:`flush` or loop turn."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._turn)
        if self._inline < INLINE_STREAMS:
            self._inline += 1
            self.writes += deliver(topic)
            return
        self._due.append((deliver, topic))

    def _turn(self) -> None:
        self._scheduled = False
        self._inline = 0
        self.flush()

    def flush(self) -> None:
        """Run every delivery queued so far (nothing to do is the common case)."""
        if not self._due:
            return
        self.runs += 1
        due, self._due = self._due, []
        for deliver, topic in due:
            self.writes += deliver(topic)
