"""One topic instance's segment files: how the engine reads them, how recovery loads them.

A topic's records end up in `topics/<topic_id hex>/seg-<first_seq>.data/.idx`
(docs/FORMATS.md, "Segment files"). This module holds:

* :class:`SegmentSource` - the engine's view of one segment (a
  :class:`~topics.engine.frames.FrameSource`): a sealed `.data` is read through
  `mmap`, the active one through `pread`, both opened on first use and kept in
  one process-wide LRU, :data:`open_files`, that holds at most
  `TOPICS_MAX_OPEN_SEGMENT_FILES` handles (one file descriptor each), so the
  descriptors used for reads never grow with the number of topics or
  segments. Every frame read is verified by the engine (`verify = True`).
* :class:`TopicStore` / :class:`SegMeta` - the checkpointer's bookkeeping of a
  topic's segments (first seq, count, deleted entries, sealed or active) and the
  writer of the active segment.
* :func:`load_topic` - recovery's bulk load: every `.idx` read with one `pread`
  and turned into slot rows with numpy (`.data` is touched only to resume the
  active segment and to size records that carry a node or tag).
* :func:`flip_deleted` - the in-place 0xD5 delete flag of a sealed segment
  (docs/FORMATS.md, "Delete flags"), fdatasynced.

Gaps between segments (records that were below a floor when checkpointed)
load as deleted holes; a segment overlapping the one before it is reported and
ignored; a `.data` or `.idx` without its pair (a checkpoint cut short before
the pair was durable) is removed.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import posixpath
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from topics.engine.index import LOC_HOLE, NODE_UNKNOWN, SLOT_DTYPE, SlotArray
from topics.format.frame import (
    SEG_FRAME_OVERHEAD,
    SEG_HDR,
    Buf,
    check_frame,
    encode_record,
    segment_data_lens,
)
from topics.format.idx import (
    DELETED,
    F_HAS_META,
    F_HAS_NODE,
    F_HAS_TAG,
    F_RECORD_MASK,
    IDX_ENTRY_DTYPE,
    IDX_FLAGS_OFFSET,
)
from topics.storage.fs import File, Fs, read_file, write_all, write_file
from topics.storage.iogate import READ_PIECE_BYTES, io_gate
from topics.storage.objstore import cold_root as object_root
from topics.storage.objstore import is_object_url
from topics.storage.segment import (
    IDX_ENTRY_SIZE,
    SegmentPaths,
    SegmentWriter,
    scan_segments,
    segment_paths,
    topic_dir,
)
from topics.storage.segstore import (
    LocalSegmentStore,
    SegmentPart,
    SegmentStore,
    Tier,
    TopicTier,
)

__all__ = [
    "DEFAULT_MAX_OPEN_SEGMENT_FILES",
    "OpenSegmentFiles",
    "open_files",
    "set_max_open_segment_files",
    "SegmentSource",
    "SegMeta",
    "TopicStore",
    "LoadedTopic",
    "RELIES_ON_NOTHING",
    "load_topic",
    "cold_store",
    "flip_deleted",
    "flip_deleted_in",
    "replace_idx",
    "sealed_tiling_problem",
    "same_frames",
    "RECLAIM_DEAD_RATIO",
    "REWRITE_SUFFIX",
    "Rewrite",
    "plan_rewrite",
    "install_rewrite",
    "finish_rewrites",
    "idx_to_check",
    "retire_topic_dir",
    "retired_dirs",
    "unlink_dir",
    "RETIRED_SUFFIX",
]

log = logging.getLogger("topics.segments")

#: Default of :data:`TOPICS_MAX_OPEN_SEGMENT_FILES`: segment read handles kept open.
DEFAULT_MAX_OPEN_SEGMENT_FILES = 256
_ENV_CAP = "TOPICS_MAX_OPEN_SEGMENT_FILES"


def _cap_from_env() -> int:
    raw = os.environ.get(_ENV_CAP, "").strip()
    try:
        return max(1, int(raw)) if raw else DEFAULT_MAX_OPEN_SEGMENT_FILES
    except ValueError:
        log.warning(
            "%s=%r is not an integer; using %d", _ENV_CAP, raw, DEFAULT_MAX_OPEN_SEGMENT_FILES
        )
        return DEFAULT_MAX_OPEN_SEGMENT_FILES


class OpenSegmentFiles:
    """A process-wide LRU of the read handles :class:`SegmentSource` keeps open.

    A handle is either a `pread` file (the active segment, or any non-real
    `Fs`) or an `mmap` of a sealed `.data` (which holds a duplicate of its file
    descriptor for as long as it lives). Each costs one descriptor, so at most
    `cap` descriptors are held for reads however many topics and segments
    exist; the least recently used handle is released when a new one would
    exceed the cap, and the source reopens it on its next read.

    A released `mmap` is never closed explicitly: the pool only drops its
    reference, so a read that still holds the map (the `buf` of a
    :meth:`SegmentSource.span`) keeps it valid, and CPython unmaps it (closing
    its descriptor) as soon as the last holder lets go. A released `pread` file
    is closed under the pool's lock, which every `pread` through the pool also
    holds, so no read ever sees its descriptor vanish.

    Thread-safe. `cap` (>= 1) comes from `TOPICS_MAX_OPEN_SEGMENT_FILES`
    (default :data:`DEFAULT_MAX_OPEN_SEGMENT_FILES`; README "Configuration").
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(1, cap)
        self.lock = threading.Lock()
        self._lru: OrderedDict[SegmentSource, None] = OrderedDict()
        self.opened = 0  # handles opened so far (reopens included): a test's view of churn

    def __len__(self) -> int:
        return len(self._lru)

    def set_cap(self, cap: int) -> None:
        """Change the cap (>= 1), releasing the oldest handles beyond it."""
        with self.lock:
            self.cap = max(1, cap)
            self._trim()

    def touch(self, src: SegmentSource) -> None:
        """`src` was just used (lock held by the caller)."""
        self._lru.move_to_end(src)

    def add(self, src: SegmentSource) -> None:
        """`src` now holds a handle (lock held); releases the oldest beyond the cap."""
        self.opened += 1
        self._lru[src] = None
        self._lru.move_to_end(src)
        self._trim()

    def discard(self, src: SegmentSource) -> None:
        """`src` gave its handle back (lock held)."""
        self._lru.pop(src, None)

    def _trim(self) -> None:
        while len(self._lru) > self.cap:
            old, _ = self._lru.popitem(last=False)
            old._drop_handle()

    def close_under(self, directory: str) -> int:
        """Release the handles of every file under `directory`; returns how many.

        For a topic directory about to be removed: a descriptor left open would
        keep the unlinked files' disk space until it was evicted.
        """
        prefix = directory.rstrip("/") + "/"
        with self.lock:
            gone = [s for s in self._lru if s.name.startswith(prefix)]
            for src in gone:
                del self._lru[src]
                src._drop_handle()
        return len(gone)

    def clear(self) -> None:
        """Release every handle (tests; a later read reopens)."""
        with self.lock:
            while self._lru:
                old, _ = self._lru.popitem(last=False)
                old._drop_handle()


