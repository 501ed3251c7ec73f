"""WAL shard: group commit, ack points, rotation, torn-tail repair, failure latching."""

from __future__ import annotations

import errno
import mmap
import threading
import time
from pathlib import Path

import pytest
from tests.support.clock import TestClock
from tests.support.fakedisk import FaultFs

from topics.format.frame import APPEND, Frame, encode_record
from topics.storage.fs import Data, RealFile, RealFs
from topics.storage.wal import (
    JOIN_MAX_BYTES,
    WRITE_NOW_MAX_BYTES,
    WalDamage,
    WalEntry,
    WalFull,
    WalReadOnly,
    WalShard,
    scan_shard,
)

FILE = 64 * 1024


class Waiter:
    """Collects completions from the writer thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: list[tuple[WalEntry, bool, float]] = []
        self.event = threading.Event()
        self.want = 0

    def cb(self, e: WalEntry, ok: bool, fsync_ms: float) -> None:
        with self.lock:
            self.done.append((e, ok, fsync_ms))
            if len(self.done) >= self.want:
                self.event.set()

    def wait(self, n: int, timeout: float = 10) -> list[tuple[WalEntry, bool, float]]:
        with self.lock:
            self.want = n
            if len(self.done) >= n:
                self.event.set()
        assert self.event.wait(timeout), f"only {len(self.done)} of {n} completions"
        self.event.clear()
        return self.done


def rec(seq: int, size: int = 40) -> bytes:
    return encode_record(
        7, seq, 1000 + seq, None, None, b'"' + b"x" * size + b'"', None, durable=True
    )


def test_submit_write_sync_and_scan(tmp_path: Path) -> None:
    d = str(tmp_path / "wal")
    shard, found = WalShard.open(RealFs(), d, file_bytes=FILE)
    assert found.frames == []
    w = Waiter()
    for s in range(1, 6):
        shard.submit(WalEntry(rec(s), 1, sync=(s % 2 == 0), done=w.cb))
    done = w.wait(5)
    assert all(ok for _, ok, _ in done)
    assert [e.index for e, _, _ in done] == [0, 1, 2, 3, 4]
    shard.close()
    assert shard.metrics.frames == 5 and shard.metrics.fsyncs >= 1
    scan = scan_shard(RealFs(), d)
    assert [f.seq for _, f in scan.frames] == [1, 2, 3, 4, 5]
    # Five entries plus the SyncMarks written after each sync that made bytes durable.
    assert scan.torn is None and scan.next_index == 5 + shard.metrics.sync_marks
    assert scan.mark > 0
    assert (tmp_path / "wal" / "CURRENT").read_text().strip() == scan.end_file
    assert all(f.type == APPEND for _, f in scan.frames)


def test_group_commit_batches_queued_entries(tmp_path: Path) -> None:
    shard, _ = WalShard.open(RealFs(), str(tmp_path / "w"), file_bytes=FILE * 16)
    w = Waiter()
    n = 300
    for s in range(1, n + 1):
        shard.submit(WalEntry(rec(s), 1, sync=True, done=w.cb))
    done = w.wait(n)
    shard.close()
    assert all(ok for _, ok, _ in done)
    # Far fewer syncs than entries: queued submissions share one fdatasync.
    assert shard.metrics.fsyncs < n and shard.metrics.batches < n
    assert all(ms > 0 for _, _, ms in done)


def test_rotation_and_reopen_continue_the_log(tmp_path: Path) -> None:
    d = str(tmp_path / "w")
    shard, _ = WalShard.open(RealFs(), d, file_bytes=2048)
    w = Waiter()
    for s in range(1, 101):
        shard.submit(WalEntry(rec(s), 1, sync=False, done=w.cb))
    w.wait(100)
    shard.close()
    assert shard.metrics.rotations >= 2
    scan = scan_shard(RealFs(), d)
    assert [f.seq for _, f in scan.frames] == list(range(1, 101))
    shard2, found = WalShard.open(RealFs(), d, file_bytes=2048)
    assert len(found.frames) == 100
    w2 = Waiter()
    shard2.submit(WalEntry(rec(101), 1, sync=True, done=w2.cb))
    w2.wait(1)
    shard2.close()
    assert [f.seq for _, f in scan_shard(RealFs(), d).frames] == list(range(1, 102))
    assert w2.done[0][0].index == found.next_index


def _three(d: Path, *, sync: bool = True) -> list[Frame]:
    shard, _ = WalShard.open(RealFs(), str(d), file_bytes=FILE)
    w = Waiter()
    for s in range(1, 4):
        shard.submit(WalEntry(rec(s), 1, sync=sync, done=w.cb))
    w.wait(3)
    shard.close()
    return [f for _, f in scan_shard(RealFs(), str(d)).frames]


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_damage_before_the_sync_mark_refuses_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "w"
    frames = _three(d)
    log = sorted(d.glob("wal-*.log"))[0]
    _flip(log, frames[2].offset + 20)  # the last record: synced, so a mark follows it
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(WalDamage) as ei:
        WalShard.open(RealFs(), str(d), file_bytes=FILE)
    msg = str(ei.value)
    assert log.name in msg and f"[{frames[2].offset}, " in msg and "seqs" in msg
    assert ei.value.damage[0].start == frames[2].offset
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # nothing changed


def test_damage_in_the_middle_names_the_seqs_at_risk(tmp_path: Path) -> None:
    d = tmp_path / "w"
    frames = _three(d)
    _flip(sorted(d.glob("wal-*.log"))[0], frames[1].offset + 40)
    found = scan_shard(RealFs(), str(d))
    assert found.torn is None and len(found.damage) == 1
    dmg = found.damage[0]
    assert (dmg.start, dmg.end) == (frames[1].offset, frames[2].offset)
    assert dmg.before == {7: 1} and dmg.after == {7: 3} and dmg.valid_after >= 1
    assert "seqs 2..2" in dmg.at_risk()
    # The valid frames on both sides of the damage are read.
    assert [f.seq for _, f in found.frames] == [1, 3]


def test_torn_tail_past_the_mark_is_cut_after_keeping_its_bytes(tmp_path: Path) -> None:
    d = tmp_path / "w"
    frames = _three(d)
    log = sorted(d.glob("wal-*.log"))[0]
    # A write in flight at the crash: a frame after the last mark, half written.
    found = scan_shard(RealFs(), str(d))
    end = found.end_offset
    torn = rec(4)[:30]
    raw = bytearray(log.read_bytes())
    raw[end : end + len(torn)] = torn
    log.write_bytes(bytes(raw))
    shard2, found = WalShard.open(RealFs(), str(d), file_bytes=FILE)
    assert [f.seq for _, f in found.frames] == [1, 2, 3] and found.torn is not None
    aside = d / f"{log.name}.torn-{end}"
    assert aside.read_bytes() == torn.rstrip(b"\0")  # the bytes up to the last non-zero one
    w2 = Waiter()
    shard2.submit(WalEntry(rec(4), 1, sync=True, done=w2.cb))
    w2.wait(1)
    shard2.close()
    again = scan_shard(RealFs(), str(d))
    assert [f.seq for _, f in again.frames] == [1, 2, 3, 4] and again.torn is None
    assert frames[0].seq == 1


def test_damage_in_an_older_file_and_a_missing_file_refuse(tmp_path: Path) -> None:
    d = tmp_path / "w"
    shard, _ = WalShard.open(RealFs(), str(d), file_bytes=1024)
    w = Waiter()
    for s in range(1, 40):
        shard.submit(WalEntry(rec(s), 1, sync=True, done=w.cb))
    w.wait(39)
    shard.close()
    files = sorted(d.glob("wal-*.log"))
    assert len(files) >= 3
    # A flip in a rotated-out file: valid frames follow in later files.
    first = [f for n, f in scan_shard(RealFs(), str(d)).frames if n == files[0].name]
    saved = files[0].read_bytes()
    _flip(files[0], first[1].offset + 45)
    with pytest.raises(WalDamage):
        WalShard.open(RealFs(), str(d), file_bytes=1024)
    assert sorted(d.glob("wal-*.log")) == files
    files[0].write_bytes(saved)
    # A missing middle file is a gap in frame indexes.
    middle = files[1].read_bytes()
    files[1].unlink()
    found = scan_shard(RealFs(), str(d))
    assert found.damage and "missing" in found.damage[0].reason
    with pytest.raises(WalDamage):
        WalShard.open(RealFs(), str(d), file_bytes=1024)
    files[1].write_bytes(middle)
    assert not scan_shard(RealFs(), str(d)).damage


def test_queue_full_refuses_without_queueing(tmp_path: Path) -> None:
    shard = WalShard(RealFs(), str(tmp_path), queue_max=2)
    # Not started: entries stay queued, so the cap is reached deterministically.
    shard.submit(WalEntry(rec(1), 1, sync=False, done=lambda *a: None))
    shard.submit(WalEntry(rec(2), 1, sync=False, done=lambda *a: None))
    with pytest.raises(WalFull):
        shard.submit(WalEntry(rec(3), 1, sync=False, done=lambda *a: None))
    assert shard.metrics.submit_full == 1 and shard.queue_depth == 2


class _SyncFailFile:
    def __init__(self, inner: RealFile, fs: FailingSyncFs) -> None:
        self.inner = inner
        self.fs = fs

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def fdatasync(self) -> None:
        if self.fs.armed:
            raise OSError(errno.EIO, "injected fdatasync failure")
        self.inner.fdatasync()


class FailingSyncFs(RealFs):
    """RealFs whose files fail fdatasync once armed."""

    armed = False

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        f = super().open(path, create=create, write=write, exclusive=exclusive)
        return _SyncFailFile(f, self)  # type: ignore[return-value]


def test_fsync_failure_fails_the_batch_and_latches_read_only(tmp_path: Path) -> None:
    fs = FailingSyncFs()
    shard, _ = WalShard.open(fs, str(tmp_path / "w"), file_bytes=FILE)
    w = Waiter()
    shard.submit(WalEntry(rec(1), 1, sync=True, done=w.cb))
    w.wait(1)
    fs.armed = True
    shard.submit(WalEntry(rec(2), 1, sync=True, done=w.cb))
    done = w.wait(2)
    assert [ok for _, ok, _ in done] == [True, False]
    assert isinstance(done[1][0].error, OSError) and shard.read_only
    with pytest.raises(WalReadOnly):
        shard.submit(WalEntry(rec(3), 1, sync=True, done=w.cb))
    fs.armed = False
    shard.close()


class _RecordingFile:
    """A RealFile that records what each pwrite was handed."""

    def __init__(self, inner: RealFile, calls: list[tuple[int, int, object]]) -> None:
        self.inner = inner
        self.calls = calls

    def pwrite(self, data: Data, offset: int) -> int:
        obj = data.obj if isinstance(data, memoryview) else data
        self.calls.append((offset, len(data), obj))
        return self.inner.pwrite(data, offset)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class RecordingFs(RealFs):
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, object]] = []

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        f = super().open(path, create=create, write=write, exclusive=exclusive)
        return _RecordingFile(f, self.calls)  # type: ignore[return-value]


def test_entry_parts_are_written_back_to_back_and_a_large_part_is_not_copied(
    tmp_path: Path,
) -> None:
    d = str(tmp_path / "wal")
    fs = RecordingFs()
    shard, _ = WalShard.open(fs, d, file_bytes=4 * 1024 * 1024)
    big = mmap.mmap(-1, len(rec(2, size=JOIN_MAX_BYTES)))
    big[:] = rec(2, size=JOIN_MAX_BYTES)
    small = rec(3)
    fs.calls.clear()
    w = Waiter()
    e1 = WalEntry(rec(1), 2, sync=False, done=w.cb, more=(rec(9),))
    shard.submit(e1)
    w.wait(1)
    assert len(fs.calls) == 1  # small parts: joined into one pwrite
    fs.calls.clear()
    e2 = WalEntry(big, 2, sync=True, done=w.cb, more=(small,))
    assert e2.size == len(big) + len(small)
    shard.submit(e2)
    done = w.wait(2)
    assert all(ok for _, ok, _ in done)
    # The large part went out from its own buffer (no joined copy), the small one after it.
    writes = [(off, n, obj) for off, n, obj in fs.calls if n > 0]
    assert writes[0][2] is big and writes[0][1] == len(big)
    assert writes[1][:2] == (e2.offset + len(big), len(small))
    assert e2.offset == e1.offset + e1.size and e2.index == 2
    shard.close()
    assert [f.seq for _, f in scan_shard(RealFs(), d).frames] == [1, 9, 2, 3]
    assert shard.metrics.bytes_written >= e1.size + e2.size


def test_disk_full_retries_follow_the_shard_clock(tmp_path: Path) -> None:
    # The writer reads the retry time from the shard's clock: with a test clock,
    # an entry held by a full disk is retried only once that clock has moved on.
    clock = TestClock()
    fault = FaultFs(RealFs())
    shard, _ = WalShard.open(
        fault, str(tmp_path / "w"), file_bytes=FILE, full_retry_s=0.01, clock=clock
    )
    rule = fault.fail("pwrite", 1, "ENOSPC", persistent=True)
    w = Waiter()
    shard.submit(WalEntry(rec(1), 1, sync=False, done=w.cb, acked_early=True))
    for _ in range(500):
        if shard.disk_full:
            break
        time.sleep(0.01)
    assert shard.disk_full and shard.disk_full_since == 0.0
    fault.rules.remove(rule)  # space is back
    time.sleep(0.1)  # ten real retry periods go by ...
    assert not w.done and shard.disk_full  # ... but not on the shard's clock
    clock.advance(10)
    assert w.wait(1)[0][1] and not shard.disk_full
    shard.close()


# -- writes on the submitting thread (docs/ARCHITECTURE.md, "The write path") ----------


class _HeldFile(RealFile):
    """A RealFile whose fdatasync waits while its filesystem holds syncs."""

    __slots__ = ("owner",)

    def __init__(self, fd: int, path: str, owner: _SlowSyncFs) -> None:
        super().__init__(fd, path)
        self.owner = owner

    def fdatasync(self) -> None:
        if self.owner.hold:
            self.owner.in_sync.set()
            assert self.owner.release.wait(10)
        super().fdatasync()


class _SlowSyncFs(RealFs):
    """RealFs whose fdatasync waits until released, to hold the writer in a sync."""

    def __init__(self) -> None:
        self.in_sync = threading.Event()
        self.release = threading.Event()
        self.hold = False

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        f = super().open(path, create=create, write=write, exclusive=exclusive)
        return _HeldFile(f.fd, f.path, self)


def test_write_now_writes_on_the_caller_when_nothing_is_ahead(tmp_path: Path) -> None:
    d = str(tmp_path / "w")
    shard, _ = WalShard.open(RealFs(), d, file_bytes=FILE, sync_interval_s=0.01)
    w = Waiter()
    caller = threading.get_ident()
    seen: list[int] = []

    def cb(e: WalEntry, ok: bool, ms: float) -> None:
        seen.append(threading.get_ident())
        w.cb(e, ok, ms)

    syncs = shard.metrics.fsyncs
    assert shard.write_now(WalEntry(rec(1), 1, sync=False, done=cb))
    assert seen == [caller]  # completed before write_now returned, on this thread
    # The writer was woken for the background sync the direct write left due.
    deadline = time.monotonic() + 5
    while shard.metrics.fsyncs == syncs and time.monotonic() < deadline:
        time.sleep(0.005)
    assert shard.metrics.fsyncs == syncs + 1
    assert not shard.write_now(WalEntry(rec(2), 1, sync=True, done=cb))  # an fsync: the writer's
    shard.submit(WalEntry(rec(2), 1, sync=True, done=cb))
    w.wait(2)
    shard.close()
    assert shard.metrics.direct_writes == 1
    assert [f.seq for _, f in scan_shard(RealFs(), d).frames] == [1, 2]


def test_write_now_never_overtakes_queued_entries(tmp_path: Path) -> None:
    """An entry queued first is written first; during the writer's fdatasync the loop
    may append, and what it appended stays due for the next sync."""
    d = str(tmp_path / "w")
    fs = _SlowSyncFs()
    shard, _ = WalShard.open(fs, d, file_bytes=FILE, sync_interval_s=0.01)
    w = Waiter()
    fs.hold = True
    shard.submit(WalEntry(rec(1), 1, sync=True, done=w.cb))
    assert fs.in_sync.wait(10)  # the writer wrote seq 1 and sits in its fdatasync
    assert shard.write_now(WalEntry(rec(2), 1, sync=False, done=w.cb))  # appended meanwhile
    shard.submit(WalEntry(rec(3), 1, sync=True, done=w.cb))  # queued behind the sync
    assert not shard.write_now(WalEntry(rec(4), 1, sync=False, done=w.cb))  # 3 is ahead
    shard.submit(WalEntry(rec(4), 1, sync=False, done=w.cb))
    fs.hold = False
    fs.release.set()
    w.wait(4)
    shard.close()
    assert all(ok for _, ok, _ in w.done)
    assert [f.seq for _, f in scan_shard(RealFs(), d).frames] == [1, 2, 3, 4]
    assert shard.metrics.direct_writes == 1


def test_write_now_steps_aside_for_a_large_entry_or_a_full_file(tmp_path: Path) -> None:
    shard, _ = WalShard.open(RealFs(), str(tmp_path / "w"), file_bytes=384 * 1024)
    w = Waiter()

    def sized(seq: int, n: int) -> bytes:
        return encode_record(7, seq, 1, None, None, b'"' + b"x" * n + b'"', None, durable=True)

    assert not shard.write_now(WalEntry(sized(1, WRITE_NOW_MAX_BYTES), 1, sync=False, done=w.cb))
    assert shard.write_now(WalEntry(sized(1, 200_000), 1, sync=False, done=w.cb))
    # The next one needs a new file: rotating is the writer's job.
    assert not shard.write_now(WalEntry(sized(2, 200_000), 1, sync=False, done=w.cb))
    shard.close()
    assert not shard.write_now(WalEntry(rec(3), 1, sync=False, done=w.cb))  # closed
    assert len(w.done) == 1
