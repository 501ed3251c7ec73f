"""The WAL-backed journal: the engine's mutations as frames in sharded WALs.

A topic's frames always go to shard `xxh3_64(topic_id) % n` (docs/FORMATS.md, "WAL frame"),
so its appends and control frames stay in one ordered stream. Router frames go
to shard 0; they carry the topic ids they connect, so recovery can tell a
router of a deleted topic instance from a live one.

Ack points per durability class (README "Durability and the data directory"):

| class | frames | the write is published when |
|---|---|---|
| ephemeral | none (config frames only) | at once |
| memory | appended, no reservation | at enqueue (written next, synced on the writer's tick) |
| disk | appended + a HeadWatermark every 256 seqs (synced) | at enqueue, except a batch that carries a new reservation: after its sync |
| fsync | appended, synced | the batch's `fdatasync` returned |

Control frames carry `h`, the topic's head when they were logged: recovery
orders a topic's frames by position in its seq space, which keeps the order
right even when the shard count changed between runs.

Completions arrive on the writer threads and are handed to the event loop with
`call_soon_threadsafe`; engine state is only ever touched on the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import posixpath
import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import xxhash

from topics.engine.events import (
    ConfigChanged,
    Event,
    FloorsAdvanced,
    LeaseChanged,
    RecordsAppended,
    RecordsDeleted,
    RouterDeleted,
    RouterPut,
    SeqsDeleted,
    TopicCreated,
    TopicDeleted,
)
from topics.engine.journal import DONE, NOT_LOGGED, Handle
from topics.errors import TopicsError
from topics.format.frame import CHECKPOINT_MARK, HEAD_WATERMARK, encode_control
from topics.storage.eventcodec import control_frame
from topics.storage.fs import Data, Fs
from topics.storage.wal import WalDiskFull, WalEntry, WalFull, WalMetrics, WalReadOnly, WalShard

if TYPE_CHECKING:
    from topics.engine.core import Engine
    from topics.engine.topic import Topic

__all__ = ["WalJournal", "shard_dirs", "shard_of", "exact_head_topics", "HEAD_RESERVATION"]

log = logging.getLogger("topics.journal")

HEAD_RESERVATION = 256
_U64 = struct.Struct("<Q")


def shard_of(topic_id: int, n: int) -> int:
    """The shard a topic lives on: `xxh3_64(topic_id as u64 LE) % n`."""
    return int(xxhash.xxh3_64_intdigest(_U64.pack(topic_id)) % n) if n > 1 else 0


def shard_dirs(data_dir: str, n: int) -> list[str]:
    """Shard directories for `n` shards: flat `wal/` for one, `wal/shard-NN/` otherwise."""
    root = posixpath.join(data_dir, "wal")
    if n <= 1:
        return [root]
    return [posixpath.join(root, f"shard-{i:02d}") for i in range(n)]


class WalJournal:
    """Implements the engine's Journal protocol (`log(event) -> Handle`) on top of
    open WAL shards."""

    def __init__(
        self,
        shards: list[WalShard],
        loop: asyncio.AbstractEventLoop,
        *,
        reserved: dict[int, int] | None = None,
    ) -> None:
        self.shards = shards
        self.loop = loop
        # Durable head reservation per topic id (disk class).
        self.reserved: dict[int, int] = dict(reserved or {})
        # Early-acked (disk/memory) frames gathered during one loop iteration, per
        # shard: handed to the writer as one entry, so a burst of requests costs one
        # thread wake-up and one pwrite instead of one each.
        self._coalesce: dict[int, list[Data]] = {}
        self._coalesce_frames: dict[int, int] = {}
        self._flush_scheduled = False
        self._prereserving: set[int] = set()
        self._pending_controls: list[asyncio.Future[bool]] = []
        self._floor_unlogged = False  # a floor could not be logged (said once)
        # Every control frame not completed yet (a checkpoint's capture waits for them).
        self.inflight_controls: set[asyncio.Future[bool]] = set()
        # The live topics, for the exact-head markers of a clean close (set by the owner).
        self.topics: Callable[[], Iterable[Topic]] = lambda: ()
        # topic id -> live instance, for the durability class of a topic's events
        # (set by the owner, see bind(); unknown: logged as for fsync).
        self.topic_of: Callable[[int], Topic | None] = lambda topic_id: None
        # Router frames are numbered; a snapshot records the last number it
        # reflects, so replay from its checkpoint skips older router frames.
        self.router_ops = 0

    # ------------------------------------------------------------ plumbing

    def _shard(self, topic_id: int) -> WalShard:
        return self.shards[shard_of(topic_id, len(self.shards))]

    def _submit(self, shard: WalShard, entry: WalEntry) -> None:
        if self._coalesce:
            self.flush()  # keep log order: earlier early-acked frames go first
        try:
            shard.submit(entry)
        except WalFull:
            raise TopicsError(429, "throttled", "the write-ahead log is busy; retry") from None
        except WalDiskFull:
            raise _disk_full() from None
        except WalReadOnly:
            raise TopicsError(500, "internal", "the write-ahead log is read-only") from None

    def bind(self, engine: Engine) -> None:
        """Take the live topics from `engine` (durability classes, exact heads)."""
        self.topic_of = engine.topic_by_id
        self.topics = lambda: exact_head_topics(engine)

    def log(self, event: Event) -> Handle:
        """Log one engine event (the engine's Journal protocol).

        The handle completes on the loop once the event is durable for its
        topic's class (the table above); appends acknowledged on enqueue and
        events a class does not log get an already completed handle. Raises
        TopicsError when the log refuses the event (nothing logged): `429` (a
        shard's queue is full), `507` (its disk is full), `500` (read-only),
        `413` (a batch larger than one WAL file). Floors and lease events are
        logged best effort: a refusal is not raised, their handle fails.
        """
        if event.__class__ is RecordsAppended:  # the hot path
            return self._log_append(event)
        fn = self._LOG.get(type(event))
        if fn is None:
            raise TypeError(f"{type(event).__name__} is not logged by the journal")
        return fn(self, event)

    def _control(
        self,
        shard: WalShard,
        typ: int,
        topic_id: int,
        body: dict[str, Any],
        *,
        sync: bool = True,
        seq: int = 0,
        ts: int = 0,
    ) -> Handle:
        """Log one control frame; the handle completes when it is durable.

        The request scope it is logged in (:meth:`open_request`) waits for it in
        :meth:`barrier`; a checkpoint's capture waits for every one in flight.
        """
        data = encode_control(typ, topic_id, body, seq=seq, ts=ts, durable=sync)
        fut: asyncio.Future[bool] = self.loop.create_future()
        h = Handle()
        loop = self.loop

        def done(e: WalEntry, ok: bool, fsync_ms: float) -> None:
            if not ok:
                _log_failure(e, ok, fsync_ms)
            # The handle's callbacks run in the same loop callback that settles the
            # future, so completions keep the shard's log order (a checkpoint mark
            # after this frame resolves only once its effect is applied).
            loop.call_soon_threadsafe(_settle, fut, h, ok)

        self._submit(shard, WalEntry(data, 1, sync, done))
        # Tracked once queued (a refused frame is waited for by nobody).
        scope = _REQUEST.get()
        if scope is not None:
            scope.append(fut)  # this request waits for it, and only this one
        else:
            pend = self._pending_controls
            if len(pend) >= 64 and pend[0].done():
                # Nobody outside a request scope waited: drop what completed.
                self._pending_controls = pend = [f for f in pend if not f.done()]
            pend.append(fut)
        self.inflight_controls.add(fut)
        fut.add_done_callback(self.inflight_controls.discard)
        return h

    def _event_control(self, ev: Event, *, sync: bool = True) -> Handle:
        typ, topic_id, body, seq, ts = control_frame(ev)
        return self._control(self._shard(topic_id), typ, topic_id, body, sync=sync, seq=seq, ts=ts)

    def _class_of(self, topic_id: int) -> str:
        t = self.topic_of(topic_id)
        return t.config.durability if t is not None else "fsync"

    # ------------------------------------------------------------ records

    def _log_append(self, ev: RecordsAppended) -> Handle:
        pw = ev.write
        t = pw.topic
        cls = t.config.durability
        if cls == "ephemeral":
            return DONE
        data = pw.frames
        shard = self._shard(t.topic_id)
        if len(data) + 128 > shard.capacity:
            # A write is one WAL entry and entries never span files: refuse it before
            # anything is acknowledged.
            raise TopicsError(
                413,
                "payload_too_large",
                f"the batch is {len(data)} bytes in the log; one WAL file holds {shard.capacity}",
            )
        frames = len(pw.records)
        sync = cls == "fsync"
        more: tuple[Data, ...] = ()
        reserved_before = self.reserved.get(t.topic_id, 0)
        if cls == "disk" and pw.last_seq > reserved_before:
            # Seqs of a disk topic are never reused after a crash: before publishing
            # past the durable reservation, fsync a new one 256 seqs ahead. It is
            # logged right after the batch in the same entry (written and synced
            # with it), as a part of its own: the batch's frames are not copied.
            res = pw.last_seq + HEAD_RESERVATION
            more = (
                encode_control(HEAD_WATERMARK, t.topic_id, {}, seq=res, ts=pw.ts, durable=True),
            )
            frames += 1
            sync = True
            self.reserved[t.topic_id] = res
        elif (
            cls == "disk"
            and pw.last_seq > reserved_before - HEAD_RESERVATION // 2
            and t.topic_id not in self._prereserving
        ):
            # Half way through the window: log the next reservation now (synced,
            # not waited on), so later batches rarely have to wait for one. It is
            # counted only once durable; the crash gap stays within 256 of the
            # head published when it was taken.
            self._prereserve(t.topic_id, pw.last_seq + HEAD_RESERVATION, pw.ts)
        loop = self.loop
        if not sync:
            # disk/memory: acknowledged on enqueue (README "Durability and the data directory": "acked on frame
            # enqueue"); the writer thread writes it next and syncs on its tick.
            si = shard_of(t.topic_id, len(self.shards))
            shard = self.shards[si]
            if shard.read_only:
                raise TopicsError(500, "internal", "the write-ahead log is read-only")
            if shard.disk_full:
                raise _disk_full()
            if shard.queue_depth >= shard.queue_max:
                raise TopicsError(429, "throttled", "the write-ahead log is busy; retry")
            self._coalesce.setdefault(si, []).append(data)
            self._coalesce_frames[si] = self._coalesce_frames.get(si, 0) + frames
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self.flush)
            return DONE
        h = Handle()
        tid = t.topic_id
        fsync = cls == "fsync"

        def done(e: WalEntry, ok: bool, fsync_ms: float) -> None:
            err = _disk_full() if not ok and isinstance(e.error, WalDiskFull) else None
            loop.call_soon_threadsafe(
                self._write_done,
                h,
                tid,
                ok,
                err,
                fsync_ms if fsync else 0.0,
                reserved_before,
                e.window_ms,
            )

        try:
            entry = WalEntry(data, frames, sync, done, more=more)
            entry.gather = fsync  # a widened commit window saves fsync-class syncs only
            self._submit(self._shard(tid), entry)
        except TopicsError:
            self.reserved[tid] = reserved_before
            raise
        return h

    @staticmethod
    def open_request() -> contextvars.Token[list[asyncio.Future[bool]] | None]:
        """Start a request's scope: control frames logged in this context (and in
        tasks it starts) are the ones :meth:`barrier` waits for. Close it with
        :meth:`close_request` and the returned token."""
        return _REQUEST.set([])

    @staticmethod
    def close_request(token: contextvars.Token[list[asyncio.Future[bool]] | None]) -> None:
        _REQUEST.reset(token)

    def has_pending_controls(self) -> bool:
        """True while control frames this request (or, outside a request scope,
        anyone on this loop) logged have not completed."""
        scope = _REQUEST.get()
        if scope is not None:
            return any(not f.done() for f in scope) or any(
                f.done() and not f.result() for f in scope
            )
        pend = self._pending_controls
        if pend and pend[0].done():
            self._pending_controls = pend = [f for f in pend if not f.done()]
        return bool(pend)

    async def barrier(self) -> None:
        """Wait until the control frames this request logged are durable (or failed).

        Inside a request scope (:meth:`open_request`) only that request's frames
        are waited for, never another request's; outside one, every frame logged
        so far. Raises `500 internal` when one of them could not be logged: the
        change it described is not durable, so the request must not be
        acknowledged.
        """
        scope = _REQUEST.get()
        if scope is not None:
            pend = list(scope)
            scope.clear()
        else:
            pend, self._pending_controls = self._pending_controls, []
        if not pend:
            return
        results = await asyncio.gather(*pend)
        if not all(results):
            raise TopicsError(500, "internal", "the change could not be written to the log")

    def _prereserve(self, topic_id: int, res: int, ts: int) -> None:
        self._prereserving.add(topic_id)
        loop = self.loop
        frame = encode_control(HEAD_WATERMARK, topic_id, {}, seq=res, ts=ts, durable=True)

        def done(e: WalEntry, ok: bool, fsync_ms: float) -> None:
            loop.call_soon_threadsafe(self._prereserved, topic_id, res, ok)

        try:
            self._submit(self._shard(topic_id), WalEntry(frame, 1, True, done))
        except TopicsError:
            self._prereserving.discard(topic_id)

    def _prereserved(self, topic_id: int, res: int, ok: bool) -> None:
        self._prereserving.discard(topic_id)
        if ok and res > self.reserved.get(topic_id, 0):
            self.reserved[topic_id] = res

    def flush(self) -> None:
        """Hand the frames gathered this loop iteration to their shards' writers.

        Runs before any later submission to the same shard is queued, so the
        shard's log order stays the order in which records were assigned seqs.
        """
        self._flush_scheduled = False
        pending, self._coalesce = self._coalesce, {}
        counts, self._coalesce_frames = self._coalesce_frames, {}
        for si, chunks in pending.items():
            shard = self.shards[si]
            # Entries never span WAL files: group the chunks into entries that fit one.
            groups: list[list[Data]] = [[]]
            size = 0
            for c in chunks:
                if groups[-1] and size + len(c) > shard.capacity:
                    groups.append([])
                    size = 0
                groups[-1].append(c)
                size += len(c)
            n_frames = counts[si]
            for g in groups:
                # Frame counts only feed the shard's frame index; give the rest to the last.
                frames = sum(_count_frames(c) for c in g) if len(groups) > 1 else n_frames
                # The chunks stay apart (no joined copy here, on the loop): the writer
                # joins the small ones and writes a large one from its own buffer.
                entry = WalEntry(
                    g[0], frames, False, _log_failure, acked_early=True, more=tuple(g[1:])
                )
                try:
                    if not shard.write_now(entry):
                        shard.submit(entry)
                except (WalFull, WalReadOnly) as exc:
                    # Already acknowledged: the shard must not carry on past this hole.
                    shard.latch(f"could not queue acknowledged frames: {exc!r}")
                    break

    def _write_done(
        self,
        h: Handle,
        topic_id: int,
        ok: bool,
        error: TopicsError | None,
        fsync_ms: float,
        reserved: int,
        window_ms: float = 0.0,
    ) -> None:
        if not ok and self.reserved.get(topic_id, 0) > reserved:
            self.reserved[topic_id] = reserved
        h.throttle_ms = window_ms
        h.settle(ok, error, fsync_ms)

    # ------------------------------------------------------------ topics

    def _log_topic_control(self, ev: Event) -> Handle:
        # TopicCreate, ConfigUpdate, TopicDelete: synced whatever the class.
        return self._event_control(ev)

    def _log_records_deleted(self, ev: RecordsDeleted | SeqsDeleted) -> Handle:
        cls = self._class_of(ev.topic_id)
        if cls == "ephemeral" or (isinstance(ev, SeqsDeleted) and not ev.seqs):
            return DONE
        return self._event_control(ev, sync=cls == "fsync")

    def _log_floors(self, ev: FloorsAdvanced) -> Handle:
        cls = self._class_of(ev.topic_id)
        if cls in ("ephemeral", "memory"):
            return DONE
        # Logged on the side: a read that advanced a floor never waits for it, and
        # never fails because of it (a full or read-only log). Unlogged, the floor
        # is simply logged again with the next advance or kept by the next
        # snapshot; a crash before either only brings evicted records back.
        token = _REQUEST.set(None)
        try:
            h = self._event_control(ev, sync=cls == "fsync")
            self._floor_unlogged = False
            return h
        except TopicsError as exc:
            t = self.topic_of(ev.topic_id)
            (log.debug if self._floor_unlogged else log.warning)(
                "topic %s: floor not logged (%s); logged again with the next advance",
                t.name if t is not None else f"{ev.topic_id:016x}",
                exc.message,
            )
            self._floor_unlogged = True
            return NOT_LOGGED
        finally:
            _REQUEST.reset(token)

    def _log_lease(self, ev: LeaseChanged) -> Handle:
        try:
            return self._event_control(ev)
        except TopicsError:
            return NOT_LOGGED  # lease logging errors are ignored (README: queue leases)

    # ------------------------------------------------------------ routers

    def _log_router(self, ev: RouterPut | RouterDeleted) -> Handle:
        typ, _tid, body, _seq, _ts = control_frame(ev)
        body["op"] = self.router_ops + 1
        h = self._control(self.shards[0], typ, 0, body)
        self.router_ops += 1
        return h

    _LOG: dict[type, Callable[[WalJournal, Any], Handle]] = {
        RecordsAppended: _log_append,
        TopicCreated: _log_topic_control,
        ConfigChanged: _log_topic_control,
        TopicDeleted: _log_topic_control,
        RecordsDeleted: _log_records_deleted,
        SeqsDeleted: _log_records_deleted,
        FloorsAdvanced: _log_floors,
        LeaseChanged: _log_lease,
        RouterPut: _log_router,
        RouterDeleted: _log_router,
    }

    # ------------------------------------------------------------ checkpoints

    def mark(self, shard: int, body: dict[str, Any], ts: int) -> asyncio.Future[WalEntry | None]:
        """Log a CheckpointMark on `shard` (synced); the future gets the written entry.

        Everything submitted to the shard before the mark precedes it in the log,
        and the mark's sync makes all of it durable: the entry's `file`/`offset`/
        `index` are where replay starts for a snapshot taken after it. The future
        gets None when the mark could not be logged. Raises TopicsError (429/500)
        when the shard refuses the submission.
        """
        fut: asyncio.Future[WalEntry | None] = self.loop.create_future()
        loop = self.loop

        def done(e: WalEntry, ok: bool, fsync_ms: float) -> None:
            loop.call_soon_threadsafe(_settle_entry, fut, e if ok else None)

        frame = encode_control(CHECKPOINT_MARK, 0, body, ts=ts, durable=True)
        self._submit(self.shards[shard], WalEntry(frame, 1, True, done))
        return fut

    def bytes_written(self) -> int:
        """WAL bytes written by every shard since open."""
        return sum(s.metrics.bytes_written for s in self.shards)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Log exact heads, drain and sync every shard, then stop their writer threads.

        A clean stop records each `disk` and `ephemeral` topic's exact head, so
        the next start neither pads a disk topic to its reservation nor re-issues
        an ephemeral topic's seqs (README "Durability and the data directory").
        """
        if self._coalesce:
            self.flush()
        for t in list(self.topics()):
            cls = t.config.durability
            if cls in ("disk", "ephemeral") and t.head_seq and t.alive:
                try:
                    self._control(
                        self._shard(t.topic_id),
                        HEAD_WATERMARK,
                        t.topic_id,
                        {"exact": True},
                        seq=t.head_seq,
                        ts=t.last_ts,
                    )
                except TopicsError:
                    pass  # read-only: the next start pads, as after a crash
        for s in self.shards:
            s.close()

    def degraded(self) -> dict[str, Any] | None:
        """What keeps writes from being accepted, or None when they are.

        `{"disk_full": [shard dirs], "read_only": [shard dirs]}` with the empty
        lists left out (README "When the disk fills up").
        """
        full = [s.dir for s in self.shards if s.disk_full]
        ro = [s.dir for s in self.shards if s.read_only]
        if not full and not ro:
            return None
        out: dict[str, Any] = {}
        if full:
            out["disk_full"] = full
        if ro:
            out["read_only"] = ro
        return out

    def metrics(self) -> dict[str, Any]:
        """The `wal` object of the JSON metrics form (docs/API.md, "15.3 `GET /v0/metrics`")."""
        m = [s.metrics for s in self.shards]
        return {
            "fsyncs": sum(x.fsyncs for x in m),
            "frames": sum(x.frames for x in m),
            "batches": sum(x.batches for x in m),
            "bytes_written": sum(x.bytes_written for x in m),
            "rotations": sum(x.rotations for x in m),
            "queue_depth": sum(s.queue_depth for s in self.shards),
            "queue_depth_peak": max((x.queue_depth_peak for x in m), default=0),
            "submit_full_total": sum(x.submit_full for x in m),
            "direct_writes_total": sum(x.direct_writes for x in m),
            "read_only": any(s.read_only for s in self.shards),
            "disk_full": any(s.disk_full for s in self.shards),
            "fsync_count": sum(x.fsyncs for x in m),
            "fsync_micros_total": sum(x.fsync_micros_total for x in m),
        }

    def prometheus_lines(self) -> list[str]:
        """WAL metrics in Prometheus text form (docs/API.md, "15.3 `GET /v0/metrics`")."""
        j = self.metrics()
        out: list[str] = []

        def one(name: str, typ: str, help_: str, value: Any) -> None:
            out.extend((f"# HELP {name} {help_}", f"# TYPE {name} {typ}", f"{name} {int(value)}"))

        one("topics_wal_frames_total", "counter", "WAL frames written.", j["frames"])
        one("topics_wal_batches_total", "counter", "WAL write batches.", j["batches"])
        one("topics_wal_fsyncs_total", "counter", "WAL fdatasync calls.", j["fsyncs"])
        one("topics_wal_bytes_written_total", "counter", "WAL bytes written.", j["bytes_written"])
        one("topics_wal_rotations_total", "counter", "WAL file rotations.", j["rotations"])
        one(
            "topics_wal_submit_full_total",
            "counter",
            "Submissions refused with a full queue.",
            j["submit_full_total"],
        )
        one(
            "topics_wal_direct_writes_total",
            "counter",
            "WAL entries written by the event loop itself, not handed to a writer thread.",
            j["direct_writes_total"],
        )
        one("topics_wal_queue_depth", "gauge", "Queued WAL submissions.", j["queue_depth"])
        one(
            "topics_wal_queue_depth_peak",
            "gauge",
            "Peak queued submissions.",
            j["queue_depth_peak"],
        )
        one("topics_wal_read_only", "gauge", "1 when the WAL is latched read-only.", j["read_only"])
        one(
            "topics_wal_disk_full",
            "gauge",
            "1 while the WAL's disk is full (writes get 507).",
            j["disk_full"],
        )
        name = "topics_wal_fsync_latency_us"
        out.append(f"# HELP {name} WAL fdatasync latency in microseconds.")
        out.append(f"# TYPE {name} histogram")
        hist = [0] * 10
        for s in self.shards:
            for i, c in enumerate(s.metrics.fsync_hist):
                hist[i] += c
        cum = 0
        for b, c in zip(WalMetrics.BUCKETS_US, hist, strict=False):
            cum += c
            out.append(f'{name}_bucket{{le="{b}"}} {cum}')
        cum += hist[-1]
        out.append(f'{name}_bucket{{le="+Inf"}} {cum}')
        out.append(f"{name}_sum {j['fsync_micros_total']}")
        out.append(f"{name}_count {j['fsync_count']}")
        return out


# The control frames logged by the request running in this context (None: no
# request scope, e.g. a test driving the journal directly).
_REQUEST: contextvars.ContextVar[list[asyncio.Future[bool]] | None] = contextvars.ContextVar(
    "topics_journal_request", default=None
)


def _disk_full() -> TopicsError:
    """`507 insufficient_storage`: the WAL's disk is full; nothing was written."""
    return TopicsError(
        507,
        "insufficient_storage",
        "the disk holding the write-ahead log is full; nothing was written; retry later",
        retry_after=5,
    )


def _count_frames(data: Data) -> int:
    """Number of frames in a run of well-formed frames (length prefixes only)."""
    n = 0
    off = 0
    end = len(data)
    while off < end:
        off += 4 + int.from_bytes(data[off : off + 4], "little")
        n += 1
    return n


def _settle(fut: asyncio.Future[bool], h: Handle, ok: bool) -> None:
    try:
        h.settle(ok)
    except Exception:  # pragma: no cover - an engine bug must not wedge the barrier
        log.exception("applying a committed control frame failed")
    if not fut.done():
        fut.set_result(ok)


def _settle_entry(fut: asyncio.Future[WalEntry | None], e: WalEntry | None) -> None:
    if not fut.done():
        fut.set_result(e)


def exact_head_topics(engine: Engine) -> list[Topic]:
    """Topics whose exact head a clean stop records: all but router destinations.

    A destination's head counts derived copies, which are not in the WAL; recovery
    re-derives them at the same seqs only if its head is not padded over them.
    """
    routers = engine.routers
    return [t for t in engine.topics.values() if routers is None or not routers.feeding(t.name)]


def _log_failure(e: WalEntry, ok: bool, fsync_ms: float) -> None:
    if not ok:
        log.error("control frame could not be logged: %s", e.error)


def open_shards(fs: Fs, data_dir: str, n: int, **kw: Any) -> list[WalShard]:
    """Open (and repair) the shards of the current layout; see :func:`shard_dirs`."""
    return [WalShard.open(fs, d, **kw)[0] for d in shard_dirs(data_dir, n)]