#: The pool every :class:`SegmentSource` of this process shares.
open_files = OpenSegmentFiles(_cap_from_env())


def set_max_open_segment_files(cap: int) -> None:
    """Set the read-handle cap of :data:`open_files` (what the env knob sets at import)."""
    open_files.set_cap(cap)


class SegmentSource:
    """Frames of one segment `.data` file, read by the engine (a FrameSource).

    A sealed `.data` is read through an `mmap` when its `Fs` can map it
    (:meth:`topics.fs.File.map`), anything else (the active segment, an `Fs`
    that cannot map) through `pread`.
    Either handle is opened on first use and kept in :data:`open_files`, which
    bounds how many are open at once; a read after the pool released the
    handle reopens it. Raises OSError (e.g. FileNotFoundError) when the file
    cannot be opened or read.
    """

    __slots__ = (
        "fs",
        "name",
        "sealed",
        "cold",
        "_map",
        "_file",
        "_pinned",
        "_pin_users",
        "_pin_closing",
        "__weakref__",
    )

    hdr = SEG_HDR
    verify = True
    blocking = True

    def __init__(self, fs: Fs, data_path: str, sealed: bool, *, cold: bool = False) -> None:
        self.fs = fs
        self.name = data_path
        self.sealed = sealed
        #: In the cold tier (reads of it count as `cold_segments_read`, docs/API.md 8.1).
        self.cold = cold
        self._map: mmap.mmap | None = None
        self._file: File | None = None
        # A handle on the file as it was when :meth:`pin` ran, outside the pool:
        # every read goes to it until :meth:`close` (a rewrite replaced the file).
        self._pinned: File | None = None
        self._pin_users = 0  # fetches reading the pinned handle right now
        self._pin_closing = False  # closed while in use: the last user closes it

    def pin(self) -> None:
        """Keep reading the file as it is now, even once another file takes its name.

        Called before a rewrite renames new bytes over the segment
        (docs/FORMATS.md, "Reclaim"): until the engine switches to a new source
        and closes this one, reads see the old bytes their slots point into.
        Raises OSError when the file cannot be opened.
        """
        f = self.fs.open(self.name)
        with open_files.lock:
            old, self._pinned = self._pinned, f
            if self._pin_users:
                old = None  # a fetch still reads it; left to the garbage collector
            self._pin_closing = False
        if old is not None:
            old.close()

    @property
    def is_open(self) -> bool:
        """Whether this source holds a handle (a map or a file) right now."""
        return self._map is not None or self._file is not None

    def span(self, lo: int, hi: int) -> tuple[Buf, int]:
        """The bytes `[lo, hi)` of `.data`: the whole map (base 0) or one pread (base lo).

        A returned map stays valid for as long as the caller holds it, even if
        the pool releases it meanwhile.
        """
        pool = open_files
        with pool.lock:
            pinned = self._pinned
            if pinned is not None:
                return pinned.pread(hi - lo, lo), lo
            m = self._map
            if m is not None:
                pool.touch(self)
                return m, 0
            if self.sealed and self._file is None:
                m = self._mapped()
                if m is not None:
                    return m, 0
            f = self._file
            if f is None:
                f = self._file = self.fs.open(self.name)
                pool.add(self)
            else:
                pool.touch(self)
            return f.pread(hi - lo, lo), lo

    def fetch(self, lo: int, hi: int) -> bytes:
        """The bytes `[lo, hi)` of `.data`, read with a handle of its own (any thread).

        For reads off the event loop (:mod:`topics.storage.reads`): neither the
        pool's lock nor a map is held while the disk answers, so a slow read
        stalls nobody else. Large spans are read in pieces that give way to WAL
        syncs (:mod:`topics.storage.iogate`), without kernel readahead. Short at
        the end of the file. Raises OSError when the file cannot be read.
        """
        with open_files.lock:
            pinned = self._pinned
            if pinned is not None:
                self._pin_users += 1
        if pinned is not None:
            # Read without the pool's lock (a slow read stalls nobody); a close
            # meanwhile leaves the handle to the last reader.
            try:
                return pinned.pread(hi - lo, lo)
            finally:
                with open_files.lock:
                    self._pin_users -= 1
                    last = self._pin_closing and not self._pin_users
                if last:
                    pinned.close()
        f = self.fs.open(self.name)
        try:
            if getattr(f, "remote", False):
                # An object store: the whole span in one ranged GET (pieces would
                # each pay a round trip; there is no local disk to share).
                return f.pread(hi - lo, lo)
            f.no_readahead()
            parts = []
            for at in range(lo, hi, READ_PIECE_BYTES):
                io_gate.before_read()
                part = f.pread(min(READ_PIECE_BYTES, hi - at), at)
                parts.append(part)
                if len(part) < READ_PIECE_BYTES:
                    break  # the end of the file
            return b"".join(parts)
        finally:
            f.close()

    def _mapped(self) -> mmap.mmap | None:
        """Map the sealed file (pool lock held, no handle held yet).

        Returns the map, or None when the file cannot be mapped (empty, or an
        `Fs` without maps): the file just opened then stays as the `pread`
        handle, so the next read neither maps nor opens again.
        """
        f = self.fs.open(self.name)
        try:
            m = f.map()
        except BaseException:
            f.close()
            raise
        if m is None:
            self._file = f
        else:
            f.close()  # the map holds its own descriptor
            self._map = m
        open_files.add(self)
        return m

    def _drop_handle(self) -> None:
        """Give the handle up (pool lock held): close a file, drop a map reference."""
        self._map = None  # unmapped by CPython once no read holds it
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def seal(self) -> None:
        """The segment became immutable: later reads may map it."""
        with open_files.lock:
            if self._file is not None:
                self._file.close()
                self._file = None
                open_files.discard(self)

    def close(self) -> None:
        """Release the map and the read handles (idempotent); a later read reopens."""
        with open_files.lock:
            open_files.discard(self)
            self._drop_handle()
            pinned, self._pinned = self._pinned, None
            if pinned is not None and self._pin_users:
                self._pin_closing, pinned = True, None  # the last fetch closes it
        if pinned is not None:
            pinned.close()


