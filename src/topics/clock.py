"""Time seam for the engine and storage.

Everything in `engine/` and `storage/` reads time through a :class:`Clock`, so
tests can drive TTL expiry, lease deadlines, dedupe windows, auto-priority
decay and the storage timers (checkpoint interval, WAL disk-full retries) with
a manually driven clock instead of sleeping (docs/ARCHITECTURE.md, "Layers").
Only this module calls the OS clocks there (enforced by ruff banned-API rules:
`pyproject.toml`, and `ruff.toml` in `engine/` and `storage/`).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Wall-clock milliseconds since the Unix epoch, and a monotonic reading."""

    def now_ms(self) -> int:
        """Current time in integer ms since the epoch (may step backwards)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go backwards.

        For intervals and durations (timers, elapsed time in reports), never for
        timestamps: only differences between two readings mean anything.
        """
        ...


class SystemClock:
    """The real clocks: `time.time()` in integer ms, and `time.monotonic()` in seconds."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()
