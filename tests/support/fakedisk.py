"""Fault-injection doubles for the storage seam (:mod:`topics.storage.fs`).

Three layers, composable in any order because each one takes and returns the
:class:`~topics.storage.fs.Fs` protocol:

* :class:`FakeDisk` — an in-memory filesystem that separates what a program
  *sees* (the live view: page cache + live namespace) from what would survive a
  power cut (the durable image). It decides **what** survives a crash.
* :class:`FaultFs` — makes the N-th call of one op class fail with a real
  ``OSError(errno.X)`` or a short write. It decides **which call** fails.
* :class:`MonitorFs` — a passive watcher that raises :class:`AssertionError`
  on the three ordering bugs that lose data (rename of an un-synced ``.tmp``,
  pruning the old snapshot before the new one's rename is durable, writing a
  segment's ``.idx`` before its ``.data`` is durable).

:func:`crash_points` picks the crash points of a SQLite-style sweep: probe the
number M of mutating ops of a workload (:attr:`FakeDisk.ops`), then for each k
re-run it on a fresh disk armed with :meth:`FakeDisk.crash_after` (k), recover
and check the oracle.

The model (see ``/work/shared/notes/reliability-anchors.md`` §2, §6):

* **Bytes.** Every inode holds ``durable`` bytes, a ``pending`` list of
  positioned writes and truncates in program order, and the ``live`` bytes
  (durable with pending applied), which is what reads see. ``fdatasync`` and
  ``fsync`` apply that file's pending ops to ``durable``.
* **Names.** Every directory has a live and a durable namespace. Creating,
  renaming and unlinking change the live namespace at once and queue a
  directory op; ``fsync_dir(d)`` makes ``d``'s live namespace durable. A rename
  between two directories is two independent ops (unlink in one, link in the
  other). Open handles keep their inode across unlink/replace, as in POSIX.
* **Crash.** Rebuilds nothing yet: the durable image is fixed at crash time
  according to the mode, and the device is frozen (every op raises
  ``OSError(EIO)``) until :meth:`FakeDisk.recover` rebuilds the live state from
  the durable image. Handles opened before the crash are dead afterwards
  (``EBADF``): the process that owned them did not survive the power cut.

Simplifications, chosen on purpose and relied on by the unit tests:

* Directory creation is durable immediately by default (journaled metadata).
  ``FakeDisk(durable_mkdir=False)`` makes a new directory's entry a pending op
  of its parent, like any other name.
* Directories cannot be renamed or removed; opening a directory raises
  ``IsADirectoryError`` even read-only (Linux would hand out a descriptor).
* ``subset`` crashes keep any subset of the pending ops (a later write can
  persist without an earlier one), applied in program order: a page cache
  writes back the *latest* contents of a page, so an older write never lands
  on top of a newer one at the same offset.
* ``zero_sector`` damage zeroes the part of one 512-byte, file-aligned sector
  that lies inside the torn write; bytes outside the write are never touched
  (the powersafe-overwrite assumption; damage outside the write is a separate,
  poke-based scenario — see :meth:`FakeDisk.poke`).
"""

from __future__ import annotations

import errno
import mmap
import os
import posixpath
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal, get_args

from topics.storage.fs import File, Fs

__all__ = [
    "SECTOR",
    "CrashMode",
    "Damage",
    "FakeDisk",
    "FakeFile",
    "FaultFile",
    "FaultFs",
    "FaultKind",
    "FaultRule",
    "MonitorFile",
    "MonitorFs",
    "OpClass",
    "crash_points",
]

CrashMode = Literal["drop_all", "subset", "torn_last"]
Damage = Literal["prefix", "zero_sector", "garble"]
OpClass = Literal[
    "pwrite",
    "pread",
    "fdatasync",
    "fsync",
    "truncate",
    "open",
    "replace",
    "unlink",
    "makedirs",
    "fsync_dir",
    "listdir",
]
FaultKind = Literal["EIO", "ENOSPC", "ESTALE", "EAGAIN", "short"]

SECTOR = 512
"""Size of the unit that ``zero_sector`` damage wipes."""

_CRASH_MODES: tuple[str, ...] = get_args(CrashMode)
_DAMAGES: tuple[str, ...] = get_args(Damage)
_OP_CLASSES: tuple[str, ...] = get_args(OpClass)
_FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)

_DIR = -1
"""Namespace entry value for a sub-directory (files map to inode numbers >= 1)."""


def _oserror(code: int, path: str, detail: str | None = None) -> OSError:
    """Build the same OSError subclass the OS would raise for `code`."""
    return OSError(code, detail or os.strerror(code), path)


def _norm(path: str) -> str:
    """Normalise a FakeDisk path: absolute, no ``.``/``..``/duplicate slashes.

    Relative paths are taken relative to ``/``.
    """
    path = os.fspath(path)
    if path == "":
        raise _oserror(errno.ENOENT, path)
    p = posixpath.normpath(posixpath.join("/", path))
    if p.startswith("//"):  # POSIX keeps a leading "//"; we do not
        p = "/" + p.lstrip("/")
    return p


def _apply_write(buf: bytearray, offset: int, data: bytes) -> None:
    """Positioned write with POSIX hole semantics (a gap reads as zeros).

    An empty write changes nothing, not even the size (as ``pwrite(2)``).
    """
    if not data:
        return
    end = offset + len(data)
    if len(buf) < offset:
        buf.extend(bytes(offset - len(buf)))
    buf[offset:end] = data


