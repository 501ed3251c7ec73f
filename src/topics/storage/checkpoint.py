"""The checkpointer: WAL frames into segment files, metadata snapshots, WAL pruning.

One cycle (docs/FORMATS.md, "Checkpoints and WAL pruning"), all state changes on the event loop, all file work in a thread:

1. **Marks** (loop): take every topic's pending delete-flag flips and live
   floor, note the topic instances that were deleted, then log one
   CheckpointMark per shard (synced). Everything logged before a mark precedes
   it in its shard, and its sync makes that durable: the effects taken here
   (flips, segment drops, directory removals) are safe to apply to segment
   files once the marks are done.
2. **Capture** (loop, when every mark is durable): the metadata snapshot body
   and, per non-ephemeral topic, the slots not yet in a segment together with
   the in-memory chunks holding their frames. Marks and capture describe the
   same cut of the log: replay from the marks onto the snapshot re-applies
   only frames logged after the marks (see :mod:`topics.storage.meta`).
3. **Files** (thread): flip delete flags, seal segments by age, drop whole
   segments below the live floor or fully deleted, append the captured frames
   to each topic's active segment (WAL frame -> segment frame: the type byte
   dropped, the checksum recomputed; holes become header-only frames flagged
   0xD5), sealing on the count and size triggers, fdatasync every touched file,
   remove deleted topics' directories, write `meta/snapshot.NNNN.bin`, then
   delete WAL files that no retained snapshot needs. Topics are written
   independently, several at once (`io_threads`); each
   topic's frames are converted and written `STEP_BYTES` at a time, so the
   cycle's extra memory is a few steps, not the bytes it moves. A topic's
   segment writer gives its descriptors back once its files are flushed.
4. **Re-point** (loop): slots of the written records now point into the
   segments; their chunks are freed.

A failure in step 3 writes no snapshot (the WAL keeps everything) and the
affected topics resume their active segment from disk on the next cycle.
Cycles run every `interval_ms` when anything changed, after `wal_bytes` of WAL
growth, and at graceful shutdown (checked every `check_s` seconds). Elapsed time
is read from the engine's :class:`~topics.clock.Clock` (its monotonic reading),
so a test clock decides when the interval has passed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import mmap
import posixpath
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from topics.clock import SystemClock
from topics.engine.index import LOC_HOLE, SlotArray
from topics.engine.topic import CHUNK_BASE, Topic
from topics.errors import TopicsError
from topics.format.frame import FrameBuf, encode_record
from topics.storage.fs import Fs, read_file
from topics.storage.meta import capture_meta
from topics.storage.objstore import is_object_url
from topics.storage.segment import SegmentWriter, segment_blob, segment_paths, topic_dir
from topics.storage.segstore import SegmentPart, Tier
from topics.storage.snapshot import (
    decode_snapshot,
    list_snapshots,
    next_snapshot_number,
    write_snapshot,
)
from topics.storage.topicstore import (
    RECLAIM_DEAD_RATIO,
    SegmentSource,
    SegMeta,
    TopicStore,
    flip_deleted,
    flip_deleted_in,
    install_rewrite,
    plan_rewrite,
    replace_idx,
    retire_topic_dir,
    retired_dirs,
    same_frames,
    sealed_tiling_problem,
    unlink_dir,
)
from topics.storage.wal import WalEntry, WalPosition, prune_files

if TYPE_CHECKING:
    from topics.engine.core import Engine
    from topics.storage.journal import WalJournal

__all__ = [
    "CheckpointConfig",
    "CheckpointReport",
    "Checkpointer",
    "CheckpointFailed",
    "Reaper",
    "Relocator",
]

log = logging.getLogger("topics.checkpoint")

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_WAL_SEQ = 14  # byte offset of `seq` in a WAL frame
_HOLE_FRAME = 45  # a segment frame with no node, tag or payload
#: Most segment-frame bytes converted and written in one step (a single larger
#: record still goes whole): bounds a cycle's working memory, see `_topic_files`.
STEP_BYTES = 2 * 1024 * 1024
#: Most bytes of segments one cycle rewrites to reclaim deleted records' space
#: (docs/FORMATS.md, "Reclaim"); segments beyond it wait for later cycles.
RECLAIM_BYTES_PER_CYCLE = 64 * 1024 * 1024


class CheckpointFailed(Exception):
    """A cycle could not complete (nothing was pruned; the WAL still holds everything)."""


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Knobs of the checkpointer (README "Configuration": TOPICS_CHECKPOINT_*, TOPICS_SEGMENT_*)."""

    segment_max_events: int = 10_000
    segment_max_bytes: int = 67_108_864
    segment_max_age_ms: int = 3_600_000
    interval_ms: int = 60_000
    wal_bytes: int = 67_108_864
    check_s: float = 5.0
    #: Threads writing topics' segment files at once (each topic's files are
    #: written by one thread, in order; concurrent fdatasyncs share journal
    #: commits, so a cycle over many small topics is several times faster).
    #: `1` keeps the order of file operations deterministic (the crash tests'
    #: in-memory disk sets it).
    io_threads: int = 8
    #: Newest sealed segments each topic keeps hot; older ones relocate to the cold
    #: tier when there is one (docs/FORMATS.md, "Relocation").
    hot_retain_segments: int = 4
    #: Most bytes of sealed hot segments a topic keeps (0: no byte bound); with both
    #: bounds set, the one that keeps fewer segments hot wins.
    hot_retain_bytes: int = 0
    #: Most bytes per second the relocator copies to the cold tier (0: unpaced).
    relocate_bytes_per_s: int = 64 * 1024 * 1024
    #: `1`: copies to the cold tier run on the relocator's own thread, between
    #: cycles; `0`: inside the cycle's file work, in a fixed order (the crash
    #: tests' in-memory disk sets it).
    relocate_threads: int = 1


@dataclass
class CheckpointReport:
    """What one cycle did (all counts for this cycle)."""

    snapshot: int = 0
    topics: int = 0
    records: int = 0
    bytes: int = 0
    sealed: int = 0
    dropped: int = 0
    flips: int = 0
    wal_pruned: int = 0
    relocated: int = 0
    reclaimed: int = 0
    reclaimed_bytes: int = 0
    seconds: float = 0.0


@dataclass
class _Plan:
    topic: Topic
    store: TopicStore
    first: int  # first seq to write
    rows: SlotArray  # slots first .. first + len - 1 (a copy)
    chunks: dict[int, bytes | FrameBuf]
    flips: list[int]
    drop_below: int