@dataclass(slots=True)
class SegMeta:
    """What the checkpointer knows of one segment; entries are seqs `first_seq ..`."""

    first_seq: int
    count: int
    loc: int
    sealed: bool
    data_bytes: int
    deleted: int = 0
    first_ts: int = 0
    tier: Tier = Tier.HOT
    holes: int = 0  # entries that are header-only frames (their bytes already reclaimed)

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


@dataclass
class TopicStore:
    """A topic instance's segments (ascending) and its active segment's writer.

    `tier` resolves and drops sealed segments in either tier (docs/FORMATS.md, "Segment files"; the
    active segment is always HOT, in `dir`). Owned by the checkpointer: `writer`
    is only used inside a checkpoint.
    """

    topic_id: int
    dir: str
    tier: TopicTier
    segs: list[SegMeta] = field(default_factory=list)
    writer: SegmentWriter | None = None
    next_loc: int = 0
    #: Cold copies recovery found that the snapshot does not list (never committed
    #: by a relocation, or left by a drop cut short); deleted after the next snapshot.
    orphans: list[SegMeta] = field(default_factory=list)

    @classmethod
    def create(cls, fs: Fs, root: str, topic_id: int, cold_root: str | None = None) -> TopicStore:
        """An empty store for `topic_id` under data dir `root` (and the cold root, if any:
        a directory, or an `s3://bucket/prefix` url, docs/FORMATS.md "Object-store cold tier")."""
        d = topic_dir(root, topic_id)
        return cls(
            topic_id, d, TopicTier(LocalSegmentStore(fs, d), cold_store(fs, cold_root, topic_id))
        )

    def drop(self, seg: SegMeta) -> None:
        """Delete a whole sealed segment from its tier (`.idx` first; idempotent)."""
        self.tier.store(seg.tier).delete(seg.first_seq)

    def part_path(self, seg: SegMeta, part: SegmentPart) -> str:
        """Where one part of `seg` is read from (through its tier store's `fs`)."""
        return self.tier.store(seg.tier).path(seg.first_seq, part)

    def source(self, seg: SegMeta) -> SegmentSource:
        """A reader of `seg`'s `.data` in the tier it is in now."""
        store = self.tier.store(seg.tier)
        return SegmentSource(
            store.fs,
            store.path(seg.first_seq, SegmentPart.DATA),
            seg.sealed,
            cold=seg.tier is Tier.COLD,
        )

    def alloc_loc(self) -> int:
        loc = self.next_loc
        self.next_loc += 1
        return loc

    def seg_for(self, seq: int) -> SegMeta | None:
        """The segment holding `seq`, if any (binary search over first seqs)."""
        i = bisect_right([s.first_seq for s in self.segs], seq) - 1
        if i >= 0 and seq <= self.segs[i].last_seq:
            return self.segs[i]
        return None

    @property
    def end_seq(self) -> int:
        """Last seq in a segment (0 when there is none)."""
        return self.segs[-1].last_seq if self.segs else 0


def cold_store(fs: Fs, cold_root: str | None, topic_id: int) -> SegmentStore | None:
    """The cold-tier store of one topic: None without a cold root, the object store's
    for an `s3://` url, else a directory under `cold_root` on `fs`."""
    if not cold_root:
        return None
    if is_object_url(cold_root):
        return object_root(cold_root).store(topic_id)
    return LocalSegmentStore(fs, topic_dir(cold_root, topic_id))


@dataclass
class LoadedTopic:
    """Recovery's result for one topic directory."""

    store: TopicStore
    base_seq: int
    rows: SlotArray
    sources: dict[int, SegmentSource]

    @property
    def end_seq(self) -> int:
        return self.base_seq + len(self.rows) - 1


def _file_size(fs: Fs, path: str) -> int:
    f = fs.open(path)
    try:
        return f.size()
    finally:
        f.close()


