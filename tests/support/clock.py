"""A manually driven :class:`~topics.clock.Clock` for deterministic tests."""

from __future__ import annotations

__all__ = ["TestClock"]


class TestClock:
    """A clock that only moves when the test says so.

    Wall time starts at `start_ms` (default 1_767_225_600_000,
    2026-01-01T00:00:00Z); monotonic time starts at 0.0 s. :meth:`advance` moves
    both; :meth:`set` steps the wall clock only (as an NTP step would), so
    monotonic time never goes backwards.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._now = start_ms
        self._mono_ms = 0

    def now_ms(self) -> int:
        return self._now

    def monotonic(self) -> float:
        return self._mono_ms / 1000

    def advance(self, ms: int) -> int:
        """Move time forward by `ms` (>= 0) and return the new wall time."""
        if ms < 0:
            raise ValueError("TestClock.advance takes a non-negative step")
        self._now += ms
        self._mono_ms += ms
        return self._now

    def set(self, now_ms: int) -> None:
        """Jump the wall clock to an absolute time (may go backwards, to test clock steps)."""
        self._now = now_ms
