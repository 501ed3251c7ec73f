"""An in-process server on the real filesystem: Engine + Storage over RealFs.

The counterpart of :mod:`tests.support.durable` for resource tests that need real
file descriptors, real ``mmap`` and real page cache (a FakeDisk keeps every byte
in the test's own memory, so it cannot show either). It wires what a durable
:class:`topics.node.Node` wires (engine, routers, queues, recovery, WAL journal,
checkpointer) but not the node's data-directory lock or background work, on a
private event loop that runs only while a call waits: the test decides when
anything runs, and counts file descriptors without the lock's.

Tests that must run under a lowered ``RLIMIT_NOFILE`` or measure RSS use it in a
child process of their own (see ``tests/fault/test_resource_bounds.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tests.support.process import TEST_WAL_FILE_BYTES
from topics.clock import SystemClock
from topics.engine.core import DiffParams, Engine, Replay
from topics.engine.queues import Queues
from topics.engine.routers import RouterSet
from topics.engine.topic import PendingWrite
from topics.storage.checkpoint import CheckpointConfig, CheckpointReport
from topics.storage.fs import RealFs
from topics.storage.runtime import Storage, StorageConfig

__all__ = ["RealStore", "open_fds", "proc_status_kib"]


def open_fds(pid: int | str = "self") -> int:
    """Number of open file descriptors of process `pid` (counts `/proc/PID/fd`)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_status_kib(field: str, pid: int | str = "self") -> int:
    """A `kB` field of `/proc/PID/status` (e.g. ``VmRSS``, ``VmHWM``), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class RealStore:
    """One engine generation on `data_dir` (RealFs); use as a context manager."""

    def __init__(
        self,
        data_dir: str,
        *,
        shards: int = 2,
        checkpoint: CheckpointConfig | None = None,
        sync_interval_s: float = 0.005,
        timeout_s: float = 120.0,
        wal_file_bytes: int = TEST_WAL_FILE_BYTES,
    ) -> None:
        self.data_dir = data_dir
        self.cfg = StorageConfig(
            data_dir,
            shards,
            # Periodic checkpoints off: the test decides when one runs.
            checkpoint or CheckpointConfig(interval_ms=0, wal_bytes=0),
            {"sync_interval_s": sync_interval_s, "file_bytes": wal_file_bytes},
        )
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Engine | None = None
        self.storage: Storage | None = None

    def __enter__(self) -> RealStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Recover the data dir and install the WAL journal (raises what recovery raises)."""
        self.loop = asyncio.new_event_loop()
        engine = Engine(clock=SystemClock(), fs=RealFs())
        RouterSet(engine)
        Queues(engine)
        self.storage = self.loop.run_until_complete(Storage.open(engine, RealFs(), self.cfg))
        self.engine = engine

    def close(self) -> None:
        """Graceful stop: final checkpoint, WAL writers drained."""
        self._stop(graceful=True)

    def abort(self) -> None:
        """Stop without a final checkpoint (the WAL writers are drained)."""
        self._stop(graceful=False)

    def _stop(self, *, graceful: bool) -> None:
        if self.storage is not None and self.loop is not None:
            self.run(self.storage.close() if graceful else self.storage.abort())
        self.storage = None
        self.engine = None
        if self.loop is not None:
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
            self.loop = None

    def run(self, coro: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(asyncio.wait_for(coro, self.timeout_s))

    def eng(self) -> Engine:
        assert self.engine is not None, "not open"
        return self.engine

    def checkpoint(self) -> CheckpointReport:
        """One checkpoint cycle now; raises CheckpointFailed."""
        assert self.storage is not None
        rep: CheckpointReport = self.run(self.storage.checkpoint())
        return rep

    def write_many(
        self, writes: Sequence[tuple[str, Sequence[Mapping[str, Any]], Mapping[str, Any] | None]]
    ) -> list[tuple[int, int]]:
        """Stage every write (topic, records, create-config) back to back, wait for all.

        Returns `(first_seq, last_seq)` per write; raises AssertionError when one
        was not acknowledged (TopicsError when it was refused).
        """
        eng = self.eng()
        pws: list[PendingWrite] = []
        for topic, records, config in writes:
            body: dict[str, Any] = {"records": [dict(r) for r in records]}
            if config is not None:
                body["config"] = dict(config)
            res = eng.begin_write(topic, eng.parse_write(body, None))
            assert not isinstance(res, dict), "unexpected idempotent replay"
            pws.append(res.pending if isinstance(res, Replay) else res)
        self._wait(pws)
        out: list[tuple[int, int]] = []
        for pw in pws:
            assert pw.ok, f"write to {pw.topic.name} failed"
            out.append((pw.first_seq, pw.last_seq))
        return out

    def _wait(self, pws: Sequence[PendingWrite]) -> None:
        loop = self.loop
        assert loop is not None
        futs: list[asyncio.Future[None]] = []
        for pw in pws:
            if pw.published:
                continue
            fut: asyncio.Future[None] = loop.create_future()

            def done(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)

            pw.waiters.append(done)
            futs.append(fut)
        if futs:
            self.run(asyncio.gather(*futs))

    def read_all(self, topic: str, *, budget: int = 8_388_608) -> list[dict[str, Any]]:
        """Every live record of `topic` in seq order, rendered as the wire objects."""
        eng = self.eng()
        out: list[dict[str, Any]] = []
        cur = 0
        while True:
            _t, r = eng.diff(
                topic, DiffParams(from_seq=cur, limit=1000, include_tags=True, budget=budget)
            )
            out.extend(orjson.loads(b) for b in r.records)
            if r.next_from_seq <= cur or r.caught_up:
                return out
            cur = r.next_from_seq
