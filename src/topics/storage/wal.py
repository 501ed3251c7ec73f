"""One WAL shard: preallocated log files, a writer thread and group commit.

Layout of a shard directory (README "Durability and the data directory")::

    CURRENT                      names the active file (replaced atomically)
    wal-0000000000000000.log     preallocated, zero-filled, append-only frames
    wal-0000000000001024.log     the next file: named by the shard-wide index
                                 of its first frame (ours: frames mix topics,
                                 so a record seq cannot name a file)

Invariants:

* Bytes are written in submission order by one writer thread; a batch is one
  `pwrite` (many frames; a part of 1 MiB or more, such as a large write's
  frames, gets a `pwrite` of its own, from its own buffer) and, when any
  member needs it, one `fdatasync`.
* A member is acknowledged only after its class's commit point: `sync=True`
  members after the `fdatasync` returned, others after the write. A lone
  submission is written at once (no waiting window); under load, everything
  queued while the previous batch was syncing forms the next batch.
* Files are preallocated by writing zeros (cheaper `fdatasync` than a growing
  file on this machine, docs/BENCHMARKS.md), so the end of the log is
  the first frame whose length field is zero or whose checksum fails.
* A failed write or sync fails every member of its batch (except members an
  earlier sync in the same batch already made durable). A failed `fdatasync`
  latches the shard read-only (the kernel may have dropped the dirty pages, so a
  retry could report success for lost bytes) and zeroes everything written since
  the last successful sync, so a process restart neither replays the failed batch
  nor appends after bytes that never reached the disk; a failed `pwrite` rewinds
  the tail so the next batch overwrites the partial bytes.

Time comes from the shard's :class:`~topics.clock.Clock` (`clock`, the system
clock unless a test gives its own): its monotonic reading times the disk-full
retries and the fsync latencies. It only paces background work and never
decides correctness. The writer waits on its queue with a real timeout (the
periodic sync of non-`fsync` members, the next disk-full retry), so a test
clock changes what the writer reads, not how long it sleeps.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from topics.clock import Clock, SystemClock
from topics.format.frame import (
    APPEND,
    F_BATCH_MORE,
    LOST,
    SYNC_MARK,
    WAL_COLS_DTYPE,
    Frame,
    FrameError,
    Torn,
    decode_frame,
    encode_control,
    find_next_frame,
    scan_columns,
)
from topics.storage.fs import Data, File, Fs, list_names, write_all, write_file
from topics.storage.iogate import io_gate

__all__ = [
    "WalShard",
    "WalEntry",
    "WalFull",
    "WalReadOnly",
    "WalDiskFull",
    "WalDamage",
    "Damage",
    "ShardScan",
    "ScannedFile",
    "WalPosition",
    "scan_shard",
    "wal_file_name",
    "DEFAULT_FILE_BYTES",
]

log = logging.getLogger("topics.wal")

DEFAULT_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_QUEUE_MAX = 4096
DEFAULT_SYNC_INTERVAL_S = 0.005
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Entries up to this size that need no fsync may be written on the submitting
#: thread (:meth:`WalShard.write_now`); larger ones go to the writer thread.
WRITE_NOW_MAX_BYTES = 256 * 1024
#: Parts of a write under this size are joined into one pwrite; larger ones are
#: written from their own buffer.
JOIN_MAX_BYTES = 1 << 20
_ZERO_CHUNK = bytes(1 << 20)
# The largest SyncMark frame: room for one is kept free at the end of every file.
_MARK_ROOM = len(encode_control(SYNC_MARK, 0, {"synced": (1 << 64) - 1}))


class _Wake:
    """Queued to wake the writer thread when :meth:`WalShard.write_now` left it work."""


_WAKE = _Wake()


class WalFull(Exception):
    """The shard's ingest queue is full (the HTTP layer answers 429)."""


class WalReadOnly(Exception):
    """The shard is latched read-only after a sync or rotation failure (500)."""


class WalDiskFull(Exception):
    """The shard's filesystem is full: new writes are refused until space returns.

    The HTTP layer answers `507 insufficient_storage` with `Retry-After`
    (README "When the disk fills up"). Nothing refused this way was acknowledged.
    """


# Errors that mean "no space", not "the device failed".
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How often a shard that hit a full disk tries again (seconds).
DISK_FULL_RETRY_S = 1.0
# The smallest file preallocation falls back to when the filesystem is small.
MIN_FILE_BYTES = 1 << 20


