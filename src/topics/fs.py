"""The filesystem seam's interface: every durable byte goes through an :class:`Fs`.

WAL, segments, snapshots, recovery, the data-dir lock and the offline (Spark)
reader take an `Fs` instead of calling the OS directly, so tests can substitute
a disk that crashes or fails; :class:`topics.storage.fs.RealFs` is the
production implementation (docs/ARCHITECTURE.md, "Layers"). Like
:mod:`topics.clock`, this module has no dependency, so every layer may name the
seam without importing storage.

What only some filesystems can do is a capability of the seam, never a test of
the implementation's type: :meth:`File.map` returns None when the file cannot
be memory-mapped (an in-memory test disk), and the reader falls back to `pread`.

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

    def fsync(self) -> None:
        """Flush file data and metadata to stable storage."""
        ...

    def truncate(self, size: int) -> None:
        """Cut or extend (with zeros) the file to `size` bytes."""
        ...

    def size(self) -> int:
        """The file's current size in bytes."""
        ...

    def map(self) -> mmap.mmap | None:
        """A read-only memory map of the whole file as it is now, or None.

        None when the file is empty or this `Fs` cannot map its files (then
        read with :meth:`pread`). The map stays valid after :meth:`close`; it is
        released when the last reference to it goes. Raises OSError.
        """
        ...

    def no_readahead(self) -> None:
        """Read only the bytes asked for from this handle: no speculative readahead.

        For reads of history that pace their own I/O (docs/ARCHITECTURE.md, "The
        read path"); a hint, so a `Fs` without one may ignore it.
        """
        ...

    def lock(self) -> bool:
        """Take an exclusive advisory lock on the file without waiting.

        True when taken; False when another open file holds it (another process,
        or another open of the same file in this one). The lock is of the file
        its path names: when that path was unlinked or replaced since the open,
        nothing is held and FileNotFoundError is raised (open it again). Held
        until :meth:`unlock` or :meth:`close`. Raises OSError.
        """
        ...

    def unlock(self) -> None:
        """Release the lock taken by :meth:`lock` (nothing when none is held)."""
        ...

    def close(self) -> None:
        """Release the descriptor (and a lock it holds); idempotent."""
        ...


class Fs(Protocol):
    """Filesystem operations used by storage, the data-dir lock and the offline reader."""

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> File:
        """Open `path` (read-only unless `write`); `create` makes it if missing.

        With `exclusive` (and `create`), FileExistsError when `path` already
        exists, so the caller knows it made the file. Raises OSError
        (FileNotFoundError when missing and not `create`).
        """
        ...

    def replace(self, src: str, dst: str) -> None:
        """Atomically rename `src` over `dst` (durable only after :meth:`fsync_dir`)."""
        ...

    def unlink(self, path: str) -> None:
        """Remove a file name (durable only after :meth:`fsync_dir` of its directory)."""
        ...

    def rmdir(self, path: str) -> None:
        """Remove an empty directory (durable only after :meth:`fsync_dir` of its parent)."""
        ...

    def rmtree(self, path: str) -> None:
        """Remove `path` and, when it is a directory, everything under it.

        A symlink (even to a directory) is removed itself, never followed. What
        can be removed is, even when something cannot: then OSError is raised
        (FileNotFoundError when nothing is there).
        """
        ...

    def listdir(self, path: str) -> list[str]:
        """The names in directory `path`, sorted. Raises OSError."""
        ...

    def mkdir(self, path: str) -> None:
        """Create one directory; FileExistsError when `path` exists, OSError otherwise."""
        ...

    def makedirs(self, path: str) -> None:
        """Create `path` and missing parents; an existing directory is fine."""
        ...

    def exists(self, path: str) -> bool:
        """Whether `path` names something (a symlink counts only if its target exists)."""
        ...

    def lexists(self, path: str) -> bool:
        """Whether `path` names something, a dangling symlink included."""
        ...

    def isdir(self, path: str) -> bool:
        """Whether `path` is a directory (following symlinks)."""
        ...

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and unlinks inside directory `path` durable."""
        ...
