"""Segment stores and the per-topic HOT/COLD tier resolver.

The tier seam (the `SegmentStore` protocol, `LocalSegmentStore`, `TopicTier`;
README `TOPICS_COLD_DIR`). A store holds
whole sealed segments of one topic, each identified by its first seq (a
:data:`SegmentId`) and made of two parts, `.data` and `.idx`, laid out exactly as
in :mod:`topics.storage.segment` (docs/FORMATS.md)::

    <root_dir>/seg-<first_seq %016d>.data
    <root_dir>/seg-<first_seq %016d>.idx
    <root_dir>/seg-<first_seq %016d>.{data,idx}.tmp   (a put in progress)

Invariants:

* **A segment exists iff both final parts exist.** :meth:`LocalSegmentStore.put`
  installs `.data` before `.idx` (each via tmp -> fdatasync -> rename) and then
  fsyncs the directory, so the `.idx` rename is the commit point; a crash leaves
  the segment complete or incomplete, never half-indexed. :meth:`delete` removes
  `.idx` first for the same reason.
* **Puts are idempotent.** Re-putting a complete segment is a no-op (sealed
  segments are a deterministic materialization of the WAL), so a rerun after a
  crash never rewrites or duplicates it, nor pulls a cold copy back to hot.
* **Reads never short-read.** A range past the end of a part raises
  :class:`~topics.storage.segment.SegmentRangeError`.
* **HOT wins.** :meth:`TopicTier.resolve` prefers the HOT copy when both tiers
  hold a segment (the mid-relocation window), so a segment is never lost.

Every call is synchronous and self-contained ("runs on a blocking/IO pool
off the hot path"); all I/O goes through the injected :class:`~topics.storage.fs.Fs`.
"""

from __future__ import annotations

import builtins
import enum
import os
from typing import Protocol

from topics.storage.fs import Fs, write_file
from topics.storage.segment import (
    SegmentRangeError,
    scan_segments,
    segment_paths,
)

__all__ = [
    "SegmentId",
    "SegmentPart",
    "SegmentStore",
    "LocalSegmentStore",
    "Tier",
    "TopicTier",
]

SegmentId = int
"""A segment's identity: its first seq (the same in both tiers)."""


class SegmentPart(enum.Enum):
    """Which file of a segment."""

    DATA = "data"
    IDX = "idx"


class Tier(enum.Enum):
    """Where a segment lives."""

    HOT = "hot"
    COLD = "cold"


class SegmentStore(Protocol):
    """Persists, reads and drops whole segments of one topic (docs/FORMATS.md, "Segment files").

    Synchronous by design: each call may be issued on a blocking pool, so a slow
    (cold) store can never hold up writes or live delivery. `fs` and
    :meth:`path` name a part for reading through the `Fs` seam (a file path, or
    an object url read by the object store's read-only `Fs`).
    """

    fs: Fs

    def path(self, id: SegmentId, part: SegmentPart) -> str:
        """Where one part of segment `id` is read from, through :attr:`fs`."""
        ...

    def put(self, id: SegmentId, data: bytes, idx: bytes) -> None:
        """Durably (fsynced) write both parts of segment `id`."""
        ...

    def read_range(self, id: SegmentId, part: SegmentPart, offset: int, len: int) -> bytes:
        """Exactly `len` bytes of `part` at `offset` (one frame, or a bulk `.idx`)."""
        ...

    def delete(self, id: SegmentId) -> None:
        """Drop a whole segment; idempotent."""
        ...

    def list(self) -> builtins.list[SegmentId]:
        """Ids of the complete segments, ascending (oldest first)."""
        ...

    def exists(self, id: SegmentId, part: SegmentPart) -> bool:
        """Cheap probe of one part (relocation idempotency)."""
        ...

    def len(self, id: SegmentId, part: SegmentPart) -> int:
        """Byte size of one part."""
        ...