def _is_full(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


@dataclass(frozen=True, slots=True)
class WalPosition:
    """A place in a shard's log: the frame at byte `offset` of `file`, shard-wide `index`."""

    file: str
    offset: int
    index: int


def wal_file_name(first_index: int) -> str:
    """`wal-<first frame index, 16 zero-padded digits>.log`."""
    return f"wal-{first_index:016d}.log"


@dataclass(eq=False)
class WalEntry:
    """One submission: encoded frames, whether it needs fsync, and its outcome.

    `done` is called exactly once, from the writer thread, with
    `(entry, ok, fsync_ms)`; `fsync_ms` is the sync time of the batch (0.0 when
    the entry did not wait for a sync).
    """

    data: Data
    frames: int
    sync: bool
    done: Callable[[WalEntry, bool, float], None]
    ok: bool = False
    fsync_ms: float = 0.0
    error: BaseException | None = None
    index: int = 0  # shard-wide index of the entry's first frame
    file: str = ""  # the log file it was written to, and its byte offset there
    offset: int = 0
    # The engine already acknowledged this entry at enqueue (disk/memory classes);
    # if writing it fails, the shard latches read-only rather than carry on past
    # a hole in acknowledged data.
    acked_early: bool = False
    # More bytes of the entry, written right after `data` (a disk write's head
    # reservation after its frames, early-acked frames gathered in one loop
    # iteration): kept as they are, so no one copies a large batch to join them.
    more: tuple[Data, ...] = ()
    # len(data) + the lengths of `more`: the bytes the entry takes in the log.
    size: int = field(init=False, default=0)
    # When it was queued (the shard clock's monotonic seconds), and how long it
    # then waited for a widened commit window (ms; docs/SCHEDULER.md).
    queued_at: float = field(init=False, default=0.0)
    window_ms: float = field(init=False, default=0.0)
    # The writer may hold a batch that starts with this entry for the commit
    # window (fsync-class appends; never head reservations or control frames).
    gather: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.size = len(self.data) + sum(len(b) for b in self.more)


@dataclass
class WalMetrics:
    frames: int = 0
    batches: int = 0
    fsyncs: int = 0
    bytes_written: int = 0
    rotations: int = 0
    sync_marks: int = 0
    submit_full: int = 0
    direct_writes: int = 0  # entries written on the submitting thread (write_now)
    queue_depth_peak: int = 0
    fsync_micros_total: int = 0
    fsync_hist: list[int] = field(default_factory=lambda: [0] * 10)

    BUCKETS_US = (50, 100, 250, 500, 1000, 5000, 10000, 50000, 100000)

    def observe_fsync(self, us: int) -> None:
        self.fsyncs += 1
        self.fsync_micros_total += us
        for i, b in enumerate(self.BUCKETS_US):
            if us <= b:
                self.fsync_hist[i] += 1
                return
        self.fsync_hist[-1] += 1


@dataclass
class ScannedFile:
    """One WAL file as recovery read it.

    `buf` holds the file's bytes (the used prefix only, when that is much
    shorter than the file); `cols` has one WAL_COLS_DTYPE row per valid frame
    of the log from where the scan started in this file; `first_index` is the
    shard-wide index of `cols[0]`.
    """

    name: str
    buf: bytes
    cols: npt.NDArray[np.void]
    first_index: int


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a shard's log that fail validation and are not a torn tail.

    `file`/`start`/`end`: the byte range `[start, end)` of the file that no
    valid frame covers; `reason` says why (a decoder `TORN_*` reason, a missing
    file, an incomplete write); `valid_after` counts the valid frames of the
    shard after it (SyncMarks left out); `before`/`after` map topic id -> the last Append seq seen
    before the range and the first seen after it (the seqs at risk lie between).
    See docs/FORMATS.md, "Torn tail or damage".
    """

    file: str
    start: int
    end: int
    reason: str
    valid_after: int
    before: dict[int, int]
    after: dict[int, int]
    index: int = -1  # for missing frames: the first missing frame index
    frames: int = 1  # frame indexes the range stands for (what a repair filler must keep)

    def at_risk(self, limit: int = 4) -> str:
        """The seq ranges at risk, one `topic <id hex> seqs a..b` clause per topic."""
        parts: list[str] = []
        for tid in sorted(set(self.before) | set(self.after)):
            lo = self.before.get(tid)
            hi = self.after.get(tid)
            if lo is not None and hi is not None:
                if hi <= lo + 1:
                    continue
                parts.append(f"topic {tid:016x} seqs {lo + 1}..{hi - 1}")
            elif lo is not None:
                parts.append(f"topic {tid:016x} seqs after {lo}")
            elif hi is not None:
                parts.append(f"topic {tid:016x} seqs before {hi}")
        if not parts:
            return "no Append seq can be placed in it"
        more = f" and {len(parts) - limit} more topics" if len(parts) > limit else ""
        return ", ".join(parts[:limit]) + more

    def describe(self, shard_dir: str) -> str:
        return (
            f"{posixpath.join(shard_dir, self.file)} bytes [{self.start}, {self.end}): "
            f"{self.reason}; {self.valid_after} valid frames follow; at risk: {self.at_risk()}"
        )


class WalDamage(OSError):
    """A shard's log holds damage, not a torn tail: recovery refuses to touch it.

    `shard` is the shard directory, `damage` the damaged ranges in log order.
    The message names the file, the byte range, the reason and the seqs at risk;
    nothing on disk has been changed. `topics repair` salvages (docs/FORMATS.md).
    """

    def __init__(self, shard: str, damage: list[Damage]) -> None:
        self.shard = shard
        self.damage = damage
        first = damage[0].describe(shard)
        more = f" (and {len(damage) - 1} more damaged ranges)" if len(damage) > 1 else ""
        super().__init__(
            errno.EIO,
            f"WAL damage in {first}{more}; refusing to start with nothing changed on disk; "
            "inspect with `topics verify`, salvage with `topics repair`",
        )


@dataclass
class ShardScan:
    """What recovery found in a shard: valid frames in order and where the log ends.

    `files` are the files read, in order, from the start position on (a
    checkpoint position skips whole files before it and the frames before it in
    its own file). `torn` is set when the log ends on a torn tail (cut by
    :meth:`WalShard.open`, its bytes kept aside first); `damage` lists every
    other invalid range (recovery refuses to start when it is not empty).
    `marks` is the highest SyncMark offset of the newest file.
    """

    dir: str
    files: list[ScannedFile]
    end_file: str | None  # file holding the logical end (None: no files)
    end_offset: int  # byte offset of the logical end inside end_file
    next_index: int  # shard-wide index the next frame gets
    torn: Torn | None  # the invalid bytes that ended the log, if any
    damage: list[Damage] = field(default_factory=list)
    torn_end: int = 0  # end of the torn bytes (the last non-zero byte + 1)
    mark: int = 0

    @property
    def frames(self) -> list[tuple[str, Frame]]:
        """Every scanned frame but SyncMarks, decoded, as `(file name, frame)` (tools, tests)."""
        out: list[tuple[str, Frame]] = []
        for f in self.files:
            for off in f.cols["off"][f.cols["type"] != SYNC_MARK].tolist():
                fr = decode_frame(f.buf, off)
                assert isinstance(fr, Frame)
                out.append((f.name, fr))
        return out


def _list_wal_files(fs: Fs, d: str) -> list[str]:
    return sorted(n for n in list_names(fs, d) if n.startswith("wal-") and n.endswith(".log"))


def _first_index(name: str) -> int:
    return int(name[4:-4])


def _nonzero_end(buf: bytes, start: int) -> int:
    """One past the last non-zero byte at or after `start` (`start` when all zero)."""
    n = len(buf)
    if buf.count(0, start) == n - start:
        return start
    a = np.frombuffer(buf, np.uint8)
    hi = n
    step = 1 << 20
    while hi > start:
        lo = max(start, hi - step)
        nz = np.flatnonzero(a[lo:hi])
        if len(nz):
            return lo + int(nz[-1]) + 1
        hi = lo
    return start  # pragma: no cover - the count above said otherwise


@dataclass
class _FileScan:
    name: str
    buf: bytes
    base_index: int
    cols: npt.NDArray[np.void]
    # Invalid ranges in file order: (start, end, reason, number of valid rows before it).
    bad: list[tuple[int, int, str, int]]
    end: int  # offset after the last valid frame
    used: int  # one past the last non-zero byte
    extra: int  # frame indexes the Lost fillers among `cols` stand for beyond one each


def _scan_file(
    buf: bytes, begin: int
) -> tuple[npt.NDArray[np.void], list[tuple[int, int, str, int]], int, int]:
    """Every valid frame of `buf` from `begin`, reading past invalid ranges.

    Returns the rows, the invalid ranges `(start, end, reason, rows before)`,
    the offset after the last valid frame and the end of the used bytes.
    """
    pieces: list[npt.NDArray[np.void]] = []
    bad: list[tuple[int, int, str, int]] = []
    rows = 0
    off = begin
    last_end = begin
    while True:
        res = scan_columns(buf, off)
        if len(res.cols):
            pieces.append(res.cols)
            rows += len(res.cols)
            last_end = res.end_offset
        elif off == begin:
            last_end = begin
        stop = res.end_offset
        if res.torn is None:
            used = _nonzero_end(buf, stop)
            if used == stop:
                break  # zeros (preallocated space) or the end of the file
            reason = "data after a zeroed frame length"
        else:
            reason = res.torn.reason
        nxt = find_next_frame(buf, stop + 1)
        if nxt is None:
            used = _nonzero_end(buf, stop)
            bad.append((stop, max(used, stop + 1), reason, rows))
            break
        bad.append((stop, nxt, reason, rows))
        off = nxt
    if len(pieces) == 1:
        cols = pieces[0]
    else:
        cols = np.concatenate(pieces) if pieces else np.zeros(0, WAL_COLS_DTYPE)
    used = max((b[1] for b in bad), default=0)
    return cols, bad, last_end, max(used, last_end)


def _marks(buf: bytes, cols: npt.NDArray[np.void]) -> int:
    """The highest `synced` offset of the SyncMark frames among `cols` (0 when none)."""
    best = 0
    for off in cols["off"][cols["type"] == SYNC_MARK].tolist():
        fr = decode_frame(buf, off)
        if isinstance(fr, Frame):
            try:
                best = max(best, int(fr.control().get("synced", 0)))
            except (FrameError, TypeError, ValueError):
                continue
    return best


def _lost_extra(cols: npt.NDArray[np.void]) -> int:
    """Frame indexes beyond one each that the shard-level Lost fillers in `cols` stand
    for (a filler's header `seq` is its frame count; docs/FORMATS.md, "Repair")."""
    sel = (cols["type"] == LOST) & (cols["topic_id"] == 0)
    if not sel.any():
        return 0
    return int(np.maximum(cols["seq"][sel].astype(np.int64), 1).sum()) - int(sel.sum())


def _write_tail(cols: npt.NDArray[np.void]) -> int:
    """How many rows at the end of `cols` belong to a write whose last frame is missing."""
    cut = 0
    n = len(cols)
    while (
        cut < n
        and cols["type"][n - 1 - cut] == APPEND
        and cols["flags"][n - 1 - cut] & F_BATCH_MORE
    ):
        cut += 1
    return cut


def scan_shard(fs: Fs, d: str, start: WalPosition | None = None) -> ShardScan:
    """Read a shard's files in order, past any invalid bytes, and classify them.

    With `start`, files wholly before it are not read and the scan of its own
    file begins at its byte offset (the frames before a checkpoint position are
    already reflected in the snapshot that names it). Raises OSError from the
    filesystem; never raises on corrupt bytes and never changes anything.

    Invalid bytes are a torn tail (`torn`) only when they lie in the newest
    file, at or after the highest SyncMark of that file (bytes never known
    durable), with no valid frame of a later file after them; every other
    invalid range, a gap in frame indexes between files and a missing replay
    start are `damage` (docs/FORMATS.md, "Torn tail or damage").
    """
    files = _list_wal_files(fs, d)
    if not files:
        return ShardScan(d, [], None, 0, 0, None)
    first = 0
    if start is not None:
        # Skip every file whose successor begins at or before the start index.
        while first + 1 < len(files) and _first_index(files[first + 1]) <= start.index:
            first += 1
    # (file pos, start, end, reason, row, first missing frame index or -1, frame count)
    damage_raw: list[tuple[int, int, int, str, int, int, int]] = []
    scanned: list[_FileScan] = []
    for i in range(first, len(files)):
        name = files[i]
        f = fs.open(posixpath.join(d, name))
        try:
            buf = f.pread(f.size(), 0)
        finally:
            f.close()
        base_index = _first_index(name)
        begin = 0
        if start is not None and i == first:
            if name == start.file:
                begin = start.offset
                base_index = start.index
            elif base_index > start.index:
                damage_raw.append(
                    (
                        0,
                        0,
                        0,
                        f"the file holding the replay start {start.file} is missing",
                        0,
                        start.index,
                        base_index - start.index,
                    )
                )
        cols, bad, end, used = _scan_file(buf, begin)
        if start is not None and i == first and name != start.file and base_index < start.index:
            # The named file is gone: drop the frames before the start index here.
            drop = min(start.index - base_index, len(cols))
            cols = cols[drop:]
            bad = [(a, b, r, max(k - drop, 0)) for a, b, r, k in bad]
            base_index += drop
        scanned.append(_FileScan(name, buf, base_index, cols, bad, end, used, _lost_extra(cols)))

    newest = len(scanned) - 1
    mark = _marks(scanned[newest].buf, scanned[newest].cols)
    torn: Torn | None = None
    torn_end = 0
    for k, fsc in enumerate(scanned):
        last = k == newest
        # How many frame indexes the invalid ranges of a rotated-out file stand for:
        # the next file starts at the index after the file's last frame.
        missing = 0
        if not last:
            missing = _first_index(scanned[k + 1].name) - fsc.base_index - len(fsc.cols) - fsc.extra
        for j, (a, b, reason, row) in enumerate(fsc.bad):
            if last and a >= mark and not damage_raw and j == 0:
                torn, torn_end = Torn(a, reason), fsc.used
                # Everything from the torn bytes on is cut: drop valid frames after them.
                fsc.cols = fsc.cols[:row]
                fsc.end = a
                break
            k_frames = 1
            if j == len(fsc.bad) - 1 and not last:
                k_frames = max(1, missing - (len(fsc.bad) - 1))
            damage_raw.append((k, a, b, reason, row, -1, k_frames))
        if not last and not fsc.bad and missing:
            nxt = fsc.base_index + len(fsc.cols) + fsc.extra
            damage_raw.append(
                (
                    k,
                    fsc.end,
                    fsc.end,
                    f"frames {nxt}..{nxt + missing - 1} are missing (a WAL file is gone?)",
                    len(fsc.cols),
                    nxt,
                    missing,
                )
            )
    end_scan = scanned[newest]
    cut = _write_tail(end_scan.cols)
    if cut:
        off = int(end_scan.cols["off"][len(end_scan.cols) - cut])
        if off >= mark:
            # A write torn part way through leaves valid frames still flagged "more
            # follow": drop them, so the whole write is gone (all-or-nothing).
            end_scan.cols = end_scan.cols[: len(end_scan.cols) - cut]
            if torn is None:
                torn, torn_end = Torn(off, "incomplete write"), max(end_scan.used, end_scan.end)
            else:
                torn = Torn(off, torn.reason)
            end_scan.end = off
        else:
            damage_raw.append(
                (
                    newest,
                    end_scan.end,
                    end_scan.end,
                    "a write whose last frame is missing",
                    len(end_scan.cols),
                    -1,
                    0,
                )
            )

    damage = _damage(scanned, damage_raw) if damage_raw else []
    out: list[ScannedFile] = []
    for fsc in scanned:
        buf = fsc.buf
        if fsc.used < len(buf) // 4:
            buf = buf[: fsc.used]  # keep only the used part of a mostly empty file
        out.append(ScannedFile(fsc.name, buf, fsc.cols, fsc.base_index))
    return ShardScan(
        d,
        out,
        end_scan.name,
        end_scan.end,
        end_scan.base_index + len(end_scan.cols) + end_scan.extra,
        torn,
        damage,
        torn_end,
        mark,
    )


def _damage(
    scanned: list[_FileScan], raw: list[tuple[int, int, int, str, int, int, int]]
) -> list[Damage]:
    """Attach to each damaged range the valid frames after it and the seqs around it."""
    counts = [len(f.cols) for f in scanned]
    appends = [f.cols["type"] == APPEND for f in scanned]
    # Frames that carry something (SyncMarks are bookkeeping), per file, cumulative.
    real = [np.cumsum(f.cols["type"] != SYNC_MARK) for f in scanned]
    totals = [int(r[-1]) if len(r) else 0 for r in real]
    out: list[Damage] = []
    for k, a, b, reason, row, index, frames in sorted(raw):
        before_here = int(real[k][row - 1]) if row > 0 else 0
        after = totals[k] - before_here + sum(totals[k + 1 :])
        before_seq: dict[int, int] = {}
        after_seq: dict[int, int] = {}
        for j, fsc in enumerate(scanned):
            if j > k:
                break
            stop = row if j == k else counts[j]
            part = fsc.cols[:stop][appends[j][:stop]]
            before_seq.update(zip(part["topic_id"].tolist(), part["seq"].tolist(), strict=True))
        for j in range(len(scanned) - 1, k - 1, -1):
            lo = row if j == k else 0
            part = scanned[j].cols[lo:][appends[j][lo:]][::-1]
            after_seq.update(zip(part["topic_id"].tolist(), part["seq"].tolist(), strict=True))
        out.append(
            Damage(scanned[k].name, a, b, reason, after, before_seq, after_seq, index, frames)
        )
    return out


class WalShard:
    """An open shard: submit entries from any thread, one writer thread persists them.

    Construct with :meth:`open`, which scans the log, refuses damage
    (:class:`WalDamage`), cuts a torn tail (after keeping its bytes aside) and
    starts the writer.

    After every successful `fdatasync` that made new bytes durable, the writer
    appends a SyncMark frame recording the durable offset of the active file
    (before the synced batch is acknowledged). Recovery uses the highest mark
    to tell a torn tail (invalid bytes past it) from damage (invalid bytes
    before it): docs/FORMATS.md, "Torn tail or damage".
    """

    def __init__(
        self,
        fs: Fs,
        directory: str,
        *,
        file_bytes: int = DEFAULT_FILE_BYTES,
        queue_max: int = DEFAULT_QUEUE_MAX,
        sync_interval_s: float = DEFAULT_SYNC_INTERVAL_S,
        full_retry_s: float = DISK_FULL_RETRY_S,
        clock: Clock | None = None,
    ) -> None:
        self.fs = fs
        self.clock: Clock = clock or SystemClock()
        self.full_retry_s = full_retry_s
        self.dir = directory
        self.file_bytes = file_bytes
        self.queue_max = queue_max
        self.sync_interval_s = sync_interval_s
        # How long the writer keeps gathering a batch after its first entry (s):
        # 0 under normal load; the delivery governor widens it under pressure
        # (docs/SCHEDULER.md, "The ladder"). Read once per batch, from any thread.
        self.commit_window_s = 0.0
        self.metrics = WalMetrics()
        self.read_only = False
        self._q: queue.SimpleQueue[WalEntry | _Wake | None] = queue.SimpleQueue()
        self._depth = 0
        self._depth_lock = threading.Lock()
        self._file: File | None = None
        self._file_name = ""
        self._file_first = 0
        self._offset = 0
        self._next_index = 0
        self._dirty = False  # written but not yet fdatasync'ed
        # Bytes of the active file below this offset are known durable (the last
        # successful fdatasync covered them); see _sync_failed.
        self._synced_offset = 0
        # The offset just after the last SyncMark written to the active file: a new
        # mark is written only once bytes past it are durable.
        self._mark_end = 0
        # Size of the active file (smaller than file_bytes when a small filesystem
        # could not hold a whole preallocated file).
        self._size = file_bytes
        # Disk-full state: entries acknowledged before they could be written
        # (disk/memory classes) wait here, in log order, and are retried every
        # DISK_FULL_RETRY_S; new submissions are refused meanwhile.
        self.disk_full = False
        self.disk_full_since = 0.0
        self._retained: list[WalEntry] = []
        self._retry_at = 0.0
        self._retrying = False
        self._holds = 0
        self._full_probe = ""
        # Bytes after the tail up to here may hold part of a write the full disk
        # refused; they are zeroed before the next write (0: nothing to clear).
        self._stale_end = 0
        self._thread: threading.Thread | None = None
        self._stopped = False
        # Held while the file, the tail offset or the disk-full state change: by the
        # writer thread around each batch, sync and retry, and by write_now.
        self._io = threading.Lock()

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls, fs: Fs, directory: str, start: WalPosition | None = None, **kw: Any
    ) -> tuple[WalShard, ShardScan]:
        """Recover the shard's tail and start writing after it.

        Returns the shard and the scan (the valid frames from `start`, for replay).
        Raises :class:`WalDamage` (nothing changed on disk) when the log holds
        damage rather than a torn tail, OSError when the directory cannot be
        read, repaired or preallocated.
        """
        fs.makedirs(directory)
        found = scan_shard(fs, directory, start)
        return cls.open_scanned(fs, found, **kw), found

    @classmethod
    def open_scanned(cls, fs: Fs, found: ShardScan, **kw: Any) -> WalShard:
        """:meth:`open` from a scan already made (recovery scans every shard first)."""
        if found.damage:
            raise WalDamage(found.dir, found.damage)
        shard = cls(fs, found.dir, **kw)
        fs.makedirs(found.dir)
        shard._adopt(found)
        shard._start()
        return shard

    @property
    def capacity(self) -> int:
        """The most bytes one entry may have (a file, less room for a SyncMark)."""
        return self.file_bytes - _MARK_ROOM

    def _adopt(self, found: ShardScan) -> None:
        fs = self.fs
        if found.end_file is None:
            self._new_file(0)
            return
        path = posixpath.join(self.dir, found.end_file)
        f = fs.open(path, write=True)
        size = f.size()
        end = found.end_offset
        if found.torn is not None:
            stop = max(found.torn_end, end)
            log.warning(
                "wal %s: torn tail in %s at %d (%s): %d bytes after the last durable mark "
                "(at %d) are cut; they are kept in %s",
                self.dir,
                found.end_file,
                found.torn.offset,
                found.torn.reason,
                stop - end,
                found.mark,
                self._keep_aside(f, found.end_file, end, stop),
            )
            # Zero the torn bytes so the next scan ends at the last valid frame
            # (the scan checked that everything after them is zeros already).
            self._zero(f, end, min(stop, size))
        self._size = max(size, self.file_bytes)
        if size < self.file_bytes:
            try:
                self._zero(f, size, self.file_bytes)
            except OSError as exc:
                if not _is_full(exc):
                    raise
                # A small filesystem: keep the file as long as it was (no partial tail).
                f.truncate(size)
                self._size = size
                log.warning(
                    "wal %s: %s stays %d bytes (no room to extend it to %d)",
                    self.dir,
                    found.end_file,
                    size,
                    self.file_bytes,
                )
        f.fdatasync()
        self._file = f
        self._file_name = found.end_file
        self._file_first = _first_index(found.end_file)
        self._offset = end
        self._synced_offset = end
        self._mark_end = end
        self._next_index = found.next_index
        self._write_current()

    def _keep_aside(self, f: File, name: str, start: int, stop: int) -> str:
        """Copy bytes `[start, stop)` of the active file to `<name>.torn-<start>` (durably)."""
        aside = f"{name}.torn-{start}"
        path = posixpath.join(self.dir, aside)
        write_file(self.fs, path, f.pread(stop - start, start))
        self.fs.fsync_dir(self.dir)
        return path

    def _zero(self, f: File, start: int, stop: int) -> None:
        off = start
        while off < stop:
            n = min(len(_ZERO_CHUNK), stop - off)
            write_all(f, _ZERO_CHUNK[:n], off)
            off += n

    def _new_file(self, first_index: int) -> None:
        """Create, zero-fill and fsync the next log file, then point CURRENT at it.

        On a filesystem without room for `file_bytes`, the file is made as large
        as fits, halving down to MIN_FILE_BYTES; a partial file is never left
        behind. Raises OSError (ENOSPC when not even the smallest file fits).
        """
        name = wal_file_name(first_index)
        path = posixpath.join(self.dir, name)
        size = self.file_bytes
        while True:
            f = self.fs.open(path, create=True, write=True)
            try:
                f.truncate(0)
                self._zero(f, 0, size)
                f.fdatasync()
                break
            except OSError as exc:
                f.close()
                try:
                    self.fs.unlink(path)
                    self.fs.fsync_dir(self.dir)
                except OSError as exc2:
                    log.error("wal %s: cannot remove the partial %s: %s", self.dir, name, exc2)
                if not _is_full(exc) or size <= MIN_FILE_BYTES:
                    raise
                size = max(size // 2, MIN_FILE_BYTES)
        if size < self.file_bytes:
            log.warning(
                "wal %s: only %d bytes fit for %s (want %d); the disk is nearly full",
                self.dir,
                size,
                name,
                self.file_bytes,
            )
        self.fs.fsync_dir(self.dir)
        old = self._file
        self._file = f
        self._file_name = name
        self._file_first = first_index
        self._offset = 0
        self._synced_offset = 0
        self._mark_end = 0
        self._size = size
        self._next_index = first_index
        self._write_current()
        if old is not None:
            old.close()

    def _write_current(self) -> None:
        tmp = posixpath.join(self.dir, "CURRENT.tmp")
        f = self.fs.open(tmp, create=True, write=True)
        try:
            f.truncate(0)
            write_all(f, (self._file_name + "\n").encode(), 0)
            f.fdatasync()
        finally:
            f.close()
        self.fs.replace(tmp, posixpath.join(self.dir, "CURRENT"))
        self.fs.fsync_dir(self.dir)

    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"wal-writer {self.dir}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Write and sync everything queued, then stop the writer thread."""
        if self._stopped:
            return
        self._stopped = True
        self._q.put(None)
        if self._thread is not None:
            self._thread.join()
        with self._io:  # no write_now is under way on another thread
            if self._file is not None:
                self._file.close()
                self._file = None

    # ------------------------------------------------------------ submission

    @property
    def queue_depth(self) -> int:
        return self._depth

    def submit(self, entry: WalEntry) -> None:
        """Queue an entry for the writer; raises WalFull, WalDiskFull or WalReadOnly
        (nothing queued). An entry already acknowledged (`acked_early`) is queued
        even while the disk is full: it waits in log order for space."""
        if self.read_only:
            raise WalReadOnly(self.dir)
        if self.disk_full and not entry.acked_early:
            raise WalDiskFull(self.dir)
        if self._stopped:
            raise WalReadOnly(f"{self.dir} is closed")
        with self._depth_lock:
            if self._depth >= self.queue_max:
                self.metrics.submit_full += 1
                raise WalFull(self.dir)
            self._depth += 1
            if self._depth > self.metrics.queue_depth_peak:
                self.metrics.queue_depth_peak = self._depth
        if entry.gather and self.commit_window_s:
            entry.queued_at = self.clock.monotonic()  # for its window_ms
        self._q.put(entry)

    def write_now(self, entry: WalEntry) -> bool:
        """Write a page-cache-class entry on the calling thread, when nothing is ahead of it.

        For an entry that needs no fsync (`entry.sync` false) and is at most
        :data:`WRITE_NOW_MAX_BYTES`: when the writer holds nothing queued or in
        hand, is not syncing, the disk is not full and the entry fits the active
        file, the bytes are written here and `entry.done` runs before this
        returns True. Otherwise it returns False and nothing happened: the caller
        queues the entry with :meth:`submit`. Log order holds either way, since an entry is
        written here only when every entry submitted before it is written.
        (docs/ARCHITECTURE.md, "The write path".)
        """
        if (
            entry.sync
            or entry.size > WRITE_NOW_MAX_BYTES
            or self.read_only
            or self.disk_full
            or self._stopped
            or not self._io.acquire(blocking=False)
        ):
            return False
        try:
            if (
                self._depth
                or self._retained
                or self._file is None
                or self.disk_full
                or self._offset + entry.size > min(self.capacity, self._size - _MARK_ROOM)
            ):
                return False
            was_dirty = self._dirty
            self._commit([entry])
            self.metrics.direct_writes += 1
            # The writer may be asleep with no timeout: wake it for the background
            # sync (or the disk-full retry) this write now calls for.
            if (self._dirty and not was_dirty) or self.disk_full:
                self._q.put(_WAKE)
            return True
        finally:
            self._io.release()

    # ------------------------------------------------------------ the writer

    def _run(self) -> None:
        q = self._q
        stopping = False
        while True:
            timeout = self.sync_interval_s if self._dirty else None
            if self.disk_full:
                wait = max(self._retry_at - self.clock.monotonic(), 0.0)
                timeout = wait if timeout is None else min(timeout, wait)
            try:
                first = q.get(timeout=timeout)
            except queue.Empty:
                with self._io:
                    self._background_sync()
                    if self.disk_full and self.clock.monotonic() >= self._retry_at:
                        self._retry()
                continue
            batch: list[WalEntry] = []
            size = 0
            item: WalEntry | _Wake | None = first
            # A widened window only pays where a batch ends in a sync: fewer fsyncs.
            window = self.commit_window_s if isinstance(first, WalEntry) and first.gather else 0.0
            start = self.clock.monotonic() if window > 0 else 0.0
            while True:
                if item is None:
                    stopping = True
                elif not isinstance(item, _Wake):
                    batch.append(item)
                    size += item.size
                if size >= MAX_BATCH_BYTES or stopping:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    left = start + window - self.clock.monotonic() if window > 0 else 0.0
                    if left <= 0:
                        break
                    try:
                        item = q.get(timeout=left)  # a widened window: gather more
                    except queue.Empty:
                        break
            if window > 0 and batch:
                end = self.clock.monotonic()
                for e in batch:
                    e.window_ms = max(end - max(e.queued_at, start), 0.0) * 1000
            if batch:
                with self._io:
                    # Counted until the lock is held, so write_now never overtakes
                    # them: the lock is let go only once they are written.
                    with self._depth_lock:
                        self._depth -= len(batch)
                    self._commit(batch)
            if stopping:
                if self._retained:
                    with self._io:
                        self._retry()
                if self._retained:
                    log.error(
                        "wal %s: stopping with %d acknowledged entries unwritten: the disk "
                        "is still full",
                        self.dir,
                        len(self._retained),
                    )
                with self._io:
                    if self._offset > self._synced_offset:
                        self._dirty = True  # a SyncMark (or anything) not synced yet
                    if self._dirty and not self.read_only:
                        self._background_sync()
                return

    def _background_sync(self) -> None:
        if not self._dirty or self._file is None or self.read_only:
            return
        try:
            t0 = self.clock.monotonic()
            self._sync_active(concurrent=True, why="background fdatasync failed")
            self.metrics.observe_fsync(int((self.clock.monotonic() - t0) * 1e6))
        except OSError:
            return
        self._write_mark()

    def _write_mark(self) -> None:
        """Append a SyncMark saying the active file is durable up to `_synced_offset`.

        Only when bytes past the previous mark became durable; the mark itself is
        made durable by the next sync or the kernel's writeback, never by a sync of
        its own (a torn mark only loses the mark). A failed write is cleared like
        a failed batch and is otherwise harmless.
        """
        f = self._file
        if f is None or self.read_only or self._synced_offset <= self._mark_end:
            return
        if self._offset + _MARK_ROOM > self._size:
            return
        data = encode_control(SYNC_MARK, 0, {"synced": self._synced_offset})
        start = self._offset
        try:
            write_all(f, data, start)
        except OSError as exc:
            if not _is_full(exc):
                log.error("wal %s: SyncMark write failed at %d: %s", self.dir, start, exc)
            try:
                self._zero(f, start, start + len(data))
            except OSError as exc2:
                if _is_full(exc) and _is_full(exc2):
                    self._stale_end = max(self._stale_end, start + len(data))
                    self._hold([], exc, "write")
                else:
                    self._latch(f"cannot clear a failed write: {exc2}")
            return
        self._offset = start + len(data)
        self._mark_end = self._offset
        self._next_index += 1
        # Not marked dirty: the mark rides along with the next sync (or the kernel's
        # own writeback), so an idle shard pays no extra fdatasync for it.
        self.metrics.sync_marks += 1

    def latch(self, why: str) -> None:
        """Refuse every later submission (read-only), logging `why` once."""
        self._latch(why)

    def _latch(self, why: str) -> None:
        if not self.read_only:
            log.error("wal %s is now read-only: %s", self.dir, why)
        self.read_only = True

    def _fail(self, batch: list[WalEntry], exc: BaseException | None) -> None:
        if any(e.acked_early for e in batch):
            self._latch(f"an acknowledged (disk/memory class) write failed: {exc}")
        for e in batch:
            e.ok = False
            e.error = exc
            try:
                e.done(e, False, 0.0)
            except Exception:  # pragma: no cover - a callback bug must not kill the writer
                log.exception("wal completion callback failed")

    # ------------------------------------------------------------ disk full

    def _hold(self, entries: list[WalEntry], exc: BaseException | None, probe: str) -> None:
        """The disk is full: keep acknowledged entries for later, refuse the others."""
        self._holds += 1
        if not self.disk_full:
            self.disk_full = True
            self.disk_full_since = self.clock.monotonic()
            log.error(
                "wal %s: the disk is full (%s); new writes get 507 until space returns",
                self.dir,
                exc,
            )
        if probe:
            self._full_probe = probe
        self._retry_at = self.clock.monotonic() + self.full_retry_s
        self._retained.extend(e for e in entries if e.acked_early)
        refused = [e for e in entries if not e.acked_early]
        if refused:
            self._fail(refused, WalDiskFull(self.dir))

    def _retry(self) -> None:
        """Try again what the full disk stopped: the retained entries, or the rotation."""
        holds = self._holds
        if self._stale_end > self._offset and self._file is not None:
            try:
                self._zero(self._file, self._offset, self._stale_end)
                self._stale_end = 0
            except OSError as exc:
                if not _is_full(exc):
                    self._latch(f"cannot clear a failed write: {exc}")
                self._hold([], exc, "")
                return
        batch, self._retained = self._retained, []
        self._retrying = True
        try:
            if batch:
                self._commit(batch)
            elif self._full_probe == "rotate" and self._file is not None and not self.read_only:
                try:
                    self._sync_active()
                    self._rotate()
                except OSError as exc:
                    if _is_full(exc):
                        self._hold([], exc, "rotate")
                    else:
                        self._latch(f"rotation failed: {exc}")
        finally:
            self._retrying = False
        if self._holds == holds and not self._retained and self.disk_full:
            self.disk_full = False
            log.warning(
                "wal %s: space is back after %.1f s; writes resume",
                self.dir,
                self.clock.monotonic() - self.disk_full_since,
            )

    def _commit(self, batch: list[WalEntry]) -> None:
        """Write a batch (rotating at entry boundaries), sync once if needed, complete it."""
        if self.read_only or self._file is None:
            self._fail(batch, WalReadOnly(self.dir))
            return
        if self._retained and not self._retrying:
            # Earlier acknowledged entries wait for space: nothing may overtake them.
            self._hold(batch, None, "")
            return
        written: list[WalEntry] = []
        synced = 0  # written[:synced] are durable (synced before a rotation)
        sync_error: OSError | None = None
        i = 0
        while i < len(batch):
            room = min(self.capacity, self._size - _MARK_ROOM) - self._offset
            j = i
            size = 0
            while j < len(batch) and size + batch[j].size <= room:
                size += batch[j].size
                j += 1
            if j == i:
                if self._offset == 0:
                    # A single entry larger than a whole file can never be written.
                    self._fail([batch[i]], OSError(errno.EFBIG, "entry exceeds the WAL file size"))
                    i += 1
                    continue
                try:
                    self._sync_active()
                    synced = len(written)
                    self._rotate()
                except OSError as exc:
                    if _is_full(exc) and synced == len(written):
                        # No room for the next file: nothing is lost, the writes wait.
                        self._hold(batch[i:], exc, "rotate")
                        break
                    self._latch(f"rotation failed: {exc}")
                    self._fail(batch[i:], exc)
                    if synced < len(written):
                        sync_error = exc  # the full file's sync failed
                    break
                continue
            chunk = batch[i:j]
            if not self._write_chunk(chunk, size):
                if _is_full(chunk[0].error):
                    self._hold(batch[i:], chunk[0].error, "write")
                else:
                    self._fail(batch[i:], chunk[0].error)
                break
            written.extend(chunk)
            i = j
        if not written:
            return
        fsync_ms = 0.0
        if sync_error is None:
            if any(e.sync for e in written[synced:]):
                try:
                    t0 = self.clock.monotonic()
                    self._sync_active(concurrent=not self._retrying)
                    dt = self.clock.monotonic() - t0
                    self.metrics.observe_fsync(int(dt * 1e6))
                    fsync_ms = dt * 1000
                    synced = len(written)
                except OSError as exc:
                    sync_error = exc
                else:
                    # Record the durable offset before anyone hears of the commit.
                    self._write_mark()
            elif synced < len(written):
                self._dirty = True
        if sync_error is not None:
            # Only what a successful sync covered is acknowledged (entries synced by
            # a rotation earlier in this batch); the rest failed, and _sync_failed
            # cleared its bytes from the file.
            self._fail(written[synced:], sync_error)
            written = written[:synced]
            if not written:
                return
        self.metrics.batches += 1
        for e in written:
            e.ok = True
            e.fsync_ms = fsync_ms if e.sync else 0.0
            try:
                e.done(e, True, e.fsync_ms)
            except Exception:  # pragma: no cover
                log.exception("wal completion callback failed")

    def _write_chunk(self, chunk: list[WalEntry], size: int) -> bool:
        """Write whole entries at the tail; False (entries marked) on failure.

        Small entries go out joined in one pwrite; a large buffer is written from
        where it is, never copied (:func:`_write_parts`).
        """
        assert self._file is not None
        parts = [b for e in chunk for b in (e.data, *e.more)]
        start = self._offset
        try:
            _write_parts(self._file, parts, start)
        except OSError as exc:
            log.error("wal %s: write failed at %d: %s", self.dir, start, exc)
            for e in chunk:
                e.error = exc
            # Zero whatever part landed, so no later (shorter) write can leave a
            # stale but valid frame of this failed batch behind the new tail.
            stop = min(start + size, self._size)
            try:
                self._zero(self._file, start, stop)
            except OSError as exc2:
                if _is_full(exc) and _is_full(exc2):
                    # A full disk: cleared before anything is written again (_retry).
                    self._stale_end = max(self._stale_end, stop)
                else:
                    self._latch(f"cannot clear a failed write: {exc2}")
            return False
        self._offset = start + size
        index = self._next_index
        off = start
        for e in chunk:
            e.index = index
            e.file = self._file_name
            e.offset = off
            index += e.frames
            off += e.size
        self._next_index = index
        self.metrics.frames += sum(e.frames for e in chunk)
        self.metrics.bytes_written += size
        return True

    def _rotate(self) -> None:
        """Switch to a fresh preallocated file (the caller synced the full one)."""
        assert self._file is not None
        self._new_file(self._next_index)
        self.metrics.rotations += 1

    def _sync_active(self, *, concurrent: bool = False, why: str = "fdatasync failed") -> None:
        """fdatasync the active file; on failure clear its unsynced tail (latched) and re-raise.

        With `concurrent` (the writer thread, holding the shard's lock) the lock is
        let go for the sync itself, so :meth:`write_now` can append meanwhile:
        the sync covers what was written before it began, and whatever was
        appended during it leaves the shard dirty for the next one.
        """
        f = self._file
        assert f is not None
        offset = self._offset
        try:
            if concurrent:
                self._io.release()
            try:
                with io_gate.sync():
                    f.fdatasync()
            finally:
                if concurrent:
                    self._io.acquire()
        except OSError as exc:
            self._sync_failed(f"{why}: {exc}")
            raise
        self._synced_offset = offset
        self._dirty = self._offset > offset

    def _sync_failed(self, why: str) -> None:
        """An fdatasync of the active file failed: latch read-only, clear the unsynced tail.

        After a failed fsync the kernel may drop the dirty pages yet keep serving
        them from the page cache (fsyncgate). Left there, a *process restart*
        would replay those bytes — resurrecting a batch that was reported failed —
        and then append new, fsync-acked frames after bytes that never reach the
        disk, so a later power loss would end the log before the new frames and
        lose them. Zeroing everything written since the last successful sync
        (best effort, then one more best-effort sync; nothing is acknowledged on
        the strength of it) makes the page cache end the log at the last durable
        frame; recovery re-zeroes and syncs everything after the end before it
        appends (`_adopt`).
        """
        self._latch(why)
        f = self._file
        start, stop = self._synced_offset, self._offset
        if f is None or stop <= start:
            return
        try:
            self._zero(f, start, stop)
            f.fdatasync()
        except OSError as exc:
            log.error(
                "wal %s: cannot clear the unsynced tail [%d, %d): %s", self.dir, start, stop, exc
            )

    # ------------------------------------------------------------ inspection

    @property
    def position(self) -> tuple[str, int, int]:
        """(active file, byte offset of the tail, next frame index)."""
        return self._file_name, self._offset, self._next_index


def _write_parts(f: File, parts: list[Data], offset: int) -> None:
    """Write `parts` back to back from `offset`.

    Runs of parts under :data:`JOIN_MAX_BYTES` are joined into one pwrite (many
    small entries: one syscall); a larger part is written as it is, so a big
    batch is never copied. Raises OSError from the writes (part of the bytes
    may have landed: the caller clears the whole range).
    """
    if len(parts) == 1:
        write_all(f, parts[0], offset)
        return
    run: list[Data] = []
    run_bytes = 0
    for p in parts:
        if len(p) < JOIN_MAX_BYTES:
            run.append(p)
            run_bytes += len(p)
            continue
        if run:
            write_all(f, run[0] if len(run) == 1 else b"".join(run), offset)
            offset += run_bytes
            run, run_bytes = [], 0
        write_all(f, p, offset)
        offset += len(p)
    if run:
        write_all(f, run[0] if len(run) == 1 else b"".join(run), offset)


def prune_files(fs: Fs, d: str, before: WalPosition, keep: str = "") -> list[str]:
    """Delete WAL files in `d` wholly before `before` (a file goes when its successor
    starts at or before `before.index`); `keep` is never deleted. Returns the names."""
    files = _list_wal_files(fs, d)
    gone: list[str] = []
    for i in range(len(files) - 1):
        if _first_index(files[i + 1]) <= before.index and files[i] != keep:
            fs.unlink(posixpath.join(d, files[i]))
            gone.append(files[i])
    if gone:
        fs.fsync_dir(d)
    return gone
