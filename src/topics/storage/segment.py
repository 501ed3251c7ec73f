"""Per-topic segment files: `seg-<first_seq>.data` frames + a fixed-stride `.idx`.

Segment files, sealing triggers and reads (docs/FORMATS.md, "Segment files";
README TOPICS_SEGMENT_*). Layout (all LE)::

    topics/<topic_id as %016x>/seg-<first_seq as %016d>.data
    topics/<topic_id as %016x>/seg-<first_seq as %016d>.idx

`.data` is a run of segment frames, one per seq in order. This module treats a
frame as an opaque byte range and only reads the three fields it must check on
the read/verify path::

    off 0   frame_len u32   == len(frame) - 4
    off 13  seq       u64   == the seq the `.idx` entry stands for
    off -8  xxh3      u64   == XXH3-64(frame[4:-8])

`.idx` is 20 bytes per seq, entry `i` <=> seq `first_seq + i` (so the entry of
`seq` lives at byte `(seq - first_seq) * 20`; no scan)::

    offset u32 | len u32 | ts u64 | flags u8 | pad 3

Invariants:

* **Write order.** Appends write `.data` at once and keep their `.idx` entries
  in memory; :meth:`SegmentWriter.flush` fdatasyncs `.data`, then writes and
  fdatasyncs the entries, so no `.idx` entry ever points at bytes that are not
  durable (the reader still checks: an entry past the end of `.data` is
  :class:`SegmentCorrupt`).
* **Sealed segments are immutable.** A checksum, length or seq mismatch on read
  raises :class:`SegmentCorrupt` -- never a silent skip or truncation. Only the
  active segment can have a torn tail, and only :meth:`SegmentWriter.resume`
  truncates it.
* **The delete flag is outside the checksum.** Deleting flips the `.idx` flags
  byte to :data:`~topics.engine.index.DELETED` (0xD5) in place; `.data` is never
  rewritten, so a deleted record's frame still verifies.

All I/O goes through an injected :class:`~topics.storage.fs.Fs`. Records are
read by the engine through :class:`topics.storage.topicstore.SegmentSource`
and checked by fsck (:mod:`topics.storage.check`).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import xxhash

from topics.format.frame import native_segment_frames
from topics.format.idx import IDX_ENTRY_DTYPE, IDX_ENTRY_SIZE
from topics.storage.fs import File, Fs, write_all

__all__ = [
    "IDX_ENTRY_SIZE",
    "MIN_FRAME_LEN",
    "MAX_DATA_BYTES",
    "IdxArray",
    "SegmentError",
    "SegmentCorrupt",
    "SegmentRangeError",
    "SegmentPaths",
    "SegmentScan",
    "SegmentInfo",
    "SegmentWriter",
    "segment_name",
    "segment_paths",
    "topic_dir",
    "frame_problem",
    "scan_segments",
    "segment_blob",
]


#: Bytes per `.idx` entry (the fixed stride).
#: Smallest byte range that can be a frame: `frame_len u32` + the trailing checksum.
MIN_FRAME_LEN = 4 + 8
#: `.idx` offsets are u32, so a `.data` file can never grow past this many bytes.
MAX_DATA_BYTES = 0xFFFFFFFF

_SEQ_OFF = 13  # frame_len u32, flags u8, topic_id u64 -> seq u64 (docs/FORMATS.md)
_U32 = struct.Struct("<I")
_NAME_RE = re.compile(r"^seg-(\d{16})\.(data|idx)$")

IdxArray = npt.NDArray[np.void]
"""A 1-D numpy array of :data:`~topics.engine.index.IDX_ENTRY_DTYPE` entries."""


# -- errors -------------------------------------------------------------------


class SegmentError(Exception):
    """Base class of segment-file errors."""


class SegmentCorrupt(SegmentError):
    """Bytes of a segment are not what the format promises (docs/FORMATS.md: corruption is surfaced).

    Attributes:
        path: the file that failed (`.data` or `.idx`).
        seq: the record seq involved, or None for a whole-file problem.
        reason: short human-readable cause.
    """

    def __init__(self, path: str, seq: int | None, reason: str = "corrupt") -> None:
        where = f" seq {seq}" if seq is not None else ""
        super().__init__(f"{path}:{where} {reason}")
        self.path = path
        self.seq = seq
        self.reason = reason


class SegmentRangeError(SegmentError, LookupError):
    """A seq or byte range outside what a segment holds (never a silent short read)."""


# -- naming --------------------------------------------------------------------


class SegmentPaths(NamedTuple):
    """The two files of one segment."""

    data: str
    idx: str


def segment_name(first_seq: int) -> str:
    """`seg-<first_seq as 16 zero-padded decimal digits>` (no extension).

    Zero padding makes lexical order equal seq order (docs/FORMATS.md, "Segment files").
    """
    if first_seq < 0:
        raise ValueError(f"first_seq must be >= 0, got {first_seq}")
    return f"seg-{first_seq:016d}"


def segment_paths(directory: str, first_seq: int) -> SegmentPaths:
    """Full paths of `seg-<first_seq>.data` and `.idx` inside `directory`."""
    base = os.path.join(directory, segment_name(first_seq))
    return SegmentPaths(base + ".data", base + ".idx")


def topic_dir(root: str, topic_id: int) -> str:
    """`<root>/topics/<topic_id as 16 lowercase hex digits>`.

    Named by the interned id, never the topic name, so no user string reaches a
    path (docs/FORMATS.md, "Segment files").
    """
    if topic_id < 0:
        raise ValueError(f"topic_id must be >= 0, got {topic_id}")
    return os.path.join(root, "topics", f"{topic_id:016x}")


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What :func:`scan_segments` found in one topic directory.

    Attributes:
        segments: complete `(first_seq, paths)` pairs, ascending by first_seq.
        strays: paths of a `.data` without its `.idx` or the reverse (an
            incomplete segment: never served, left for reclaim).
        temps: `*.tmp` leftovers of an interrupted put (ignored).
    """

    segments: list[tuple[int, SegmentPaths]]
    strays: list[str]
    temps: list[str]