def _rows(
    entries: np.ndarray, loc: int, data: bytes | None, data_size: int
) -> tuple[SlotArray, int]:
    """Slot rows for `.idx` entries of one segment; returns (rows, deleted count)."""
    n = len(entries)
    rows = np.zeros(n, SLOT_DTYPE)
    rows["offset"] = entries["offset"]
    rows["len"] = entries["len"]
    rows["ts"] = entries["ts"]
    fl = entries["flags"]
    deleted = fl == DELETED
    rows["flags"] = np.where(deleted, DELETED, fl & F_RECORD_MASK)
    rows["loc"] = loc
    rows["node"] = np.where(~deleted & ((fl & F_HAS_NODE) != 0), NODE_UNKNOWN, 0)
    meta4 = np.where((fl & F_HAS_META) != 0, 4, 0).astype(np.int64)
    lens = entries["len"].astype(np.int64)
    size = lens - SEG_FRAME_OVERHEAD - meta4
    texty = np.flatnonzero(~deleted & ((fl & (F_HAS_NODE | F_HAS_TAG)) != 0))
    if len(texty):
        if data is None:
            size[texty] = 0
        else:
            dl = segment_data_lens(data, entries["offset"][texty].astype(np.int64))
            size[texty] = dl - meta4[texty]
    size[deleted] = 0
    rows["bytes"] = np.clip(size, 0, 0xFFFFFFFF)
    return rows, int(np.count_nonzero(deleted))


class SegmentDamage(OSError):
    """A segment the newest snapshot relies on is missing a part, short, or its
    `.idx` disagrees with its `.data`: recovery refuses to start with nothing
    changed (docs/FORMATS.md, "Segments the snapshot relies on").

    `topic_id` is the topic instance, `problems` one line per damaged segment,
    `ranges` the `(first, last)` seqs each damaged segment held (as far as
    its surviving part tells).
    """

    def __init__(self, topic_id: int, problems: list[str], ranges: list[tuple[int, int]]) -> None:
        self.topic_id = topic_id
        self.problems = problems
        self.ranges = ranges
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            errno.EIO,
            f"segment damage in topic {topic_id:016x}: {problems[0]}{more}; refusing to start "
            "with nothing changed on disk; inspect with `topics verify`, salvage with "
            "`topics repair`",
        )


class Published(NamedTuple):
    """What a snapshot's topic map says its segments hold (see :func:`published_upto`)."""

    last: int  # highest seq the snapshot relies on a segment for
    floor: int
    segs: tuple[tuple[int, int], ...]  # (first seq, entries) of each segment it lists
    listed: bool = False  # the map has `segs`: exactly those segments are relied on
    cold: frozenset[int] = frozenset()  # first seqs of the listed segments in the cold tier


def published_upto(m: dict[str, Any]) -> Published:
    """What the snapshot topic map `m` relies on (docs/FORMATS.md, "Segments the
    snapshot relies on").

    A map with `segs` names the hot segments its snapshot relies on, each with at
    least that many entries, and `cold` the ones it relies on in the cold tier
    (either tier may hold a relied-on segment: relocation copies before it
    deletes), and nothing else: seqs up to the head that no listed
    segment holds are holes or deleted records (the padding of a disk reservation
    after a crash, a fully deleted segment that was dropped) and were never
    written, or were written by a checkpoint whose snapshot never became durable.
    `last` is then the last seq of the listed segments.

    A map without `segs` (written before snapshots listed their segments) can
    only be read the old way: a checkpoint captures the snapshot body and, from
    the same instant, writes every record up to the captured head into segments
    before the snapshot is written (ephemeral topics write none, so only the
    earlier `ckpt` counts), so every seq above `floor` up to `last` is taken to
    be in a segment. Seqs at or below the eviction and delete floors may be left
    unwritten either way.
    """
    ckpt = int(m.get("ckpt", 0))
    floor = max(
        int(m.get("l_cap", 0)),
        int(m.get("l_ttl", 0)),
        int(m.get("l_trim", 0)),
        int(m.get("delete_below", 0)) - 1,
    )
    raw = m.get("segs")
    segs = tuple((int(a), int(b)) for a, b in raw or [])
    if raw is not None:
        cold = tuple((int(a), int(b)) for a, b in m.get("cold") or [])
        segs = tuple(sorted(segs + cold))
        last = max((a + b - 1 for a, b in segs if b > 0), default=0)
        return Published(last, floor, segs, True, frozenset(a for a, _b in cold))
    if (m.get("config") or {}).get("durability") == "ephemeral":
        return Published(ckpt, floor, segs)
    return Published(max(ckpt, int(m.get("head", 0))), floor, segs)


def _first_of(path: str) -> int:
    return int(posixpath.basename(path)[4:20])


def _idx_entries(raw: bytes) -> np.ndarray:
    """The whole 20-byte entries of `.idx` bytes `raw`."""
    return np.frombuffer(raw[: len(raw) - len(raw) % IDX_ENTRY_SIZE], IDX_ENTRY_DTYPE)


def _tiling_problem(e: np.ndarray, data_size: int, *, exact: bool) -> str | None:
    """Why `.idx` entries `e` do not tile `.data` of `data_size` bytes from offset 0
    (each entry starting where the previous one ends; with `exact` the last one
    ending at the end of `.data`, else anywhere inside it), or None."""
    if not len(e):
        return None
    off = e["offset"].astype(np.int64)
    end = off + e["len"].astype(np.int64)
    last = int(end[-1])
    if off[0] != 0 or bool(np.any(off[1:] != end[:-1])) or last > data_size:
        return "is short" if last > data_size else "disagrees with its .idx"
    if exact and last != data_size:
        return "disagrees with its .idx"
    return None


