"""Atomic metadata snapshots: `meta/snapshot.NNNN.bin`.

Metadata snapshot files (docs/FORMATS.md, "Snapshots"). The file's bytes are encoded and decoded by
:mod:`topics.format.snapshot`; this module names, writes, prunes and loads the
files. `NNNN` is the snapshot number, zero-padded to at least four digits; the
highest valid number wins.

Invariants:

* **Crash-atomic install.** `write_snapshot` writes `snapshot.NNNN.bin.tmp`,
  fdatasyncs it, renames it over the final name and fsyncs the directory. Until
  that fsync returns the rename may roll back and the previous snapshot loads.
* **Prune only after durable.** Older snapshots are removed only after the new
  one is durably installed (and reads back valid); the newest valid previous one
  is kept as a fallback. A failed write never prunes anything.
* **Corrupt is skipped, never deleted.** `load_latest` tries the newest first and
  passes over any file with a bad magic, version, length, checksum or body,
  leaving it on disk. Leftover `.tmp` files are ignored and cleaned up.
* **The decoder is total.** `decode_snapshot` returns a dict or a
  :class:`SnapshotInvalid` value for any input; it raises nothing else.

All I/O goes through the injected :class:`~topics.storage.fs.Fs`.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from topics.format.snapshot import (
    HEADER_SIZE,
    MAGIC,
    VERSION,
    SnapshotInvalid,
    decode_snapshot,
    encode_snapshot,
)
from topics.storage.fs import Fs, read_file, write_file

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "SnapshotInvalid",
    "snapshot_name",
    "encode_snapshot",
    "decode_snapshot",
    "list_snapshots",
    "next_snapshot_number",
    "write_snapshot",
    "load_latest",
    "load_valid",
]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^snapshot\.(\d+)\.bin$")


def snapshot_name(n: int) -> str:
    """`snapshot.NNNN.bin` for snapshot number `n >= 0` (at least 4 digits)."""
    if n < 0:
        raise ValueError(f"snapshot number must be >= 0, got {n}")
    return f"snapshot.{n:04d}.bin"


def list_snapshots(fs: Fs, meta_dir: str) -> list[tuple[int, str]]:
    """`(n, path)` of every `snapshot.N.bin` in `meta_dir`, ascending by `n`.

    Valid or not; `.tmp` and other names are left out. A missing dir is empty.
    """
    if not fs.exists(meta_dir):
        return []
    out: list[tuple[int, str]] = []
    for name in fs.listdir(meta_dir):
        m = _NAME_RE.match(name)
        if m is not None:
            out.append((int(m.group(1)), os.path.join(meta_dir, name)))
    out.sort()
    return out


def next_snapshot_number(fs: Fs, meta_dir: str) -> int:
    """One more than the highest snapshot number on disk (valid or not), or 1."""
    snaps = list_snapshots(fs, meta_dir)
    return snaps[-1][0] + 1 if snaps else 1


def _fsync_parent(fs: Fs, path: str) -> None:
    fs.fsync_dir(os.path.dirname(path.rstrip("/")) or ".")


def write_snapshot(fs: Fs, meta_dir: str, n: int, body: dict[Any, Any]) -> str:
    """Durably install snapshot `n` and prune older ones; returns its path.

    Sequence: encode -> write `snapshot.NNNN.bin.tmp` -> fdatasync ->
    replace onto `snapshot.NNNN.bin` -> fsync `meta_dir` -> read back -> unlink
    every older snapshot except the newest valid one below `n` -> fsync
    `meta_dir`. Snapshots numbered above `n` are never touched.

    Raises:
        TypeError: `body` cannot be msgpack-encoded (nothing is written).
        OSError: from the fs, up to and including the directory fsync; nothing
            has been pruned and the previous snapshot stays authoritative. The
            `.tmp` is removed on a best-effort basis. A failure while pruning
            (after the install is durable) is logged, not raised.
    """
    payload = encode_snapshot(body)
    if not fs.exists(meta_dir):
        fs.makedirs(meta_dir)
        _fsync_parent(fs, meta_dir)
    final = os.path.join(meta_dir, snapshot_name(n))
    tmp = final + ".tmp"
    try:
        write_file(fs, tmp, payload)
        fs.replace(tmp, final)
    except BaseException:
        try:
            if fs.exists(tmp):
                fs.unlink(tmp)
        except OSError:
            pass
        raise
    fs.fsync_dir(meta_dir)
    try:
        _prune(fs, meta_dir, n, final)
    except OSError as exc:  # the new snapshot is durable; a leftover is pruned next time
        log.warning("snapshot prune in %s failed: %s", meta_dir, exc)
    return final


def _prune(fs: Fs, meta_dir: str, n: int, final: str) -> None:
    if isinstance(decode_snapshot(read_file(fs, final)), SnapshotInvalid):
        log.error("snapshot %s does not read back valid; nothing pruned", final)
        return
    older = [(m, p) for m, p in list_snapshots(fs, meta_dir) if m < n]
    kept = False
    removed = False
    for _m, path in reversed(older):
        if not kept and not isinstance(decode_snapshot(read_file(fs, path)), SnapshotInvalid):
            kept = True
            continue
        fs.unlink(path)
        removed = True
    if removed:
        fs.fsync_dir(meta_dir)


def _cleanup_tmp(fs: Fs, meta_dir: str) -> None:
    removed = False
    for name in fs.listdir(meta_dir):
        if name.startswith("snapshot.") and name.endswith(".tmp"):
            try:
                fs.unlink(os.path.join(meta_dir, name))
                removed = True
            except OSError as exc:
                log.warning("cannot remove leftover %s: %s", name, exc)
    if removed:
        try:
            fs.fsync_dir(meta_dir)
        except OSError as exc:
            log.warning("cannot fsync %s after tmp cleanup: %s", meta_dir, exc)


def load_valid(fs: Fs, meta_dir: str) -> list[tuple[int, dict[Any, Any]]]:
    """Every valid snapshot as `(n, body)`, newest first (at most the newest two are
    kept on disk: the newest and its fallback).

    Removes leftover `snapshot.*.tmp` files first, like :func:`load_latest`;
    invalid snapshots are skipped with a warning. Raises OSError when one cannot
    be read.
    """
    if not fs.exists(meta_dir):
        return []
    _cleanup_tmp(fs, meta_dir)
    out: list[tuple[int, dict[Any, Any]]] = []
    for n, path in reversed(list_snapshots(fs, meta_dir)):
        result = decode_snapshot(read_file(fs, path))
        if isinstance(result, SnapshotInvalid):
            log.warning("skipping invalid snapshot %s: %s", path, result.reason)
            continue
        out.append((n, result))
    return out


def load_latest(fs: Fs, meta_dir: str) -> tuple[int, dict[Any, Any]] | None:
    """The newest valid snapshot as `(n, body)`, or None when there is none.

    Removes leftover `snapshot.*.tmp` files first (best effort: a failure is
    logged, not raised). Invalid snapshots are skipped with a warning and left
    on disk.

    Raises:
        OSError: reading a snapshot failed (an I/O error is not "invalid"; the
            caller decides rather than silently falling back).
    """
    if not fs.exists(meta_dir):
        return None
    _cleanup_tmp(fs, meta_dir)
    for n, path in reversed(list_snapshots(fs, meta_dir)):
        result = decode_snapshot(read_file(fs, path))
        if isinstance(result, SnapshotInvalid):
            log.warning("skipping invalid snapshot %s: %s", path, result.reason)
            continue
        return n, result
    return None
