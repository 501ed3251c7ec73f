"""The filesystem seam's interface: every durable byte goes through an :class:`Fs`.

WAL, segments, snapshots, recovery and the data-dir lock take an `Fs` instead of
calling the OS directly, so tests can substitute a disk that crashes or fails;
:class:`topics.storage.fs.RealFs` is the production implementation. Like
:mod:`topics.clock`, this module has no dependency, so every layer may name the
seam without importing storage.

`File.pwrite` returns the number of bytes written, exactly like `pwrite(2)`: a
short write is possible and callers that need all-or-nothing must loop
(:func:`topics.storage.fs.write_all`). It takes any bytes-like object
(:data:`Data`) and must not keep a reference to it after returning (the
caller's buffer is handed over without a copy).
"""

from __future__ import annotations

import mmap
from typing import Protocol

__all__ = ["Fs", "File", "Data"]

#: What may be written: bytes, or a buffer handed over without copying it (a
#: memoryview slice, a bytearray, an anonymous mmap holding frames).
Data = bytes | bytearray | memoryview | mmap.mmap


class File(Protocol):
    """An open file descriptor with positional I/O."""

    def pread(self, size: int, offset: int) -> bytes:
        """Read up to `size` bytes at `offset` (fewer at EOF)."""
        ...

    def pwrite(self, data: Data, offset: int) -> int:
        """Write at `offset`; returns how many bytes were written (may be short)."""
        ...

    def fdatasync(self) -> None:
        """Flush file data (not all metadata) to stable storage."""
        ...

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class Fs(Protocol):
    """Filesystem operations used by storage."""

    def open(self, path: str, *, create: bool = False, write: bool = False) -> File:
        """Open `path` (read-only unless `write`); `create` makes it if missing."""
        ...

    def replace(self, src: str, dst: str) -> None:
        """Atomically rename `src` over `dst` (durable only after :meth:`fsync_dir`)."""
        ...

    def unlink(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None:
        """Remove an empty directory (durable only after :meth:`fsync_dir` of its parent)."""
        ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str) -> None: ...

    def exists(self, path: str) -> bool: ...

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and unlinks inside directory `path` durable."""
        ...
