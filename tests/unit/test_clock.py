"""The time seam: `SystemClock` and the tests' `TestClock` (docs/ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import pytest
from tests.support.clock import TestClock

from topics.clock import Clock, SystemClock


def test_system_clock_reads_both_clocks() -> None:
    clock: Clock = SystemClock()
    a, b = clock.monotonic(), clock.monotonic()
    assert b >= a
    assert clock.now_ms() > 1_700_000_000_000


def test_test_clock_moves_only_when_told() -> None:
    c = TestClock(1000)
    clock: Clock = c
    assert (clock.now_ms(), clock.monotonic()) == (1000, 0.0)
    assert c.advance(1500) == 2500
    assert (clock.now_ms(), clock.monotonic()) == (2500, 1.5)
    c.set(0)  # a wall-clock step back: monotonic time does not follow
    assert (clock.now_ms(), clock.monotonic()) == (0, 1.5)
    with pytest.raises(ValueError):
        c.advance(-1)
