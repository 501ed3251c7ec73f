"""Time seam for the engine.

Everything in `engine/` and `storage/` reads time through a :class:`Clock`, so
tests can drive TTL expiry, lease deadlines, dedupe windows and auto-priority
decay with a :class:`TestClock` instead of sleeping. Only this module may call
the wall clock (enforced by a ruff banned-API rule).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "TestClock"]


class Clock(Protocol):
    """A source of wall-clock milliseconds since the Unix epoch."""

    def now_ms(self) -> int:
        """Current time in integer ms since the epoch."""
        ...


class SystemClock:
    """The real wall clock (`time.time()`), in integer milliseconds."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)


class TestClock:
    """A manually driven clock for deterministic tests.

    Starts at `start_ms` (default 1_767_225_600_000, 2026-01-01T00:00:00Z) and
    only moves when :meth:`advance` or :meth:`set` is called.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move time forward by `ms` (>= 0) and return the new time."""
        if ms < 0:
            raise ValueError("TestClock.advance takes a non-negative step")
        self._now += ms
        return self._now

    def set(self, now_ms: int) -> None:
        """Jump to an absolute time (may go backwards, to test clock steps)."""
        self._now = now_ms
