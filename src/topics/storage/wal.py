"""One WAL shard: preallocated log files, a writer thread and group commit.

Layout of a shard directory (seed: WAL & group commit, on-disk layout)::

    CURRENT                      names the active file (replaced atomically)
    wal-0000000000000000.log     preallocated, zero-filled, append-only frames
    wal-0000000000001024.log     the next file: named by the shard-wide index
                                 of its first frame (ours: frames mix topics,
                                 so a record seq cannot name a file)

Invariants:

* Bytes are written in submission order by one writer thread; a batch is one
  `pwrite` (many frames) and, when any member needs it, one `fdatasync`.
* A member is acknowledged only after its class's commit point: `sync=True`
  members after the `fdatasync` returned, others after the write. A lone
  submission is written at once (no waiting window); under load, everything
  queued while the previous batch was syncing forms the next batch.
* Files are preallocated by writing zeros (cheaper `fdatasync` than a growing
  file on this machine, notes/peers-and-limits.md §1a), so the end of the log is
  the first frame whose length field is zero or whose checksum fails.
* A failed write or sync fails every member of its batch (except members an
  earlier sync in the same batch already made durable). A failed `fdatasync`
  latches the shard read-only (the kernel may have dropped the dirty pages, so a
  retry could report success for lost bytes) and zeroes everything written since
  the last successful sync, so a process restart neither replays the failed batch
  nor appends after bytes that never reached the disk; a failed `pwrite` rewinds
  the tail so the next batch overwrites the partial bytes.

Time for the periodic sync of non-`fsync` members comes from `time.monotonic`
inside the writer thread: it only paces background work and never decides
correctness.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from topics.storage.frame import APPEND, F_BATCH_MORE, End, Frame, Torn, decode_frame, scan_columns
from topics.storage.fs import File, Fs, write_all

__all__ = [
    "WalShard",
    "WalEntry",
    "WalFull",
    "WalReadOnly",
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
_ZERO_CHUNK = bytes(1 << 20)


class WalFull(Exception):
    """The shard's ingest queue is full (the HTTP layer answers 429)."""


class WalReadOnly(Exception):
    """The shard is latched read-only after a sync or rotation failure (500)."""


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

    data: bytes
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