def check_published(
    fs: Fs,
    d: str,
    topic_id: int,
    published: Published | None,
    listed: list[int],
    strays: list[str],
    lost: Sequence[tuple[int, int]] = (),
    elsewhere: Sequence[int] = (),
) -> None:
    """Refuse (:class:`SegmentDamage`) when a segment the snapshot relies on is damaged.

    `published` is :func:`published_upto` of the topic's snapshot map (None:
    the topic is not in the snapshot, so none of its segments is relied on);
    `listed` the first seqs of the segments with both parts in `d`, `strays` the
    halves without their pair. Checked, reading only (docs/FORMATS.md, "Segments
    the snapshot relies on"): a relied-on half without its partner; a relied-on
    segment that is gone or has fewer `.idx` entries than relied on; a sealed
    `.idx` that is not whole entries or whose entries do not tile `.data`
    exactly; the newest relied-on segment's entries not whole or pointing past
    `.data`. Which segments are relied on: with `published.listed`, exactly the
    ones the snapshot lists (any other file was written by a checkpoint whose
    snapshot never became durable, or is what a drop left behind); otherwise
    every segment starting at or below `published.last`. Segments whole in
    another tier (`elsewhere`: their first seqs) count as present; segments
    wholly at or below the floor are not checked (they are never read again).
    Damage wholly inside `lost` (seq ranges `topics repair` already recorded as
    lost) is not raised again. Raises OSError from the fs.
    """
    if published is None:
        return
    on = _OnDisk(fs, d, published, listed, strays, elsewhere)
    if published.listed:
        problems, ranges = _listed_problems(on)
    else:
        problems, ranges = _unlisted_problems(on)
    keep = [
        (p, r)
        for p, r in zip(problems, ranges, strict=True)
        if not any(a <= r[0] and r[1] <= b for a, b in lost)
    ]
    if keep:
        raise SegmentDamage(topic_id, [p for p, _r in keep], [r for _p, r in keep])


class _OnDisk(NamedTuple):
    """What :func:`check_published` found of one topic's segments, for its two checks."""

    fs: Fs
    d: str
    published: Published
    listed: list[int]
    strays: list[str]
    elsewhere: Sequence[int]


#: Problems found (one line each) and the seq range each one puts at risk.
_Found = tuple[list[str], list[tuple[int, int]]]


def _listed_problems(on: _OnDisk) -> _Found:
    """Damage to the segments a snapshot with `segs` lists (see :func:`check_published`)."""
    fs, d, published, listed, strays, elsewhere = on
    floor = published.floor
    relied = {first: count for first, count in published.segs if count > 0}
    newest = max(relied, default=-1)
    pairs = set(listed)
    problems: list[str] = []
    ranges: list[tuple[int, int]] = []
    stray_at = {_first_of(p): p for p in strays}
    for first, count in sorted(relied.items()):
        last = first + count - 1
        if last <= floor:
            continue  # wholly below the floor: not read again, dropped by a checkpoint
        paths = segment_paths(d, first)
        if first not in pairs:
            if first in elsewhere:
                continue  # whole in the cold tier
            path = stray_at.get(first)
            if first in published.cold and path is None:
                problems.append(
                    f"segment {first} (seqs {first}..{last}) the snapshot lists in the cold "
                    "tier is in neither tier"
                )
            elif path is not None:
                other = ".data" if path.endswith(".idx") else ".idx"
                problems.append(f"{path}: its {other} is missing")
            else:
                problems.append(
                    f"{paths.data}: the segment (seqs {first}..{last}) the snapshot lists is gone"
                )
            ranges.append((first, last))
            continue
        raw = read_file(fs, idx_to_check(fs, paths))
        data_size = _file_size(fs, paths.data)
        have = len(raw) // IDX_ENTRY_SIZE
        if have < count:
            problems.append(
                f"{paths.idx}: {have} entries, the snapshot recorded {count} "
                f"(seqs {first + have}..{last} are missing)"
            )
            ranges.append((first + have, last))
            continue
        if first == newest:
            # The snapshot's active segment: later checkpoints may have appended to
            # it (and left a torn tail); only the entries it relied on are checked.
            e = _idx_entries(raw)[:count]
            why = _tiling_problem(e, data_size, exact=False)
        elif len(raw) % IDX_ENTRY_SIZE:
            problems.append(f"{paths.idx}: {len(raw)} bytes is not whole 20-byte entries")
            ranges.append((first, last))
            continue
        else:
            e = _idx_entries(raw)
            why = _tiling_problem(e, data_size, exact=True)
        if why is not None:
            problems.append(
                f"{paths.data} ({data_size} bytes) {why} (seqs {first}..{first + len(e) - 1})"
            )
            ranges.append((first, first + len(e) - 1))
    return problems, ranges


def _unlisted_problems(on: _OnDisk) -> _Found:
    """Damage to the segments a snapshot without `segs` relies on: every one starting
    at or below its `last` (see :func:`published_upto`)."""
    fs, d, published, listed, strays, elsewhere = on
    ckpt, floor = published.last, published.floor
    problems: list[str] = []
    ranges: list[tuple[int, int]] = []
    starts = sorted([*listed, *(_first_of(p) for p in strays)])

    def until(first: int, count: int | None) -> int:
        if count is not None:
            return first + count - 1
        later = [x for x in starts if x > first]
        return (later[0] - 1) if later else ckpt

    for path in strays:
        first = _first_of(path)
        if first > ckpt or first in elsewhere:
            continue  # written by a checkpoint that never published its snapshot
        has_idx = path.endswith(".idx")
        if has_idx:
            e = _idx_entries(read_file(fs, path))
            if until(first, len(e)) <= floor or (len(e) and bool(np.all(e["flags"] == DELETED))):
                continue  # what a drop (below the floor, or fully deleted) leaves behind
            count: int | None = len(e)
        else:
            count = None
            if until(first, None) <= floor:
                continue
        other = ".data" if has_idx else ".idx"
        problems.append(f"{path}: its {other} is missing")
        ranges.append((first, min(until(first, count), ckpt)))
    for i, first in enumerate(listed):
        if first > ckpt:
            continue
        if i + 1 < len(listed) and listed[i + 1] - 1 <= floor:
            continue  # wholly below the floor: not read again, dropped by a checkpoint
        paths = segment_paths(d, first)
        raw = read_file(fs, idx_to_check(fs, paths))
        data_size = _file_size(fs, paths.data)
        newest = i == len(listed) - 1
        if newest:
            need = ckpt - first + 1
            have = len(raw) // IDX_ENTRY_SIZE
            if ckpt > floor and have < need:
                problems.append(
                    f"{paths.idx}: {have} entries, but the snapshot relies on {need} "
                    f"(seqs {first + have}..{ckpt} are missing)"
                )
                ranges.append((first + have, ckpt))
                continue
            e = _idx_entries(raw)[: max(need, 0)]
        elif len(raw) % IDX_ENTRY_SIZE:
            problems.append(f"{paths.idx}: {len(raw)} bytes is not whole 20-byte entries")
            ranges.append((first, until(first, None)))
            continue
        else:
            e = _idx_entries(raw)
        why = _tiling_problem(e, data_size, exact=not newest)
        if why is not None:
            problems.append(
                f"{paths.data} ({data_size} bytes) {why} (seqs {first}..{first + len(e) - 1})"
            )
            ranges.append((first, first + len(e) - 1))
    return problems, ranges