def _apply_truncate(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


@dataclass(frozen=True, slots=True)
class _Write:
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _Trunc:
    size: int


_FileOp = _Write | _Trunc


def _apply(buf: bytearray, op: _FileOp) -> None:
    if isinstance(op, _Write):
        _apply_write(buf, op.offset, op.data)
    else:
        _apply_truncate(buf, op.size)


@dataclass(slots=True)
class _Inode:
    ino: int
    durable: bytearray = field(default_factory=bytearray)
    live: bytearray = field(default_factory=bytearray)
    pending: list[_FileOp] = field(default_factory=list)
    # True once fsyncgate dropped dirty pages: live then shows bytes that are
    # neither durable nor pending (Linux keeps them in the page cache).
    diverged: bool = False


@dataclass(slots=True)
class _DirOp:
    """A pending change to one directory: name -> inode, `_DIR`, or None (gone)."""

    dir: str
    changes: dict[str, int | None]


@dataclass(frozen=True, slots=True)
class _Arm:
    target: int
    mode: CrashMode
    damage: Damage | None
    seed: int


class FakeDisk:
    """In-memory :class:`~topics.storage.fs.Fs` with a separate durable image.

    Attributes:
        lying_fsync: when true, ``fdatasync``/``fsync``/``fsync_dir`` succeed
            (and are counted) but promote nothing.
        fsyncgate: when true, any fsync failure injected by :class:`FaultFs`
            discards the file's dirty pages (Linux behaviour; a later fsync
            then succeeds without persisting them). A :class:`FaultRule` with
            ``fsyncgate=True`` does the same for just that rule.
        trace: every counted mutating op as ``(op, path)``, in order; handy
            for printing which op a crash point landed on.
        crashes: how many times the disk has crashed.
    """

    def __init__(self, *, durable_mkdir: bool = True) -> None:
        self.durable_mkdir = durable_mkdir
        self.lying_fsync = False
        self.fsyncgate = False
        self.trace: list[tuple[str, str]] = []
        self.crashes = 0
        self._lock = threading.RLock()
        self._ops = 0
        self._next_ino = 1
        self._inodes: dict[int, _Inode] = {}
        self._live: dict[str, dict[str, int]] = {"/": {}}
        self._durable: dict[str, dict[str, int]] = {"/": {}}
        self._dir_pending: list[_DirOp] = []
        self._dir_alias: dict[str, str] = {}  # renamed directory -> its former path
        self._frozen = False
        self._epoch = 0
        self._armed: _Arm | None = None
        # inode -> the handle holding its advisory lock (FakeFile.lock); a crash
        # ends the process that held them.
        self._locks: dict[int, FakeFile] = {}

    # ------------------------------------------------------------------ state

    @property
    def ops(self) -> int:
        """Number of mutating ops completed so far (never reset)."""
        return self._ops

    @property
    def frozen(self) -> bool:
        """True between a crash and :meth:`recover`."""
        return self._frozen

    def crash_after(
        self,
        n: int,
        mode: CrashMode = "drop_all",
        damage: Damage | None = None,
        seed: int = 0,
    ) -> None:
        """Crash once `n` more mutating ops have completed (``n == 0``: now).

        The n-th op itself returns normally; every op after it raises
        ``OSError(EIO)`` until :meth:`recover`.
        """
        _check_crash_args(mode, damage)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            self._check_power()
            if n == 0:
                self._crash_now(mode, damage, seed)
            else:
                self._armed = _Arm(self._ops + n, mode, damage, seed)

    def crash(
        self, mode: CrashMode = "drop_all", damage: Damage | None = None, seed: int = 0
    ) -> None:
        """Power loss now.

        Modes:
            ``drop_all``: every pending write/truncate and every un-synced
                directory op is lost.
            ``subset``: each pending file op and each pending directory op
                independently survives with probability 1/2 (seeded), applied
                in program order.
            ``torn_last``: like ``drop_all``, except that the last pending
                *write* of each file lands damaged: ``prefix`` keeps a strict
                prefix (1..len-1 bytes; nothing for a 1-byte write), ``zero_sector``
                lands whole but with one 512-byte sector of it zeroed,
                ``garble`` lands whole with one byte flipped. ``damage``
                defaults to ``prefix`` and is rejected for the other modes.
        """
        _check_crash_args(mode, damage)
        with self._lock:
            self._check_power()
            self._crash_now(mode, damage, seed)

    def recover(self) -> None:
        """Power back: rebuild the live state from the durable image."""
        with self._lock:
            if not self._frozen:
                raise RuntimeError("recover() without a crash")
            reach = self._reachable(self._durable)
            self._live = {d: dict(e) for d, e in self._durable.items() if d in reach}
            self._dir_alias = {}
            for node in self._inodes.values():
                node.live = bytearray(node.durable)
                node.pending = []
                node.diverged = False
            self._frozen = False

    def snapshot_durable(self) -> dict[str, bytes]:
        """Every file reachable through the durable namespace -> durable bytes.

        This is exactly what a recovery would find. Works while frozen.
        """
        with self._lock:
            return self._snapshot(self._durable, live=False)

    def snapshot_live(self) -> dict[str, bytes]:
        """Every file in the live namespace -> live bytes (what reads see)."""
        with self._lock:
            self._check_power()
            return self._snapshot(self._live, live=True)

    def durable_dirs(self) -> list[str]:
        """Directories that would exist after a crash right now."""
        with self._lock:
            return sorted(self._reachable(self._durable))

    def live_dirs(self) -> list[str]:
        """Directories that exist in the live namespace."""
        with self._lock:
            return sorted(self._live)

    def poke(self, path: str, offset: int, data: bytes) -> None:
        """Edit the durable image of `path` in place (a corruption scenario).

        While frozen the path is looked up in the durable namespace; otherwise
        in the live one, and the live bytes are rebuilt as durable + pending.
        Not counted as an op.
        """
        p = _norm(path)
        with self._lock:
            ns = self._durable if self._frozen else self._live
            parent, name = posixpath.split(p)
            ino = ns.get(parent, {}).get(name)
            if ino is None or ino == _DIR:
                raise _oserror(errno.ENOENT, p)
            node = self._inodes[ino]
            _apply_write(node.durable, offset, bytes(data))
            if not self._frozen:
                node.live = bytearray(node.durable)
                for op in node.pending:
                    _apply(node.live, op)
                node.diverged = False

    def check_invariants(self) -> None:
        """Assert the model's own consistency (used by the double's tests).

        live == durable + pending, for every inode that fsyncgate did not
        diverge and for every directory; the durable root exists.
        """
        with self._lock:
            assert "/" in self._durable and "/" in self._live
            for node in self._inodes.values():
                if node.diverged or self._frozen:
                    continue
                expect = bytearray(node.durable)
                for op in node.pending:
                    _apply(expect, op)
                assert expect == node.live, f"inode {node.ino}: live != durable + pending"
            if self._frozen:
                return
            for d, entries in self._live.items():
                expect_ns = dict(self._durable.get(d, {}))
                for dop in self._dir_pending:
                    if dop.dir == d:
                        _apply_dirop(expect_ns, dop)
                assert expect_ns == entries, f"dir {d}: live != durable + pending"

    # ---------------------------------------------------------------- Fs API

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> FakeFile:
        p = _norm(path)
        with self._lock:
            self._check_power()
            if p == "/":
                raise _oserror(errno.EISDIR, p)
            parent, name = posixpath.split(p)
            entries = self._dir(parent, p)
            ino = entries.get(name)
            if ino is not None and create and exclusive:
                raise _oserror(errno.EEXIST, p)
            if ino == _DIR:
                raise _oserror(errno.EISDIR, p)
            if ino is None:
                if not create:
                    raise _oserror(errno.ENOENT, p)
                ino = self._next_ino
                self._next_ino += 1
                self._inodes[ino] = _Inode(ino)
                entries[name] = ino
                self._queue_dirop(parent, {name: ino})
                self._count("create", p)
            return FakeFile(self, ino, p, write, self._epoch)

    def replace(self, src: str, dst: str) -> None:
        s, d = _norm(src), _norm(dst)
        with self._lock:
            self._check_power()
            sparent, sname = posixpath.split(s)
            sentries = self._dir(sparent, s)
            ino = sentries.get(sname)
            if ino is None:
                raise _oserror(errno.ENOENT, s)
            if ino == _DIR:
                self._rename_dir(s, d, sparent, sname)
                return
            dparent, dname = posixpath.split(d)
            dentries = self._dir(dparent, d)
            if dentries.get(dname) == _DIR:
                raise _oserror(errno.EISDIR, d)
            if s != d:
                del sentries[sname]
                dentries[dname] = ino
                if sparent == dparent:
                    self._queue_dirop(sparent, {sname: None, dname: ino})
                else:
                    self._queue_dirop(sparent, {sname: None})
                    self._queue_dirop(dparent, {dname: ino})
            self._count("replace", d)

    def _rename_dir(self, s: str, d: str, sparent: str, sname: str) -> None:
        """rename(2) of a directory onto an absent name (or an empty directory).

        The live subtree moves at once. The rename itself becomes durable with its
        parents' fsyncs, like any directory entry; the renamed directory's own
        contents are durable as far as they were fsynced, under whichever name
        survives a crash: the durable entries are copied to the new paths and an
        fsync of a directory under the new name updates the old one too.
        """
        if d == s or d.startswith(s + "/"):
            raise _oserror(errno.EINVAL, d)
        dparent, dname = posixpath.split(d)
        dentries = self._dir(dparent, d)
        existing = dentries.get(dname)
        if existing is not None:
            if existing != _DIR:
                raise _oserror(errno.ENOTDIR, d)
            if self._live.get(d):
                raise _oserror(errno.ENOTEMPTY, d)
        moved = [k for k in self._live if k == s or k.startswith(s + "/")]
        for k in moved:
            self._live[d + k[len(s) :]] = self._live.pop(k)
        for k in [k for k in self._durable if k == s or k.startswith(s + "/")]:
            self._durable[d + k[len(s) :]] = dict(self._durable[k])
        self._dir_alias[d] = s
        del self._dir(sparent, s)[sname]
        dentries[dname] = _DIR
        if sparent == dparent:
            self._queue_dirop(sparent, {sname: None, dname: _DIR})
        else:
            self._queue_dirop(sparent, {sname: None})
            self._queue_dirop(dparent, {dname: _DIR})
        self._count("replace", d)

    def unlink(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            parent, name = posixpath.split(p)
            entries = self._dir(parent, p)
            ino = entries.get(name)
            if ino is None:
                raise _oserror(errno.ENOENT, p)
            if ino == _DIR:
                raise _oserror(errno.EISDIR, p)
            del entries[name]
            self._queue_dirop(parent, {name: None})
            self._count("unlink", p)

    def rmdir(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            parent, name = posixpath.split(p)
            entries = self._dir(parent, p)
            if entries.get(name) != _DIR:
                raise _oserror(errno.ENOTDIR if name in entries else errno.ENOENT, p)
            if self._live.get(p):
                raise _oserror(errno.ENOTEMPTY, p)
            del entries[name]
            self._live.pop(p, None)
            self._queue_dirop(parent, {name: None})
            self._count("rmdir", p)

    def rmtree(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            parent, name = posixpath.split(p)
            e = self._dir(parent, p).get(name)
            if e is None:
                raise _oserror(errno.ENOENT, p)
            if e != _DIR:
                self.unlink(p)
                return
            for child in sorted(self._live[p]):
                self.rmtree(posixpath.join(p, child))
            self.rmdir(p)

    def listdir(self, path: str) -> list[str]:
        p = _norm(path)
        with self._lock:
            self._check_power()
            return sorted(self._dir(p, p))

    def mkdir(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            parent, name = posixpath.split(p)
            if p == "/" or name in self._dir(parent, p):
                raise _oserror(errno.EEXIST, p)
        self.makedirs(p)

    def makedirs(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            created = False
            cur = "/"
            parts = [c for c in p.split("/") if c]
            for i, comp in enumerate(parts):
                entries = self._live[cur]
                child = posixpath.join(cur, comp)
                e = entries.get(comp)
                if e is None:
                    entries[comp] = _DIR
                    self._live[child] = {}
                    self._durable[child] = {}
                    if self.durable_mkdir:
                        self._durable[cur][comp] = _DIR
                        for dop in self._dir_pending:  # superseded by this mkdir
                            if dop.dir == cur:
                                dop.changes.pop(comp, None)
                    else:
                        self._queue_dirop(cur, {comp: _DIR})
                    created = True
                elif e != _DIR:
                    last = i == len(parts) - 1
                    raise _oserror(errno.EEXIST if last else errno.ENOTDIR, p)
                cur = child
            if created:
                self._count("makedirs", p)

    def exists(self, path: str) -> bool:
        p = _norm(path)
        with self._lock:
            self._check_power()
            if p in self._live:
                return True
            parent, name = posixpath.split(p)
            return name in self._live.get(parent, {})

    def lexists(self, path: str) -> bool:
        return self.exists(path)  # no symlinks on a FakeDisk

    def isdir(self, path: str) -> bool:
        p = _norm(path)
        with self._lock:
            self._check_power()
            return p in self._live

    def fsync_dir(self, path: str) -> None:
        p = _norm(path)
        with self._lock:
            self._check_power()
            entries = self._dir(p, p)
            if not self.lying_fsync:
                self._durable[p] = dict(entries)
                self._dir_pending = [op for op in self._dir_pending if op.dir != p]
                # A renamed directory's contents are durable under its old name too
                # (the rename itself may not be).
                for new, old in self._dir_alias.items():
                    if p == new or p.startswith(new + "/"):
                        self._durable[old + p[len(new) :]] = dict(entries)
            self._count("fsync_dir", p)

    # ------------------------------------------------------------- internals

    def _check_power(self) -> None:
        if self._frozen:
            raise OSError(errno.EIO, "device frozen (FakeDisk crashed; call recover())")

    def _count(self, op: str, path: str) -> None:
        self._ops += 1
        self.trace.append((op, path))
        arm = self._armed
        if arm is not None and self._ops >= arm.target:
            self._armed = None
            self._crash_now(arm.mode, arm.damage, arm.seed)

    def _dir(self, d: str, orig: str) -> dict[str, int]:
        """Live entries of directory `d`, or the error the OS would raise."""
        entries = self._live.get(d)
        if entries is not None:
            return entries
        cur = "/"
        for comp in (c for c in d.split("/") if c):
            e = self._live[cur].get(comp)
            if e is None:
                raise _oserror(errno.ENOENT, orig)
            if e != _DIR:
                raise _oserror(errno.ENOTDIR, orig)
            cur = posixpath.join(cur, comp)
        raise AssertionError(f"FakeDisk namespace inconsistent at {d!r}")  # pragma: no cover

    def _queue_dirop(self, d: str, changes: dict[str, int | None]) -> None:
        self._dir_pending.append(_DirOp(d, changes))

    def _promote(self, node: _Inode) -> None:
        if self.lying_fsync:
            return
        for op in node.pending:
            _apply(node.durable, op)
        node.pending = []

    def _crash_now(self, mode: CrashMode, damage: Damage | None, seed: int) -> None:
        rng = random.Random(seed)
        for ino in sorted(self._inodes):
            node = self._inodes[ino]
            if mode == "subset":
                for op in node.pending:
                    if rng.random() < 0.5:
                        _apply(node.durable, op)
            elif mode == "torn_last":
                writes = [op for op in node.pending if isinstance(op, _Write)]
                if writes:
                    _apply(node.durable, _tear(writes[-1], damage or "prefix", rng))
            node.pending = []
        if mode == "subset":
            for dop in self._dir_pending:
                if rng.random() < 0.5:
                    _apply_dirop(self._durable[dop.dir], dop)
        self._dir_pending = []
        reach = self._reachable(self._durable)
        self._durable = {d: self._durable.get(d, {}) for d in reach}
        keep = {e for entries in self._durable.values() for e in entries.values() if e != _DIR}
        self._inodes = {i: n for i, n in self._inodes.items() if i in keep}
        self._armed = None
        self._frozen = True
        self._epoch += 1
        self.crashes += 1
        self._locks.clear()

    @staticmethod
    def _reachable(ns: dict[str, dict[str, int]]) -> set[str]:
        reach = {"/"}
        stack = ["/"]
        while stack:
            d = stack.pop()
            for name, e in ns.get(d, {}).items():
                if e == _DIR:
                    child = posixpath.join(d, name)
                    if child not in reach:
                        reach.add(child)
                        stack.append(child)
        return reach

    def _snapshot(self, ns: dict[str, dict[str, int]], *, live: bool) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for d in self._reachable(ns):
            for name, e in ns.get(d, {}).items():
                if e != _DIR:
                    node = self._inodes[e]
                    out[posixpath.join(d, name)] = bytes(node.live if live else node.durable)
        return dict(sorted(out.items()))


def _apply_dirop(entries: dict[str, int], dop: _DirOp) -> None:
    for name, e in dop.changes.items():
        if e is None:
            entries.pop(name, None)
        else:
            entries[name] = e


def _tear(w: _Write, damage: Damage, rng: random.Random) -> _Write:
    """The damaged version of write `w` that a torn crash persists."""
    data = bytearray(w.data)
    if not data:
        return w
    if damage == "prefix":
        keep = rng.randrange(1, len(data)) if len(data) > 1 else 0
        return _Write(w.offset, bytes(data[:keep]))
    if damage == "zero_sector":
        first = w.offset // SECTOR
        last = (w.offset + len(data) - 1) // SECTOR
        sector = rng.randint(first, last)
        lo = max(sector * SECTOR, w.offset) - w.offset
        hi = min((sector + 1) * SECTOR, w.offset + len(data)) - w.offset
        data[lo:hi] = bytes(hi - lo)
        return _Write(w.offset, bytes(data))
    i = rng.randrange(len(data))
    data[i] ^= 0xFF
    return _Write(w.offset, bytes(data))


def _check_crash_args(mode: str, damage: str | None) -> None:
    if mode not in _CRASH_MODES:
        raise ValueError(f"unknown crash mode {mode!r}; expected one of {_CRASH_MODES}")
    if damage is not None:
        if mode != "torn_last":
            raise ValueError(f"damage {damage!r} only applies to mode 'torn_last'")
        if damage not in _DAMAGES:
            raise ValueError(f"unknown damage {damage!r}; expected one of {_DAMAGES}")


class FakeFile:
    """A handle on a :class:`FakeDisk` inode (survives unlink/replace of its name)."""

    def __init__(self, disk: FakeDisk, ino: int, path: str, writable: bool, epoch: int) -> None:
        self.disk = disk
        self.ino = ino
        self.path = path
        self.writable = writable
        self._epoch = epoch
        self._closed = False

    def _node(self) -> _Inode:
        disk = self.disk
        disk._check_power()
        if self._closed:
            raise OSError(errno.EBADF, "FakeFile is closed", self.path)
        if self._epoch != disk._epoch:
            raise OSError(errno.EBADF, "stale handle from before the crash", self.path)
        return disk._inodes[self.ino]

    def pread(self, size: int, offset: int) -> bytes:
        with self.disk._lock:
            node = self._node()
            if size < 0 or offset < 0:
                raise _oserror(errno.EINVAL, self.path)
            return bytes(node.live[offset : offset + size])

    def pwrite(self, data: bytes, offset: int) -> int:
        with self.disk._lock:
            node = self._node()
            if not self.writable:
                raise _oserror(errno.EBADF, self.path)
            if offset < 0:
                raise _oserror(errno.EINVAL, self.path)
            data = bytes(data)
            _apply_write(node.live, offset, data)
            node.pending.append(_Write(offset, data))
            self.disk._count("pwrite", self.path)
            return len(data)

    def truncate(self, size: int) -> None:
        with self.disk._lock:
            node = self._node()
            if not self.writable or size < 0:
                raise _oserror(errno.EINVAL, self.path)
            _apply_truncate(node.live, size)
            node.pending.append(_Trunc(size))
            self.disk._count("truncate", self.path)

    def fdatasync(self) -> None:
        with self.disk._lock:
            self.disk._promote(self._node())
            self.disk._count("fdatasync", self.path)

    def fsync(self) -> None:
        with self.disk._lock:
            self.disk._promote(self._node())
            self.disk._count("fsync", self.path)

    def size(self) -> int:
        with self.disk._lock:
            return len(self._node().live)

    def map(self) -> None:
        """Never: an in-memory file has no descriptor to map (readers use pread)."""
        return None

    def no_readahead(self) -> None:
        """Nothing to do: an in-memory file reads nothing ahead."""

    def lock(self) -> bool:
        with self.disk._lock:
            node = self._node()
            holder = self.disk._locks.get(node.ino)
            if holder is not None and holder is not self:
                return False
            parent, name = posixpath.split(self.path)
            if self.disk._live.get(parent, {}).get(name) != node.ino:
                raise _oserror(errno.ENOENT, self.path, "the path no longer names this file")
            self.disk._locks[node.ino] = self
            return True

    def unlock(self) -> None:
        with self.disk._lock:
            if self.disk._locks.get(self.ino) is self:
                del self.disk._locks[self.ino]

    def close(self) -> None:
        """Idempotent; never raises (closing touches no device). Releases a lock."""
        with self.disk._lock:
            if self.disk._locks.get(self.ino) is self:
                del self.disk._locks[self.ino]
        self._closed = True

    def sync_failed(self, discard: bool) -> None:
        """Called by :class:`FaultFs` when it fails an fsync of this file.

        With `discard` (or :attr:`FakeDisk.fsyncgate`), the dirty pages are
        dropped from the pending list without becoming durable, while the live
        view still shows them: the fsyncgate behaviour of Linux, where a later
        fsync succeeds and the data is silently gone after a crash.
        """
        with self.disk._lock:
            if self.disk._frozen or self._epoch != self.disk._epoch:
                return
            node = self.disk._inodes[self.ino]
            if (discard or self.disk.fsyncgate) and node.pending:
                node.pending = []
                node.diverged = True


def _find_disk(fs: object) -> FakeDisk | None:
    """Follow ``.inner`` links from a wrapper fs down to a FakeDisk."""
    for _ in range(32):
        if fs is None or isinstance(fs, FakeDisk):
            return fs
        fs = getattr(fs, "inner", None)
    return None


def _find_fake(f: object) -> FakeFile | None:
    """Follow ``.inner`` links from a wrapper handle down to a FakeFile."""
    seen = 0
    while f is not None and seen < 32:
        if isinstance(f, FakeFile):
            return f
        f = getattr(f, "inner", None)
        seen += 1
    return None


# ------------------------------------------------------------------ FaultFs

_ERRNO = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "ESTALE": errno.ESTALE, "EAGAIN": errno.EAGAIN}


@dataclass(eq=False)
class FaultRule:
    """Fail the `nth` call of `op` (1-based, counted from when the rule is added).

    `persistent` fails that call and every later one of the class. `short`
    (``pwrite`` only) writes a prefix of ``short_keep`` bytes (default
    ``len(data) // 2``; capped at ``len(data)``, may be 0) and returns the count.
    `fsyncgate` (``fdatasync``/``fsync`` only) also drops the file's dirty pages
    on an inner :class:`FakeDisk`. `fired` counts how often the rule fired.
    """

    op: OpClass
    nth: int = 1
    kind: FaultKind = "EIO"
    persistent: bool = False
    fsyncgate: bool = False
    short_keep: int | None = None
    fired: int = field(default=0, init=False)
    base: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.op not in _OP_CLASSES:
            raise ValueError(f"unknown op class {self.op!r}; expected one of {_OP_CLASSES}")
        if self.kind not in _FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {_FAULT_KINDS}")
        if self.nth < 1:
            raise ValueError(f"nth is 1-based, got {self.nth}")
        if self.kind == "short" and self.op != "pwrite":
            raise ValueError("a short fault only applies to pwrite")
        if self.fsyncgate and self.op not in ("fdatasync", "fsync"):
            raise ValueError("fsyncgate only applies to fdatasync/fsync")
        if self.short_keep is not None and (self.kind != "short" or self.short_keep < 0):
            raise ValueError("short_keep needs kind='short' and a count >= 0")


RuleSpec = FaultRule | tuple[str, int, str] | tuple[str, int, str, bool]


class FaultFs:
    """Wrap any :class:`Fs` and fail selected calls.

    One counter per op class, shared by every handle: ``counts["pwrite"]`` is
    the number of ``pwrite`` calls through any file opened from this FaultFs.
    The first matching rule fires; an error fault raises before the inner op
    runs (so it has no effect), e.g. ``OSError(errno.ENOSPC, "injected ENOSPC
    on pwrite", path)``.
    """

    def __init__(self, inner: Fs, rules: Iterable[RuleSpec] = ()) -> None:
        self.inner = inner
        self.counts: dict[str, int] = dict.fromkeys(_OP_CLASSES, 0)
        self.rules: list[FaultRule] = []
        self._lock = threading.Lock()
        for r in rules:
            self.add(r if isinstance(r, FaultRule) else FaultRule(*r))

    def add(self, rule: FaultRule) -> FaultRule:
        """Arm `rule`; its `nth` counts calls made from now on."""
        with self._lock:
            rule.base = self.counts[rule.op]
            self.rules.append(rule)
        return rule

    def fail(
        self,
        op: OpClass,
        nth: int = 1,
        kind: FaultKind = "EIO",
        *,
        persistent: bool = False,
        fsyncgate: bool = False,
        short_keep: int | None = None,
    ) -> FaultRule:
        """Shorthand for ``add(FaultRule(...))``."""
        return self.add(FaultRule(op, nth, kind, persistent, fsyncgate, short_keep))

    def clear(self) -> None:
        """Disarm every rule (counters keep counting)."""
        with self._lock:
            self.rules.clear()

    def _hit(self, op: OpClass, path: str) -> FaultRule | None:
        with self._lock:
            self.counts[op] += 1
            c = self.counts[op]
            for rule in self.rules:
                if rule.op != op:
                    continue
                k = c - rule.base
                if k == rule.nth or (rule.persistent and k > rule.nth):
                    rule.fired += 1
                    return rule
        return None

    def _check(self, op: OpClass, path: str) -> FaultRule | None:
        rule = self._hit(op, path)
        if rule is not None and rule.kind != "short":
            raise OSError(_ERRNO[rule.kind], f"injected {rule.kind} on {op}", path)
        return rule

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> FaultFile:
        self._check("open", path)
        inner = self.inner.open(path, create=create, write=write, exclusive=exclusive)
        return FaultFile(self, inner, path)

    def replace(self, src: str, dst: str) -> None:
        self._check("replace", dst)
        self.inner.replace(src, dst)

    def unlink(self, path: str) -> None:
        self._check("unlink", path)
        self.inner.unlink(path)

    def rmdir(self, path: str) -> None:
        self._check("unlink", path)
        self.inner.rmdir(path)

    def rmtree(self, path: str) -> None:
        self._check("unlink", path)
        self.inner.rmtree(path)

    def listdir(self, path: str) -> list[str]:
        self._check("listdir", path)
        return self.inner.listdir(path)

    def mkdir(self, path: str) -> None:
        self._check("makedirs", path)
        self.inner.mkdir(path)

    def makedirs(self, path: str) -> None:
        self._check("makedirs", path)
        self.inner.makedirs(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def lexists(self, path: str) -> bool:
        return self.inner.lexists(path)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(path)

    def fsync_dir(self, path: str) -> None:
        self._check("fsync_dir", path)
        self.inner.fsync_dir(path)


class FaultFile:
    """A handle opened through :class:`FaultFs`."""

    def __init__(self, fs: FaultFs, inner: File, path: str) -> None:
        self.fs = fs
        self.inner = inner
        self.path = path

    def pread(self, size: int, offset: int) -> bytes:
        self.fs._check("pread", self.path)
        return self.inner.pread(size, offset)

    def pwrite(self, data: bytes, offset: int) -> int:
        rule = self.fs._check("pwrite", self.path)
        if rule is not None:  # short
            keep = len(data) // 2 if rule.short_keep is None else rule.short_keep
            return self.inner.pwrite(bytes(data[:keep]), offset)
        return self.inner.pwrite(data, offset)

    def _sync(self, op: Literal["fdatasync", "fsync"], do: Callable[[], None]) -> None:
        rule = self.fs._hit(op, self.path)
        if rule is not None:
            fake = _find_fake(self.inner)
            if fake is not None:
                fake.sync_failed(discard=rule.fsyncgate)
            elif rule.fsyncgate:
                raise TypeError("an fsyncgate rule needs a FakeDisk underneath")
            raise OSError(_ERRNO[rule.kind], f"injected {rule.kind} on {op}", self.path)
        do()

    def fdatasync(self) -> None:
        self._sync("fdatasync", self.inner.fdatasync)

    def fsync(self) -> None:
        self._sync("fsync", self.inner.fsync)

    def truncate(self, size: int) -> None:
        self.fs._check("truncate", self.path)
        self.inner.truncate(size)

    def size(self) -> int:
        return self.inner.size()

    def map(self) -> None:
        """Never: a mapped read would bypass the `pread` faults."""
        return None

    def no_readahead(self) -> None:
        self.inner.no_readahead()

    def lock(self) -> bool:
        return self.inner.lock()

    def unlock(self) -> None:
        self.inner.unlock()

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------- MonitorFs

SNAPSHOT_GLOB = "snapshot.*.bin"


@dataclass(slots=True)
class _Watch:
    """What MonitorFs knows about one file (follows the inode across renames)."""

    path: str
    dirty: bool = False  # written/truncated since its last successful fsync


class MonitorFs:
    """Pass-through :class:`Fs` that checks durable-ordering rules.

    Violations raise :class:`AssertionError` before the offending op reaches
    the inner fs, and are also appended to :attr:`violations` (engine code that
    swallows exceptions cannot hide them; call :meth:`assert_clean`).

    1. ``replace(x.tmp, y)`` while ``x.tmp`` has writes not yet fsynced.
    2. ``unlink`` of a ``snapshot.*.bin`` while another ``snapshot.*.bin`` in the
       same directory was renamed into place and that directory has not been
       ``fsync_dir``-ed since.
    3. ``pwrite`` to ``S.idx`` while ``S.data`` has writes not yet fsynced.

    Files that existed before the monitor saw them are assumed clean. When a
    :class:`FakeDisk` is found underneath (through ``.inner`` links), the
    tracked state is forgotten after each of its crashes: what survived is, by
    definition, durable. Call :meth:`reset` to do the same by hand.
    """

    def __init__(self, inner: Fs) -> None:
        self.inner = inner
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._files: dict[str, _Watch] = {}
        self._snap_pending: dict[str, set[str]] = {}
        self._disk = _find_disk(inner)
        self._crashes_seen = self._disk.crashes if self._disk is not None else 0

    def reset(self) -> None:
        """Forget every tracked file and pending snapshot rename."""
        with self._lock:
            self._files.clear()
            self._snap_pending.clear()

    def _sync_crashes(self) -> None:
        """Drop pre-crash state once the FakeDisk underneath has crashed (lock held)."""
        if self._disk is not None and self._disk.crashes != self._crashes_seen:
            self._crashes_seen = self._disk.crashes
            self._files.clear()
            self._snap_pending.clear()

    def assert_clean(self) -> None:
        assert not self.violations, "MonitorFs violations:\n" + "\n".join(self.violations)

    def _violate(self, msg: str) -> None:
        self.violations.append(msg)
        raise AssertionError(f"MonitorFs: {msg}")

    @staticmethod
    def _n(path: str) -> str:
        return posixpath.normpath(os.fspath(path))

    def _watch(self, p: str) -> _Watch:
        self._sync_crashes()
        w = self._files.get(p)
        if w is None:
            w = self._files[p] = _Watch(p)
        return w

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> MonitorFile:
        f = self.inner.open(path, create=create, write=write, exclusive=exclusive)
        with self._lock:
            w = self._watch(self._n(path))
        return MonitorFile(self, f, w)

    def replace(self, src: str, dst: str) -> None:
        s, d = self._n(src), self._n(dst)
        with self._lock:
            self._sync_crashes()
            w = self._files.get(s)
            if s.endswith(".tmp") and w is not None and w.dirty:
                self._violate(f"{s} renamed over {d} before it was fsynced")
        self.inner.replace(src, dst)
        with self._lock:
            w = self._files.pop(s, None) or _Watch(d)
            w.path = d
            self._files[d] = w
            dparent, dname = posixpath.split(d)
            if fnmatchcase(dname, SNAPSHOT_GLOB):
                self._snap_pending.setdefault(dparent, set()).add(dname)

    def unlink(self, path: str) -> None:
        p = self._n(path)
        parent, name = posixpath.split(p)
        with self._lock:
            self._sync_crashes()
            if fnmatchcase(name, SNAPSHOT_GLOB):
                newer = self._snap_pending.get(parent, set()) - {name}
                if newer:
                    self._violate(
                        f"{p} unlinked before the rename of {sorted(newer)} was made "
                        f"durable by fsync_dir({parent})"
                    )
        self.inner.unlink(path)
        with self._lock:
            self._files.pop(p, None)
            self._snap_pending.get(parent, set()).discard(name)

    def rmdir(self, path: str) -> None:
        self.inner.rmdir(path)

    def rmtree(self, path: str) -> None:
        self.inner.rmtree(path)
        with self._lock:
            p = self._n(path)
            for k in [k for k in self._files if k == p or k.startswith(p + "/")]:
                del self._files[k]

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def lexists(self, path: str) -> bool:
        return self.inner.lexists(path)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(path)

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)
        with self._lock:
            self._snap_pending.pop(self._n(path), None)


class MonitorFile:
    """A handle opened through :class:`MonitorFs`."""

    def __init__(self, fs: MonitorFs, inner: File, watch: _Watch) -> None:
        self.fs = fs
        self.inner = inner
        self.watch = watch

    def pread(self, size: int, offset: int) -> bytes:
        return self.inner.pread(size, offset)

    def pwrite(self, data: bytes, offset: int) -> int:
        fs = self.fs
        with fs._lock:
            fs._sync_crashes()
            path = self.watch.path
            if path.endswith(".idx") and len(data) > 0:
                data_file = fs._files.get(path[: -len(".idx")] + ".data")
                if data_file is not None and data_file.dirty:
                    fs._violate(f"{path} written before {data_file.path} was fsynced")
            self.watch.dirty = True  # conservatively, even if the write fails
        return self.inner.pwrite(data, offset)

    def truncate(self, size: int) -> None:
        with self.fs._lock:
            self.watch.dirty = True
        self.inner.truncate(size)

    def fdatasync(self) -> None:
        self.inner.fdatasync()
        with self.fs._lock:
            self.watch.dirty = False

    def fsync(self) -> None:
        self.inner.fsync()
        with self.fs._lock:
            self.watch.dirty = False

    def size(self) -> int:
        return self.inner.size()

    def map(self) -> mmap.mmap | None:
        return self.inner.map()  # reads are not watched

    def no_readahead(self) -> None:
        self.inner.no_readahead()

    def lock(self) -> bool:
        return self.inner.lock()

    def unlock(self) -> None:
        self.inner.unlock()

    def close(self) -> None:
        self.inner.close()


# ------------------------------------------------------------- crash points


def crash_points(m: int, samples: int = 4) -> list[int]:
    """Crash points for a sweep over a workload of `m` mutating ops.

    About `samples` deterministic points in ``[0, m]``, always including 0 and
    `m` (crash before anything / after everything), the rest spread evenly in
    between. Every point ``0..m`` when ``TOPICS_TEST_EXHAUSTIVE=1``.
    """
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if os.environ.get("TOPICS_TEST_EXHAUSTIVE", "").strip().lower() in ("1", "true", "yes"):
        return list(range(m + 1))
    if m + 1 <= samples:
        return list(range(m + 1))
    inner = samples - 2
    return sorted({0, m, *(round(m * (i + 1) / (inner + 1)) for i in range(inner))})
