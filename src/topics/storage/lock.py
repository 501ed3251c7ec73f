"""`.topics.lock`: one process per data directory.

An advisory exclusive `flock` held for the life of the server. A second process
pointed at the same directory fails at startup instead of appending to the same
WAL (README.md "Durability and the data directory"). The lock is not durable
state, so it uses the OS directly rather than the Fs seam.

A start that fails after taking the lock can undo itself with
:meth:`DataDirLock.discard`: it removes what this process added to the data
directory (the lock file, new top-level entries, directories it created), so a
failed `topics serve` leaves the filesystem as it found it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil

__all__ = ["LOCK_NAME", "DataDirError", "DataDirLock", "DataDirLocked", "data_dir_problem"]

LOCK_NAME = ".topics.lock"


class DataDirError(Exception):
    """The data directory cannot be used; the message is one line naming the path."""


class DataDirLocked(DataDirError):
    """Another process holds the data directory."""


def _nearest_existing(path: str) -> str:
    """`path` or its closest ancestor that exists (lstat); `/` or `.` at worst."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def data_dir_problem(data_dir: str) -> str | None:
    """Why `data_dir` cannot be a data directory, without touching the disk; else None.

    Catches the cases that need no write to detect: the path is an existing
    non-directory, or a missing path whose closest existing ancestor is not a
    directory (`file/sub`). Returns a one-line message.
    """
    if os.path.lexists(data_dir):
        if not os.path.isdir(data_dir):
            return f"data directory {data_dir} exists and is not a directory"
        return None
    anc = _nearest_existing(data_dir)
    if os.path.lexists(anc) and not os.path.isdir(anc):
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

    Attributes: `path` (the lock file), `created_dirs` (directories this call
    created, outermost first), `created_file` (whether the lock file is new).
    """

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_NAME)
        self.fd = -1
        self.created_dirs: list[str] = []
        self.created_file = False
        self._before: set[str] = set()
        self._previous = b""
        problem = data_dir_problem(data_dir)
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
            self._before = set(os.listdir(data_dir))
        except OSError as exc:
            self._undo_lock()
            raise DataDirError(f"cannot read data directory {data_dir}: {_why(exc)}") from None

    def _make_dirs(self) -> None:
        missing: list[str] = []
        p = os.path.abspath(self.data_dir)
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
                continue  # created concurrently by someone else: not ours
            self.created_dirs.append(d)

    def _acquire(self) -> None:
        # The lock file may be unlinked by a failed start (see discard) between our
        # open and our flock; then we hold a lock on a dead inode, so check that the
        # path still names the file we locked and retry otherwise.
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                created = True
            except FileExistsError:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # unlinked in between: try to create it again
                created = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                os.close(fd)
                raise DataDirLocked(
                    f"data directory {self.data_dir} is in use by another topics process"
                    + (f" (pid {holder})" if holder else "")
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.fd = fd
        self.created_file = created
        # An old file keeps its text if this start fails (see _undo_lock).
        self._previous = b"" if created else os.pread(fd, 4096, 0)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def _remove_created_dirs(self) -> None:
        for d in reversed(self.created_dirs):
            with contextlib.suppress(OSError):  # not empty any more: not ours alone
                os.rmdir(d)

    def _undo_lock(self) -> None:
        # Remove the lock file if this start created it (else restore its old
        # text), release, and remove the directories this start created. The file
        # is unlinked while still locked: a process that opened it just before
        # sees, once it gets the lock, that the path is gone and retries.
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                if self.created_file:
                    os.unlink(self.path)
                else:
                    os.ftruncate(self.fd, 0)
                    os.pwrite(self.fd, self._previous, 0)
        self.release()
        self._remove_created_dirs()

    def release(self) -> None:
        """Unlock and close (the lock file stays: the normal end of a server)."""
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1

    def discard(self) -> None:
        """Undo a failed start, then release.

        Removes every top-level entry of the data directory that appeared after
        the lock was taken (what recovery created), the lock file when this start
        created it, and the directories this start created. Entries that existed
        before the start are never touched. Errors while removing are ignored
        (best effort; the process is about to exit).
        """
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            for name in set(os.listdir(self.data_dir)) - self._before:
                p = os.path.join(self.data_dir, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(p)
        self._undo_lock()
