"""Durable storage wired to an engine: recovery, the WAL journal, the checkpointer.

`topics serve` and the fault-test harness open storage the same way, through
:meth:`Storage.open`: recover the data directory into a fresh engine (the
WAL shards stay open), install the :class:`~topics.storage.journal.WalJournal`
as the engine's journal, and hand the recovered segment stores to a
:class:`~topics.storage.checkpoint.Checkpointer`. A shard-count change is
absorbed by a checkpoint before the engine serves (so two layout changes never
pile up unabsorbed). :meth:`Storage.close` is the graceful stop (routers
drained, a final checkpoint with exact heads, shards synced and stopped);
:meth:`Storage.abort` stops the threads without writing anything more (a test's
simulated crash).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topics.engine.core import Engine
from topics.storage.checkpoint import CheckpointConfig, Checkpointer, CheckpointFailed
from topics.storage.fs import Fs
from topics.storage.journal import WalJournal
from topics.storage.objstore import is_object_url
from topics.storage.recovery import RecoveryReport, recover_async

__all__ = ["StorageConfig", "Storage"]

log = logging.getLogger("topics.storage")


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Where and how to keep data: the data dir, WAL shard count, checkpoint knobs.

    `shard_kw` goes to :class:`~topics.storage.wal.WalShard` (`file_bytes`,
    `sync_interval_s`, `queue_max`).
    """

    data_dir: str
    shards: int
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    shard_kw: dict[str, Any] = field(default_factory=dict)
    cold_dir: str | None = None


class Storage:
    """An engine's open durable storage (one per process and data directory)."""

    def __init__(
        self,
        engine: Engine,
        fs: Fs,
        journal: WalJournal,
        checkpointer: Checkpointer,
        report: RecoveryReport,
    ) -> None:
        self.engine = engine
        self.fs = fs
        self.journal = journal
        self.checkpointer = checkpointer
        self.report = report
        self.closed = False

    @classmethod
    async def open(
        cls,
        engine: Engine,
        fs: Fs,
        config: StorageConfig,
        *,
        progress: Callable[[float], None] | None = None,
    ) -> Storage:
        """Recover `config.data_dir` into `engine` (fresh) and install durable storage.

        Raises OSError when the directory cannot be read or repaired, and
        CheckpointFailed when a shard-count change cannot be absorbed.
        """
        if config.cold_dir and is_object_url(config.cold_dir):
            # Cold segments are then object urls: reads of them go to the object store.
            from topics.storage.objstore import fs_for

            fs = fs_for(fs, config.cold_dir)
        shards, report = await recover_async(
            engine,
            fs,
            config.data_dir,
            config.shards,
            progress=progress,
            cold_dir=config.cold_dir,
            **config.shard_kw,
        )
        journal = WalJournal(shards, asyncio.get_running_loop(), reserved=report.reserved)
        journal.router_ops = report.router_ops
        journal.bind(engine)
        engine.journal = journal
        ck = Checkpointer(
            engine,
            journal,
            fs,
            config.data_dir,
            config.checkpoint,
            stores=report.stores,
            absorbed=report.absorbed,
            cold_dir=config.cold_dir,
        )
        st = cls(engine, fs, journal, ck, report)
        if report.layout_changed:
            try:
                await ck.checkpoint()
            except BaseException:
                await asyncio.to_thread(journal.close)
                raise
        elif report.records or config.cold_dir:
            # Move the replayed records into segments soon; with a cold tier, the
            # first cycle also queues the segments beyond hot retention, even on
            # a data dir that nothing writes to.
            ck.force_next()
        return st

    def start(self) -> None:
        """Start periodic checkpoints (call on the serving loop)."""
        self.checkpointer.start()

    async def checkpoint(self) -> Any:
        """Run one checkpoint cycle now; returns its report. Raises CheckpointFailed."""
        return await self.checkpointer.checkpoint()

    async def close(self) -> None:
        """Graceful stop: drain routers, final checkpoint (exact heads), stop the shards.

        A failing final checkpoint is logged; the WAL still holds everything.
        """
        if self.closed:
            return
        self.closed = True
        await self.checkpointer.stop()
        if self.engine.routers is not None:
            self.engine.routers.drain_all()
        try:
            await self.checkpointer.checkpoint(final=True)
        except (CheckpointFailed, OSError) as exc:
            log.error("final checkpoint failed (the WAL keeps everything): %s", exc)
        await asyncio.to_thread(self.journal.close)

    async def abort(self) -> None:
        """Stop without writing anything more (the crash tests' power cut)."""
        if self.closed:
            return
        self.closed = True
        await self.checkpointer.stop()
        await asyncio.to_thread(self.journal.close)