#: What a topic that is in no snapshot (created after it, or there is none) relies
#: on: no segment (the WAL holds every one of its records).
RELIES_ON_NOTHING = Published(0, 0, (), True)


def load_topic(
    fs: Fs,
    root: str,
    topic_id: int,
    cold_root: str | None = None,
    published: Published | None = None,
) -> LoadedTopic:
    """Load the segments of topic instance `topic_id` under data dir `root`.

    Segments are listed through the topic's tier (HOT preferred when a segment is
    in both). The newest is resumed as the active one: entries whose frames do
    not verify are its torn tail and are truncated, and so, when `published` (see
    :func:`published_upto`; :data:`RELIES_ON_NOTHING` for a topic in no snapshot)
    tells which segments the snapshot relies on, is every entry past the ones it
    relies on: a checkpoint whose snapshot never became durable wrote them, a
    crash may have torn their `.idx` bytes that no frame checksum covers (a hole's
    0xD5 flag, a timestamp), and the WAL still holds their records
    (docs/FORMATS.md, "Segments the snapshot relies on"). Older ones are sealed
    (flushed whole before a newer one was created) and only their `.idx` is read.
    The caller has already checked the segments the snapshot relies on
    (:func:`check_published`, for every topic before anything changes). Raises
    OSError from the fs.
    """
    store = TopicStore.create(fs, root, topic_id, cold_root)
    d = store.dir
    finish_rewrites(fs, d)
    scan = scan_segments(fs, d)
    # The check passed, so a half without its pair was never published (an
    # interrupted checkpoint: the WAL still has those records) or is what a drop
    # left behind: it goes.
    for path in scan.strays:
        log.warning("removing segment half without its pair: %s", path)
        fs.unlink(path)
    for path in scan.temps:
        try:
            fs.unlink(path)
        except OSError as exc:
            log.warning("cannot remove leftover %s: %s", path, exc)
    parts: list[SlotArray] = []
    sources: dict[int, SegmentSource] = {}
    base_seq = 0
    expect = 0  # next seq after the previous segment
    listed = store.tier.list()
    for i, (first, tier) in enumerate(listed):
        tier_store = store.tier.store(tier)
        tfs = tier_store.fs
        paths = SegmentPaths(
            tier_store.path(first, SegmentPart.DATA), tier_store.path(first, SegmentPart.IDX)
        )
        if (
            tier is Tier.COLD
            and published is not None
            and published.listed
            and first not in dict(published.segs)
        ):
            # A cold copy the snapshot does not list: a relocation that never
            # committed (the hot copy, or the WAL, holds these records), or a drop
            # cut short. Not loaded; deleted after the next snapshot.
            log.warning("cold copy %s is not in the snapshot; it will be deleted", paths.data)
            store.orphans.append(SegMeta(first, 0, -1, True, 0, 0, 0, Tier.COLD))
            continue
        if expect and first < expect:
            log.error(
                "segment %s overlaps the one before it (ends at %d); ignored",
                paths.data,
                expect - 1,
            )
            continue
        active = i == len(listed) - 1 and tier is Tier.HOT
        if active:
            keep = None
            if published is not None and published.listed:
                keep = dict(published.segs).get(first, 0)
            writer = SegmentWriter.resume(fs, d, first, max_count=keep)
            store.writer = writer
            try:
                raw = writer.idx_bytes()
            finally:
                # Resumed (and fdatasynced if it was cut): no descriptors held until
                # the checkpointer appends to it, however many topics there are.
                writer.release()
            data_size = writer.data_bytes
        else:
            raw = read_file(tfs, paths.idx)
            raw = raw[: len(raw) - len(raw) % IDX_ENTRY_SIZE]
            data_size = _file_size(tfs, paths.data)
        entries = np.frombuffer(raw, IDX_ENTRY_DTYPE)
        if not len(entries):
            if active:
                # Empty (or torn down to nothing): later checkpoints append to it,
                # so the engine must be able to read it like any active segment.
                loc = store.alloc_loc()
                store.segs.append(SegMeta(first, 0, loc, False, 0))
                sources[loc] = SegmentSource(fs, paths.data, sealed=False)
            continue
        fl = entries["flags"]
        needs_data = bool(np.any((fl != DELETED) & ((fl & (F_HAS_NODE | F_HAS_TAG)) != 0)))
        data = read_file(tfs, paths.data) if needs_data else None
        loc = store.alloc_loc()
        rows, deleted = _rows(entries, loc, data, data_size)
        holes = int(np.count_nonzero((fl == DELETED) & (entries["len"] == HOLE_FRAME_BYTES)))
        if not parts:
            base_seq = first
        elif first > expect:
            gap = np.zeros(first - expect, SLOT_DTYPE)
            gap["flags"] = DELETED
            gap["loc"] = LOC_HOLE
            gap["ts"] = rows["ts"][0]
            parts.append(gap)
        parts.append(rows)
        expect = first + len(entries)
        store.segs.append(
            SegMeta(
                first,
                len(entries),
                loc,
                not active,
                data_size,
                deleted,
                int(entries["ts"][0]),
                tier,
                holes,
            )
        )
        sources[loc] = SegmentSource(tfs, paths.data, sealed=not active, cold=tier is Tier.COLD)
    rows_all = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else None
    if rows_all is None:
        rows_all = np.zeros(0, SLOT_DTYPE)
    return LoadedTopic(store, base_seq, rows_all, sources)


