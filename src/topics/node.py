"""The composition root: one topics node built from a :class:`~topics.config.ServerConfig`.

A :class:`Node` owns everything the shells share (docs/ARCHITECTURE.md,
"Layers"): the clock, the engine with its routers, queues and watch registry,
the authenticator, durable storage (recovered through
:meth:`topics.storage.runtime.Storage.open`) or none at all (memory mode), and
the background work. Shells (the HTTP app, the Kafka listener) receive a Node;
they never build these parts themselves.

Background work owned here:

* router forwarding driven by publication: a record published by any shell
  schedules its routers' forwarding on the loop (`RouterSet.schedule`), off the
  writer's acknowledgment path (docs/ARCHITECTURE.md, "The write path");
* the stalled-source retry pass: every :data:`ROUTER_RETRY_S` seconds the
  sources that could not move (a full `discard:"reject"` dest) are retried;
* periodic checkpoints (durable mode; the storage's checkpointer).

Retention, lease expiry and idle watch-session GC are applied by the engine
when a topic, queue or session is next touched; they need no timer.

Lifecycle: ``Node(config)`` builds the parts (nothing is touched on disk);
:meth:`Node.lock` takes the data directory's lock (durable mode);
``await start()`` recovers the data directory and starts the background work;
``await stop()`` is the graceful end (routers drained, the final checkpoint,
the lock released); ``await abort()`` stops without writing anything more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from topics.auth import Authenticator
from topics.clock import Clock, SystemClock
from topics.config import ServerConfig
from topics.delivery import Delivery
from topics.engine.core import Engine
from topics.engine.queues import Queues
from topics.engine.routers import RouterSet
from topics.engine.scheduler import LATENCY_CEILING_MS, TOP_BAND, band_of
from topics.engine.watch import WatchRegistry
from topics.errors import TopicsError
from topics.storage.segstore import Tier

if TYPE_CHECKING:
    from topics.engine.frames import FrameSource
    from topics.engine.topic import PendingWrite
    from topics.storage.fs import Fs
    from topics.storage.journal import WalJournal
    from topics.storage.lock import DataDirLock
    from topics.storage.recovery import RecoveryReport
    from topics.storage.runtime import Storage, StorageConfig

__all__ = ["Node", "ROUTER_RETRY_S", "storage_config", "wait_published"]

log = logging.getLogger("topics")

#: Seconds between two retries of the router sources that could not move.
ROUTER_RETRY_S = 0.05
#: Share of a WAL shard's ingest queue (TOPICS_* `queue_max`, 4096 entries) at
#: which the governor may refuse writes; the whole queue is the hard bound that
#: refuses every write (docs/SCHEDULER.md, "The ladder").
QUEUE_FULL_SHARE = 0.5
#: What a write refused under pressure is told to wait (ms).
RETRY_AFTER_MS = 200


def storage_config(cfg: ServerConfig) -> StorageConfig:
    """The durable-storage settings of `cfg` (README.md "Configuration").

    Checkpoint triggers are checked every 5 s, or 4 times per checkpoint
    interval when that is shorter (at least every 20 ms).
    """
    from topics.storage.checkpoint import CheckpointConfig
    from topics.storage.runtime import StorageConfig

    return StorageConfig(
        cfg.data_dir,
        cfg.wal_shards,
        CheckpointConfig(
            segment_max_events=cfg.segment_max_events,
            segment_max_bytes=cfg.segment_max_bytes,
            segment_max_age_ms=cfg.segment_max_age_ms,
            hot_retain_segments=cfg.hot_retain_segments,
            hot_retain_bytes=cfg.hot_retain_bytes,
            relocate_bytes_per_s=cfg.relocate_bytes_per_s,
            interval_ms=cfg.checkpoint_interval_ms,
            wal_bytes=cfg.checkpoint_wal_bytes,
            check_s=min(5.0, max(0.02, cfg.checkpoint_interval_ms / 4000))
            if cfg.checkpoint_interval_ms
            else 5.0,
        ),
        {"file_bytes": cfg.wal_file_bytes},
        cold_dir=cfg.cold_dir,
    )


class Node:
    """One server instance: the engine and its parts, storage, background work.

    Attributes the shells use: `config`, `clock`, `engine`, `routers`, `queues`,
    `watches`, `auth` (the :class:`~topics.auth.Authenticator` of
    `config.api_keys`), `storage` (the open
    :class:`~topics.storage.runtime.Storage`, None in memory mode or before
    :meth:`start`), `wal` (the WAL journal the engine commits through, None in
    memory mode), `ready` (False while recovery runs: data routes answer 503),
    `replay_progress` (0.0-1.0), `started` (``time.monotonic()`` at
    construction, s) and `shell_metrics` (sections a shell adds to
    `/v0/metrics`: name -> a function returning that section's JSON object;
    the Kafka listener registers `"kafka"` while it runs, so the HTTP shell can
    show it without importing the Kafka shell).

    `durable` False is memory mode: nothing is read or written on disk and
    the node is ready at once. `fs` is the filesystem durable storage goes
    through (a :class:`~topics.storage.fs.RealFs` by default);
    `router_retry_s` the period of the stalled-source retry pass (s).
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Clock | None = None,
        durable: bool = False,
        fs: Fs | None = None,
        router_retry_s: float = ROUTER_RETRY_S,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.durable = durable
        if durable and fs is None:
            from topics.storage.fs import RealFs

            fs = RealFs()
        self.fs = fs
        self.engine = Engine(clock=self.clock, limits=config.limits, fs=fs)
        self.routers = RouterSet(self.engine)
        self.queues = Queues(self.engine)
        self.watches = WatchRegistry(self.engine)
        self.delivery = Delivery(
            self.engine,
            self.clock,
            fifo=config.scheduler == "fifo",
            pool_busy=self._pool_busy,
            set_commit_window=self._set_commit_window,
        )
        self.auth = Authenticator(config.api_keys)
        self.storage: Storage | None = None
        self.wal: WalJournal | None = None
        self.ready = not durable
        self.replay_progress = 0.0 if durable else 1.0
        self.started = time.monotonic()
        self.shell_metrics: dict[str, Callable[[], dict[str, Any]]] = {}
        self.router_retry_s = router_retry_s
        self._lock: DataDirLock | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._forwarding: set[asyncio.Task[None]] = set()
        self.running = False

    @classmethod
    def memory(cls, config: ServerConfig | None = None, *, clock: Clock | None = None) -> Node:
        """A memory-mode node (nothing on disk), ready at once; `config` defaults to ServerConfig()."""
        return cls(config or ServerConfig(), clock=clock)

    # ------------------------------------------------------------ lifecycle

    def lock(self) -> None:
        """Take the data directory's lock, creating the directory (durable mode only).

        Raises :class:`~topics.storage.lock.DataDirError` when the directory is
        unusable or :class:`~topics.storage.lock.DataDirLocked` when another
        process holds it (README.md "Durability and the data directory").
        """
        if not self.durable or self._lock is not None:
            return
        from topics.storage.lock import DataDirLock

        self._lock = DataDirLock(self.config.data_dir)

    async def start(self) -> None:
        """Recover the data directory (durable mode), then start the background work.

        Durable mode takes the lock first when :meth:`lock` was not called,
        replays the data directory while `replay_progress` moves from 0 to 1,
        installs the WAL journal and starts periodic checkpoints; `ready` is
        left to the caller (``topics serve`` sets it once every listener is
        up). Raises what :meth:`lock` and `Storage.open` raise (DataDirError,
        OSError, CheckpointFailed...); call :meth:`abort` then.
        """
        if self.running:
            return
        if self.durable:
            self.lock()
            from topics.storage.runtime import Storage

            assert self.fs is not None
            storage = await Storage.open(
                self.engine, self.fs, storage_config(self.config), progress=self._on_progress
            )
            self.storage = storage
            self.wal = storage.journal
            self.replay_progress = 1.0
            _log_recovery(storage.report)
            storage.start()
        loop = asyncio.get_running_loop()
        self.delivery.start(loop)
        # Publication schedules forwarding (whichever shell wrote); the periodic
        # pass only retries sources that could not move.
        self.routers.schedule = self._schedule_forwarding
        self._tasks.append(loop.create_task(self._router_retry()))
        self.running = True

    async def stop(self) -> None:
        """Graceful stop: background work ends, routers drain, storage closes, lock released.

        Durable mode runs a final checkpoint with exact heads (a failing one is
        logged; the WAL keeps everything). Call it after the shells stopped
        taking requests. Idempotent.
        """
        await self._stop_background()
        self.routers.drain_all()
        if self.storage is not None:
            await self.storage.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    async def abort(self, *, discard: bool = False) -> None:
        """Stop without writing anything more (a failed start, a simulated crash).

        With `discard` the lock is discarded: what this start added to the data
        directory (recovery's files, the lock file, directories it created) is
        removed again, so a failed ``topics serve`` leaves nothing behind.
        Otherwise the lock is released.
        """
        await self._stop_background()
        if self.storage is not None:
            await self.storage.abort()
        if self._lock is not None:
            if discard:
                self._lock.discard()
            else:
                self._lock.release()
            self._lock = None

    async def _stop_background(self) -> None:
        self.running = False
        self.delivery.stop()
        self.routers.schedule = None
        tasks = self._tasks + list(self._forwarding)
        self._tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    def write_pace(self, topic: str, bypass: bool, *, refuse: bool = True) -> float:
        """The ladder's word on a write to `topic` (docs/SCHEDULER.md, "The ladder"):
        how long it must wait before it is staged (ms; 0.0 almost always).

        Raises TopicsError `429 throttled` (`Retry-After`, `detail
        {"retry_after_ms"}`) while the server is saturated: pressure near 1,
        high long enough to defer, and an ingest queue full (a WAL shard's queue
        at :data:`QUEUE_FULL_SHARE` of its bound, or requests waiting for the
        event loop as long as the latency ceiling). With `refuse=False` (a Kafka
        producer is throttled, never refused) that refusal is returned as a
        wait of :data:`RETRY_AFTER_MS` instead. Otherwise a write is paced
        while the governor's pace is up, its topic is below the top band and a
        higher band published while pacing within the last second (alone, a
        flood of equals is not slowed). Nothing of this with `bypass`
        (`disable_backpressure`) or for a topic of the top band. Changes nothing.
        """
        d = self.delivery
        g = d.governor
        if bypass or (not g.pace and not g.deferring):
            return 0.0  # the common case ends here
        t = self.engine.topics.get(topic)
        band = d.band(t) if t is not None else band_of(0)
        if band == TOP_BAND:
            return 0.0
        if g.deferring:
            full = self._wal_fill() >= QUEUE_FULL_SHARE or g.ingest_ms >= LATENCY_CEILING_MS
            if g.refuse_write(full):
                if not refuse:
                    return float(RETRY_AFTER_MS)
                d.rejected += 1
                raise TopicsError(
                    429,
                    "throttled",
                    "the server is saturated; retry later (or write with disable_backpressure)",
                    {"retry_after_ms": RETRY_AFTER_MS},
                )
        if not g.pace or not d.urgent_above(band):
            return 0.0
        wait_ms = g.pace_ms_for(band)
        if wait_ms > 0:
            d.paced += 1
        return wait_ms

    async def admit_write(self, topic: str, bypass: bool) -> float:
        """:meth:`write_pace`, then the wait it asks for; returns the wait (ms)."""
        wait_ms = self.write_pace(topic, bypass)
        if wait_ms > 0:
            await asyncio.sleep(wait_ms / 1000)
        return wait_ms

    def _wal_fill(self) -> float:
        """The fullest WAL shard's ingest queue, as a share of its bound (0 in memory mode)."""
        wal = self.wal
        if wal is None:
            return 0.0
        return max((sh.queue_depth / max(sh.queue_max, 1) for sh in wal.shards), default=0.0)

    def _pool_busy(self) -> float:
        """The governor's pool signal: the busier of the read pool and the WAL ingest queues."""
        from topics.storage.reads import read_pool

        return max(read_pool.busy_share(), self._wal_fill())

    def _set_commit_window(self, seconds: float) -> None:
        wal = self.wal
        if wal is not None:
            for sh in wal.shards:
                sh.commit_window_s = seconds

    def _on_progress(self, fraction: float) -> None:
        self.replay_progress = fraction

    def _schedule_forwarding(self, drain: Callable[[], object]) -> None:
        """Run a forwarding pass soon: on the next turn of the loop when every record
        it reads is in memory, else once the segment spans it reads are warm
        (a pass changes state as it reads, so it cannot stop for the disk)."""
        if self.delivery.defer_routers(lambda: self._forward(drain)):
            return  # the lowest band is deferred: forwarding waits a band below its sources
        self._forward(drain)

    def _forward(self, drain: Callable[[], object]) -> None:
        loop = asyncio.get_running_loop()
        spans = self.routers.pending_spans()
        if not spans:
            loop.call_soon(drain)
            return
        task = loop.create_task(self._warm_then(spans, drain))
        self._forwarding.add(task)
        task.add_done_callback(self._forwarding.discard)

    @staticmethod
    async def _warm_then(
        spans: list[tuple[FrameSource, int, int]], drain: Callable[[], object]
    ) -> None:
        from topics.storage.reads import read_pool

        try:
            await read_pool.warm(spans)
        finally:
            drain()  # even when stopped meanwhile: the pass must not stay scheduled

    async def _router_retry(self) -> None:
        """Retry stalled router sources every `router_retry_s` (publication schedules the rest)."""
        while True:
            await asyncio.sleep(self.router_retry_s)
            if self.delivery.governor.deferring:
                continue  # forwarding is deferred with the lowest band
            try:
                self.routers.drain_dirty()
            except Exception:  # pragma: no cover - logged, the pass keeps going
                log.exception("router retry pass failed")

    # ------------------------------------------------- the commit log, per request

    def open_request(self) -> Any:
        """Start a request's scope on the WAL journal; the token for :meth:`close_request`.

        Control frames a request logs inside its scope are the ones
        :meth:`barrier` waits for (docs/ARCHITECTURE.md, "The write path").
        None in memory mode.
        """
        wal = self.wal
        return wal.open_request() if wal is not None else None

    def close_request(self, token: Any) -> None:
        """End the scope :meth:`open_request` returned `token` for (None: nothing to end)."""
        if token is not None and self.wal is not None:
            self.wal.close_request(token)

    def has_pending_controls(self) -> bool:
        """True while control frames of this request are not yet committed (False in memory mode)."""
        wal = self.wal
        return wal is not None and wal.has_pending_controls()

    async def barrier(self) -> None:
        """Wait until the control frames this request logged are durable (no-op in memory mode).

        Raises TopicsError `500 internal` when one of them could not be logged.
        """
        wal = self.wal
        if wal is not None:
            await wal.barrier()

    # ------------------------------------------------------------ state for probes

    def degraded(self) -> dict[str, list[str]] | None:
        """Why writes cannot be committed, or None (always None in memory mode).

        `{"disk_full": [shard dirs], "read_only": [shard dirs]}` with the empty
        lists left out (README.md "When the disk fills up").
        """
        wal = self.wal
        return wal.degraded() if wal is not None else None

    def wal_metrics(self) -> dict[str, Any] | None:
        """The `wal` object of the JSON metrics (docs/API.md, "15.3 `GET /v0/metrics`"); None in memory mode."""
        wal = self.wal
        return wal.metrics() if wal is not None else None

    def wal_prometheus_lines(self) -> list[str]:
        """The WAL series in Prometheus text form (docs/API.md, "15.3 `GET /v0/metrics`"); empty in memory mode."""
        wal = self.wal
        return wal.prometheus_lines() if wal is not None else []

    def storage_stats(self) -> dict[str, Any]:
        """Index and checkpoint figures (ours, beyond the /v0 contract): bytes in ints, times in s.

        `index_bytes` is what the per-topic slot arrays hold (capacity included),
        `index_slots` their length, `chunk_bytes` the in-memory frames not yet
        copied into segments; durable mode adds `segments`, `cold_segments`,
        `reclaimed_segments`, `reclaimed_bytes`, `checkpoints`, `checkpoint_failures`, `last_checkpoint` (once one ran) and
        `recovery`, and with a cold tier `relocated_segments`,
        `relocation_copied_bytes`, `relocation_failures` and `relocation_queued`
        (docs/API.md, "15.3 `GET /v0/metrics`").
        """
        topics = self.engine.topics.values()
        out: dict[str, Any] = {
            "index_bytes": sum(t.index.nbytes() for t in topics),
            "index_slots": sum(len(t.index) for t in topics),
            "chunk_bytes": sum(t.chunk_bytes() for t in topics),
        }
        storage = self.storage
        if storage is None:
            return out
        ck = storage.checkpointer
        out["segments"] = sum(len(st.segs) for st in list(ck.stores.values()))
        out["checkpoints"] = ck.cycles
        out["checkpoint_failures"] = ck.failures
        out["cold_segments"] = sum(
            1 for st in list(ck.stores.values()) for g in list(st.segs) if g.tier is Tier.COLD
        )
        out["reclaimed_segments"] = ck.reclaimed
        out["reclaimed_bytes"] = ck.reclaimed_bytes
        rel = ck.relocator
        if rel is not None:
            out["relocated_segments"] = ck.relocated
            out["relocation_copied_bytes"] = rel.copied_bytes
            out["relocation_failures"] = rel.failed
            out["relocation_queued"] = rel.queued
        last = ck.last
        if last is not None:
            out["last_checkpoint"] = {
                "snapshot": last.snapshot,
                "records": last.records,
                "bytes": last.bytes,
                "sealed": last.sealed,
                "dropped": last.dropped,
                "flips": last.flips,
                "wal_files_pruned": last.wal_pruned,
                "seconds": round(last.seconds, 4),
            }
        rep = storage.report
        out["recovery"] = {
            "snapshot": rep.snapshot,
            "segment_records": rep.segment_records,
            "wal_records": rep.records,
            "wal_frames": rep.frames,
            "seconds": round(rep.seconds, 4),
        }
        return out


async def wait_published(pw: PendingWrite) -> None:
    """Wait until a staged batch has been published: its commit point passed, as its
    durability class says (docs/ARCHITECTURE.md, "The write path"). Every shell
    that writes waits so before it answers."""
    if pw.published:
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not fut.done():
            fut.set_result(None)

    pw.waiters.append(done)
    await fut


def _log_recovery(report: RecoveryReport) -> None:
    log.info(
        "recovered %d topics: snapshot %d, %d records from %d segment files, "
        "%d records from %d WAL frames in %d shard(s), in %.3f s%s",
        report.topics,
        report.snapshot,
        report.segment_records,
        report.segments,
        report.records,
        report.frames,
        report.shards,
        report.seconds,
        f"; torn tails truncated: {report.torn}" if report.torn else "",
    )
