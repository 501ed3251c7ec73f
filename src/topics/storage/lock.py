"""`.topics.lock`: one process per data directory.

An advisory exclusive `flock` held for the life of the server. A second process
pointed at the same directory fails at startup instead of appending to the same
WAL (seed: on-disk layout). The lock is not durable state, so it uses the OS
directly rather than the Fs seam.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["DataDirLock", "DataDirLocked"]

LOCK_NAME = ".topics.lock"


class DataDirLocked(Exception):
    """Another process holds the data directory."""


class DataDirLock:
    """Holds `<data_dir>/.topics.lock` until :meth:`release` (or process exit)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_NAME)
        os.makedirs(data_dir, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise DataDirLocked(
                f"data directory {data_dir} is in use by another topics process"
                + (f" (pid {holder})" if holder else "")
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
