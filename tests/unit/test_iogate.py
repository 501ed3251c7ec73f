"""WAL syncs go first: history reads wait while one is in flight, a bounded time.

docs/ARCHITECTURE.md, "The read path"; `topics.storage.iogate`.
"""

from __future__ import annotations

import threading
import time

from topics.storage.iogate import READ_YIELD_MAX_S, IoGate


def test_a_read_waits_for_the_sync_in_flight() -> None:
    gate = IoGate()
    t0 = time.monotonic()
    gate.before_read()  # nothing syncing: no wait
    assert time.monotonic() - t0 < READ_YIELD_MAX_S

    started = threading.Event()
    release = threading.Event()

    def syncer() -> None:
        with gate.sync():
            started.set()
            release.wait(5)

    th = threading.Thread(target=syncer)
    th.start()
    started.wait(5)
    waited: list[float] = []

    def reader() -> None:
        t = time.monotonic()
        gate.before_read()
        waited.append(time.monotonic() - t)

    rd = threading.Thread(target=reader)
    rd.start()
    time.sleep(READ_YIELD_MAX_S / 5)
    release.set()  # the sync ends before the cap: the reader goes on at once
    rd.join(5)
    th.join(5)
    assert waited and READ_YIELD_MAX_S / 10 < waited[0] < 1.0


def test_a_sync_that_never_ends_does_not_starve_reads() -> None:
    gate = IoGate()
    with gate.sync():
        t = time.monotonic()
        gate.before_read()
        took = time.monotonic() - t
    assert READ_YIELD_MAX_S * 0.8 <= took < READ_YIELD_MAX_S + 0.5


def test_a_fetch_in_pieces_reads_the_same_bytes(tmp_path) -> None:
    from topics.storage.fs import RealFs
    from topics.storage.iogate import READ_PIECE_BYTES
    from topics.storage.topicstore import SegmentSource

    data = bytes(range(256)) * (READ_PIECE_BYTES * 3 // 256 + 7)
    path = tmp_path / "seg-1.data"
    path.write_bytes(data)
    seg = SegmentSource(RealFs(), str(path), sealed=True)
    for lo, hi in ((0, 10), (5, READ_PIECE_BYTES + 9), (0, len(data)), (100, len(data) + 5000)):
        assert seg.fetch(lo, hi) == data[lo:hi]
