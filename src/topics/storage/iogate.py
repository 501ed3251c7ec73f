"""WAL syncs go to the disk before reads of history (docs/ARCHITECTURE.md, "The read path").

A cold read of a segment file and a WAL `fdatasync` share one device queue: a
large read in flight when a write's sync is issued makes the acknowledgement
wait for it. Reads off the loop therefore fetch in pieces of at most
:data:`READ_PIECE_BYTES`, and before each piece wait while any WAL sync is in
flight (at most :data:`READ_YIELD_MAX_S`, so a log that never stops syncing
cannot starve a reader). A sync then waits behind one small read at most.
Thread-safe: syncs happen on the WAL writer threads, reads on the read pool.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["READ_PIECE_BYTES", "READ_YIELD_MAX_S", "IoGate", "io_gate"]

#: Largest single read a fetch of history issues (bytes).
READ_PIECE_BYTES = 128 * 1024
#: Longest a piece of a history read waits for WAL syncs in flight (s).
READ_YIELD_MAX_S = 0.005


class IoGate:
    """Counts WAL syncs in flight; readers of history wait for none to be."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._syncing = 0

    @contextmanager
    def sync(self) -> Iterator[None]:
        """Held by a WAL writer around one `fdatasync`."""
        with self._cond:
            self._syncing += 1
        try:
            yield
        finally:
            with self._cond:
                self._syncing -= 1
                if not self._syncing:
                    self._cond.notify_all()

    def before_read(self) -> None:
        """Block (up to :data:`READ_YIELD_MAX_S`) while any WAL sync is in flight."""
        if not self._syncing:  # a racy peek is fine: it only saves the lock
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing, READ_YIELD_MAX_S)


#: The gate of this process.
io_gate = IoGate()