#: Suffix of the files a rewrite writes before it renames them over a segment's parts
#: (docs/FORMATS.md, "Reclaim").
REWRITE_SUFFIX = ".rw"
#: Bytes of a header-only segment frame (a hole: no node, tag or payload).
HOLE_FRAME_BYTES = 45
#: A sealed segment is rewritten once at least this share of its entries are
#: deleted records that still hold their bytes (docs/FORMATS.md, "Reclaim").
RECLAIM_DEAD_RATIO = 0.5


def idx_to_check(fs: Fs, paths: SegmentPaths) -> str:
    """The `.idx` that pairs with `.data` now: the rewrite's `.idx.rw` when a rewrite
    renamed its `.data` in and was cut short before its `.idx` (recovery finishes it,
    :func:`finish_rewrites`), else the segment's `.idx`."""
    idx_rw = paths.idx + REWRITE_SUFFIX
    if fs.exists(idx_rw) and not fs.exists(paths.data + REWRITE_SUFFIX):
        return idx_rw
    return paths.idx


def finish_rewrites(fs: Fs, d: str) -> None:
    """Finish or undo the rewrites a crash cut short in topic directory `d`.

    A rewrite writes `.data.rw` and `.idx.rw` (each synced, the directory synced
    after each), then renames `.data.rw` and `.idx.rw` over the parts. So an
    `.idx.rw` without its `.data.rw` means the new `.data` is in: the `.idx.rw` is
    renamed over the `.idx`. Any other leftover is a rewrite that renamed
    nothing: the segment is whole as it was, and the leftovers go. Raises OSError.
    """
    if not fs.exists(d):
        return
    names = set(fs.listdir(d))
    changed = False
    for name in sorted(names):
        if not name.endswith(".idx" + REWRITE_SUFFIX):
            continue
        stem = name[: -len(".idx" + REWRITE_SUFFIX)]
        if stem + ".data" + REWRITE_SUFFIX not in names:
            fs.replace(posixpath.join(d, name), posixpath.join(d, stem + ".idx"))
            changed = True
    for name in sorted(names):
        if name.endswith(REWRITE_SUFFIX) and fs.exists(posixpath.join(d, name)):
            fs.unlink(posixpath.join(d, name))
            changed = True
    if changed:
        fs.fsync_dir(d)


class Rewrite(NamedTuple):
    """A sealed segment rewritten without its deleted records' bytes."""

    data: bytes
    idx: bytes
    offsets: np.ndarray  # per entry: the new frame offset in `.data`
    lens: np.ndarray  # per entry: the new frame length
    holes: int  # header-only entries in the new segment


def plan_rewrite(fs: Fs, paths: SegmentPaths, first_seq: int, topic_id: int) -> Rewrite:
    """The segment at `paths` with every deleted entry's frame replaced by a hole.

    Entries keep their seqs, timestamps and flags; a deleted one's frame becomes
    header-only (45 bytes), every other frame is copied byte for byte after it
    verified (length, seq, checksum). Raises OSError when a part cannot be read,
    its `.idx` does not tile its `.data`, or a frame kept does not verify: what
    cannot be read is never rewritten.
    """
    raw = read_file(fs, paths.idx)
    data = read_file(fs, paths.data)
    why = sealed_tiling_problem(raw, len(data))
    if why is not None:
        raise OSError(errno.EIO, f"not rewritten: {paths.data} {why}")
    e = _idx_entries(raw)
    flags = e["flags"]
    offs = e["offset"].astype(np.int64)
    lens = e["len"].astype(np.int64)
    new_lens = np.where(flags == DELETED, HOLE_FRAME_BYTES, lens)
    new_offs = np.concatenate(([0], np.cumsum(new_lens)[:-1])).astype(np.int64)
    parts: list[bytes] = []
    ts = e["ts"]
    for i in range(len(e)):
        seq = first_seq + i
        if flags[i] == DELETED:
            parts.append(
                encode_record(
                    topic_id, seq, int(ts[i]), None, None, b"", None, durable=False, segment=True
                )
            )
            continue
        o, ln = int(offs[i]), int(lens[i])
        bad = check_frame(data, o, ln, seq, SEG_HDR)
        if bad is not None:
            raise OSError(errno.EIO, f"not rewritten: {paths.data} seq {seq}: {bad}")
        parts.append(data[o : o + ln])
    new = np.zeros(len(e), IDX_ENTRY_DTYPE)
    new["offset"] = new_offs
    new["len"] = new_lens
    new["ts"] = ts
    new["flags"] = flags
    holes = int(np.count_nonzero(flags == DELETED))
    return Rewrite(b"".join(parts), new.tobytes(), new_offs, new_lens, holes)


def install_rewrite(fs: Fs, paths: SegmentPaths, rw: Rewrite, before_rename: Any = None) -> None:
    """Put a :class:`Rewrite` in place of the segment at `paths`, crash-safely.

    `.data.rw` (synced), directory sync, `.idx.rw` (synced), directory sync,
    then `before_rename()` (the engine's reader pins the old file), rename
    `.data.rw` over `.data`, directory sync, rename `.idx.rw` over `.idx`,
    directory sync. :func:`finish_rewrites` completes or undoes a rewrite a crash
    cut short. Raises OSError.
    """
    d = posixpath.dirname(paths.data)
    write_file(fs, paths.data + REWRITE_SUFFIX, rw.data)
    fs.fsync_dir(d)
    write_file(fs, paths.idx + REWRITE_SUFFIX, rw.idx)
    fs.fsync_dir(d)
    if before_rename is not None:
        before_rename()
    fs.replace(paths.data + REWRITE_SUFFIX, paths.data)
    fs.fsync_dir(d)
    fs.replace(paths.idx + REWRITE_SUFFIX, paths.idx)
    fs.fsync_dir(d)