@dataclass
class _Result:
    plan: _Plan
    locs: np.ndarray[Any, Any] | None = None  # per written row: segment loc, offset, len
    offs: np.ndarray[Any, Any] | None = None
    lens: np.ndarray[Any, Any] | None = None
    new_sources: dict[int, SegmentSource] = field(default_factory=dict)
    sealed: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    # Segments taken out of the store whose files go only once a snapshot that no
    # longer relies on them is durable.
    drops: list[tuple[TopicStore, SegMeta]] = field(default_factory=list)
    # Segments whose tier became COLD in this cycle (their readers move on the loop).
    relocated: list[SegMeta] = field(default_factory=list)
    # Segments rewritten without their deleted records' bytes: new frame offsets
    # and lengths per entry (the loop re-points their slots and readers).
    rewritten: list[tuple[SegMeta, np.ndarray[Any, Any], np.ndarray[Any, Any]]] = field(
        default_factory=list
    )
    error: BaseException | None = None
    flips_failed: bool = False


class Reaper:
    """Unlinks deleted topics' retired directories on a thread of its own.

    A topic delete renames the directory (`topics/<id>.deleted`) once a durable
    snapshot no longer relies on it; unlinking its files, which may take long
    for a big topic, happens here, never in a checkpoint cycle or on the event
    loop. Every checkpoint cycle lists the retired directories again, so one
    whose unlink failed or was cut short by a crash is finished after the next
    cycle (docs/FORMATS.md, "Deleted topics"). Thread-safe.
    """

    def __init__(self, fs: Fs) -> None:
        self.fs = fs
        self.done = 0
        self.failed = 0
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._queued: set[str] = set()

    def unlink(self, path: str) -> None:
        """Queue the retired directory `path` for unlinking (once while it is queued)."""
        with self._lock:
            if path in self._queued:
                return
            self._queued.add(path)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="topics-reaper")
            self._pool.submit(self._one, path)

    def _one(self, path: str) -> None:
        try:
            unlink_dir(self.fs, path)
            self.done += 1
        except OSError as exc:  # listed again by the next checkpoint cycle
            self.failed += 1
            log.warning("cannot unlink %s (retried after the next checkpoint): %s", path, exc)
        finally:
            with self._lock:
                self._queued.discard(path)

    def stop(self) -> None:
        """Finish the queued unlinks and stop the thread (blocking)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class Relocator:
    """Copies sealed hot segments to the cold tier on a thread of its own, paced.

    The copy is the slow half of a relocation (docs/FORMATS.md, "Relocation"):
    read both parts of the hot segment, check that its `.idx` tiles its
    `.data`, and put them in the cold store (durable when the put returns).
    A checkpoint cycle commits a finished copy: it flips the segment's tier,
    lists it in the snapshot as cold, and only after a later snapshot deletes
    the hot copy. The copy itself changes nothing the engine or a snapshot
    sees, so a crash or failure at any point leaves the segment hot (a cold
    copy that was never committed is deleted by recovery's next cycle).

    With `inline` the copy runs in the thread that submits it (the cycle's),
    so it is done when :meth:`submit` returns.

    Pacing: after a copy of n bytes the thread rests until n / `rate` seconds
    (by `monotonic`, the engine clock's reading) have passed since it began, so
    copies average at most `rate` bytes per second (0: unpaced). Counters for
    `/v0/metrics`: `copied`, `copied_bytes`, `failed`, `queued`. Thread-safe.
    """

    def __init__(
        self, rate: int = 0, monotonic: Callable[[], float] | None = None, *, inline: bool = False
    ) -> None:
        self.rate = rate
        self.inline = inline
        self._monotonic = monotonic or SystemClock().monotonic
        self._rest = threading.Event()  # set by stop(): no more resting
        self.copied = 0
        self.copied_bytes = 0
        self.failed = 0
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._queued: set[tuple[int, int]] = set()
        self._done: dict[tuple[int, int], bytes] = {}  # (topic id, first seq) -> `.idx` copied
        self._stopped = False
        self._failing = False  # from a failed copy to the next good one

    @property
    def queued(self) -> int:
        """Copies waiting or running."""
        with self._lock:
            return len(self._queued)

    def submit(self, store: TopicStore, first: int) -> None:
        """Queue the copy of hot segment `first` of `store` (once while queued or done)."""
        key = (store.topic_id, first)
        with self._lock:
            if self._stopped or key in self._queued or key in self._done:
                return
            self._queued.add(key)
            if not self.inline and self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="topics-relocate")
            pool = self._pool
        if pool is None:
            self._copy(store, first)  # inline: done when this returns
        else:
            pool.submit(self._copy, store, first)

    def has_done(self) -> bool:
        """Whether finished copies wait for a cycle to commit them."""
        with self._lock:
            return bool(self._done)

    def take(self, topic_id: int, first: int) -> bytes | None:
        """The `.idx` bytes a finished copy uploaded (and forget it), or None."""
        with self._lock:
            return self._done.pop((topic_id, first), None)

    def take_other(self, topic_id: int, keep: set[int]) -> list[int]:
        """First seqs of finished copies of `topic_id` not in `keep` (forgotten)."""
        with self._lock:
            out = [f for t, f in self._done if t == topic_id and f not in keep]
            for f in out:
                del self._done[(topic_id, f)]
            return out

    def _copy(self, store: TopicStore, first: int) -> None:
        key = (store.topic_id, first)
        try:
            cold = store.tier.cold
            if cold is None:
                return
            hot = store.tier.hot
            began = self._monotonic()
            idx = read_file(hot.fs, hot.path(first, SegmentPart.IDX))
            data = read_file(hot.fs, hot.path(first, SegmentPart.DATA))
            why = sealed_tiling_problem(idx, len(data))
            if why is not None:
                # Never copy what does not read back whole: the segment stays hot
                # and `topics verify` names it.
                raise OSError(f"not relocated: {hot.path(first, SegmentPart.DATA)} {why}")
            cold.put(first, data, idx)
            with self._lock:
                self._done[key] = idx
                self.copied += 1
                self.copied_bytes += len(data) + len(idx)
            if self.rate:
                spent = self._monotonic() - began
                self._rest.wait(max(0.0, (len(data) + len(idx)) / self.rate - spent))
        except Exception as exc:  # OSError, ColdStoreError: the segment stays hot, retried
            with self._lock:
                self.failed += 1
                first_of_stretch, self._failing = not self._failing, True
            # One warning per stretch of failures (a store that is down fails every
            # copy, every cycle, until it is back); the rest at debug level.
            (log.warning if first_of_stretch else log.debug)(
                "relocating segment %d of topic %016x failed (the segment stays hot and "
                "is tried again): %s",
                first,
                key[0],
                exc,
            )
        else:
            if self._failing:
                self._failing = False
                log.warning("relocation to the cold tier works again")
        finally:
            with self._lock:
                self._queued.discard(key)

    def stop(self) -> None:
        """Let the running copy finish, drop the queued ones (blocking)."""
        with self._lock:
            self._stopped = True
            pool, self._pool = self._pool, None
        self._rest.set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class Checkpointer:
    """Runs checkpoint cycles for one engine and its WAL journal.

    `stores` are the segment stores recovery loaded (topic id -> store);
    `snapshot_wal` the WAL positions of the snapshot recovery started from (the
    fallback once a newer one is written); `absorbed` the shard directories of an
    older shard layout that the next snapshot fully absorbs (their end positions).
    """

    def __init__(
        self,
        engine: Engine,
        journal: WalJournal,
        fs: Fs,
        data_dir: str,
        config: CheckpointConfig | None = None,
        *,
        stores: dict[int, TopicStore] | None = None,
        absorbed: dict[str, WalPosition] | None = None,
        cold_dir: str | None = None,
    ) -> None:
        self.engine = engine
        self.journal = journal
        self.fs = fs
        self.data_dir = data_dir
        self.meta_dir = posixpath.join(data_dir, "meta")
        self.cfg = config or CheckpointConfig()
        self.cold_dir = cold_dir
        self.stores: dict[int, TopicStore] = dict(stores or {})
        self.absorbed: dict[str, WalPosition] = dict(absorbed or {})
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_bytes = journal.bytes_written()
        self._last_mono = self.engine.clock.monotonic()
        self.cycles = 0
        self.failures = 0
        self.relocated = 0  # segments whose move to the cold tier was committed
        self.reclaimed = 0  # segments rewritten without their deleted records' bytes
        self.reclaimed_bytes = 0
        self._reclaim_lock = threading.Lock()
        self._reclaim_left = 0
        self.last: CheckpointReport | None = None
        self._stopped = False
        self._force = False
        self._running: asyncio.Future[CheckpointReport] | None = None
        # Segments and deleted topics' directories waiting for a durable snapshot
        # that no longer relies on them (then _remove_unpublished deletes them).
        self._drops_pending: list[tuple[TopicStore, SegMeta]] = []
        self._gone_pending: list[int] = []
        self.reaper = Reaper(fs)
        self.relocator = (
            Relocator(
                self.cfg.relocate_bytes_per_s,
                engine.clock.monotonic,
                inline=self.cfg.relocate_threads == 0,
            )
            if cold_dir
            else None
        )
        # Cold copies recovery found that no snapshot lists (a relocation never
        # committed, or a drop cut short): they go after the first snapshot.
        for st in self.stores.values():
            self._drops_pending.extend((st, seg) for seg in st.orphans)
            st.orphans = []
        # True from a failed periodic cycle to the next good one: errors of the
        # same stretch (a full disk, say) are logged once, not every cycle.
        self._failing = False

    # ------------------------------------------------------------ scheduling

    def start(self) -> None:
        """Start the periodic trigger check on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the periodic trigger, wait for a running cycle, give back read handles.

        A cycle in flight is never cancelled: its file work runs in a thread
        that would go on writing while the next cycle starts.
        """
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        running, self._running = self._running, None
        if running is not None:
            try:
                await running
            except Exception as exc:
                log.error("checkpoint failed: %s", exc)
        self._release_handles()  # a stopping storage (graceful or not) keeps no descriptors
        await asyncio.to_thread(self.reaper.stop)
        if self.relocator is not None:
            await asyncio.to_thread(self.relocator.stop)

    def force_next(self) -> None:
        """Make the next trigger check run a cycle (e.g. after a large WAL replay)."""
        self._force = True

    def due(self) -> bool:
        """True when a cycle should run now (WAL growth, elapsed time, segment age)."""
        if self._force:
            return True
        grown = self.journal.bytes_written() - self._last_bytes
        if self.cfg.wal_bytes and grown >= self.cfg.wal_bytes:
            return True
        elapsed_ms = (self.engine.clock.monotonic() - self._last_mono) * 1000
        if self.cfg.interval_ms and elapsed_ms >= self.cfg.interval_ms:
            if grown > 0 or any(t.flip_seqs for t in self.engine.topics.values()):
                return True
            return self._age_due() or self._tier_work()
        return False

    def _tier_work(self) -> bool:
        """Copies to the cold tier to commit, or files that wait for a snapshot to go."""
        rel = self.relocator
        return bool(self._drops_pending) or (rel is not None and rel.has_done())

    def _age_due(self) -> bool:
        max_age = self.cfg.segment_max_age_ms
        if not max_age:
            return False
        now = self.engine.clock.now_ms()
        for st in list(self.stores.values()):
            w = st.writer
            if w is not None and w.count and w.age_ms(now) >= max_age:
                return True
        return False

    async def _run(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.cfg.check_s)
            if self._stopped or not self.due():
                continue
            self._running = asyncio.ensure_future(self.checkpoint())
            try:
                await asyncio.shield(self._running)
            except asyncio.CancelledError:
                raise  # stop(): the shielded cycle finishes on its own and stop() awaits it
            except Exception as exc:  # logged once per failing stretch; the next trigger retries
                if not self._failing:
                    log.error("checkpoint failed (retried every %.0f s): %s", self.cfg.check_s, exc)
                else:
                    log.debug("checkpoint failed again: %s", exc)
                self._failing = True
            else:
                if self._failing:
                    log.warning("checkpoint succeeded again")
                self._failing = False
            self._running = None

    # ------------------------------------------------------------ one cycle

    async def checkpoint(self, *, final: bool = False) -> CheckpointReport:
        """Run one cycle now (serialised with any other). Raises CheckpointFailed.

        `final` (graceful shutdown) records exact heads instead of reservations
        and, succeeded or not, ends by giving back every segment read handle.
        """
        async with self._lock:
            t0 = self.engine.clock.monotonic()
            try:
                report = await self._cycle(final)
            except BaseException:
                self.failures += 1
                raise
            finally:
                if final:
                    self._release_handles()
            report.seconds = self.engine.clock.monotonic() - t0
            log.info(
                "checkpoint: snapshot %d, %d records (%d bytes) into segments, %d sealed, "
                "%d dropped, %d delete flags, %d WAL files pruned, %.3f s",
                report.snapshot,
                report.records,
                report.bytes,
                report.sealed,
                report.dropped,
                report.flips,
                report.wal_pruned,
                report.seconds,
            )
            self._force = False
            self.cycles += 1
            self.relocated += report.relocated
            self.reclaimed += report.reclaimed
            self.reclaimed_bytes += report.reclaimed_bytes
            self.last = report
            return report

    async def _cycle(self, final: bool) -> CheckpointReport:
        eng = self.engine
        journal = self.journal
        # 1. Marks.
        flips: dict[int, list[int]] = {}
        floors: dict[int, int] = {}
        alive: dict[int, Topic] = {}
        # Records deleted before the marks, not yet in a segment: their deletes are
        # durable once the marks are, so they are written without their data.
        deleted: dict[int, np.ndarray[Any, Any]] = {}
        for t in eng.topics.values():
            alive[t.topic_id] = t
            floors[t.topic_id] = t.earliest_seq
            if t.flip_seqs:
                flips[t.topic_id], t.flip_seqs = t.flip_seqs, []
            first = max(t.ckpt_seq + 1, t.base_seq)
            if first <= t.head_seq:
                w = t.index.window(first - t.base_seq, t.head_seq - first + 1)
                dels = np.flatnonzero(w["flags"] == 0xD5)
                if len(dels):
                    deleted[t.topic_id] = dels + first
        gone = [tid for tid in self.stores if tid not in alive]
        mark_bodies = self._mark_bodies(alive)
        futs: list[asyncio.Future[WalEntry | None]] = []
        try:
            for i, body in enumerate(mark_bodies):
                futs.append(journal.mark(i, body, eng.clock.now_ms()))
        except TopicsError as exc:
            self._give_back(flips)
            raise CheckpointFailed(f"cannot log checkpoint marks: {exc.detail}") from None
        entries = await asyncio.gather(*futs)
        if any(e is None for e in entries):
            self._give_back(flips)
            raise CheckpointFailed("a checkpoint mark could not be made durable")
        # 2. Capture: snapshot body and the records not yet in a segment. Changes
        # already applied in memory whose control frame is still in flight are
        # captured too: the snapshot is written only if every one of them commits.
        inflight = list(journal.inflight_controls)
        meta = capture_meta(eng, journal.reserved, journal.router_ops, exact_heads=final)
        wal: dict[str, list[Any]] = {}
        for sh, e in zip(journal.shards, entries, strict=True):
            assert e is not None
            wal[self._rel(sh.dir)] = [e.file, e.offset, e.index]
        for d, pos in self.absorbed.items():
            wal[self._rel(d)] = [pos.file, pos.offset, pos.index]
        meta["wal"] = wal
        # Flips are listed in the snapshot and made after it is durable: recovery
        # from it re-applies them, so a flip torn by a crash is never trusted.
        meta["flips"] = [[tid, _ranges(seqs)] for tid, seqs in flips.items()]
        plans = [
            p for t in alive.values() if (p := self._plan(t, flips, floors, deleted)) is not None
        ]
        # Stores for topics that have none yet are made here, on the loop.
        report = CheckpointReport(topics=len(plans))
        committed = all(await asyncio.gather(*inflight)) if inflight else True
        results, snap_error = await asyncio.to_thread(
            self._files, plans, gone, meta, report, committed
        )
        # 4. Re-point.
        failed = self._apply(results, report, snapshot_ok=snap_error is None)
        self._last_bytes = journal.bytes_written()
        self._last_mono = self.engine.clock.monotonic()
        if snap_error is not None:
            raise CheckpointFailed(f"snapshot write failed: {snap_error}")
        if failed is not None:
            raise CheckpointFailed(f"segment write failed: {failed}")
        return report

    def _release_handles(self) -> None:
        """Give back every segment read handle (a read after this reopens its file).

        :meth:`stop` and the last cycle of a graceful shutdown end with it, so a
        stopped storage leaves no descriptor or map behind in the process-wide
        pool (:data:`~topics.storage.topicstore.open_files`).
        """
        for t in self.engine.topics.values():
            for src in t.sources.values():
                if isinstance(src, SegmentSource):
                    src.close()

    def _give_back(self, flips: dict[int, list[int]]) -> None:
        for t in self.engine.topics.values():
            got = flips.get(t.topic_id)
            if got:
                t.flip_seqs = got + t.flip_seqs

    def _rel(self, d: str) -> str:
        return posixpath.relpath(d, self.data_dir)

    def _mark_bodies(self, alive: dict[int, Topic]) -> list[dict[str, Any]]:
        from topics.storage.journal import shard_of

        n = len(self.journal.shards)
        bodies: list[dict[str, Any]] = [{"shard": i, "topics": {}} for i in range(n)]
        for tid, t in alive.items():
            st = self.stores.get(tid)
            active = st.segs[-1] if st is not None and st.segs else None
            bodies[shard_of(tid, n)]["topics"][tid] = {
                "seq": t.ckpt_seq,
                "segment": active.first_seq if active is not None else 0,
                "data_len": active.data_bytes if active is not None else 0,
            }
        return bodies

    def _plan(
        self,
        t: Topic,
        flips: dict[int, list[int]],
        floors: dict[int, int],
        deleted_at_marks: dict[int, np.ndarray[Any, Any]],
    ) -> _Plan | None:
        tid = t.topic_id
        store = self.stores.get(tid)
        fl = flips.get(tid, [])
        first = max(t.ckpt_seq + 1, t.base_seq)
        last = t.head_seq
        writes = t.config.durability != "ephemeral" and first <= last
        if not writes and not fl and store is None:
            return None
        if store is None:
            store = self.stores[tid] = TopicStore.create(self.fs, self.data_dir, tid, self.cold_dir)
        rows = np.zeros(0, dtype=t.index.view().dtype)
        chunks: dict[int, bytes | FrameBuf] = {}
        if writes:
            idx = t.index
            rows = idx.window(first - idx.base_seq, last - first + 1).copy()
            deleted = np.flatnonzero(rows["flags"] == 0xD5) + first
            if len(deleted):
                durable = np.isin(deleted, deleted_at_marks.get(tid, np.zeros(0, np.int64)))
                # Deleted before the marks: a header-only frame flagged deleted.
                rows["loc"][deleted[durable] - first] = LOC_HOLE
                # Deleted since: written with its data; the flag is flipped once the
                # delete is known durable (the next cycle's marks).
                t.flip_seqs.extend(deleted[~durable].tolist())
            for loc in np.unique(rows["loc"]).tolist():
                if loc == LOC_HOLE:
                    continue
                src = t.sources.get(loc)
                buf = getattr(src, "buf", None)
                # A write's frames are bytes, or (laid out ahead of staging) a
                # bytearray or an anonymous mmap; recovered ones are bytes.
                if loc < CHUNK_BASE or not isinstance(buf, bytes | bytearray | mmap.mmap):
                    raise CheckpointFailed(f"topic {t.name}: seq slot points at {loc:#x}")
                chunks[loc] = buf
            t.ckpt_claim = last
        else:
            first = last + 1
        return _Plan(t, store, first, rows, chunks, fl, floors.get(tid, 0))

    # ------------------------------------------------------------ file work (thread)

    def _files(
        self,
        plans: list[_Plan],
        gone: list[int],
        meta: dict[str, Any],
        report: CheckpointReport,
        committed: bool,
    ) -> tuple[list[_Result], BaseException | None]:
        """Step 3; returns the per-topic results and the snapshot error (None: written).

        With `committed` False (a control frame captured in flight failed) the
        segments are still written (the WAL keeps what they hold) but no snapshot.
        """
        fs = self.fs
        now = int(meta["taken_ms"])
        results: list[_Result] = []
        self._reclaim_left = RECLAIM_BYTES_PER_CYCLE
        for r, part in self._all_topic_files(plans, now):
            results.append(r)
            report.records += part.records
            report.bytes += part.bytes
            report.sealed += part.sealed
            report.dropped += part.dropped
            report.relocated += part.relocated
            report.reclaimed += part.reclaimed
            report.reclaimed_bytes += part.reclaimed_bytes
        for r in results:
            self._drops_pending.extend(r.drops)
        ok = all(r.error is None for r in results)
        if not ok:
            return results, CheckpointFailed("a topic's segments could not be written")
        if not committed:
            return results, CheckpointFailed("a change captured in flight was not logged")
        for tid in gone:
            st = self.stores.pop(tid, None)
            if st is not None and st.writer is not None:
                st.writer.close()
            self._gone_pending.append(tid)
        # The snapshot lists the segments it relies on in each tier (docs/FORMATS.md,
        # "Segments the snapshot relies on"), as they are after this cycle's writes.
        for m in meta.get("topics") or []:
            st = self.stores.get(int(m["id"]))
            segs = st.segs if st is not None else []
            m["segs"] = [[g.first_seq, g.count] for g in segs if g.tier is Tier.HOT and g.count]
            cold = [[g.first_seq, g.count] for g in segs if g.tier is Tier.COLD and g.count]
            if cold:
                m["cold"] = cold
        try:
            n = next_snapshot_number(fs, self.meta_dir)
            write_snapshot(fs, self.meta_dir, n, meta)
        except Exception as exc:  # OSError, or a body msgpack cannot encode (a bug)
            (log.debug if self._failing else log.error)("snapshot write failed: %s", exc)
            return results, exc
        report.snapshot = n
        # Files the previous snapshot relied on and this one does not: only now may
        # they go (recovery refuses to start over a published segment that is gone).
        self._remove_unpublished()
        for r in results:
            if r.plan.flips:
                try:
                    self._flip(r.plan, report)
                except OSError as exc:
                    log.error("delete flags of topic %s not written: %s", r.plan.topic.name, exc)
                    r.flips_failed = True
        try:
            report.wal_pruned = self._prune(n)
        except OSError as exc:
            log.warning("WAL pruning failed (retried next time): %s", exc)
        return results, None

    def _remove_unpublished(self) -> None:
        """Delete dropped segments and deleted topics' directories (after a snapshot)."""
        fs = self.fs
        drops, self._drops_pending = self._drops_pending, []
        for store, seg in drops:
            try:
                store.drop(seg)  # through its tier's SegmentStore (idempotent)
            except OSError as exc:
                log.warning("cannot drop segment %d of %s: %s", seg.first_seq, store.dir, exc)
                self._drops_pending.append((store, seg))
        gone, self._gone_pending = self._gone_pending, []
        # An object store cannot rename: a deleted topic's objects are deleted by
        # the reaper straight away (docs/FORMATS.md, "Deleted topics").
        objects = self.cold_dir if self.cold_dir and is_object_url(self.cold_dir) else None
        roots = [r for r in (self.data_dir, self.cold_dir) if r and r != objects]
        for tid in gone:
            try:
                for root in roots:
                    retire_topic_dir(fs, root, tid)
            except OSError as exc:
                log.warning("cannot retire the files of deleted topic %016x: %s", tid, exc)
                self._gone_pending.append(tid)
                continue
            if objects is not None:
                self.reaper.unlink(topic_dir(objects, tid))
        # Every retired directory, this cycle's and any an earlier run (or a crash)
        # left behind, goes to the reaper (which ignores one it already has).
        for root in roots:
            try:
                for path in retired_dirs(fs, root):
                    self.reaper.unlink(path)
            except OSError as exc:
                log.warning("cannot list the retired topic directories of %s: %s", root, exc)

    def _all_topic_files(
        self, plans: list[_Plan], now: int
    ) -> list[tuple[_Result, CheckpointReport]]:
        """Each plan's segment files: its result and report counts, in plan order.

        Topics are independent (own directory, store and writer), so batches
        of them run on up to `io_threads` threads; each topic
        is written by one thread from start to end, and the memory a topic
        needs is bounded per step (`STEP_BYTES`), so the cycle's working set is
        at most about `io_threads` steps.
        """
        threads = self.cfg.io_threads
        if threads <= 1 or len(plans) < 2:
            return [self._one_topic_files(p, now) for p in plans]
        per = max(1, min(64, len(plans) // (threads * 4)))
        batches = [plans[k : k + per] for k in range(0, len(plans), per)]
        with ThreadPoolExecutor(
            max_workers=min(threads, len(batches)), thread_name_prefix="checkpoint-io"
        ) as ex:
            done = ex.map(lambda b: [self._one_topic_files(p, now) for p in b], batches)
            return [out for batch in done for out in batch]

    def _one_topic_files(self, p: _Plan, now: int) -> tuple[_Result, CheckpointReport]:
        r = _Result(p)
        part = CheckpointReport()
        try:
            self._topic_files(p, r, now, part)
            if p.store.writer is not None:
                # Flushed: the writer's descriptors go back until a later cycle
                # appends again, so idle topics hold none.
                p.store.writer.release()
        except Exception as exc:  # OSError, FrameCorrupt...: the cycle writes no snapshot
            (log.debug if self._failing else log.error)(
                "checkpoint of topic %s failed: %s", p.topic.name, exc
            )
            r.error = exc
            self._reset_writer(p.store)
        return r, part

    def _flip(self, p: _Plan, report: CheckpointReport) -> None:
        """Flip the `.idx` flag of records deleted before the marks (0xD5, fdatasync)."""
        store = p.store
        by_seg: dict[int, list[int]] = {}
        for s in p.flips:
            seg = store.seg_for(s)
            if seg is not None:
                by_seg.setdefault(seg.first_seq, []).append(s)
        for first, seqs in by_seg.items():
            seg = store.seg_for(first)
            assert seg is not None
            flip_deleted_in(store.tier.store(seg.tier), first, seqs)
            hot = store.tier.hot
            if seg.tier is Tier.COLD and hot.exists(first, SegmentPart.IDX):
                # The hot copy of a relocated segment waits for the next snapshot
                # to be deleted; recovery prefers it until then, so it gets the flag too.
                flip_deleted(hot.fs, hot.path(first, SegmentPart.IDX), first, seqs)
            seg.deleted += len(set(seqs))
            report.flips += len(seqs)

    def _reset_writer(self, store: TopicStore) -> None:
        w, store.writer = store.writer, None
        if w is not None:
            w.close()

    def _ensure_writer(self, store: TopicStore, first: int) -> SegmentWriter:
        """The active writer, resumed from disk after a failure."""
        w = store.writer
        if w is None and store.segs and not store.segs[-1].sealed:
            seg = store.segs[-1]
            w = SegmentWriter.resume(
                self.fs, store.dir, seg.first_seq, max_count=max(first - seg.first_seq, 0)
            )
            seg.count, seg.data_bytes = w.count, w.data_bytes
            store.writer = w
        assert w is not None or not store.segs or store.segs[-1].sealed
        return w  # type: ignore[return-value]

    def _seal(self, store: TopicStore, r: _Result, report: CheckpointReport) -> None:
        w, store.writer = store.writer, None
        if w is None:
            return
        seg = store.segs[-1]
        if w.count == 0:
            # An empty active segment is never sealed: it goes.
            w.close()
            store.drop(seg)
            store.segs.pop()
            r.dropped.append(seg.loc)
            return
        w.seal()
        seg.sealed = True
        r.sealed.append(seg.loc)
        report.sealed += 1

    def _open_segment(self, store: TopicStore, first: int, r: _Result, ts: int) -> SegmentWriter:
        paths = segment_paths(store.dir, first)
        if any(self.fs.exists(p) for p in paths):
            # Left by a cycle of this process that failed part way (a full disk, an
            # I/O error): no snapshot relies on it and the WAL still holds its
            # records, so it is written again from the start.
            log.warning("rewriting segment %s left by a failed checkpoint", paths.data)
            store.tier.store(Tier.HOT).delete(first)
        w = SegmentWriter(self.fs, store.dir, first)
        store.writer = w
        seg = SegMeta(first, 0, store.alloc_loc(), False, 0, 0, ts)
        store.segs.append(seg)
        r.new_sources[seg.loc] = SegmentSource(self.fs, w.paths.data, sealed=False)
        return w

    def _topic_files(self, p: _Plan, r: _Result, now: int, report: CheckpointReport) -> None:
        self._topic_segments(p, r, now, report)
        # Sealed hot segments beyond hot retention: relocation moves them, so reclaim
        # leaves them alone (their copy is made from the bytes as they are).
        moving = (
            self._relocation_candidates(p.store)
            if self.relocator is not None and p.store.tier.cold is not None
            else []
        )
        self._reclaim(p, r, report, {g.first_seq for g in moving})
        if self.relocator is not None and p.store.tier.cold is not None:
            self._relocate(p.store, moving, r, report)

    def _reclaim_take(self, nbytes: int) -> bool:
        """Take `nbytes` of this cycle's rewrite budget; False when it is spent."""
        with self._reclaim_lock:
            if self._reclaim_left <= 0:
                return False
            self._reclaim_left -= nbytes
            return True

    def _reclaim(self, p: _Plan, r: _Result, report: CheckpointReport, moving: set[int]) -> None:
        """Rewrite sealed hot segments whose deleted records hold their bytes.

        A segment qualifies once deleted entries that are not yet holes make up
        :data:`~topics.storage.topicstore.RECLAIM_DEAD_RATIO` of it (a fully
        deleted one is dropped instead). Each cycle rewrites at most
        :data:`RECLAIM_BYTES_PER_CYCLE` bytes of segments; the rest wait for the
        next. The rewrite keeps every entry, so the snapshot's view of the
        segment does not change (docs/FORMATS.md, "Reclaim"). Segments in
        `moving` (first seqs) are about to go to the cold tier and are skipped.
        """
        store = p.store
        for seg in store.segs:
            if not seg.sealed or seg.tier is not Tier.HOT or seg.deleted >= seg.count:
                continue
            if seg.first_seq in moving:
                continue
            dead = seg.deleted - seg.holes
            if dead <= 0 or dead < RECLAIM_DEAD_RATIO * seg.count:
                continue
            if not self._reclaim_take(seg.data_bytes):
                return
            paths = segment_paths(store.dir, seg.first_seq)
            try:
                rw = plan_rewrite(self.fs, paths, seg.first_seq, store.topic_id)
            except OSError as exc:
                log.warning("segment %s not reclaimed: %s", paths.data, exc)
                continue
            src = p.topic.sources.get(seg.loc)
            install_rewrite(self.fs, paths, rw, src.pin if isinstance(src, SegmentSource) else None)
            report.reclaimed += 1
            report.reclaimed_bytes += seg.data_bytes - len(rw.data)
            seg.holes = rw.holes
            seg.data_bytes = len(rw.data)
            r.rewritten.append((seg, rw.offsets, rw.lens))

    def _relocation_candidates(self, store: TopicStore) -> list[SegMeta]:
        """Sealed hot segments beyond the hot-retention bounds, oldest first."""
        cfg = self.cfg
        hot = [g for g in store.segs if g.sealed and g.tier is Tier.HOT]
        keep = min(len(hot), max(cfg.hot_retain_segments, 0))
        if cfg.hot_retain_bytes:
            kept_bytes = 0
            n = 0
            for g in reversed(hot[len(hot) - keep :]):
                if kept_bytes + g.data_bytes > cfg.hot_retain_bytes:
                    break
                kept_bytes += g.data_bytes
                n += 1
            keep = n
        return hot[: len(hot) - keep]

    def _relocate(
        self, store: TopicStore, cands: list[SegMeta], r: _Result, report: CheckpointReport
    ) -> None:
        """Commit finished copies of `cands` (beyond hot retention), queue the others.

        Committing flips the segment's tier to COLD (the snapshot written after
        this lists it there); its readers move to the cold copy on the loop
        (:meth:`_apply`) and the hot copy is deleted after the next snapshot
        (docs/FORMATS.md, "Relocation"). A delete flag set on the hot `.idx`
        after it was copied is carried over by replacing the cold `.idx`.
        """
        relocator = self.relocator
        cold = store.tier.cold
        assert relocator is not None and cold is not None
        hot = store.tier.hot
        for seg in cands:
            copied = relocator.take(store.topic_id, seg.first_seq)
            if copied is None:
                relocator.submit(store, seg.first_seq)
                copied = relocator.take(store.topic_id, seg.first_seq)  # done if inline
                if copied is None:
                    continue
            idx = read_file(hot.fs, hot.path(seg.first_seq, SegmentPart.IDX))
            if idx != copied:
                if not same_frames(idx, copied):
                    # The hot segment changed under the copy (it was rewritten):
                    # that copy is stale; it goes, and a new one is made.
                    cold.delete(seg.first_seq)
                    relocator.submit(store, seg.first_seq)
                    continue
                replace_idx(cold, seg.first_seq, idx)  # delete flags set since the copy
            seg.tier = Tier.COLD
            r.relocated.append(seg)
            report.relocated += 1
        # Copies finished for segments dropped meanwhile: no snapshot lists them.
        keep = {g.first_seq for g in cands}
        for first in relocator.take_other(store.topic_id, keep):
            cold.delete(first)

    def _topic_segments(self, p: _Plan, r: _Result, now: int, report: CheckpointReport) -> None:
        cfg = self.cfg
        store = p.store
        if store.segs and not store.segs[-1].sealed:
            self._ensure_writer(store, p.first if len(p.rows) else store.segs[-1].last_seq + 1)
        # Age trigger.
        w = store.writer
        if (
            w is not None
            and w.count
            and cfg.segment_max_age_ms
            and w.age_ms(now) >= cfg.segment_max_age_ms
        ):
            self._seal(store, r, report)
        # Whole segments below the live floor, or fully deleted (never the active one).
        keep: list[SegMeta] = []
        for seg in store.segs:
            if seg.sealed and (seg.last_seq < p.drop_below or seg.deleted >= seg.count):
                # The newest durable snapshot may still rely on it: its files are
                # deleted after this cycle's snapshot is durable (_files).
                r.drops.append((store, seg))
                r.dropped.append(seg.loc)
                report.dropped += 1
            else:
                keep.append(seg)
        store.segs = keep
        # New records.
        n = len(p.rows)
        if not n:
            if store.writer is not None:
                store.writer.flush()
            return
        rows = p.rows
        w = store.writer
        if w is not None and w.next_seq != p.first:
            self._seal(store, r, report)
            w = None
        locs = np.zeros(n, np.uint32)
        offs = np.zeros(n, np.uint32)
        lens = np.zeros(n, np.uint32)
        tid = p.topic.topic_id
        r_loc = rows["loc"].astype(np.int64)
        r_off = rows["offset"].astype(np.int64)
        r_len = rows["len"].astype(np.int64)
        r_ts = rows["ts"]
        hole = r_loc == LOC_HOLE
        fsize = np.where(hole, _HOLE_FRAME, r_len - 1)  # segment frame sizes
        max_events, max_bytes = cfg.segment_max_events, cfg.segment_max_bytes
        i = 0
        while i < n:
            if w is None or w.count >= max_events or w.data_bytes >= max_bytes:
                if w is not None:
                    self._seal(store, r, report)
                w = self._open_segment(store, p.first + i, r, int(r_ts[i]))
            room = max_events - w.count
            sizes = fsize[i : i + room]
            # Records that start below the byte trigger go in (the last may cross it),
            # converted and written at most STEP_BYTES at a time (at least one record):
            # the frames are copied once into a blob of that size, so a cycle's memory
            # does not grow with the records it moves. Steps append to the same writer,
            # so the segments are the same whatever the step size.
            ends = np.cumsum(sizes)
            k = max(int(np.searchsorted(ends - sizes, max_bytes - w.data_bytes)), 1)
            k = min(k, max(int(np.searchsorted(ends, STEP_BYTES, side="right")), 1))
            j = i + k
            blob, flen, fl = self._frames(p, tid, i, j, r_loc, r_off, r_len, r_ts, hole)
            entries = w.append_blob(blob, flen, r_ts[i:j], fl)
            seg = store.segs[-1]
            seg.count = w.count
            seg.data_bytes = w.data_bytes
            seg.deleted += int(np.count_nonzero(hole[i:j]))
            seg.holes += int(np.count_nonzero(hole[i:j]))
            locs[i:j] = seg.loc
            offs[i:j] = entries["offset"]
            lens[i:j] = entries["len"]
            report.records += j - i
            report.bytes += len(blob)
            del blob, entries
            i = j
            if w.count >= max_events or w.data_bytes >= max_bytes:
                w.flush()
                self._seal(store, r, report)
                w = None
        if store.writer is not None:
            store.writer.flush()
        r.locs, r.offs, r.lens = locs, offs, lens

    def _frames(
        self,
        p: _Plan,
        tid: int,
        i: int,
        j: int,
        r_loc: np.ndarray[Any, Any],
        r_off: np.ndarray[Any, Any],
        r_len: np.ndarray[Any, Any],
        r_ts: np.ndarray[Any, Any],
        hole: np.ndarray[Any, Any],
    ) -> tuple[bytes, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Segment frames of rows `[i, j)`: (blob, frame lengths, `.idx` flags)."""
        h = hole[i:j]
        if not h.any():
            return self._chunk_frames(p, i, j, r_loc, r_off, r_len)
        cuts = [0, *(np.flatnonzero(h[1:] != h[:-1]) + 1).tolist(), j - i]
        blobs: list[bytes] = []
        flens: list[np.ndarray[Any, Any]] = []
        flags: list[np.ndarray[Any, Any]] = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            lo, hi = i + a, i + b
            if h[a]:
                # Holes (and records deleted before the marks): header-only frames.
                for k in range(lo, hi):
                    blobs.append(
                        encode_record(
                            tid,
                            p.first + k,
                            int(r_ts[k]),
                            None,
                            None,
                            b"",
                            None,
                            durable=False,
                            segment=True,
                        )
                    )
                flens.append(np.full(hi - lo, _HOLE_FRAME, np.uint32))
                flags.append(np.full(hi - lo, 0xD5, np.uint8))
                continue
            blob, flen, fl = self._chunk_frames(p, lo, hi, r_loc, r_off, r_len)
            blobs.append(blob)
            flens.append(flen)
            flags.append(fl)
        return b"".join(blobs), np.concatenate(flens), np.concatenate(flags)

    def _chunk_frames(
        self,
        p: _Plan,
        lo: int,
        hi: int,
        r_loc: np.ndarray[Any, Any],
        r_off: np.ndarray[Any, Any],
        r_len: np.ndarray[Any, Any],
    ) -> tuple[bytes, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Segment frames of rows `[lo, hi)`, none of them a hole."""
        loc = r_loc[lo:hi]
        keys, which = np.unique(loc, return_inverse=True)
        bufs = [p.chunks[int(k)] for k in keys.tolist()]
        o, ln = r_off[lo:hi], r_len[lo:hi]
        sizes = np.array([len(b) for b in bufs], np.int64)[which]
        if np.any(ln < 46) or np.any(o + ln > sizes):
            raise CheckpointFailed(f"topic {p.topic.name}: in-memory frames out of place")
        blob, flen, fl, seqs = segment_blob(bufs, which, o, ln)
        if np.any(seqs != np.arange(p.first + lo, p.first + hi, dtype=np.uint64)):
            raise CheckpointFailed(f"topic {p.topic.name}: in-memory frame of another seq")
        return blob, flen, fl

    def _prune(self, n: int) -> int:
        """Delete WAL files no retained snapshot (the fallback included) still needs."""
        fs = self.fs
        keep: dict[str, WalPosition] = {}
        for m, path in list_snapshots(fs, self.meta_dir):
            if m == n:
                continue
            f = fs.open(path)
            try:
                body = decode_snapshot(f.pread(f.size(), 0))
            finally:
                f.close()
            if not isinstance(body, dict):
                continue
            for d, pos in (body.get("wal") or {}).items():
                wp = WalPosition(str(pos[0]), int(pos[1]), int(pos[2]))
                if d not in keep or wp.index < keep[d].index:
                    keep[d] = wp
        if not keep:
            return 0  # no fallback snapshot yet: every WAL file may still be needed
        pruned = 0
        for rel, pos in keep.items():
            d = posixpath.join(self.data_dir, rel)
            if rel in {self._rel(x) for x in self.absorbed}:
                continue
            pruned += len(prune_files(fs, d, pos))
        # Shard directories of an older layout go once the fallback absorbs them too.
        for d in list(self.absorbed):
            if self._rel(d) in keep and keep[self._rel(d)].index >= self.absorbed[d].index:
                for name in fs.listdir(d):
                    fs.unlink(posixpath.join(d, name))
                    pruned += 1
                fs.fsync_dir(d)
                fs.rmdir(d)
                fs.fsync_dir(posixpath.dirname(d))
                del self.absorbed[d]
        return pruned

    # ------------------------------------------------------------ re-point (loop)

    def _apply(
        self, results: list[_Result], report: CheckpointReport, *, snapshot_ok: bool
    ) -> BaseException | None:
        failed: BaseException | None = None
        eng = self.engine
        for r in results:
            t = r.plan.topic
            live = t.alive and eng.topics.get(t.name) is t
            if r.plan.flips and (r.flips_failed or not snapshot_ok) and live:
                t.flip_seqs = r.plan.flips + t.flip_seqs  # not durable yet: next cycle
            for loc, src in r.new_sources.items():
                if live:
                    t.sources[loc] = src
                else:
                    src.close()
            for loc in r.sealed:
                sealed = t.sources.get(loc)
                if isinstance(sealed, SegmentSource):
                    sealed.seal()
            for loc in r.dropped:
                gone = t.sources.pop(loc, None)
                if isinstance(gone, SegmentSource):
                    gone.close()
            for seg, offs, lens in r.rewritten:
                # The segment's file was replaced: its slots point into the new
                # bytes and a new reader opens them; the old reader (pinned to the
                # old file) goes (docs/FORMATS.md, "Reclaim").
                old = t.sources.get(seg.loc)
                if live and seg.loc in t.sources:
                    got = _slots(t, seg.first_seq, seg.last_seq)
                    if got is not None:
                        w, k = got
                        mine = w["loc"] == seg.loc
                        w["offset"][mine] = offs[k : k + len(w)][mine]
                        w["len"][mine] = lens[k : k + len(w)][mine]
                    t.sources[seg.loc] = r.plan.store.source(seg)
                if isinstance(old, SegmentSource):
                    old.close()
            for seg in r.relocated:
                # Reads move to the cold copy now; the hot copy goes after the next
                # snapshot, which lists the segment as cold (docs/FORMATS.md, "Relocation").
                old = t.sources.get(seg.loc)
                if live and seg.loc in t.sources:
                    t.sources[seg.loc] = r.plan.store.source(seg)
                if isinstance(old, SegmentSource):
                    old.close()
                self._drops_pending.append((r.plan.store, dataclasses.replace(seg, tier=Tier.HOT)))
            if r.error is not None:
                failed = failed or r.error
                t.ckpt_claim = t.ckpt_seq
                continue
            if not live or r.locs is None:
                continue
            p = r.plan
            last = p.first + len(p.rows) - 1
            got = _slots(t, p.first, last)
            if got is not None:
                w, k = got
                m = len(w)
                w["loc"] = r.locs[k : k + m]
                w["offset"] = r.offs[k : k + m]  # type: ignore[index]
                w["len"] = r.lens[k : k + m]  # type: ignore[index]
            t.ckpt_seq = max(t.ckpt_seq, last)
            t.free_chunks()
        return failed


def _slots(t: Topic, first: int, last: int) -> tuple[SlotArray, int] | None:
    """The slots of seqs `first..last` still in `t`'s index (a writable view) and the
    position of its first one in that range, or None when none are left."""
    idx = t.index
    lo = max(first, idx.base_seq)
    hi = min(last, idx.end_seq)
    if lo > hi:
        return None
    return idx.window(lo - idx.base_seq, hi - lo + 1), lo - first


def _ranges(seqs: list[int]) -> list[list[int]]:
    """Ascending seqs as `[first, count]` runs (compact in a snapshot)."""
    out: list[list[int]] = []
    for s in sorted(set(seqs)):
        if out and out[-1][0] + out[-1][1] == s:
            out[-1][1] += 1
        else:
            out.append([s, 1])
    return out


def expand_ranges(runs: list[list[int]]) -> list[int]:
    """The seqs of :func:`_ranges` runs."""
    return [s for first, count in runs for s in range(int(first), int(first) + int(count))]