class LocalSegmentStore:
    """A :class:`SegmentStore` over a local directory (the HOT dir, or the cold dir).

    `root_dir` is the topic's segment directory (e.g.
    :func:`~topics.storage.segment.topic_dir` under the data or cold root); it is
    created on the first put.
    """

    def __init__(self, fs: Fs, root_dir: str) -> None:
        self.fs = fs
        self.root_dir = root_dir

    def path(self, id: SegmentId, part: SegmentPart) -> str:
        """Final path of one part of segment `id`."""
        p = segment_paths(self.root_dir, id)
        return p.data if part is SegmentPart.DATA else p.idx

    def _write_tmp(self, final: str, payload: bytes) -> str:
        tmp = final + ".tmp"
        write_file(self.fs, tmp, payload)
        return tmp

    def put(self, id: SegmentId, data: bytes, idx: bytes) -> None:
        """Durable write of both parts: tmp + fdatasync + rename `.data`, then `.idx`, then dir fsync.

        A complete existing segment is left untouched (idempotent re-put). A stray
        `.idx` without its `.data` is unlinked first so the new `.data` can never
        pair with a stale index. Raises OSError from the fs; after a failure the
        segment is incomplete (not listed) and the put may be retried.
        """
        data_path = self.path(id, SegmentPart.DATA)
        idx_path = self.path(id, SegmentPart.IDX)
        fs = self.fs
        if fs.exists(data_path) and fs.exists(idx_path):
            return
        if not fs.exists(self.root_dir):
            fs.makedirs(self.root_dir)
            fs.fsync_dir(os.path.dirname(self.root_dir.rstrip("/")) or ".")
        if fs.exists(idx_path):
            fs.unlink(idx_path)
            fs.fsync_dir(self.root_dir)
        data_tmp = self._write_tmp(data_path, data)
        fs.replace(data_tmp, data_path)
        idx_tmp = self._write_tmp(idx_path, idx)
        fs.replace(idx_tmp, idx_path)
        fs.fsync_dir(self.root_dir)

    def read_range(self, id: SegmentId, part: SegmentPart, offset: int, len: int) -> bytes:
        """Exactly `len` bytes of `part` at `offset`.

        Raises:
            FileNotFoundError: the part does not exist.
            SegmentRangeError: negative arguments or a range past the end of the part.
        """
        if offset < 0 or len < 0:
            raise SegmentRangeError(f"bad range offset={offset} len={len}")
        f = self.fs.open(self.path(id, part))
        try:
            out = f.pread(len, offset) if len else b""
        finally:
            f.close()
        if builtins.len(out) != len:
            raise SegmentRangeError(
                f"range [{offset}, +{len}) past the end of {self.path(id, part)}"
            )
        return out

    def delete(self, id: SegmentId) -> None:
        """Unlink `.data` (and its tmp), fsync the directory, then `.idx` (and its tmp).

        A crash in between leaves at most the `.idx`, whose entries tell recovery
        the segment was dropped (below the floor, or every entry deleted) rather
        than damaged (docs/FORMATS.md, "Segments the snapshot relies on").
        Missing files are fine, so the call is idempotent.
        """
        fs = self.fs
        for part in (SegmentPart.DATA, SegmentPart.IDX):
            removed = False
            final = self.path(id, part)
            for path in (final, final + ".tmp"):
                if fs.exists(path):
                    try:
                        fs.unlink(path)
                    except FileNotFoundError:
                        continue
                    removed = True
            if removed:
                fs.fsync_dir(self.root_dir)

    def list(self) -> builtins.list[SegmentId]:
        """Ids with both parts present, ascending; strays and `.tmp` are not listed."""
        return [first for first, _ in scan_segments(self.fs, self.root_dir).segments]

    def exists(self, id: SegmentId, part: SegmentPart) -> bool:
        """Whether the final file of `part` exists."""
        return self.fs.exists(self.path(id, part))

    def len(self, id: SegmentId, part: SegmentPart) -> int:
        """Byte size of `part`; raises FileNotFoundError when missing."""
        f = self.fs.open(self.path(id, part))
        try:
            return f.size()
        finally:
            f.close()


class TopicTier:
    """A topic's required HOT store plus an optional COLD store (README `TOPICS_COLD_DIR`).

    With `cold=None` tiering is disabled and everything resolves HOT.
    """

    def __init__(self, hot: SegmentStore, cold: SegmentStore | None = None) -> None:
        self.hot = hot
        self.cold = cold

    @staticmethod
    def _complete(store: SegmentStore, id: SegmentId) -> bool:
        return store.exists(id, SegmentPart.DATA) and store.exists(id, SegmentPart.IDX)

    def resolve(self, id: SegmentId) -> Tier | None:
        """Which tier holds a complete copy of segment `id`: HOT if it does, else
        COLD, else None (an incomplete half is never resolved)."""
        if self._complete(self.hot, id):
            return Tier.HOT
        if self.cold is not None and self._complete(self.cold, id):
            return Tier.COLD
        return None

    def store(self, tier: Tier) -> SegmentStore:
        """The store of `tier`; raises LookupError for COLD when tiering is off."""
        if tier is Tier.HOT:
            return self.hot
        if self.cold is None:
            raise LookupError("no cold tier configured")
        return self.cold

    def resolve_store(self, id: SegmentId) -> SegmentStore | None:
        """The store to read segment `id` from (HOT preferred), or None."""
        tier = self.resolve(id)
        return None if tier is None else self.store(tier)

    def list(self) -> builtins.list[tuple[SegmentId, Tier]]:
        """Every complete segment in either tier, ascending, with its resolved tier."""
        hot = set(self.hot.list())
        cold = set(self.cold.list()) if self.cold is not None else set()
        return [(i, Tier.HOT if i in hot else Tier.COLD) for i in sorted(hot | cold)]