def sealed_tiling_problem(idx: bytes, data_size: int) -> str | None:
    """Why a sealed segment's `.idx` bytes do not tile a `.data` of `data_size` bytes
    exactly (whole 20-byte entries, frames back to back from the header), or None."""
    if len(idx) % IDX_ENTRY_SIZE:
        return f"has a {len(idx)}-byte .idx (not whole 20-byte entries)"
    return _tiling_problem(_idx_entries(idx), data_size, exact=True)


def same_frames(a: bytes, b: bytes) -> bool:
    """Whether two `.idx` images index the same frames (entries, offsets, lengths,
    timestamps), whatever their delete flags."""
    if len(a) != len(b) or len(a) % IDX_ENTRY_SIZE:
        return False
    ea, eb = _idx_entries(a), _idx_entries(b)
    return all(bool(np.array_equal(ea[k], eb[k])) for k in ("offset", "len", "ts"))


def replace_idx(store: SegmentStore, first_seq: int, idx: bytes) -> None:
    """Replace the `.idx` of a complete segment in `store` as one atomic step.

    A local store writes a temporary file, fdatasyncs it and renames it over the
    old one (then fsyncs the directory); an object store PUTs the object whole.
    Raises OSError (FileNotFoundError when the segment is gone)."""
    if isinstance(store, LocalSegmentStore):
        fs = store.fs
        final = store.path(first_seq, SegmentPart.IDX)
        if not fs.exists(store.path(first_seq, SegmentPart.DATA)):
            raise FileNotFoundError(errno.ENOENT, "segment is gone", final)
        write_file(fs, final + ".tmp", idx)
        fs.replace(final + ".tmp", final)
        fs.fsync_dir(store.root_dir)
        return
    replace = getattr(store, "replace_idx", None)
    if replace is None:
        raise OSError(errno.ENOTSUP, f"cannot replace an .idx in {type(store).__name__}")
    replace(first_seq, idx)


def flip_deleted_in(store: SegmentStore, first_seq: int, seqs: list[int]) -> None:
    """:func:`flip_deleted` for a segment in any tier store: in place in a local file,
    by replacing the whole `.idx` in an object store. Raises OSError."""
    if isinstance(store, LocalSegmentStore):
        flip_deleted(store.fs, store.path(first_seq, SegmentPart.IDX), first_seq, seqs)
        return
    raw = bytearray(read_file(store.fs, store.path(first_seq, SegmentPart.IDX)))
    n = len(raw) // IDX_ENTRY_SIZE
    changed = False
    for s in sorted(set(seqs)):
        i = s - first_seq
        if 0 <= i < n and raw[i * IDX_ENTRY_SIZE + IDX_FLAGS_OFFSET] != DELETED:
            raw[i * IDX_ENTRY_SIZE + IDX_FLAGS_OFFSET] = DELETED
            changed = True
    if changed:
        replace_idx(store, first_seq, bytes(raw))


def flip_deleted(fs: Fs, idx_path: str, first_seq: int, seqs: list[int]) -> None:
    """Set the `.idx` flags byte of each seq to 0xD5 in place, then fdatasync.

    `.data` is never rewritten (docs/FORMATS.md, "Segment files"); the flag is outside the checksum.
    Seqs past the file's entries are ignored. Raises OSError from the fs.
    """
    f = fs.open(idx_path, write=True)
    try:
        n = f.size() // IDX_ENTRY_SIZE
        wrote = False
        for s in sorted(set(seqs)):
            i = s - first_seq
            if 0 <= i < n:
                write_all(f, bytes((DELETED,)), i * IDX_ENTRY_SIZE + IDX_FLAGS_OFFSET)
                wrote = True
        if wrote:
            f.fdatasync()
    finally:
        f.close()


#: Suffix of a deleted topic's directory waiting to be unlinked (docs/FORMATS.md,
#: "Deleted topics").
RETIRED_SUFFIX = ".deleted"


def retire_topic_dir(fs: Fs, root: str, topic_id: int) -> str | None:
    """Rename a deleted topic instance's directory under `root` to `<id>.deleted`.

    The rename (and the fsync of `topics/`) is the only step taken inline; the
    files are unlinked later by :func:`unlink_dir`, in the background. A
    leftover directory of the same name from an interrupted earlier attempt is
    unlinked first. Returns the new path, or None when the directory is absent.
    Raises OSError from the fs.
    """
    d = topic_dir(root, topic_id)
    open_files.close_under(d)
    if not fs.exists(d):
        return None
    dest = d + RETIRED_SUFFIX
    if fs.exists(dest):
        unlink_dir(fs, dest)
    fs.replace(d, dest)
    fs.fsync_dir(posixpath.dirname(d))
    return dest


def retired_dirs(fs: Fs, root: str) -> list[str]:
    """Every `topics/<id>.deleted` directory under `root` (an unlink cut short)."""
    base = posixpath.join(root, "topics")
    if not fs.exists(base):
        return []
    return [posixpath.join(base, n) for n in sorted(fs.listdir(base)) if n.endswith(RETIRED_SUFFIX)]


def unlink_dir(fs: Fs, d: str) -> None:
    """Unlink every file of directory `d`, fsync it, remove it and fsync its parent.

    Idempotent: a missing directory (or file) is fine, so an unlink cut short by a
    crash is finished by calling it again.
    """
    if not fs.exists(d):
        return
    for name in fs.listdir(d):
        try:
            fs.unlink(posixpath.join(d, name))
        except FileNotFoundError:
            continue
    fs.fsync_dir(d)
    fs.rmdir(d)
    fs.fsync_dir(posixpath.dirname(d))
