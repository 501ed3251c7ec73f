"""The I/O seam: every durable byte goes through an :class:`Fs`.

WAL, segments, snapshots, recovery, the data-dir lock and the offline reader
take an `Fs` instead of calling the OS directly, so tests can substitute a disk
that crashes or fails (the Fs interface is :mod:`topics.fs`). :class:`RealFs` is
the production implementation, and the only module that calls the OS file API
(enforced by ruff banned-API rules, docs/ARCHITECTURE.md "Layers"): unbuffered
file descriptors (`os.open`, `os.pwrite`, `os.pread`, `os.fdatasync`), `mmap`
for sealed segments, `flock` for the data-dir lock, atomic `os.replace`, and a
directory fsync to make renames and creations durable.

`File.pwrite` returns the number of bytes written, exactly like `pwrite(2)`: a
short write is possible and callers that need all-or-nothing must loop
(:func:`write_all`). It takes any bytes-like object (:data:`Data`) and must not
keep a reference to it after returning (the caller's buffer is handed over
without a copy).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil

from topics.fs import Data, File, Fs

__all__ = ["Fs", "File", "RealFs", "RealFile", "Data", "write_all"]


class RealFile:
    """A raw OS file descriptor (no Python buffering)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def pwrite(self, data: Data, offset: int) -> int:
        return os.pwrite(self.fd, data, offset)

    def fdatasync(self) -> None:
        os.fdatasync(self.fd)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def map(self) -> mmap.mmap | None:
        size = self.size()
        if size == 0:
            return None  # mmap refuses an empty file
        return mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)

    def no_readahead(self) -> None:
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def lock(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # Another process may have unlinked the file between our open and our
        # flock (a failed start removing its lock file): a lock on that inode
        # guards nothing, so check that the path still names it.
        try:
            same = os.path.samestat(os.fstat(self.fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            raise FileNotFoundError(
                errno.ENOENT, "the path no longer names the file that was opened", self.path
            )
        return True

    def unlock(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RealFs:
    """The operating system's filesystem."""

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        flags = os.O_RDWR if write else os.O_RDONLY
        if create:
            flags |= os.O_CREAT | (os.O_EXCL if exclusive else 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        return RealFile(os.open(path, flags, 0o644), path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def rmtree(self, path: str) -> None:
        if not os.path.isdir(path) or os.path.islink(path):
            os.unlink(path)
            return
        shutil.rmtree(path, ignore_errors=True)  # as much as it can ...
        if os.path.lexists(path):  # ... then say that something stayed
            raise OSError(errno.ENOTEMPTY, "could not remove everything under", path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_all(f: File, data: Data, offset: int) -> None:
    """Write every byte of `data` at `offset`, looping over short writes.

    `data` is handed to `f.pwrite` as a memoryview (the rest of it after a
    short write): it is never copied, so writing 60 MiB of frames costs no
    second 60 MiB (docs/HTTP_INPUT.md "Large bodies"). Raises OSError from the
    underlying write; a zero-byte write is reported as `OSError(EIO)` so a
    stuck device cannot spin forever.
    """
    view = memoryview(data)
    while view:
        n = f.pwrite(view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[n:]
        offset += n


def write_file(fs: Fs, path: str, data: bytes) -> None:
    """Create (or truncate) `path` and make `data` its durable content (fdatasync).

    The caller syncs the directory when the name is new. Raises OSError.
    """
    f = fs.open(path, create=True, write=True)
    try:
        f.truncate(0)
        write_all(f, data, 0)
        f.fdatasync()
    finally:
        f.close()


def read_file(fs: Fs, path: str) -> bytes:
    """The whole content of `path`. Raises OSError."""
    f = fs.open(path)
    try:
        return f.pread(f.size(), 0)
    finally:
        f.close()


def list_names(fs: Fs, path: str) -> list[str]:
    """The names in directory `path` (unsorted), none when it does not exist. Raises OSError."""
    try:
        return fs.listdir(path)
    except FileNotFoundError:
        return []
