"""A reference reader of segment files, for tests.

Production reads segments through :class:`topics.storage.topicstore.SegmentSource`
(the engine) and :mod:`topics.storage.check` (fsck); this reader checks what
:class:`~topics.storage.segment.SegmentWriter` wrote record by record, straight
from the layout in docs/FORMATS.md ("Segment files"): `.idx` entries, the frame
checks of :func:`~topics.storage.segment.frame_problem`, the in-place delete flag.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import numpy as np
import xxhash

from topics.format.idx import DELETED, IDX_ENTRY_DTYPE, IDX_ENTRY_SIZE
from topics.fs import File, Fs
from topics.storage.fs import RealFs, write_all
from topics.storage.segment import (
    MIN_FRAME_LEN,
    IdxArray,
    SegmentCorrupt,
    SegmentRangeError,
    SegmentWriter,
    frame_problem,
    segment_paths,
)

__all__ = ["SegmentReader", "seg_frame", "sealed_parts"]

FLAGS_OFF = 16  # byte offset of `flags` inside one `.idx` entry (docs/FORMATS.md)


class SegmentReader:
    """Reads one segment the test's way; `sealed=False` for the active one.

    A sealed `.data` is mapped once (`use_mmap`, when the `Fs` can map it) and
    each record is a slice; the active segment, or an `Fs` that cannot map,
    uses `pread`.
    Every frame returned has been verified (:func:`frame_problem`).

    Raises:
        FileNotFoundError / OSError: a part is missing or unreadable.
    """

    def __init__(
        self, fs: Fs, directory: str, first_seq: int, *, sealed: bool = True, use_mmap: bool = True
    ) -> None:
        self.fs = fs
        self.first_seq = first_seq
        self.sealed = sealed
        self.paths = segment_paths(directory, first_seq)
        self._map: mmap.mmap | None = None
        self._entries: IdxArray | None = None
        self._idx: File = fs.open(self.paths.idx)
        try:
            self._data: File = fs.open(self.paths.data)
        except BaseException:
            self._idx.close()
            raise
        if sealed and use_mmap:
            try:
                self._map = self._data.map()
            except BaseException:
                self._data.close()
                self._idx.close()
                raise

    @property
    def mmapped(self) -> bool:
        """Whether `.data` reads are served from a memory map."""
        return self._map is not None

    # -- index --

    def load_idx(self) -> IdxArray:
        """Read and validate the whole `.idx` with one `np.frombuffer`.

        Returns a writable array of :data:`IdxArray` (entry `i` is seq
        `first_seq + i`), cached for :meth:`read`. The `.idx` is read before the
        `.data` size, so a concurrent writer (data first) cannot fail the check.

        A sealed `.idx` must be whole entries. For the active segment
        (`sealed=False`) a partial trailing entry is an append in flight (or the
        torn tail :meth:`SegmentWriter.resume` will cut) and is not served: the
        size is rounded down to whole entries.

        Raises:
            SegmentCorrupt: a sealed size that is not a multiple of 20, an entry
                shorter than a frame, or an entry past the end of `.data`.
        """
        raw = self._idx.pread(self._idx.size(), 0)
        if len(raw) % IDX_ENTRY_SIZE:
            if self.sealed:
                raise SegmentCorrupt(
                    self.paths.idx, None, f"size {len(raw)} is not a multiple of {IDX_ENTRY_SIZE}"
                )
            raw = raw[: len(raw) - len(raw) % IDX_ENTRY_SIZE]
        entries: IdxArray = np.frombuffer(bytearray(raw), IDX_ENTRY_DTYPE)
        data_size = self._map.size() if self._map is not None else self._data.size()
        if len(entries):
            lens = entries["len"]
            ends = entries["offset"].astype(np.uint64) + lens
            bad = np.flatnonzero((ends > data_size) | (lens < MIN_FRAME_LEN))
            if len(bad):
                i = int(bad[0])
                off, ln = int(entries["offset"][i]), int(lens[i])
                why = (
                    f"entry length {ln} is below {MIN_FRAME_LEN}"
                    if ln < MIN_FRAME_LEN
                    else f"entry [{off}, +{ln}) is past the end of .data ({data_size} bytes)"
                )
                raise SegmentCorrupt(self.paths.idx, self.first_seq + i, why)
        self._entries = entries
        return entries

    def _loaded(self, last_seq: int | None) -> IdxArray:
        """The cached index, reloaded when it may be stale.

        A sealed index is loaded once. An active one is reloaded when `last_seq`
        is past the cached end, or always when `last_seq` is None (whole-index
        questions such as :attr:`count`).
        """
        e = self._entries
        if e is None or (
            not self.sealed and (last_seq is None or last_seq >= self.first_seq + len(e))
        ):
            e = self.load_idx()
        return e

    @property
    def count(self) -> int:
        """Entries in the `.idx` (loads it if needed)."""
        return len(self._loaded(None))

    @property
    def last_seq(self) -> int:
        """Highest seq in the segment (`first_seq - 1` when empty)."""
        return self.first_seq + self.count - 1

    def read_entry(self, seq: int) -> tuple[int, int, int, int]:
        """One `.idx` entry `(offset, len, ts, flags)` by direct seek.

        Reads 20 bytes at `(seq - first_seq) * 20` without loading the index.
        Raises SegmentRangeError when `seq` is outside the file.
        """
        i = seq - self.first_seq
        raw = self._idx.pread(IDX_ENTRY_SIZE, i * IDX_ENTRY_SIZE) if i >= 0 else b""
        if len(raw) != IDX_ENTRY_SIZE:
            raise SegmentRangeError(f"seq {seq} not in {self.paths.idx}")
        e = np.frombuffer(raw, IDX_ENTRY_DTYPE)[0]
        return int(e["offset"]), int(e["len"]), int(e["ts"]), int(e["flags"])

    # -- records --

    def _bytes(self, offset: int, length: int) -> bytes:
        if self._map is not None:
            return self._map[offset : offset + length]
        return self._data.pread(length, offset)

    def _check(self, frame: bytes, seq: int, length: int) -> bytes:
        problem = "short read" if len(frame) != length else frame_problem(frame, seq)
        if problem is not None:
            raise SegmentCorrupt(self.paths.data, seq, problem)
        return frame

    def _span(self, first: int, last: int) -> IdxArray:
        if first > last:
            return np.zeros(0, IDX_ENTRY_DTYPE)
        e = self._loaded(last)
        if first < self.first_seq or last >= self.first_seq + len(e):
            raise SegmentRangeError(
                f"seqs [{first}, {last}] not in {self.paths.data} "
                f"[{self.first_seq}, {self.first_seq + len(e) - 1}]"
            )
        return e[first - self.first_seq : last - self.first_seq + 1]

    def read(self, seq: int) -> bytes:
        """The verified frame of `seq` (deleted or not: the flag is the caller's).

        Raises:
            SegmentRangeError: `seq` is not in this segment.
            SegmentCorrupt: length, seq field or checksum mismatch.
        """
        e = self._span(seq, seq)[0]
        off, ln = int(e["offset"]), int(e["len"])
        return self._check(self._bytes(off, ln), seq, ln)

    def read_range(
        self, first: int, last: int, *, skip_deleted: bool = False
    ) -> list[tuple[int, bytes]]:
        """Verified `(seq, frame)` pairs for seqs `first..last` inclusive.

        The covering byte range is read once (one pread or one mmap slice) and
        cut per entry. With `skip_deleted`, entries flagged 0xD5 are left out
        (their bytes are not checked). Same errors as :meth:`read`.
        """
        span = self._span(first, last)
        if not len(span):
            return []
        keep = np.flatnonzero(span["flags"] != DELETED) if skip_deleted else np.arange(len(span))
        if not len(keep):
            return []
        offs = span["offset"][keep].astype(np.int64)
        lens = span["len"][keep].astype(np.int64)
        lo = int(offs.min())
        hi = int((offs + lens).max())
        blob = self._bytes(lo, hi - lo)
        if len(blob) != hi - lo:
            raise SegmentCorrupt(self.paths.data, first, "short read")
        view = memoryview(blob)
        out: list[tuple[int, bytes]] = []
        for k, off, ln in zip(keep.tolist(), offs.tolist(), lens.tolist(), strict=True):
            seq = first + k
            out.append((seq, self._check(bytes(view[off - lo : off - lo + ln]), seq, ln)))
        return out

    def verify(self) -> int:
        """Check every frame (fsck); returns the number verified.

        Raises SegmentCorrupt at the first bad entry or frame.
        """
        e = self.load_idx()
        if len(e):
            self.read_range(self.first_seq, self.first_seq + len(e) - 1)
        return len(e)

    # -- deletion --

    def mark_deleted(self, seqs: Iterable[int]) -> None:
        """Flip the `.idx` flags byte of each seq to 0xD5 in place, then fdatasync.

        A delete never rewrites `.data`; the flag sits outside the checksum
        (docs/FORMATS.md, "Segment files"). Idempotent. Raises SegmentRangeError
        (before writing anything) for a seq outside the segment.
        """
        wanted = sorted(set(seqs))
        if not wanted:
            return
        e = self._loaded(wanted[-1])
        for seq in wanted:
            if not self.first_seq <= seq < self.first_seq + len(e):
                raise SegmentRangeError(f"seq {seq} not in {self.paths.idx}")
        f = self.fs.open(self.paths.idx, write=True)
        try:
            for seq in wanted:
                write_all(f, bytes((DELETED,)), (seq - self.first_seq) * IDX_ENTRY_SIZE + FLAGS_OFF)
            f.fdatasync()
        finally:
            f.close()
        for seq in wanted:
            e[seq - self.first_seq]["flags"] = DELETED

    def all_deleted(self) -> bool:
        """True when every entry is flagged 0xD5 (vacuously true when empty).

        Such a sealed segment can be dropped whole (docs/FORMATS.md, "Delete flags").
        """
        return bool(np.all(self._loaded(None)["flags"] == DELETED))

    def close(self) -> None:
        """Release the map and both descriptors (idempotent)."""
        if self._map is not None:
            self._map.close()
            self._map = None
        self._data.close()
        self._idx.close()

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def seg_frame(seq: int, ts: int, data: bytes) -> bytes:
    """A segment frame per docs/FORMATS.md (no node/tag)."""
    head = struct.pack("<IBQQQHHI", 33 + len(data) + 8, 0, 7, seq, ts, 0, 0, len(data))
    body = head[4:] + data
    return head[:4] + body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def sealed_parts(tmp: Path, first: int, n: int) -> tuple[bytes, bytes]:
    """The (.data, .idx) bytes of a real sealed segment built by SegmentWriter."""
    d = str(tmp / "build")
    w = SegmentWriter(RealFs(), d, first)
    for i in range(n):
        w.append(seg_frame(first + i, 1000 + i, b'{"i":%d}' % i), 1000 + i, 0)
    w.seal()
    p = segment_paths(d, first)
    return Path(p.data).read_bytes(), Path(p.idx).read_bytes()
