"""`.topics.lock`: one process per data directory.

An advisory exclusive lock (:meth:`topics.fs.File.lock`, `flock` on a real
filesystem) held for the life of the server. A second process pointed at the
same directory fails at startup instead of appending to the same WAL (README.md
"Durability and the data directory"). Every file operation goes through the Fs
seam (docs/ARCHITECTURE.md, "Layers"), so tests can run the lock on a fake disk.

A start that fails after taking the lock can undo itself with
:meth:`DataDirLock.discard`: it removes what this process added to the data
directory (the lock file, new top-level entries, directories it created), so a
failed `topics serve` leaves the filesystem as it found it.
"""

from __future__ import annotations

import contextlib
import errno
import os

from topics.fs import File, Fs
from topics.storage.fs import RealFs, write_all

__all__ = ["LOCK_NAME", "DataDirError", "DataDirLock", "DataDirLocked", "data_dir_problem"]

LOCK_NAME = ".topics.lock"


class DataDirError(Exception):
    """The data directory cannot be used; the message is one line naming the path."""


class DataDirLocked(DataDirError):
    """Another process holds the data directory."""


def _nearest_existing(fs: Fs, path: str) -> str:
    """`path` or its closest ancestor that exists (lstat); `/` or `.` at worst."""
    p = os.path.abspath(path)
    while not fs.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def data_dir_problem(data_dir: str, fs: Fs | None = None) -> str | None:
    """Why `data_dir` cannot be a data directory, without writing anything; else None.

    Catches the cases that need no write to detect: the path is an existing
    non-directory, or a missing path whose closest existing ancestor is not a
    directory (`file/sub`). Returns a one-line message. `fs` defaults to the
    real filesystem.
    """
    fs = fs or RealFs()
    if fs.lexists(data_dir):
        if not fs.isdir(data_dir):
            return f"data directory {data_dir} exists and is not a directory"
        return None
    anc = _nearest_existing(fs, data_dir)
    if fs.lexists(anc) and not fs.isdir(anc):
        return f"cannot create data directory {data_dir}: {anc} is not a directory"
    return None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class DataDirLock:
    """Holds `<data_dir>/.topics.lock` until :meth:`release` (or process exit).

    Creates `data_dir` (and missing parents) when absent. Raises
    :class:`DataDirLocked` when another process holds the lock, and
    :class:`DataDirError` when the directory cannot be created or the lock file
    cannot be opened (not a directory, permission denied, read-only
    filesystem...). On either error nothing this call created is left behind.
    `fs` defaults to the real filesystem.

    Attributes: `path` (the lock file), `created_dirs` (directories this call
    created, outermost first), `created_file` (whether the lock file is new),
    `file` (the open lock file while held, else None).
    """

    def __init__(self, data_dir: str, *, fs: Fs | None = None) -> None:
        self.fs: Fs = fs or RealFs()
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_NAME)
        self.file: File | None = None
        self.created_dirs: list[str] = []
        self.created_file = False
        self._before: set[str] = set()
        self._previous = b""
        problem = data_dir_problem(data_dir, self.fs)
        if problem is not None:
            raise DataDirError(problem)
        try:
            self._make_dirs()
        except OSError as exc:
            self._remove_created_dirs()
            raise DataDirError(f"cannot create data directory {data_dir}: {_why(exc)}") from None
        try:
            self._acquire()
        except DataDirLocked:
            self._undo_lock()
            raise
        except OSError as exc:
            self._undo_lock()
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise DataDirError(
                    f"data directory {data_dir} is not writable: "
                    f"cannot open {LOCK_NAME} ({_why(exc)})"
                ) from None
            raise DataDirError(f"cannot open the lock file {self.path}: {_why(exc)}") from None
        try:
            # Everything present now existed before this start (or is our lock file).
            self._before = set(self.fs.listdir(data_dir))
        except OSError as exc:
            self._undo_lock()
            raise DataDirError(f"cannot read data directory {data_dir}: {_why(exc)}") from None

    def _make_dirs(self) -> None:
        fs = self.fs
        missing: list[str] = []
        p = os.path.abspath(self.data_dir)
        while not fs.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        for d in reversed(missing):
            try:
                fs.mkdir(d)
            except FileExistsError:
                if not fs.isdir(d):
                    raise
                continue  # created concurrently by someone else: not ours
            self.created_dirs.append(d)

    def _acquire(self) -> None:
        # The lock file may be unlinked by a failed start (see discard) between our
        # open and our lock; File.lock then reports that the path no longer names
        # the file we opened (FileNotFoundError), and we open it again.
        fs = self.fs
        while True:
            try:
                f = fs.open(self.path, create=True, write=True, exclusive=True)
                created = True
            except FileExistsError:
                try:
                    f = fs.open(self.path, write=True)
                except FileNotFoundError:
                    continue  # unlinked in between: try to create it again
                created = False
            try:
                locked = f.lock()
            except FileNotFoundError:
                f.close()
                continue
            except BaseException:
                f.close()
                raise
            if locked:
                break
            try:
                holder = f.pread(64, 0).decode(errors="replace").strip()
            finally:
                f.close()
            raise DataDirLocked(
                f"data directory {self.data_dir} is in use by another topics process"
                + (f" (pid {holder})" if holder else "")
            )
        self.file = f
        self.created_file = created
        # An old file keeps its text if this start fails (see _undo_lock).
        self._previous = b"" if created else f.pread(4096, 0)
        f.truncate(0)
        write_all(f, f"{os.getpid()}\n".encode(), 0)

    def _remove_created_dirs(self) -> None:
        for d in reversed(self.created_dirs):
            with contextlib.suppress(OSError):  # not empty any more: not ours alone
                self.fs.rmdir(d)

    def _undo_lock(self) -> None:
        # Remove the lock file if this start created it (else restore its old
        # text), release, and remove the directories this start created. The file
        # is unlinked while still locked: a process that opened it just before
        # sees, once it gets the lock, that the path is gone and retries.
        f = self.file
        if f is not None:
            with contextlib.suppress(OSError):
                if self.created_file:
                    self.fs.unlink(self.path)
                else:
                    f.truncate(0)
                    write_all(f, self._previous, 0)
        self.release()
        self._remove_created_dirs()

    def release(self) -> None:
        """Unlock and close (the lock file stays: the normal end of a server)."""
        f, self.file = self.file, None
        if f is not None:
            try:
                f.unlock()
            finally:
                f.close()

    def discard(self) -> None:
        """Undo a failed start, then release.

        Removes every top-level entry of the data directory that appeared after
        the lock was taken (what recovery created), the lock file when this start
        created it, and the directories this start created. Entries that existed
        before the start are never touched. Errors while removing are ignored
        (best effort; the process is about to exit).
        """
        if self.file is None:
            return
        fs = self.fs
        with contextlib.suppress(OSError):
            for name in set(fs.listdir(self.data_dir)) - self._before:
                with contextlib.suppress(OSError):
                    fs.rmtree(os.path.join(self.data_dir, name))
        self._undo_lock()
