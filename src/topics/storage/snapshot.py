"""Atomic metadata snapshots: `meta/snapshot.NNNN.bin`.

Implements seed 0 "Metadata snapshots" (seed 1 "meta/", seed 2 "Durability &
recovery"). File layout (docs/FORMATS.md, little-endian)::

    off 0          8         magic     b"TOPSNAP1"
    off 8          4         version   u32 = 1
    off 12         8         body_len  u64
    off 20         body_len  body      one msgpack map
    off 20+len     8         xxh3      u64, XXH3-64 of the body

so a file is exactly `28 + body_len` bytes. `NNNN` is the snapshot number,
zero-padded to at least four digits; the highest valid number wins.

Invariants (reliability anchors §3.5, §5 row 5):

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
import struct
from typing import Any

import msgpack
import xxhash

from topics.storage.fs import Fs, write_all

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

MAGIC = b"TOPSNAP1"
VERSION = 1
_HEADER = struct.Struct("<8sIQ")
#: Bytes before the body: magic, version, body_len.
HEADER_SIZE = _HEADER.size
_TRAILER = 8
_NAME_RE = re.compile(r"^snapshot\.(\d+)\.bin$")


class SnapshotInvalid(Exception):
    """Why some bytes are not a valid snapshot (`reason`).

    Returned as a value by :func:`decode_snapshot`; it is an exception type so
    callers that prefer raising can `raise` it unchanged.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __repr__(self) -> str:
        return f"SnapshotInvalid({self.reason!r})"


def snapshot_name(n: int) -> str:
    """`snapshot.NNNN.bin` for snapshot number `n >= 0` (at least 4 digits)."""
    if n < 0:
        raise ValueError(f"snapshot number must be >= 0, got {n}")
    return f"snapshot.{n:04d}.bin"


def encode_snapshot(body: dict[Any, Any]) -> bytes:
    """The complete file bytes for `body` (msgpack-encodable; tuples load as lists).

    Raises TypeError from msgpack for an unencodable value.
    """
    if not isinstance(body, dict):
        raise TypeError("a snapshot body must be a dict")
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return b"".join(
        (
            _HEADER.pack(MAGIC, VERSION, len(packed)),
            packed,
            xxhash.xxh3_64_intdigest(packed).to_bytes(8, "little"),
        )
    )


def decode_snapshot(buf: bytes | bytearray | memoryview) -> dict[Any, Any] | SnapshotInvalid:
    """Decode a whole snapshot file; never raises (fuzzed with Hypothesis).

    Returns the body dict, or :class:`SnapshotInvalid` naming the first failed
    check: header length, magic, version, `body_len` against the file length,
    checksum, msgpack decoding, or a body that is not a map.
    """
    try:
        raw = bytes(buf)
        if len(raw) < HEADER_SIZE + _TRAILER:
            return SnapshotInvalid(f"truncated: {len(raw)} bytes")
        magic, version, body_len = _HEADER.unpack_from(raw, 0)
        if magic != MAGIC:
            return SnapshotInvalid("bad magic")
        if version != VERSION:
            return SnapshotInvalid(f"unsupported version {version}")
        if body_len != len(raw) - HEADER_SIZE - _TRAILER:
            return SnapshotInvalid(f"body_len {body_len} does not match a {len(raw)}-byte file")
        body = raw[HEADER_SIZE : HEADER_SIZE + body_len]
        if xxhash.xxh3_64_intdigest(body) != int.from_bytes(raw[-_TRAILER:], "little"):
            return SnapshotInvalid("checksum mismatch")
        try:
            value = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types on garbage
            return SnapshotInvalid(f"undecodable body: {type(exc).__name__}")
        if not isinstance(value, dict):
            return SnapshotInvalid("body is not a map")
        return value
    except Exception as exc:  # totality: nothing but a value leaves this function
        return SnapshotInvalid(f"decode error: {type(exc).__name__}")


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


def _read(fs: Fs, path: str) -> bytes:
    f = fs.open(path)
    try:
        return f.pread(f.size(), 0)
    finally:
        f.close()


def _fsync_parent(fs: Fs, path: str) -> None:
    fs.fsync_dir(os.path.dirname(path.rstrip("/")) or ".")


def write_snapshot(fs: Fs, meta_dir: str, n: int, body: dict[Any, Any]) -> str:
    """Durably install snapshot `n` and prune older ones; returns its path.

    Sequence (seed 0): encode -> write `snapshot.NNNN.bin.tmp` -> fdatasync ->
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
        f = fs.open(tmp, create=True, write=True)
        try:
            f.truncate(0)
            write_all(f, payload, 0)
            f.fdatasync()
        finally:
            f.close()
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
    if isinstance(decode_snapshot(_read(fs, final)), SnapshotInvalid):
        log.error("snapshot %s does not read back valid; nothing pruned", final)
        return
    older = [(m, p) for m, p in list_snapshots(fs, meta_dir) if m < n]
    kept = False
    removed = False
    for _m, path in reversed(older):
        if not kept and not isinstance(decode_snapshot(_read(fs, path)), SnapshotInvalid):
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
        result = decode_snapshot(_read(fs, path))
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
        result = decode_snapshot(_read(fs, path))
        if isinstance(result, SnapshotInvalid):
            log.warning("skipping invalid snapshot %s: %s", path, result.reason)
            continue
        return n, result
    return None
