"""A durable in-process server for fault tests: real Engine + WAL on a fake disk.

:class:`Durable` wires exactly what ``topics.cli._serve`` wires — an
:class:`~topics.engine.core.Engine` with its router and queue layers,
:func:`~topics.storage.recovery.recover_async` over the data directory, then a
:class:`~topics.storage.journal.WalJournal` installed as the engine's journal —
but on an injected :class:`~topics.storage.fs.Fs` (a
:class:`~tests.support.fakedisk.FakeDisk`, optionally under a
:class:`~tests.support.fakedisk.FaultFs`) and inside a private asyncio event loop
that the harness runs only while it waits for something. Tests stay synchronous.

What it adds on top of the production wiring:

* every WAL submission is tracked, so :meth:`Durable.settle` can wait until the
  writer threads have completed everything submitted so far (control frames such
  as TopicCreate are fire-and-forget in the engine). A workload that settles
  after each step is a deterministic sequence of fs ops, which is what a
  crash-point sweep needs;
* a :class:`History` of every write attempt (the seqs the engine staged, the
  record bytes, the outcome), every acknowledged delete and topic create, and
  :func:`check_oracle`, the set oracle ``acked ⊆ survivors ⊆ attempted`` with
  all-or-nothing batches, per-epoch prefix density and "deleted never returns";
* crash/restart helpers that always stop the writer threads (a frozen FakeDisk
  raises EIO, which the writers turn into failed batches, so closing never
  hangs; a watchdog turns a hang into a test failure anyway).

Nothing here is production code: it reaches into the shards only to count
submissions and to post an empty sync barrier.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.support.clock import TestClock
from tests.support.fakedisk import FakeDisk, MonitorFs, _find_disk
from topics.engine.core import DiffParams, Engine, Replay
from topics.engine.queues import Queues
from topics.engine.routers import RouterSet
from topics.engine.topic import PendingWrite
from topics.errors import TopicsError
from topics.storage.checkpoint import CheckpointConfig, CheckpointReport
from topics.storage.fs import Fs
from topics.storage.journal import WalJournal, shard_of
from topics.storage.recovery import RecoveryReport
from topics.storage.runtime import Storage, StorageConfig
from topics.storage.wal import WalEntry, WalReadOnly, WalShard

__all__ = [
    "DATA_DIR",
    "Batch",
    "Durable",
    "GateFs",
    "HarnessHang",
    "History",
    "Staged",
    "WriteOutcome",
    "check_oracle",
    "data_of",
    "fingerprint_equal",
    "make_records",
]

DATA_DIR = "/data"
FILE_BYTES = 64 * 1024
TIMEOUT_S = 10.0


class HarnessHang(AssertionError):
    """Something the harness waited for never happened (a lost wakeup or a hang)."""


@dataclass
class WriteOutcome:
    """What a write returned: the ack body, or the error status/code.

    `first_seq`/`last_seq` are the seqs the engine staged for the batch; they are
    known even when the commit failed (None when the write was refused before
    staging, e.g. a read-only WAL).
    """

    topic: str
    ok: bool
    status: int
    code: str = ""
    ack: dict[str, Any] | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    datas: list[bytes] = field(default_factory=list)

    @property
    def seqs(self) -> list[int]:
        if self.first_seq is None or self.last_seq is None:
            return []
        return list(range(self.first_seq, self.last_seq + 1))


@dataclass
class Staged:
    """A write submitted with :meth:`Durable.submit`, waiting for :meth:`Durable.wait`."""

    out: WriteOutcome
    pw: PendingWrite | None
    batch: Batch | None


@dataclass
class Batch:
    """One write attempt in the history."""

    id: int
    epoch: int
    topic: str
    durability: str
    first_seq: int | None
    datas: list[bytes]  # compact JSON of each record's data
    ok: bool | None  # True acked, False failed; None: outcome unknown (crash mid-wait)
    status: int = 0

    @property
    def seqs(self) -> list[int]:
        if self.first_seq is None:
            return []
        return list(range(self.first_seq, self.first_seq + len(self.datas)))


@dataclass
class History:
    """Everything a test did, for the oracle.

    An epoch is one open engine (a run between two recoveries). Deletes are the
    (topic, seq) pairs an acknowledged, settled delete removed; `created` the
    topics whose TopicCreate was committed (settled ok).
    """

    batches: list[Batch] = field(default_factory=list)
    deleted: set[tuple[str, int]] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)  # name -> durability
    epoch: int = 0
    last_id: int = 0

    def add(self, b: Batch) -> None:
        self.batches.append(b)

    def next_id(self) -> int:
        self.last_id += 1
        return self.last_id

    def acked(self, topic: str | None = None) -> list[Batch]:
        return [b for b in self.batches if b.ok and (topic is None or b.topic == topic)]

    def attempted(self) -> dict[tuple[str, int], list[tuple[bytes, Batch]]]:
        """(topic, seq) -> every (data, batch) ever staged at that seq."""
        out: dict[tuple[str, int], list[tuple[bytes, Batch]]] = {}
        for b in self.batches:
            if b.first_seq is None:  # refused before staging: no seqs
                continue
            for s, d in zip(b.seqs, b.datas, strict=True):
                out.setdefault((b.topic, s), []).append((d, b))
        return out


def make_records(prefix: str, n: int, size: int = 24) -> list[dict[str, Any]]:
    """`n` wire records with unique, recognisable data (`{"u": uid, "p": filler}`)."""
    return [{"data": {"u": f"{prefix}.{i}", "p": "x" * size}} for i in range(n)]


def data_of(rec: Mapping[str, Any]) -> bytes:
    """Compact JSON of a rendered record's `data` (how the oracle compares bytes)."""
    return orjson.dumps(rec["data"])