def scan_segments(fs: Fs, directory: str) -> SegmentScan:
    """Classify the files of a topic directory (a missing directory is empty).

    Names that are neither a segment part nor `.tmp` are ignored.
    """
    if not fs.exists(directory):
        return SegmentScan([], [], [])
    parts: dict[int, set[str]] = {}
    temps: list[str] = []
    for name in fs.listdir(directory):
        if name.endswith(".tmp"):
            temps.append(os.path.join(directory, name))
            continue
        m = _NAME_RE.match(name)
        if m is not None:
            parts.setdefault(int(m.group(1)), set()).add(m.group(2))
    segments: list[tuple[int, SegmentPaths]] = []
    strays: list[str] = []
    for first in sorted(parts):
        paths = segment_paths(directory, first)
        kinds = parts[first]
        if kinds == {"data", "idx"}:
            segments.append((first, paths))
        else:
            strays.append(paths.data if "data" in kinds else paths.idx)
    return SegmentScan(segments, strays, sorted(temps))


# -- frame check ---------------------------------------------------------------


def frame_problem(frame: bytes | memoryview, seq: int | None = None) -> str | None:
    """Why `frame` is not a valid segment frame, or None when it is.

    Checks the length prefix (`frame_len == len(frame) - 4`), the seq field when
    `seq` is given, and the XXH3-64 over `frame[4:-8]` against the trailing u64.
    """
    n = len(frame)
    if n < MIN_FRAME_LEN:
        return f"frame of {n} bytes is shorter than {MIN_FRAME_LEN}"
    if int.from_bytes(frame[0:4], "little") != n - 4:
        return "frame_len does not match the indexed length"
    if seq is not None and n >= _SEQ_OFF + 8:
        got = int.from_bytes(frame[_SEQ_OFF : _SEQ_OFF + 8], "little")
        if got != seq:
            return f"frame carries seq {got}"
    if xxhash.xxh3_64_intdigest(frame[4:-8]) != int.from_bytes(frame[-8:], "little"):
        return "checksum mismatch"
    return None


