"""Offline reads of a data directory: segment files -> Arrow record (docs/SPARK.md).

No server and no JVM: this module plans and decodes; :mod:`topics.spark.source`
runs one Spark task per :class:`SegmentSlice`, and `topics spark-export` runs
the same slices in one process to write Parquet.

**What a read sees.** Planning reads the newest metadata snapshot (through
:func:`topics.storage.catalog.load_catalog` and the snapshot body itself) and
lists each topic's segment pairs, in the hot directory and the cold tier. The
consistent point is the snapshot's checkpoint: per topic, seqs up to the
snapshot's `head` (a checkpoint writes every retained record up to the head it
captured into segments before it writes the snapshot), with the
snapshot's floors (`earliest_seq`: evicted, expired and `before_seq`-deleted
records are absent), its pending delete flips and each `.idx` entry's delete
flag (0xD5) applied. Records still only in the WAL (written since the last
checkpoint: at most 60 s or 64 MiB of WAL by default, and none after a graceful
stop) are not visible. A topic with `ttl_ms` also drops records older than
`now - ttl_ms` at planning time, as the server's own reads do.

**Safe while the server runs.** Nothing is written or locked. Every file is
read through a read-only view of the Fs seam (:class:`ReadOnlyFs`; the snapshot
loader would otherwise remove `snapshot.*.tmp` files, which are a running
server's snapshot in progress).
Entries are only read up to the snapshot's head, which the server made
durable in segments before writing that snapshot; entries a later checkpoint
is appending are ignored. A segment that moves from the hot
directory to the cold tier after planning is read from the cold tier; one that
is gone from both yields nothing (logged) when the newest snapshot no longer
relies on it (its records fell below a floor since, every entry was deleted, or
the topic was deleted); when the snapshot still lists it, the read fails with
:class:`SegmentMissing` rather than skip its records.

**Object-store cold tier.** `cold_dir` may be an `s3://bucket/prefix` url
(docs/SPARK.md, "Cold tier in an object store"): the same layout, read through
the read-only :class:`~topics.storage.objstore.ObjectFs` (ranged GETs of just
the `.idx` entries and `.data` bytes wanted, never a whole object). A slice
carries the url, not a client, so a Spark executor rebuilds the store access
from its own `AWS_*` environment (:func:`~topics.storage.objstore.cold_root`).

**Missing segments.** Planning checks the segments the snapshot relies on
(docs/FORMATS.md, "Segments the snapshot relies on") against those listed in
the two tiers: a relied-on segment that is in neither, or has fewer `.idx`
entries than the snapshot recorded, raises :class:`SegmentMissing` when the
read's seq bounds reach it (an archive with a lost object is never read as if
those records had not been written).

**Verification.** Every frame read is checked as the server checks it
(:func:`topics.format.frame.check_frame` with `SEG_HDR`: length prefix equal
to the `.idx` length, the seq, XXH3-64 over `[4, len-8)`), plus the three
field lengths adding up and the `.idx` timestamp agreeing with the frame's. A
frame that fails raises :class:`~topics.engine.frames.FrameCorrupt` naming the
file, seq and reason; it is never skipped. The checks run vectorised (numpy
header gather, one XXH3 call per frame); the first failing frame is re-checked
with `check_frame` for the reason.

**Pruning.** Seq bounds drop whole segments from the catalog's seq ranges
without opening a file; timestamp bounds read only the `.idx` files (the `ts`
column) at planning time, and inside a segment both are applied to the `.idx`
before any `.data` byte is read. Only the `.data` byte range holding surviving
frames is read.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from topics.clock import SystemClock
from topics.engine.frames import FrameCorrupt
from topics.format.frame import (
    CHECKSUM,
    SEG_FRAME_OVERHEAD,
    SEG_HDR,
    SEG_HEADER_DTYPE,
    check_frame,
)
from topics.format.idx import DELETED, F_HAS_META, F_HAS_NODE, F_HAS_TAG, IDX_ENTRY_DTYPE
from topics.fs import File, Fs
from topics.storage.catalog import CatalogTopic, SegmentRef, load_catalog
from topics.storage.fs import RealFs
from topics.storage.objstore import cold_root, fs_for, is_object_url
from topics.storage.segment import IDX_ENTRY_SIZE, segment_name, segment_paths, topic_dir
from topics.storage.snapshot import list_snapshots, load_latest
from topics.storage.topicstore import published_upto

__all__ = [
    "DDL_SCHEMA",
    "arrow_schema",
    "SegmentSlice",
    "Bounds",
    "ReadOnlyFs",
    "OfflineTopic",
    "SegmentMissing",
    "NotADataDir",
    "load_offline",
    "plan_slices",
    "read_slice",
    "DEFAULT_BATCH_ROWS",
]

log = logging.getLogger(__name__)

#: The record schema (docs/SPARK.md, "Schema"), as Spark DDL.
#: `data` is `binary` with `valueFormat=binary`.
DDL_SCHEMA = (
    "topic string, seq long, ts timestamp, tag string, node string, meta string, data string"
)

#: Rows per Arrow record batch handed to Spark.
DEFAULT_BATCH_ROWS = 32768

_TS = pa.timestamp("us", tz="UTC")


def arrow_schema(value_format: str = "json") -> pa.Schema:
    """The Arrow schema Spark expects for :data:`DDL_SCHEMA` (`ts` in µs, UTC; all nullable).

    `value_format` is "json" (`data` string holding the record's JSON text) or
    "binary" (`data` binary, the same JSON text as UTF-8 bytes).
    """
    return pa.schema(
        [
            ("topic", pa.string()),
            ("seq", pa.int64()),
            ("ts", _TS),
            ("tag", pa.string()),
            ("node", pa.string()),
            ("meta", pa.string()),
            ("data", pa.binary() if value_format == "binary" else pa.string()),
        ]
    )


# -- a read-only view of the filesystem for the catalog ------------------------------


def _refuse(path: str) -> PermissionError:
    return PermissionError(errno.EROFS, "read-only view", path)


class ReadOnlyFs:
    """A view of another :class:`~topics.fs.Fs` (the real one by default) that
    refuses every change and hides `*.tmp` names.

    Every read of this module goes through it, so listing a live data directory
    never removes the server's in-progress `snapshot.N.bin.tmp`. A change
    raises PermissionError (EROFS).
    """

    def __init__(self, inner: Fs | None = None) -> None:
        self.inner: Fs = inner or RealFs()

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> File:
        if create or write or exclusive:
            raise _refuse(path)
        return self.inner.open(path)

    def replace(self, src: str, dst: str) -> None:
        raise _refuse(src)

    def _change(self, path: str) -> None:
        raise _refuse(path)

    unlink = rmdir = rmtree = mkdir = makedirs = fsync_dir = _change

    def listdir(self, path: str) -> list[str]:
        return [n for n in self.inner.listdir(path) if not n.endswith(".tmp")]

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def lexists(self, path: str) -> bool:
        return self.inner.lexists(path)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(path)


def _view(fs: Fs | None, cold_dir: str | None = None) -> ReadOnlyFs:
    """`fs` (default: the real filesystem) as a :class:`ReadOnlyFs`; when `cold_dir`
    is an `s3://` url, paths under it go to its object store instead
    (:func:`~topics.storage.objstore.fs_for`)."""
    if cold_dir is None or not is_object_url(cold_dir):
        return fs if isinstance(fs, ReadOnlyFs) else ReadOnlyFs(fs)
    inner = fs.inner if isinstance(fs, ReadOnlyFs) else (fs or RealFs())
    return ReadOnlyFs(fs_for(inner, cold_dir))


def _cold_root(cold_dir: str | None) -> str | None:
    """`cold_dir` as slices carry it: an `s3://` url normalised (no trailing `/`),
    a directory unchanged. Raises ValueError for a malformed url."""
    if cold_dir is None or not is_object_url(cold_dir):
        return cold_dir
    return cold_root(cold_dir).url


class SegmentMissing(FileNotFoundError):
    """A segment the newest snapshot relies on is in neither tier, or is short
    (docs/SPARK.md, "Errors").

    Attributes:
        topic: the topic name.
        first_seq: the segment's first seq (its file name).
        lo, hi: the seqs (inclusive) that cannot be read.
        detail: what is wrong, one line (the message without the advice).
    """

    def __init__(self, topic: str, first_seq: int, lo: int, hi: int, detail: str) -> None:
        self.topic = topic
        self.first_seq = first_seq
        self.lo = lo
        self.hi = hi
        self.detail = detail
        super().__init__(
            errno.ENOENT,
            f"topic {topic}: {detail}; seqs {lo}..{hi} cannot be read, so the read is "
            "refused rather than return the history without them (inspect with "
            "`topics verify DATA_DIR --cold-dir ...`)",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.topic, self.first_seq, self.lo, self.hi, self.detail))


# -- planning ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OfflineTopic:
    """A topic as of the newest snapshot, with what the catalog does not carry.

    `upto` is the snapshot's head: every retained seq up to it is in a segment
    (the consistent point),
    `flips` the seqs whose delete flags the snapshot says are due, `ttl_ms` its
    TTL (0 = off). `missing` lists `(first_seq, lo, hi)` for each segment the
    snapshot relies on whose seqs `lo..hi` neither tier holds (see
    :class:`SegmentMissing`); :func:`plan_slices` raises when a read reaches one.
    """

    cat: CatalogTopic
    upto: int
    ttl_ms: int
    flips: frozenset[int]
    missing: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Bounds:
    """Inclusive seq and ts (ms) bounds of one topic's read; None = unbounded."""

    seq_lo: int = 1
    seq_hi: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None

    def empty(self) -> bool:
        if self.seq_hi is not None and self.seq_hi < self.seq_lo:
            return True
        return self.ts_lo is not None and self.ts_hi is not None and self.ts_hi < self.ts_lo


@dataclass(frozen=True, slots=True)
class SegmentSlice:
    """One Spark input partition: seqs `[lo, hi]` of one segment, with the filters to apply.

    Paths are those listed at planning; `alt_*` are the same segment in the
    other tier (read when the listed copy moved). `ts_lo`/`ts_hi` are inclusive
    ms bounds, `keep_from_ts` drops expired records (ts below it), `deleted`
    are seqs deleted per the snapshot whose `.idx` flag may not be written yet.
    `data_dir` and `cold_dir` are the roots planned from (`cold_dir` possibly an
    `s3://` url, which the reading process resolves with its own `AWS_*`
    environment); `data_dir` is None for a slice built by hand (a segment gone
    at read time is then skipped without asking the snapshot).
    """

    topic: str
    topic_id: int
    first_seq: int
    lo: int
    hi: int
    data_path: str
    idx_path: str
    alt_data_path: str | None = None
    alt_idx_path: str | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None
    keep_from_ts: int | None = None
    deleted: tuple[int, ...] = field(default=())
    data_dir: str | None = None
    cold_dir: str | None = None

    @property
    def seqs(self) -> int:
        return self.hi - self.lo + 1


def _expand(ranges: Any) -> set[int]:
    out: set[int] = set()
    for first, count in ranges or []:
        out.update(range(int(first), int(first) + int(count)))
    return out


def _relied_part(m: Mapping[str, Any], first: int, lo: int, hi: int) -> tuple[int, int] | None:
    """The seqs of `[lo, hi]` in segment `first` that the snapshot topic map `m`
    relies on a segment for (docs/FORMATS.md, "Segments the snapshot relies on"),
    or None: not listed, wholly at or below the floors, or inside a range
    `topics repair` recorded as lost. A snapshot that does not list its segments
    (an older format) cannot tell, so None."""
    pub = published_upto(dict(m))
    if not pub.listed:
        return None
    count = max((c for a, c in pub.segs if a == first), default=0)
    lo, hi = max(lo, first, pub.floor + 1), min(hi, first + count - 1)
    if hi < lo:
        return None
    for a, b in m.get("lost") or []:
        if int(a) <= lo and hi <= int(b):
            return None
    return lo, hi


def _missing(m: Mapping[str, Any], cat: CatalogTopic) -> tuple[tuple[int, int, int], ...]:
    """`(first_seq, lo, hi)` of the seqs the snapshot map `m` relies on that no listed
    segment of `cat` holds (the segment is in neither tier, or has fewer entries)."""
    pub = published_upto(dict(m))
    if not pub.listed:
        return ()
    have = {ref.first_seq: ref.last_seq for ref in cat.segments}
    out: list[tuple[int, int, int]] = []
    for first, count in pub.segs:
        if count <= 0:
            continue
        part = _relied_part(m, first, have.get(first, first - 1) + 1, first + count - 1)
        if part is not None:
            out.append((first, *part))
    return tuple(sorted(set(out)))


class NotADataDir(FileNotFoundError):
    """A path given as a data directory holds no topics data (no `meta/`, no `wal/`)."""


def load_offline(
    data_dir: str, cold_dir: str | None = None, *, attempts: int = 5, fs: Fs | None = None
) -> dict[str, OfflineTopic]:
    """Topic name -> :class:`OfflineTopic` from the newest snapshot of `data_dir`.

    Retries when a checkpoint replaces the snapshot while it is being read, so
    the catalog and the snapshot body always describe the same checkpoint, and
    when a segment the snapshot relies on is listed in neither tier (a segment
    moving between tiers while they were listed); one still missing after the
    last attempt is recorded in :attr:`OfflineTopic.missing`. Files are read
    through `fs` (default: the real filesystem), read-only; `cold_dir` is a
    directory or an `s3://bucket/prefix` url (an empty prefix is an empty cold
    tier). Raises FileNotFoundError when `data_dir` (or a `cold_dir` directory)
    does not exist (:class:`NotADataDir` when it is no data directory), OSError when it cannot be read,
    :class:`~topics.storage.objstore.ColdStoreError` when the object store
    fails (unreachable, a missing bucket, denied), ValueError for a malformed
    url, RuntimeError when the data dir keeps changing under the reader.
    Empty dict: no snapshot yet (nothing was checkpointed).
    """
    cold_dir = _cold_root(cold_dir)
    view = _view(fs, cold_dir)
    if not view.isdir(data_dir):
        raise FileNotFoundError(errno.ENOENT, "data directory does not exist", data_dir)
    if cold_dir is not None and is_object_url(cold_dir):
        view.isdir(cold_dir)  # one LIST: a store that cannot be read fails here, not later
    elif cold_dir is not None and not view.isdir(cold_dir):
        raise FileNotFoundError(errno.ENOENT, "cold directory does not exist", cold_dir)
    if not any(view.isdir(os.path.join(data_dir, d)) for d in ("meta", "wal")):
        raise NotADataDir(
            errno.ENOENT,
            "not a topics data directory (it has neither meta/ nor wal/)",
            data_dir,
        )
    meta_dir = os.path.join(data_dir, "meta")
    last_err: Exception | None = None
    found_missing: dict[str, OfflineTopic] | None = None
    for _ in range(attempts):
        try:
            before = list_snapshots(view, meta_dir) if view.isdir(meta_dir) else []
            catalog = load_catalog(data_dir, cold_dir, fs=view)
            found = load_latest(view, meta_dir)
        except FileNotFoundError as e:  # a snapshot pruned between listing and reading
            last_err = e
            continue
        if found is None:
            return {}
        n, body = found
        if not before or before[-1][0] != n:
            last_err = RuntimeError("a checkpoint replaced the snapshot while it was read")
            continue
        by_id: dict[int, dict[str, Any]] = {int(m["id"]): m for m in body.get("topics") or []}
        flips: dict[int, set[int]] = {}
        for tid, ranges in body.get("flips") or []:
            flips.setdefault(int(tid), set()).update(_expand(ranges))
        out: dict[str, OfflineTopic] = {}
        for name, cat in catalog.items():
            m = by_id.get(cat.topic_id)
            if m is None:  # cannot happen for one snapshot; be strict rather than guess
                last_err = RuntimeError(f"topic {name} is in the catalog but not the snapshot")
                break
            cfg = m.get("config") or {}
            out[name] = OfflineTopic(
                cat,
                cat.head_seq,
                int(cfg.get("ttl_ms", 0) or 0),
                frozenset(flips.get(cat.topic_id, ())),
                _missing(m, cat),
            )
        else:
            if not any(t.missing for t in out.values()):
                return out
            found_missing = out  # perhaps listed mid-move between tiers: list again
    if found_missing is not None:
        return found_missing
    raise RuntimeError(f"cannot read a stable snapshot of {data_dir}: {last_err}")


def _other_tier(
    ref: SegmentRef, topic_id: int, data_dir: str, cold_dir: str | None
) -> tuple[str, str] | None:
    """`(data, idx)` paths of segment `ref` in the tier it was not listed in (or None
    without a cold tier), named by the same helpers as every tier (a url under an
    `s3://` cold root)."""
    if cold_dir is None:
        return None
    p = segment_paths(
        topic_dir(cold_dir if ref.tier == "hot" else data_dir, topic_id), ref.first_seq
    )
    return p.data, p.idx


def _read_idx(fs: Fs, path: str, first_entry: int, count: int) -> np.ndarray[Any, Any]:
    f = fs.open(path)
    try:
        raw = _pread_all(f, count * IDX_ENTRY_SIZE, first_entry * IDX_ENTRY_SIZE)
    finally:
        f.close()
    n = len(raw) // IDX_ENTRY_SIZE
    return np.frombuffer(raw, IDX_ENTRY_DTYPE, count=n)


def _ts_range(
    fs: Fs, ref: SegmentRef, topic_id: int, lo: int, hi: int, data_dir: str, cold: str | None
) -> tuple[int, int] | None:
    """Min and max `ts` of the live `.idx` entries of seqs `[lo, hi]`, or None (none live)."""
    paths = [ref.idx_path]
    alt = _other_tier(ref, topic_id, data_dir, cold)
    if alt is not None:
        paths.append(alt[1])
    for p in paths:
        try:
            idx = _read_idx(fs, p, lo - ref.first_seq, hi - lo + 1)
        except FileNotFoundError:
            continue
        live = idx["flags"] != DELETED
        if not live.any():
            return None
        ts = idx["ts"][live]
        return int(ts.min()), int(ts.max())
    return None  # gone from both tiers: nothing to read


def _missing_error(
    t: OfflineTopic, first: int, lo: int, hi: int, data_dir: str, cold_dir: str | None
) -> SegmentMissing:
    name = segment_name(first)
    ref = next((r for r in t.cat.segments if r.first_seq == first), None)
    if ref is not None:
        detail = (
            f"segment {name} ({ref.tier} tier, {ref.data_path}) holds seqs up to "
            f"{ref.last_seq}, fewer than the newest snapshot relies on"
        )
    else:
        where = " nor ".join(p for p in (data_dir, cold_dir) if p is not None)
        detail = (
            f"segment {name}, which the newest snapshot relies on, is in neither tier "
            f"({where}: a part or both are missing)"
        )
    return SegmentMissing(t.cat.name, first, lo, hi, detail)


def plan_slices(
    topics: Mapping[str, OfflineTopic],
    bounds: Mapping[str, Bounds],
    data_dir: str,
    cold_dir: str | None = None,
    *,
    now_ms: int | None = None,
    fs: Fs | None = None,
) -> list[SegmentSlice]:
    """One :class:`SegmentSlice` per segment of each topic in `bounds` that may hold rows.

    Seq pruning uses the catalog alone; when a topic's bounds carry timestamps,
    its `.idx` files are read (never `.data`, through `fs`, default the real
    filesystem, and the object store of an `s3://` `cold_dir`) and segments
    whose live timestamps all fall outside are dropped. `now_ms` (default: the
    wall clock) is the time TTLs are judged against. Slices come ordered by
    topic, then seq.

    Raises :class:`SegmentMissing` when the seq bounds of a topic reach seqs
    that a segment the snapshot relies on should hold but neither tier does
    (:attr:`OfflineTopic.missing`); OSError or
    :class:`~topics.storage.objstore.ColdStoreError` when an `.idx` read fails.
    """
    cold_dir = _cold_root(cold_dir)
    view = _view(fs, cold_dir)
    now = SystemClock().now_ms() if now_ms is None else now_ms
    out: list[SegmentSlice] = []
    for name in sorted(bounds):
        t = topics.get(name)
        b = bounds[name]
        if t is None or b.empty():
            continue
        cat = t.cat
        lo_all = max(b.seq_lo, cat.earliest_seq, 1)
        hi_all = t.upto if b.seq_hi is None else min(b.seq_hi, t.upto)
        if hi_all < lo_all:
            continue
        for first, lo, hi in t.missing:
            if lo <= hi_all and hi >= lo_all:
                raise _missing_error(t, first, max(lo, lo_all), min(hi, hi_all), data_dir, cold_dir)
        keep_from = now - t.ttl_ms if t.ttl_ms > 0 else None
        for ref in cat.segments:
            lo = max(lo_all, ref.first_seq)
            hi = min(hi_all, ref.last_seq)
            if hi < lo:
                continue
            if b.ts_lo is not None or b.ts_hi is not None or keep_from is not None:
                rng = _ts_range(view, ref, cat.topic_id, lo, hi, data_dir, cold_dir)
                if rng is None:
                    continue
                tmin, tmax = rng
                if b.ts_lo is not None and tmax < b.ts_lo:
                    continue
                if keep_from is not None and tmax < keep_from:
                    continue
                if b.ts_hi is not None and tmin > b.ts_hi:
                    continue
            alt = _other_tier(ref, cat.topic_id, data_dir, cold_dir)
            deleted = tuple(sorted(s for s in t.flips if lo <= s <= hi))
            out.append(
                SegmentSlice(
                    topic=name,
                    topic_id=cat.topic_id,
                    first_seq=ref.first_seq,
                    lo=lo,
                    hi=hi,
                    data_path=ref.data_path,
                    idx_path=ref.idx_path,
                    alt_data_path=alt[0] if alt else None,
                    alt_idx_path=alt[1] if alt else None,
                    ts_lo=b.ts_lo,
                    ts_hi=b.ts_hi,
                    keep_from_ts=keep_from,
                    deleted=deleted,
                    data_dir=data_dir,
                    cold_dir=cold_dir,
                )
            )
    return out


def select_topics(
    topics: Mapping[str, OfflineTopic], names: Iterable[str] | None, pattern: str | None
) -> list[str]:
    """Names of `topics` in `names`, or matching `pattern` (whole name), sorted."""
    if names is not None:
        want = set(names)
        return sorted(n for n in topics if n in want)
    if pattern is not None:
        rx = re.compile(pattern)
        return sorted(n for n in topics if rx.fullmatch(n))
    return sorted(topics)


# -- reading one slice ---------------------------------------------------------------


def _pread_all(f: File, size: int, offset: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < size:
        b = f.pread(size - got, offset + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Gone(Exception):
    """The segment is in neither tier any more."""


def _open_pair(fs: Fs, sl: SegmentSlice) -> tuple[File, File, str]:
    """`.idx` and `.data` opened from one tier, and the `.data` path used."""
    pairs = [(sl.idx_path, sl.data_path)]
    if sl.alt_idx_path and sl.alt_data_path:
        pairs.append((sl.alt_idx_path, sl.alt_data_path))
    for ip, dp in pairs:
        try:
            ifile = fs.open(ip)
        except FileNotFoundError:
            continue
        try:
            dfile = fs.open(dp)
        except FileNotFoundError:
            ifile.close()
            continue
        return ifile, dfile, dp
    raise _Gone()


def _gone_error(view: Fs, sl: SegmentSlice) -> SegmentMissing | None:
    """None when segment `sl`, gone from both tiers, was dropped as the server drops
    segments: the newest snapshot of `sl.data_dir` no longer relies on its seqs
    `[sl.lo, sl.hi]` (a checkpoint deletes a segment only once a snapshot that no
    longer lists it is durable), or lists no segments (an older format: cannot
    tell). Otherwise the error to raise."""
    if sl.data_dir is None:
        return None
    name = segment_name(sl.first_seq)
    where = " nor ".join(p for p in (sl.data_dir, sl.cold_dir) if p is not None)
    try:
        found = load_latest(view, os.path.join(sl.data_dir, "meta"))
    except OSError as e:
        found, why = None, f": {e}"
    else:
        why = ""
    if found is None:
        return SegmentMissing(
            sl.topic,
            sl.first_seq,
            sl.lo,
            sl.hi,
            f"segment {name} is gone from both tiers ({where}) since planning, and no "
            f"snapshot of {sl.data_dir} can be read here to tell whether it was dropped{why}",
        )
    m = next((t for t in found[1].get("topics") or [] if int(t["id"]) == sl.topic_id), None)
    if m is None:
        return None  # the topic was deleted
    part = _relied_part(m, sl.first_seq, sl.lo, sl.hi)
    if part is None:
        return None
    return SegmentMissing(
        sl.topic,
        sl.first_seq,
        part[0],
        part[1],
        f"segment {name}, which the newest snapshot still relies on, is gone from both "
        f"tiers ({where})",
    )


_HDR_COLS = np.arange(SEG_HDR, dtype=np.int64)
_U32_COLS = np.arange(4, dtype=np.int64)
_U64_COLS = np.arange(CHECKSUM.size, dtype=np.int64)


def _gather(
    buf8: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], cols: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(buf8[starts[:, None] + cols])


def _byte_ranges(
    buf: pa.Buffer,
    starts: np.ndarray[Any, Any],
    lens: np.ndarray[Any, Any],
    valid: np.ndarray[Any, Any] | None,
) -> pa.Array:
    """A binary array of `buf[starts[i] : starts[i] + lens[i]]` (null where not `valid`).

    The ranges are ascending and disjoint (frames in file order), so they and the
    gaps between them form one binary array over `buf` without copying; a take of
    every other element then copies out the values in one C++ pass.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    offs = np.empty(2 * n, dtype=np.int64)
    offs[0::2] = starts
    offs[1::2] = starts + lens
    base = int(offs[0])
    offs -= base
    if int(offs[-1]) < 2**31 and bool((np.diff(offs) >= 0).all()):
        whole = pa.Array.from_buffers(
            pa.binary(), 2 * n - 1, [None, pa.py_buffer(offs.astype(np.int32)), buf.slice(base)]
        )
        take = np.arange(0, 2 * n, 2, dtype=np.int64)
        idx = pa.array(take, mask=None if valid is None else ~valid)
        return whole.take(idx)
    mv = memoryview(buf)  # pragma: no cover - ranges out of order or a > 2 GiB span
    vals = [bytes(mv[s : s + ln]) for s, ln in zip(starts.tolist(), lens.tolist(), strict=True)]
    arr = pa.array(vals, pa.binary())
    if valid is not None:
        arr = pa.compute.if_else(pa.array(valid), arr, pa.scalar(None, pa.binary()))
    return arr


def _corrupt(path: str, raw: bytes, o: int, ln: int, seq: int, fallback: str) -> FrameCorrupt:
    why = check_frame(raw, o, ln, seq, SEG_HDR)
    return FrameCorrupt(path, seq, why or fallback)


def read_slice(
    sl: SegmentSlice,
    value_format: str = "json",
    batch_rows: int = DEFAULT_BATCH_ROWS,
    *,
    fs: Fs | None = None,
) -> Iterator[pa.RecordBatch]:
    """The live records of `sl` as record batches of :func:`arrow_schema` (`value_format`).

    Files are read through `fs` (default: the real filesystem), read-only; paths
    under an `s3://` `sl.cold_dir` through that object store (made from this
    process's `AWS_*` environment), with ranged GETs of the `.idx` entries and
    the `.data` bytes of each batch only.

    A segment gone from both tiers since planning yields nothing (logged as a
    warning) when the newest snapshot of `sl.data_dir` no longer relies on it
    (dropped below a floor, fully deleted, topic deleted); otherwise
    :class:`SegmentMissing` is raised, as it is when that snapshot cannot be
    read here to tell.

    Raises FrameCorrupt (file, seq, reason) on a frame that does not verify,
    :class:`SegmentMissing` (above), OSError when a file cannot be read,
    :class:`~topics.storage.objstore.ColdStoreError` when the object store fails.
    """
    schema = arrow_schema(value_format)
    view = _view(fs, sl.cold_dir)
    try:
        ifile, dfile, data_path = _open_pair(view, sl)
    except _Gone:
        err = _gone_error(view, sl)
        if err is not None:
            raise err from None
        log.warning(
            "segment %s of topic %s is gone (dropped or moved since planning); skipped",
            os.path.basename(sl.data_path),
            sl.topic,
        )
        return
    try:
        count = sl.hi - sl.lo + 1
        raw_idx = _pread_all(ifile, count * IDX_ENTRY_SIZE, (sl.lo - sl.first_seq) * IDX_ENTRY_SIZE)
        if len(raw_idx) < count * IDX_ENTRY_SIZE:
            raise FrameCorrupt(
                sl.idx_path,
                sl.lo + len(raw_idx) // IDX_ENTRY_SIZE,
                f".idx ends before seq {sl.hi}, which the snapshot says is checkpointed",
            )
        idx = np.frombuffer(raw_idx, IDX_ENTRY_DTYPE)
        seqs = np.arange(sl.lo, sl.hi + 1, dtype=np.int64)
        keep = idx["flags"] != DELETED
        ts_idx = idx["ts"]
        if sl.ts_lo is not None:
            keep &= ts_idx >= sl.ts_lo
        if sl.ts_hi is not None:
            keep &= ts_idx <= sl.ts_hi
        if sl.keep_from_ts is not None:
            keep &= ts_idx >= sl.keep_from_ts
        if sl.deleted:
            keep &= ~np.isin(seqs, np.asarray(sl.deleted, dtype=np.int64))
        sel = np.flatnonzero(keep)
        if not len(sel):
            return
        offs_all = idx["offset"][sel].astype(np.int64)
        lens_all = idx["len"][sel].astype(np.int64)
        ts_all = ts_idx[sel]
        seqs_all = seqs[sel]
        for start in range(0, len(sel), batch_rows):
            end = min(start + batch_rows, len(sel))
            yield _decode(
                sl,
                data_path,
                dfile,
                offs_all[start:end],
                lens_all[start:end],
                seqs_all[start:end],
                ts_all[start:end],
                schema,
                value_format,
            )
    finally:
        ifile.close()
        dfile.close()


def _decode(
    sl: SegmentSlice,
    path: str,
    dfile: File,
    offs: np.ndarray[Any, Any],
    lens: np.ndarray[Any, Any],
    seqs: np.ndarray[Any, Any],
    ts_idx: np.ndarray[Any, Any],
    schema: pa.Schema,
    value_format: str,
) -> pa.RecordBatch:
    n = len(offs)
    lo = int(offs.min())
    hi = int((offs + lens).max())
    raw = _pread_all(dfile, hi - lo, lo)
    o = offs - lo
    ln = lens
    # Frames must lie inside what was read and be at least a header plus checksum.
    bad = (o < 0) | (o + ln > len(raw)) | (ln < SEG_FRAME_OVERHEAD)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _corrupt(path, raw, int(o[i]), int(ln[i]), int(seqs[i]), "frame outside the file")
    buf8 = np.frombuffer(raw, np.uint8)
    hdr = _gather(buf8, o, _HDR_COLS).view(SEG_HEADER_DTYPE).reshape(n)
    nl = hdr["node_len"].astype(np.int64)
    tl = hdr["tag_len"].astype(np.int64)
    dl = hdr["data_len"].astype(np.int64)
    stored = _gather(buf8, o + ln - CHECKSUM.size, _U64_COLS).view("<u8").reshape(n)
    mv = memoryview(raw)
    crc = xxhash.xxh3_64_intdigest
    computed = np.fromiter(
        (
            crc(mv[a:b])
            for a, b in zip((o + 4).tolist(), (o + ln - CHECKSUM.size).tolist(), strict=True)
        ),
        dtype=np.uint64,
        count=n,
    )
    bad = (
        (hdr["frame_len"].astype(np.int64) != ln - 4)
        | (hdr["seq"].astype(np.int64) != seqs)
        | (computed != stored)
        | (nl + tl + dl + SEG_FRAME_OVERHEAD != ln)
    )
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _corrupt(
            path, raw, int(o[i]), int(ln[i]), int(seqs[i]), "lengths inconsistent with frame_len"
        )
    ts = hdr["ts"]
    if not np.array_equal(ts, ts_idx):
        i = int(np.flatnonzero(ts != ts_idx)[0])
        raise FrameCorrupt(sl.idx_path, int(seqs[i]), ".idx ts differs from the frame's ts")
    flags = hdr["flags"]
    has_node = (flags & F_HAS_NODE) != 0
    has_tag = (flags & F_HAS_TAG) != 0
    has_meta = (flags & F_HAS_META) != 0
    node_at = o + SEG_HDR
    tag_at = node_at + nl
    pay_at = tag_at + tl
    ml = np.zeros(n, dtype=np.int64)
    if has_meta.any():
        mi = np.flatnonzero(has_meta)
        ml[mi] = _gather(buf8, pay_at[mi], _U32_COLS).view("<u4").reshape(len(mi))
        badm = has_meta & (ml + 4 > dl)
        if badm.any():
            i = int(np.flatnonzero(badm)[0])
            raise FrameCorrupt(path, int(seqs[i]), "meta_len inconsistent with data_len")
    skip = np.where(has_meta, 4 + ml, 0)
    data_at = pay_at + skip
    data_len = dl - skip
    pbuf = pa.py_buffer(raw)
    node = _byte_ranges(pbuf, node_at, nl, has_node).cast(pa.string())
    tag = _byte_ranges(pbuf, tag_at, tl, has_tag).cast(pa.string())
    meta = _byte_ranges(pbuf, pay_at + 4, ml, has_meta).cast(pa.string())
    data = _byte_ranges(pbuf, data_at, data_len, None)
    if value_format != "binary":
        data = data.cast(pa.string())
    topic = pa.repeat(pa.scalar(sl.topic, pa.string()), n)
    ts_us = pa.array(ts.astype(np.int64) * 1000, _TS)
    return pa.RecordBatch.from_arrays(
        [topic, pa.array(seqs, pa.int64()), ts_us, tag, node, meta, data], schema=schema
    )