@dataclass
class WalMetrics:
    frames: int = 0
    batches: int = 0
    fsyncs: int = 0
    bytes_written: int = 0
    rotations: int = 0
    submit_full: int = 0
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

    `buf` holds the file's bytes (the valid prefix only, when that is much
    shorter than the file); `cols` has one WAL_COLS_DTYPE row per valid frame
    from where the scan started in this file; `first_index` is the shard-wide
    index of `cols[0]`.
    """

    name: str
    buf: bytes
    cols: npt.NDArray[np.void]
    first_index: int


@dataclass
class ShardScan:
    """What recovery found in a shard: valid frames in order and where the log ends.

    `files` are the files read, in order, from the start position on (a
    checkpoint position skips whole files before it and the frames before it in
    its own file).
    """

    dir: str
    files: list[ScannedFile]
    end_file: str | None  # file holding the logical end (None: no files)
    end_offset: int  # byte offset of the logical end inside end_file
    next_index: int  # shard-wide index the next frame gets
    torn: Torn | None  # the invalid frame that ended the log, if any
    later_files: list[str]  # files after the end (to be removed on open)

    @property
    def frame_count(self) -> int:
        return sum(len(f.cols) for f in self.files)

    @property
    def frames(self) -> list[tuple[str, Frame]]:
        """Every scanned frame decoded, as `(file name, frame)` (tools and tests)."""
        out: list[tuple[str, Frame]] = []
        for f in self.files:
            for off in f.cols["off"].tolist():
                fr = decode_frame(f.buf, off)
                assert isinstance(fr, Frame)
                out.append((f.name, fr))
        return out


def _list_wal_files(fs: Fs, d: str) -> list[str]:
    try:
        names = fs.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith("wal-") and n.endswith(".log"))


def _first_index(name: str) -> int:
    return int(name[4:-4])


def scan_shard(fs: Fs, d: str, start: WalPosition | None = None) -> ShardScan:
    """Read a shard's files in order and stop at the first invalid frame.

    With `start`, files wholly before it are not read and the scan of its own
    file begins at its byte offset (the frames before a checkpoint position are
    already reflected in the snapshot that names it). Raises OSError from the
    filesystem. Never raises on corrupt bytes: the first torn frame (or zeroed
    space) is the logical end of the shard.
    """
    files = _list_wal_files(fs, d)
    scanned: list[ScannedFile] = []
    if not files:
        return ShardScan(d, scanned, None, 0, 0, None, [])
    first = 0
    if start is not None:
        # Skip every file whose successor begins at or before the start index.
        while first + 1 < len(files) and _first_index(files[first + 1]) <= start.index:
            first += 1
    for i in range(first, len(files)):
        name = files[i]
        f = fs.open(posixpath.join(d, name))
        try:
            buf = f.pread(f.size(), 0)
        finally:
            f.close()
        base_index = _first_index(name)
        begin = 0
        if start is not None and i == first and name == start.file:
            begin = start.offset
            base_index = start.index
        res = scan_columns(buf, begin)
        cols = res.cols
        if start is not None and i == first and base_index < start.index:
            # The named file is gone: drop the frames before the start index here.
            drop = min(start.index - base_index, len(cols))
            cols = cols[drop:]
            base_index += drop
        nxt = base_index + len(cols)
        # A rotated file ends in zeroed space; the log continues in the next file
        # only when that file starts exactly at the next frame index.
        last = i == len(files) - 1
        if res.torn is not None or last or _first_index(files[i + 1]) != nxt:
            end, torn = res.end_offset, res.torn
            # A write torn part way through leaves valid frames still flagged "more
            # follow": drop them, so the whole write is gone (all-or-nothing).
            cut = 0
            while (
                cut < len(cols)
                and cols["type"][len(cols) - 1 - cut] == APPEND
                and cols["flags"][len(cols) - 1 - cut] & F_BATCH_MORE
            ):
                cut += 1
            if cut:
                end = int(cols["off"][len(cols) - cut])
                cols = cols[: len(cols) - cut]
                nxt -= cut
                torn = Torn(end, "incomplete write")
            if torn is None and buf.count(0, end) != len(buf) - end:
                # The log ended on a zero length, yet bytes follow: a zeroed frame hid
                # later data (files are zero-filled, so nothing else leaves bytes
                # there). Report it rather than let the repair erase it silently.
                torn = Torn(end, "data after a zeroed frame")
            if end < len(buf) // 4:
                buf = buf[:end]  # keep only the used part of a mostly empty file
            scanned.append(ScannedFile(name, buf, cols, base_index))
            return ShardScan(d, scanned, name, end, nxt, torn, files[i + 1 :])
        scanned.append(ScannedFile(name, buf, cols, base_index))
    raise AssertionError("unreachable")  # pragma: no cover


class WalShard:
    """An open shard: submit entries from any thread, one writer thread persists them.

    Construct with :meth:`open`, which recovers the tail (zeroes any torn bytes
    after the last valid frame, removes files after it) and starts the writer.
    """

    def __init__(
        self,
        fs: Fs,
        directory: str,
        *,
        file_bytes: int = DEFAULT_FILE_BYTES,
        queue_max: int = DEFAULT_QUEUE_MAX,
        sync_interval_s: float = DEFAULT_SYNC_INTERVAL_S,
    ) -> None:
        self.fs = fs
        self.dir = directory
        self.file_bytes = file_bytes
        self.queue_max = queue_max
        self.sync_interval_s = sync_interval_s
        self.metrics = WalMetrics()
        self.read_only = False
        self._q: queue.SimpleQueue[WalEntry | None] = queue.SimpleQueue()
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
        self._thread: threading.Thread | None = None
        self._stopped = False

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls, fs: Fs, directory: str, start: WalPosition | None = None, **kw: Any
    ) -> tuple[WalShard, ShardScan]:
        """Recover the shard's tail and start writing after it.

        Returns the shard and the scan (the valid frames from `start`, for replay).
        Raises OSError when the directory cannot be read, repaired or preallocated.
        """
        shard = cls(fs, directory, **kw)
        fs.makedirs(directory)
        found = scan_shard(fs, directory, start)
        shard._adopt(found)
        shard._start()
        return shard, found

    def _adopt(self, found: ShardScan) -> None:
        fs = self.fs
        for name in found.later_files:
            log.warning("wal %s: removing %s after the end of the log", self.dir, name)
            fs.unlink(posixpath.join(self.dir, name))
        if found.end_file is None:
            self._new_file(0)
            return
        path = posixpath.join(self.dir, found.end_file)
        f = fs.open(path, write=True)
        size = f.size()
        if found.torn is not None:
            log.warning(
                "wal %s: torn frame in %s at %d (%s); truncating the log there",
                self.dir,
                found.end_file,
                found.torn.offset,
                found.torn.reason,
            )
        # Zero everything after the last valid frame so the next scan ends there.
        # (With no torn frame the scan has checked that the tail is zeros already.)
        end = found.end_offset
        if end < size and found.torn is not None:
            self._zero(f, end, size)
        if size < self.file_bytes:
            self._zero(f, size, self.file_bytes)
        f.fdatasync()
        self._file = f
        self._file_name = found.end_file
        self._file_first = _first_index(found.end_file)
        self._offset = end
        self._synced_offset = end
        self._next_index = found.next_index
        if found.later_files:
            fs.fsync_dir(self.dir)
        self._write_current()

    def _zero(self, f: File, start: int, stop: int) -> None:
        off = start
        while off < stop:
            n = min(len(_ZERO_CHUNK), stop - off)
            write_all(f, _ZERO_CHUNK[:n], off)
            off += n

    def _new_file(self, first_index: int) -> None:
        """Create, zero-fill and fsync the next log file, then point CURRENT at it."""
        name = wal_file_name(first_index)
        path = posixpath.join(self.dir, name)
        f = self.fs.open(path, create=True, write=True)
        self._zero(f, 0, self.file_bytes)
        f.fdatasync()
        self.fs.fsync_dir(self.dir)
        old = self._file
        self._file = f
        self._file_name = name
        self._file_first = first_index
        self._offset = 0
        self._synced_offset = 0
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
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------ submission

    @property
    def queue_depth(self) -> int:
        return self._depth

    def submit(self, entry: WalEntry) -> None:
        """Queue an entry for the writer; raises WalFull or WalReadOnly (nothing queued)."""
        if self.read_only:
            raise WalReadOnly(self.dir)
        if self._stopped:
            raise WalReadOnly(f"{self.dir} is closed")
        with self._depth_lock:
            if self._depth >= self.queue_max:
                self.metrics.submit_full += 1
                raise WalFull(self.dir)
            self._depth += 1
            if self._depth > self.metrics.queue_depth_peak:
                self.metrics.queue_depth_peak = self._depth
        self._q.put(entry)

    # ------------------------------------------------------------ the writer

    def _run(self) -> None:
        q = self._q
        stopping = False
        while True:
            try:
                timeout = self.sync_interval_s if self._dirty else None
                first = q.get(timeout=timeout)
            except queue.Empty:
                self._background_sync()
                continue
            batch: list[WalEntry] = []
            size = 0
            item: WalEntry | None = first
            while True:
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
                    size += len(item.data)
                if size >= MAX_BATCH_BYTES:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
            if batch:
                with self._depth_lock:
                    self._depth -= len(batch)
                self._commit(batch)
            if stopping:
                if self._dirty and not self.read_only:
                    self._background_sync()
                return

    def _background_sync(self) -> None:
        if not self._dirty or self._file is None or self.read_only:
            return
        try:
            t0 = time.perf_counter()
            offset = self._offset
            self._file.fdatasync()
            self.metrics.observe_fsync(int((time.perf_counter() - t0) * 1e6))
            self._dirty = False
            self._synced_offset = offset
        except OSError as exc:
            self._sync_failed(f"background fdatasync failed: {exc}")

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

    def _commit(self, batch: list[WalEntry]) -> None:
        """Write a batch (rotating at entry boundaries), sync once if needed, complete it."""
        if self.read_only or self._file is None:
            self._fail(batch, WalReadOnly(self.dir))
            return
        written: list[WalEntry] = []
        synced = 0  # written[:synced] are durable (synced before a rotation)
        sync_error: OSError | None = None
        i = 0
        while i < len(batch):
            room = self.file_bytes - self._offset
            j = i
            size = 0
            while j < len(batch) and size + len(batch[j].data) <= room:
                size += len(batch[j].data)
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
                    self._latch(f"rotation failed: {exc}")
                    self._fail(batch[i:], exc)
                    if synced < len(written):
                        sync_error = exc  # the full file's sync failed
                    break
                continue
            chunk = batch[i:j]
            if not self._write_chunk(chunk, size):
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
                    t0 = time.perf_counter()
                    self._sync_active()
                    dt = time.perf_counter() - t0
                    self.metrics.observe_fsync(int(dt * 1e6))
                    fsync_ms = dt * 1000
                    synced = len(written)
                except OSError as exc:
                    sync_error = exc
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
        """One pwrite of whole entries at the tail; False (entries marked) on failure."""
        assert self._file is not None
        data = b"".join([e.data for e in chunk]) if len(chunk) > 1 else chunk[0].data
        start = self._offset
        try:
            write_all(self._file, data, start)
        except OSError as exc:
            log.error("wal %s: write failed at %d: %s", self.dir, start, exc)
            for e in chunk:
                e.error = exc
            # Zero whatever part landed, so no later (shorter) write can leave a
            # stale but valid frame of this failed batch behind the new tail.
            try:
                self._zero(self._file, start, min(start + size, self.file_bytes))
            except OSError as exc2:
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
            off += len(e.data)
        self._next_index = index
        self.metrics.frames += sum(e.frames for e in chunk)
        self.metrics.bytes_written += size
        return True

    def _rotate(self) -> None:
        """Switch to a fresh preallocated file (the caller synced the full one)."""
        assert self._file is not None
        self._new_file(self._next_index)
        self.metrics.rotations += 1

    def _sync_active(self) -> None:
        """fdatasync the active file; on failure clear its unsynced tail (latched) and re-raise."""
        assert self._file is not None
        offset = self._offset
        try:
            self._file.fdatasync()
        except OSError as exc:
            self._sync_failed(f"fdatasync failed: {exc}")
            raise
        self._dirty = False
        self._synced_offset = offset

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

    def files(self) -> list[str]:
        return _list_wal_files(self.fs, self.dir)

    def prune(self, before: WalPosition) -> list[str]:
        """Delete the files whose every frame precedes `before` (never the active file).

        Called by the checkpointer once a snapshot that no longer needs them is
        durable. Returns the names removed; raises OSError from the fs.
        """
        return prune_files(self.fs, self.dir, before, keep=self._file_name)

    @property
    def position(self) -> tuple[str, int, int]:
        """(active file, byte offset of the tail, next frame index)."""
        return self._file_name, self._offset, self._next_index


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


def is_end(x: object) -> bool:
    """True for the decoder's End marker (zeroed space / end of buffer)."""
    return isinstance(x, End)