# -- writer --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """Summary of a segment: seqs `[first_seq, last_seq]`, `count` records, `data_bytes`."""

    first_seq: int
    last_seq: int
    count: int
    data_bytes: int


def _entries(
    offsets: Sequence[int], lens: Sequence[int], ts: Sequence[int], flags: Sequence[int]
) -> IdxArray:
    arr = np.zeros(len(offsets), IDX_ENTRY_DTYPE)
    arr["offset"] = offsets
    arr["len"] = lens
    arr["ts"] = ts
    arr["flags"] = flags
    return arr


class SegmentWriter:
    """Appends frames to the active segment `seg-<first_seq>` of `directory`.

    The layout is that of docs/FORMATS.md, "Segment files". The
    constructor creates both files (and the directory); it refuses to clobber a
    non-empty existing segment (:meth:`resume` reopens one). Appends write their
    `.data` bytes at once; their `.idx` entries are written by :meth:`flush`,
    after `.data` is durable. Not thread-safe: one writer per segment.

    The writer holds two file descriptors while in use; :meth:`release` gives
    them back between uses (the next write reopens the files), so idle active
    segments of many topics cost no descriptors.

    Raises:
        FileExistsError: a non-empty `.data` or `.idx` already exists.
        OSError: from the fs.
    """

    _data_f: File | None
    _idx_f: File | None

    def __init__(self, fs: Fs, directory: str, first_seq: int) -> None:
        self._init(fs, directory, first_seq)
        created_dir = not fs.exists(directory)
        if created_dir:
            fs.makedirs(directory)
        for path in self.paths:
            if fs.exists(path):
                f = fs.open(path)
                try:
                    if f.size() != 0:
                        raise FileExistsError(f"segment file already exists: {path}")
                finally:
                    f.close()
        self._open_files(create=True)
        self._dir_synced = False
        self._parent_sync = created_dir

    def _init(self, fs: Fs, directory: str, first_seq: int) -> None:
        self.fs = fs
        self.directory = directory
        self.first_seq = first_seq
        self.paths = segment_paths(directory, first_seq)
        self._data_size = 0
        self._count = 0
        self._first_ts: int | None = None
        self._sealed = False
        self._closed = False
        self._dirty = False
        self._pending_idx: list[bytes] = []
        self._idx_on_disk = 0
        self._data_f = None
        self._idx_f = None

    def _open_files(self, *, create: bool) -> None:
        """Open `.data`, then `.idx` (`.data` is closed again when that fails)."""
        data = self.fs.open(self.paths.data, create=create, write=True)
        try:
            self._idx_f = self.fs.open(self.paths.idx, create=create, write=True)
        except BaseException:
            data.close()
            raise
        self._data_f = data

    @classmethod
    def resume(
        cls, fs: Fs, directory: str, first_seq: int, *, max_count: int | None = None
    ) -> SegmentWriter:
        """Reopen an existing active segment for appending after a restart.

        Whole `.idx` entries are kept while their frame lies inside `.data` and
        verifies (and, when given, at most `max_count` of them, e.g. the count
        recorded by the last CheckpointMark); the first bad entry and everything
        after it is the torn tail of the active segment and is truncated from
        both files, which are then fdatasynced. The WAL replays what was cut.

        Raises:
            FileNotFoundError: either file is missing.
        """
        w = cls.__new__(cls)
        w._init(fs, directory, first_seq)
        for path in w.paths:
            if not fs.exists(path):
                raise FileNotFoundError(path)
        w._open_files(create=False)
        w._dir_synced = True
        w._parent_sync = False
        try:
            raw = w._idx.pread(w._idx.size(), 0)
            whole = len(raw) // IDX_ENTRY_SIZE
            if max_count is not None:
                whole = min(whole, max(0, max_count))
            entries = np.frombuffer(raw, IDX_ENTRY_DTYPE, count=whole)
            data_size = w._data.size()
            good = 0
            end = 0
            for i in range(whole):
                off, ln = int(entries["offset"][i]), int(entries["len"][i])
                if off != end or off + ln > data_size:
                    break
                frame = w._data.pread(ln, off)
                if len(frame) != ln or frame_problem(frame, first_seq + i) is not None:
                    break
                good, end = i + 1, off + ln
            if good * IDX_ENTRY_SIZE != len(raw) or end != data_size:
                # index first: no durable entry may point past the cut data
                w._idx.truncate(good * IDX_ENTRY_SIZE)
                w._idx.fdatasync()
                w._data.truncate(end)
                w._data.fdatasync()
            w._count = good
            w._idx_on_disk = good
            w._data_size = end
            if good:
                w._first_ts = int(entries["ts"][0])
        except BaseException:
            w.close()
            raise
        return w

    # -- descriptors --

    @property
    def _data(self) -> File:
        if self._data_f is None:
            self._data_f = self._reopen(self.paths.data)
        return self._data_f

    @property
    def _idx(self) -> File:
        if self._idx_f is None:
            self._idx_f = self._reopen(self.paths.idx)
        return self._idx_f

    def _reopen(self, path: str) -> File:
        """Open one of the two files again after :meth:`release` (not once closed)."""
        if self._closed:
            raise SegmentError(f"segment {path} is closed")
        return self.fs.open(path, write=True)

    @property
    def holds_files(self) -> bool:
        """Whether either file is open right now (see :meth:`release`)."""
        return self._data_f is not None or self._idx_f is not None

    def release(self) -> bool:
        """Close both descriptors but keep the writer usable; True when released.

        The next append, flush or :meth:`idx_bytes` reopens the files (both
        must still exist, else OSError/FileNotFoundError). A writer with
        appends not yet flushed keeps its files (returns False): durability
        never depends on syncing through a different descriptor. This is what
        keeps a process with many topics from holding two descriptors per
        active segment between checkpoints.
        """
        if self._dirty:
            return False
        self._close_files()
        return True

    def _close_files(self) -> None:
        d, i = self._data_f, self._idx_f
        self._data_f = self._idx_f = None
        try:
            if d is not None:
                d.close()
        finally:
            if i is not None:
                i.close()

    # -- state --

    @property
    def count(self) -> int:
        """Records appended so far."""
        return self._count

    @property
    def data_bytes(self) -> int:
        """Bytes of `.data` written so far."""
        return self._data_size

    @property
    def next_seq(self) -> int:
        """Seq the next appended frame will have."""
        return self.first_seq + self._count

    @property
    def last_seq(self) -> int:
        """Seq of the newest frame (`first_seq - 1` when empty)."""
        return self.first_seq + self._count - 1

    @property
    def first_ts(self) -> int | None:
        """Commit ts (ms) of the first record; the age trigger's base."""
        return self._first_ts

    @property
    def sealed(self) -> bool:
        return self._sealed

    def age_ms(self, now_ms: int) -> int:
        """`now_ms - first_ts` (0 when empty; negative if the clock went back)."""
        return 0 if self._first_ts is None else now_ms - self._first_ts

    def should_seal(self, max_events: int, max_bytes: int, max_age_ms: int, now_ms: int) -> bool:
        """True when any seal trigger fires (README TOPICS_SEGMENT_*).

        Triggers: `count >= max_events`, `data_bytes >= max_bytes`, or (when
        `max_age_ms > 0`) `now_ms - first_ts >= max_age_ms`. An empty segment
        never seals.
        """
        if self._count == 0:
            return False
        if self._count >= max_events or self._data_size >= max_bytes:
            return True
        return max_age_ms > 0 and self.age_ms(now_ms) >= max_age_ms

    def info(self) -> SegmentInfo:
        return SegmentInfo(self.first_seq, self.last_seq, self._count, self._data_size)

    def idx_bytes(self) -> bytes:
        """Every `.idx` entry appended so far (those not flushed yet included)."""
        return self._idx.pread(self._idx_on_disk * IDX_ENTRY_SIZE, 0) + b"".join(self._pending_idx)

    # -- appends --

    def append(self, frame: bytes, ts: int, flags: int) -> int:
        """Append one frame for seq :attr:`next_seq`; returns that seq.

        `ts` is the commit time in ms, `flags` the frame's flags byte. Raises
        ValueError for a malformed frame/flags or a full `.data` (u32 offsets),
        SegmentError when sealed or closed, OSError from the fs.
        """
        seq = self.next_seq
        self.append_many([frame], [ts], [flags])
        return seq

    def append_many(
        self, frames: Sequence[bytes], ts: Sequence[int], flags: Sequence[int]
    ) -> IdxArray:
        """Append a contiguous run of frames (seqs `next_seq ..`); one write per file.

        Returns the `.idx` entries written (an :data:`IdxArray`, offsets into
        `.data`). Same errors as :meth:`append`; on a validation error nothing is
        written.
        """
        if self._sealed or self._closed:
            raise SegmentError(f"segment {self.paths.data} is sealed or closed")
        if not (len(frames) == len(ts) == len(flags)):
            raise ValueError("frames, ts and flags must have the same length")
        if not frames:
            return np.zeros(0, IDX_ENTRY_DTYPE)
        offsets: list[int] = []
        lens: list[int] = []
        pos = self._data_size
        for frame, fl in zip(frames, flags, strict=True):
            n = len(frame)
            if n < MIN_FRAME_LEN or int.from_bytes(frame[0:4], "little") != n - 4:
                raise ValueError("not a segment frame: frame_len must equal len(frame) - 4")
            if not 0 <= fl <= 0xFF:
                raise ValueError(f"invalid frame flags {fl:#x}")
            offsets.append(pos)
            lens.append(n)
            pos += n
        if pos > MAX_DATA_BYTES:
            raise ValueError("segment .data would exceed the u32 offset range; seal first")
        entries = _entries(offsets, lens, ts, flags)
        write_all(self._data, b"".join(frames), self._data_size)
        # The entries reach `.idx` in flush(), after `.data` is durable.
        self._pending_idx.append(entries.tobytes())
        if self._first_ts is None:
            self._first_ts = int(ts[0])
        self._data_size = pos
        self._count += len(frames)
        self._dirty = True
        return entries

    def append_blob(
        self,
        blob: bytes,
        lens: npt.NDArray[Any],
        ts: npt.NDArray[Any],
        flags: npt.NDArray[Any],
    ) -> IdxArray:
        """Append frames given as one blob plus per-frame lengths (seqs `next_seq ..`).

        The vectorised form of :meth:`append_many` for frames built by
        :func:`segment_blob`; checks that each length prefix matches. Same errors.
        """
        if self._sealed or self._closed:
            raise SegmentError(f"segment {self.paths.data} is sealed or closed")
        n = len(lens)
        if not (len(ts) == len(flags) == n) or int(np.sum(lens, dtype=np.int64)) != len(blob):
            raise ValueError("blob, lens, ts and flags do not agree")
        if not n:
            return np.zeros(0, IDX_ENTRY_DTYPE)
        rel = np.zeros(n, np.int64)
        if n > 1:
            np.cumsum(lens[:-1], out=rel[1:], dtype=np.int64)
        raw = np.frombuffer(blob, np.uint8)
        prefix = raw[rel[:, None] + np.arange(4)].copy().view("<u4").reshape(n)
        if np.any(prefix != lens.astype(np.int64) - 4) or np.any(lens < MIN_FRAME_LEN):
            raise ValueError("not segment frames: a frame_len does not match its length")
        pos = self._data_size
        if pos + len(blob) > MAX_DATA_BYTES:
            raise ValueError("segment .data would exceed the u32 offset range; seal first")
        entries = np.zeros(n, IDX_ENTRY_DTYPE)
        entries["offset"] = rel + pos
        entries["len"] = lens
        entries["ts"] = ts
        entries["flags"] = flags
        write_all(self._data, blob, pos)
        self._pending_idx.append(entries.tobytes())
        if self._first_ts is None:
            self._first_ts = int(ts[0])
        self._data_size = pos + len(blob)
        self._count += n
        self._dirty = True
        return entries

    # -- durability --

    def flush(self) -> None:
        """Make every append durable: fdatasync `.data`, then `.idx`.

        On the first flush after creation the directory is fsynced too (and its
        parent if the writer created the directory), so the new names survive.
        """
        if self._closed:
            raise SegmentError(f"segment {self.paths.data} is closed")
        if self._dirty or not self._dir_synced:
            self._data.fdatasync()
            if self._pending_idx:
                pending = b"".join(self._pending_idx)
                write_all(self._idx, pending, self._idx_on_disk * IDX_ENTRY_SIZE)
                self._pending_idx.clear()
                self._idx_on_disk += len(pending) // IDX_ENTRY_SIZE
            self._idx.fdatasync()
            self._dirty = False
        if not self._dir_synced:
            self.fs.fsync_dir(self.directory)
            if self._parent_sync:
                self.fs.fsync_dir(os.path.dirname(self.directory.rstrip("/")) or ".")
                self._parent_sync = False
            self._dir_synced = True

    def seal(self) -> SegmentInfo:
        """Flush, close and make the segment immutable; returns its summary.

        Later appends raise SegmentError. Sealing an already sealed segment
        returns the same summary.
        """
        if not self._sealed:
            self.flush()
            self._sealed = True
            self.close()
        return self.info()

    def close(self) -> None:
        """Close both files without flushing (idempotent); the writer is unusable after."""
        self._closed = True
        self._close_files()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _python_segment_frames(
    bufs: Sequence[bytes | bytearray | mmap.mmap],
    which: npt.NDArray[Any],
    offs: npt.NDArray[Any],
    blen: npt.NDArray[np.int64],
) -> bytes:
    """The reference loop of :func:`segment_blob`'s frames (the compiled one is
    `native_segment_frames`)."""
    o5 = offs.astype(np.int64) + 5  # [flags ..] starts after frame_len u32 and the type byte
    xx = xxhash.xxh3_64_intdigest
    pack_len = _U32.pack
    views = [memoryview(b) for b in bufs]
    pieces: list[bytes | memoryview] = []
    add = pieces.append
    for k, a, b in zip(np.asarray(which).tolist(), o5.tolist(), blen.tolist(), strict=True):
        body = views[k][a : a + b]
        add(pack_len(b + 8))
        add(body)
        add(xx(body).to_bytes(8, "little"))
    return b"".join(pieces)