class _Tracker:
    """Counts WAL submissions in flight across all shards (thread-safe)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inflight = 0
        self.failed: list[WalEntry] = []
        self.completed = 0

    def wrap(self, shard: WalShard) -> None:
        real = shard.submit

        def submit(entry: WalEntry) -> None:
            inner = entry.done

            def done(e: WalEntry, ok: bool, ms: float) -> None:
                try:
                    inner(e, ok, ms)
                finally:
                    with self.cond:
                        self.inflight -= 1
                        self.completed += 1
                        if not ok:
                            self.failed.append(e)
                        self.cond.notify_all()

            entry.done = done
            with self.cond:
                self.inflight += 1
            try:
                real(entry)
            except BaseException:
                with self.cond:
                    self.inflight -= 1
                raise

        shard.submit = submit  # type: ignore[method-assign]


class Durable:
    """One engine generation after another on the same (fake) disk.

    ``fs`` is what the storage code sees (a FakeDisk, or a FaultFs over one);
    with ``monitor`` it is additionally wrapped in a :class:`MonitorFs` whose
    ordering violations fail :meth:`close`. Call :meth:`open` to recover and
    start serving; :meth:`crash_and_recover` / :meth:`restart` start the next
    generation. Use as a context manager (or call :meth:`shutdown`) so the writer
    threads always stop.
    """

    def __init__(
        self,
        fs: Fs,
        *,
        shards: int = 2,
        data_dir: str = DATA_DIR,
        file_bytes: int = FILE_BYTES,
        sync_interval_s: float = 0.002,
        timeout_s: float = TIMEOUT_S,
        monitor: bool = True,
        clock: TestClock | None = None,
        history: History | None = None,
        segment_max_events: int = 64,
        cold_dir: str | None = None,
        full_retry_s: float = 0.05,
        hot_retain_segments: int = 4,
        hot_retain_bytes: int = 0,
    ) -> None:
        disk = _find_disk(fs)
        if disk is None:
            raise TypeError("Durable needs a FakeDisk underneath its fs")
        self.disk: FakeDisk = disk
        self.base_fs = fs
        self.monitor = MonitorFs(fs) if monitor else None
        self.fs: Fs = self.monitor if self.monitor is not None else fs
        self.n_shards = shards
        self.data_dir = data_dir
        self.shard_kw: dict[str, Any] = {
            "file_bytes": file_bytes,
            "sync_interval_s": sync_interval_s,
            "full_retry_s": full_retry_s,
        }
        self.timeout_s = timeout_s
        # One checkpoint I/O thread: the order of file operations (and so every
        # crash point) stays deterministic.
        # Copies to the cold tier run inside the cycle for the same reason.
        self.checkpoint_cfg = CheckpointConfig(
            segment_max_events=segment_max_events,
            io_threads=1,
            hot_retain_segments=hot_retain_segments,
            hot_retain_bytes=hot_retain_bytes,
            relocate_bytes_per_s=0,
            relocate_threads=0,
        )
        self.cold_dir = cold_dir
        self.storage: Storage | None = None
        self.clock = clock or TestClock()
        self.history = history or History()
        self.engine: Engine | None = None
        self.journal: WalJournal | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.report: RecoveryReport | None = None
        self.tracker = _Tracker()

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Durable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def is_open(self) -> bool:
        return self.journal is not None

    def open(self) -> RecoveryReport:
        """Recover from the data dir and install the WAL journal (as `topics serve`).

        Raises whatever recovery raises (OSError on an unreadable/unrepairable
        WAL); the harness is then closed again and can be reopened.
        """
        assert self.journal is None, "already open"
        self.loop = asyncio.new_event_loop()
        engine = Engine(clock=self.clock, fs=self.fs)
        RouterSet(engine)
        Queues(engine)
        cfg = StorageConfig(
            self.data_dir, self.n_shards, self.checkpoint_cfg, self.shard_kw, self.cold_dir
        )
        try:
            # As `topics serve`: files are read in a worker thread, the replay runs
            # on the loop, then the WAL journal and the checkpointer are installed.
            storage = self.loop.run_until_complete(Storage.open(engine, self.fs, cfg))
        except BaseException:
            self._close_loop(self.loop)
            self.loop = None
            raise
        self.tracker = _Tracker()
        for s in storage.journal.shards:
            self.tracker.wrap(s)
        self.storage = storage
        self.engine, self.journal, self.report = engine, storage.journal, storage.report
        self.history.epoch += 1
        return storage.report

    def checkpoint(self) -> CheckpointReport:
        """Run one checkpoint cycle now (segments, snapshot, WAL pruning).

        Raises CheckpointFailed when the cycle could not complete.
        """
        assert self.storage is not None and self.loop is not None, "not open"
        self._spin()
        return self.loop.run_until_complete(
            asyncio.wait_for(self.storage.checkpoint(), self.timeout_s)
        )

    def close(self) -> None:
        """Graceful shutdown (final checkpoint, writers drained), then check the monitor."""
        self._stop(graceful=True)
        if self.monitor is not None:
            self.monitor.assert_clean()

    def shutdown(self) -> None:
        """Stop the writer threads without writing anything more (teardown, crashes)."""
        self._stop(graceful=False)

    def _stop(self, *, graceful: bool) -> None:
        storage, loop = self.storage, self.loop
        self.storage = None
        self.journal = None
        if storage is not None and loop is not None:
            op = storage.close() if graceful else storage.abort()
            try:
                loop.run_until_complete(asyncio.wait_for(op, self.timeout_s))
            except TimeoutError:
                raise HarnessHang("storage close did not finish (writer thread stuck)") from None
            self._spin(loop)  # deliver completions posted during the drain
        if loop is not None:
            self._close_loop(loop)
        self.loop = None
        self.engine = None

    @staticmethod
    def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def crash(self, mode: str = "drop_all", damage: str | None = None, seed: int = 0) -> None:
        """Power loss now (unless the disk already crashed), then stop the dead engine."""
        if not self.disk.frozen:
            self.disk.crash(mode, damage, seed)  # type: ignore[arg-type]
        self.shutdown()

    def crash_and_recover(
        self,
        mode: str = "drop_all",
        damage: str | None = None,
        seed: int = 0,
        *,
        fs: Fs | None = None,
        shards: int | None = None,
    ) -> RecoveryReport:
        """Crash, power back on, and open a fresh engine on what survived.

        `fs` replaces the storage seam for the new generation (e.g. drop a
        FaultFs once the fault "clears"); `shards` changes the shard count.
        """
        self.crash(mode, damage, seed)
        self.disk.recover()
        return self.reopen(fs=fs, shards=shards)

    def restart(self, *, fs: Fs | None = None, shards: int | None = None) -> RecoveryReport:
        """Graceful shutdown and a new process on the same disk (no power loss)."""
        if self.is_open:
            self.close()
        return self.reopen(fs=fs, shards=shards)

    def reopen(self, *, fs: Fs | None = None, shards: int | None = None) -> RecoveryReport:
        if self.is_open:
            self.shutdown()
        if fs is not None:
            self.base_fs = fs
            self.monitor = MonitorFs(fs) if self.monitor is not None else None
            self.fs = self.monitor if self.monitor is not None else fs
        elif self.monitor is not None:
            self.monitor.reset()
        if shards is not None:
            self.n_shards = shards
        return self.open()

    # ------------------------------------------------------------ the loop

    def spin(self) -> None:
        """Run the event loop briefly: deliver completions the writer threads posted."""
        self._spin()

    def _spin(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or self.loop
        assert loop is not None
        for _ in range(2):
            loop.run_until_complete(asyncio.sleep(0))

    def _wait_published(self, pws: Sequence[PendingWrite]) -> None:
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
        if not futs:
            return

        async def wait() -> None:
            await asyncio.wait_for(asyncio.gather(*futs), self.timeout_s)

        try:
            loop.run_until_complete(wait())
        except TimeoutError:
            raise HarnessHang(
                f"{sum(not f.done() for f in futs)} of {len(futs)} writes never published"
            ) from None

    def settle(self, *, sync: bool = False) -> bool:
        """Wait until every WAL submission so far has completed; True if all succeeded.

        With `sync`, also post an empty sync barrier to every writable shard
        first, so non-`fsync` frames written before it are durable afterwards
        (models the shard writer's periodic sync without waiting for its timer).
        """
        assert self.journal is not None and self.loop is not None
        tr = self.tracker
        with tr.cond:
            failed_before = len(tr.failed)
        self._spin()  # run loop callbacks that submit to the WAL (coalesced flushes)
        if sync:
            for s in self.journal.shards:
                try:
                    s.submit(WalEntry(b"", 0, True, lambda e, ok, ms: None))
                except WalReadOnly:
                    pass
        deadline = threading.Event()
        timer = threading.Timer(self.timeout_s, deadline.set)
        timer.start()
        try:
            with tr.cond:
                while tr.inflight > 0:
                    if deadline.is_set():
                        raise HarnessHang(f"{tr.inflight} WAL submissions never completed")
                    tr.cond.wait(0.05)
        finally:
            timer.cancel()
        self._spin()
        with tr.cond:
            return len(tr.failed) == failed_before

    # ------------------------------------------------------------ operations

    def eng(self) -> Engine:
        assert self.engine is not None, "not open"
        return self.engine

    def shard_index(self, topic: str) -> int:
        """The shard the live topic `topic` is on (current shard count)."""
        return shard_of(self.eng().require(topic).topic_id, self.n_shards)

    def shard_of_topic(self, topic: str) -> WalShard:
        assert self.journal is not None
        return self.journal.shards[self.shard_index(topic)]

    def put_topic(self, name: str, config: Mapping[str, Any] | None = None) -> bool:
        """PUT a topic and wait for its control frame; True when it was committed.

        Raises TopicsError as the engine does (e.g. 500 on a read-only WAL).
        """
        t, _created = self.eng().put_topic(name, dict(config or {}))
        ok = self.settle()
        if ok:
            self.history.created[name] = t.config.durability
        return ok

    def write(
        self,
        topic: str,
        records: Sequence[Mapping[str, Any]],
        durability: str | None = None,
        *,
        key: str | None = None,
    ) -> WriteOutcome:
        """Submit one write through ``begin_write`` and wait until it is published.

        With `durability`, a missing topic is created with that class (the
        write's `config`). Returns the ack or the error; never raises a
        TopicsError.
        """
        return self.write_many([(topic, records, durability)], key=key)[0]

    def write_many(
        self,
        writes: Sequence[tuple[str, Sequence[Mapping[str, Any]], str | None]],
        *,
        key: str | None = None,
    ) -> list[WriteOutcome]:
        """Submit several writes back to back (so they can share a group commit), then wait."""
        return self.wait(self.submit(writes, key=key))

    def submit(
        self,
        writes: Sequence[tuple[str, Sequence[Mapping[str, Any]], str | None]],
        *,
        key: str | None = None,
    ) -> list[Staged]:
        """Stage writes through ``begin_write`` without waiting (see :meth:`wait`)."""
        eng = self.eng()
        staged: list[Staged] = []
        for topic, records, durability in writes:
            body: dict[str, Any] = {"records": [dict(r) for r in records]}
            if durability is not None and topic not in eng.topics:
                body["config"] = {"durability": durability}
            if key is not None:
                body["idempotency_key"] = key
            datas = [orjson.dumps(r["data"]) for r in records]
            out = WriteOutcome(topic, False, 0, datas=datas)
            t = eng.topics.get(topic)
            cls = t.config.durability if t is not None else (durability or "disk")
            try:
                req = eng.parse_write(body, None)
                if self.history.last_id % 2:
                    # Every other write has its frames laid out ahead of staging (as
                    # the HTTP layer does for large writes, here whatever the size),
                    # so both ways of staging run under every fault.
                    for _ in eng.prepare_write(topic, req, min_bytes=0):
                        pass
                res = eng.begin_write(topic, req)
            except TopicsError as exc:
                out.status, out.code = exc.status, exc.code
                b = Batch(
                    self.history.next_id(), self.history.epoch, topic, cls, None, datas, False
                )
                self.history.add(b)
                staged.append(Staged(out, None, b))
                continue
            if isinstance(res, dict):  # an idempotent replay
                out.ok, out.status, out.ack = True, 200, res
                staged.append(Staged(out, None, None))
                continue
            pw = res.pending if isinstance(res, Replay) else res
            out.first_seq, out.last_seq = pw.first_seq, pw.last_seq
            b = Batch(
                self.history.next_id(),
                self.history.epoch,
                topic,
                pw.topic.config.durability,
                pw.first_seq,
                datas,
                None,
            )
            self.history.add(b)
            staged.append(Staged(out, pw, b))
        return staged

    def wait(self, staged: Sequence[Staged]) -> list[WriteOutcome]:
        """Run the loop until every staged write is published; fill in the outcomes."""
        eng = self.eng()
        live = [st for st in staged if st.pw is not None]
        try:
            self._wait_published([st.pw for st in live if st.pw is not None])
        finally:
            for st in live:
                pw, out, b = st.pw, st.out, st.batch
                assert pw is not None and b is not None
                if not pw.published:
                    continue
                b.ok = pw.ok
                if pw.ok:
                    out.ok, out.ack = True, eng.write_result(pw)
                    out.status = 201 if pw.created else 200
                else:
                    try:
                        eng.write_result(pw)
                    except TopicsError as exc:
                        out.status, out.code = exc.status, exc.code
                b.status = out.status
        # Control frames submitted with the writes (TopicCreate) finish with them.
        self.settle()
        outs = [st.out for st in staged]
        for out in outs:
            t = eng.topics.get(out.topic)
            if out.ok and t is not None:
                self.history.created.setdefault(out.topic, t.config.durability)
        return outs

    def delete_records(self, topic: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Delete records and wait for the Delete frame; (engine result, committed).

        The (topic, seq) pairs removed are added to the history's deleted set
        only when the Delete frame was committed.
        """
        before = {r["$seq"] for r in self.read_all(topic) or []}
        op = self.eng().begin_delete(topic, dict(body))
        ok = self.settle() and op.done and op.ok
        res = self.eng().delete_result(op) if ok else {"deleted": 0}
        after = {r["$seq"] for r in self.read_all(topic) or []}
        if ok:
            self.history.deleted |= {(topic, s) for s in before - after}
        return res, ok

    def read_all(self, topic: str) -> list[dict[str, Any]] | None:
        """Every live record of `topic` in seq order (rendered with tags); None if absent."""
        eng = self.eng()
        if topic not in eng.topics:
            return None
        out: list[dict[str, Any]] = []
        cur = 0
        while True:
            p = DiffParams(from_seq=cur, limit=1000, include_tags=True, budget=8_388_608)
            _t, r = eng.diff(topic, p)
            out.extend(orjson.loads(b) for b in r.records)
            if r.next_from_seq <= cur or r.caught_up:
                break
            cur = r.next_from_seq
        return out

    def state(self, topic: str) -> dict[str, Any] | None:
        eng = self.eng()
        return eng.topic_state(topic, touch=False) if topic in eng.topics else None

    def fingerprint(self) -> dict[str, Any]:
        """Every topic's config, head, earliest, count and records (seq, ts, node, tag, data, meta)."""
        eng = self.eng()
        fp: dict[str, Any] = {}
        for name in sorted(eng.topics):
            t = eng.topics[name]
            fp[name] = {
                "config": t.config.to_wire(),
                "head": t.head_seq,
                "earliest": t.earliest_seq,
                "count": t.live_count,
                "bytes": t.live_bytes,
                "records": self.read_all(name),
                "tombstone": self._tombstone(name),
            }
        fp["$routers"] = sorted(eng.routers.names()) if eng.routers is not None else []
        return fp

    def _tombstone(self, topic: str) -> Any:
        _t, r = self.eng().diff(topic, DiffParams(from_seq=0, limit=1, budget=1_048_576))
        return None if r.tombstone is None else r.tombstone.to_wire()

    @property
    def read_only(self) -> list[bool]:
        assert self.journal is not None
        return [s.read_only for s in self.journal.shards]


# ------------------------------------------------------------------ oracle


def check_oracle(
    h: Durable,
    *,
    must_survive: Iterable[str] = ("fsync",),
    allow_unacked: bool = True,
    atomic_batches: bool = True,
    dense: bool = True,
    fp: Mapping[str, Any] | None = None,
    context: str = "",
) -> list[str]:
    """The set oracle over everything the history attempted; returns the violations.

    * no fabrication: every live record is a staged (topic, seq, data) triple;
    * deleted never returns: no committed delete's victim is live again;
    * all-or-nothing: each batch survives whole or not at all (minus deletes);
      with ``atomic_batches=False`` an unacked batch may survive as a prefix of
      its records (the torn multi-frame write weakness, see
      ``test_torn_multi_record_batch_is_all_or_nothing``);
    * acked ⇒ durable for batches whose class is in `must_survive`;
    * `allow_unacked=False`: failed batches must not be visible;
    * density (per topic and epoch): a batch that was not reported failed never
      vanishes while a later batch of the same epoch survives;
    * committed topic creates still exist, unless the topic was deleted.
    """
    fp = fp if fp is not None else h.fingerprint()
    hist = h.history
    attempted = hist.attempted()
    errs: list[str] = []
    where = f" [{context}]" if context else ""
    live: dict[tuple[str, int], bytes] = {}
    for name, st in fp.items():
        if name.startswith("$"):
            continue
        for rec in st["records"] or []:
            key = (name, int(rec["$seq"]))
            d = data_of(rec)
            live[key] = d
            cands = attempted.get(key, [])
            if not any(d == cd for cd, _b in cands):
                errs.append(f"fabricated record {key}: {d!r}{where}")
            if key in hist.deleted:
                errs.append(f"deleted record came back {key}{where}")
    survived: dict[int, int] = {}
    survived_seqs: dict[int, set[int]] = {}
    for key, d in live.items():
        for cd, b in attempted.get(key, []):
            if cd == d:
                survived[b.id] = survived.get(b.id, 0) + 1
                survived_seqs.setdefault(b.id, set()).add(key[1])
                break
    must = set(must_survive)
    for b in hist.batches:
        if not b.seqs:
            continue
        expect = [s for s in b.seqs if (b.topic, s) not in hist.deleted]
        n = survived.get(b.id, 0)
        if n not in (0, len(expect)):
            got = survived_seqs.get(b.id, set())
            prefix = set(expect[: len(got)]) == got
            if atomic_batches or b.ok or not prefix:
                errs.append(
                    f"batch {b.id} {b.topic}{b.seqs} half survived ({n}/{len(expect)}){where}"
                )
        if b.ok and b.durability in must and expect and n != len(expect):
            errs.append(
                f"acked {b.durability} batch {b.id} {b.topic}{b.seqs} lost (epoch {b.epoch}){where}"
            )
        if b.ok is False and not allow_unacked and n:
            errs.append(f"failed batch {b.id} {b.topic}{b.seqs} is visible{where}")
    if dense:
        groups: dict[tuple[str, int], list[Batch]] = {}
        for b in hist.batches:
            if b.seqs:
                groups.setdefault((b.topic, b.epoch), []).append(b)
        for (topic, epoch), bs in groups.items():
            bs.sort(key=lambda b: b.first_seq or 0)
            later_survivor: Batch | None = None
            for b in reversed(bs):
                alive = survived.get(b.id, 0) > 0
                exp = [s for s in b.seqs if (b.topic, s) not in hist.deleted]
                if alive:
                    later_survivor = later_survivor or b
                elif later_survivor is not None and b.ok is not False and exp:
                    # Superseded by a reuse of its seqs in a later epoch is fine.
                    errs.append(
                        f"gap: batch {b.id} {topic}{b.seqs} (epoch {epoch}) lost while batch "
                        f"{later_survivor.id}{later_survivor.seqs} survived{where}"
                    )
    for name in hist.created:
        if name not in fp:
            errs.append(f"committed topic create {name!r} is gone{where}")
    return errs


def fingerprint_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Differences between two fingerprints, as readable lines."""
    out: list[str] = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            out.append(f"{name}: {a.get(name)!r} != {b.get(name)!r}")
    return out


# ------------------------------------------------------------------ GateFs


class GateFs:
    """Blocks the n-th call of one op class until :meth:`release` (and reports it).

    Lets a test freeze the writer thread in the middle of a commit (e.g. inside
    the batch's ``fdatasync``) to crash or read while a write is in flight.
    Pass-through otherwise; `.inner` keeps the FakeDisk reachable.
    """

    def __init__(self, inner: Fs, op: str, nth: int = 1) -> None:
        self.inner = inner
        self.op = op
        self.nth = nth
        self.count = 0
        self.reached = threading.Event()
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def arm(self, op: str, nth: int = 1) -> None:
        with self._lock:
            self.op, self.nth, self.count = op, nth, 0
            self.reached.clear()
            self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def _maybe_block(self, op: str) -> None:
        if op != self.op:
            return
        with self._lock:
            self.count += 1
            hit = self.count == self.nth
        if hit:
            self.reached.set()
            if not self.gate.wait(TIMEOUT_S * 3):
                raise OSError(5, "GateFs: never released")

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> Any:
        self._maybe_block("open")
        inner = self.inner.open(path, create=create, write=write, exclusive=exclusive)
        return _GateFile(self, inner)

    def replace(self, src: str, dst: str) -> None:
        self._maybe_block("replace")
        self.inner.replace(src, dst)

    def unlink(self, path: str) -> None:
        self._maybe_block("unlink")
        self.inner.unlink(path)

    def rmdir(self, path: str) -> None:
        self._maybe_block("unlink")
        self.inner.rmdir(path)

    def rmtree(self, path: str) -> None:
        self._maybe_block("unlink")
        self.inner.rmtree(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def lexists(self, path: str) -> bool:
        return bool(self.inner.lexists(path))

    def isdir(self, path: str) -> bool:
        return bool(self.inner.isdir(path))

    def fsync_dir(self, path: str) -> None:
        self._maybe_block("fsync_dir")
        self.inner.fsync_dir(path)


class _GateFile:
    def __init__(self, fs: GateFs, inner: Any) -> None:
        self.fs = fs
        self.inner = inner

    def pread(self, size: int, offset: int) -> bytes:
        return bytes(self.inner.pread(size, offset))

    def pwrite(self, data: bytes, offset: int) -> int:
        self.fs._maybe_block("pwrite")
        return int(self.inner.pwrite(data, offset))

    def fdatasync(self) -> None:
        self.fs._maybe_block("fdatasync")
        self.inner.fdatasync()

    def fsync(self) -> None:
        self.fs._maybe_block("fsync")
        self.inner.fsync()

    def truncate(self, size: int) -> None:
        self.fs._maybe_block("truncate")
        self.inner.truncate(size)

    def size(self) -> int:
        return int(self.inner.size())

    def map(self) -> Any:
        return self.inner.map()

    def no_readahead(self) -> None:
        self.inner.no_readahead()

    def lock(self) -> bool:
        return bool(self.inner.lock())

    def unlock(self) -> None:
        self.inner.unlock()

    def close(self) -> None:
        self.inner.close()


def segmented_topic(disk: FakeDisk, seg: int) -> tuple[Durable, str]:
    """Topic `s` (class fsync) written as `3 * seg + 3` one-record writes on one shard
    and checkpointed twice, so every record sits in segments of `seg` records and
    the WAL holds none. The handle is closed; returns it and the topic's directory.
    """
    from topics.storage.segment import topic_dir

    h = Durable(disk, shards=1, segment_max_events=seg)
    h.open()
    assert h.put_topic("s", {"durability": "fsync"})
    for i in range(3 * seg + 3):
        assert h.write("s", make_records(f"s{i}", 1, size=60)).ok
    h.checkpoint()
    h.checkpoint()  # the fallback snapshot no longer needs the WAL either
    d = topic_dir(DATA_DIR, h.eng().require("s").topic_id)
    h.close()
    return h, d
