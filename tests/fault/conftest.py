"""Shared pieces of the WAL/recovery fault tests (see tests/support/durable.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.durable import Durable
from tests.support.fakedisk import FakeDisk

# (mode, damage, seed) of every power-loss flavour a sweep tries at each crash point.
CRASH_FLAVOURS: list[tuple[str, str | None, int]] = [
    ("drop_all", None, 0),
    ("subset", None, 1),
    ("subset", None, 2),
    ("torn_last", "prefix", 3),
    ("torn_last", "zero_sector", 4),
    ("torn_last", "garble", 5),
]


def flavour_id(f: tuple[str, str | None, int]) -> str:
    mode, damage, seed = f
    return f"{mode}-{damage}-{seed}" if damage else f"{mode}-{seed}"


@pytest.fixture(autouse=True)
def _quiet_storage_logs(caplog: pytest.LogCaptureFixture) -> None:
    # Injected faults make the WAL log errors by design; keep them out of the report
    # unless a test fails (caplog still captures them).
    caplog.set_level(logging.CRITICAL, logger="topics")


@pytest.fixture(autouse=True)
def _no_leaked_writer_threads() -> Iterator[None]:
    """Every test must stop the WAL writer threads it started (even after a crash)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name.startswith("wal-writer")
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked, f"writer threads left running: {[t.name for t in leaked]}"


@pytest.fixture
def disk() -> FakeDisk:
    return FakeDisk()


@pytest.fixture
def durable(disk: FakeDisk) -> Iterator[Durable]:
    h = Durable(disk)
    h.open()
    yield h
    h.shutdown()