def segment_blob(
    bufs: Sequence[bytes | bytearray | mmap.mmap],
    which: npt.NDArray[Any],
    offs: npt.NDArray[Any],
    lens: npt.NDArray[Any],
) -> tuple[bytes, npt.NDArray[np.uint32], npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
    """Segment frames for WAL Append frames: frame `i` is `bufs[which[i]][offs[i]:offs[i] + lens[i]]`.

    Returns `(blob, frame_lens, flags, seqs)`: the segment frames back to back,
    each frame's length in bytes, its flags byte (for `.idx`) and the seq it
    carries. A segment frame is its WAL frame without the type byte:
    `frame_len` one less, the bytes `[flags .. payload]` copied as they are, and
    an XXH3-64 over exactly those bytes (docs/FORMATS.md). The WAL frames must
    already be trusted (encoded in this process, or verified when the WAL was
    read).

    Memory: the frame bodies are taken as views of `bufs` and copied once, into
    the returned blob, so the working set is about `len(blob)` (callers bound it
    by converting a run of records at a time, see the checkpointer).
    """
    n = len(offs)
    blen = lens.astype(np.int64) - 13  # [flags .. payload]: minus len, type and checksum
    if native_segment_frames is not None:
        blob = native_segment_frames(
            list(bufs),
            np.ascontiguousarray(which, np.int64),
            np.ascontiguousarray(offs, np.int64),
            np.ascontiguousarray(lens, np.int64),
        )
    else:
        blob = _python_segment_frames(bufs, which, offs, blen)
    flen = blen + 12
    starts = np.zeros(n, np.int64)
    if n > 1:
        np.cumsum(flen[:-1], out=starts[1:])
    raw = np.frombuffer(blob, np.uint8)
    flags = raw[starts + 4]  # a copy (fancy indexing)
    # [frame_len u32, flags u8, topic_id u64, seq u64, ...]: the seq is at byte 13.
    seqs = raw[(starts + 13)[:, None] + np.arange(8)].view("<u8").reshape(n)
    return blob, flen.astype(np.uint32), flags, seqs
