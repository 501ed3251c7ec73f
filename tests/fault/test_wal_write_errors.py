"""Row 3 (the pwrite parts): EIO/ENOSPC/ESTALE/EAGAIN and short writes on the WAL path.

* a failed ``pwrite`` never acks: the write returns 500 (507 when the disk is
  full) and nothing of it is visible, now or after recovery;
* a full disk is a state, not a fault: the shard refuses new writes with 507
  while acknowledged early writes wait in order, and when space returns writes
  resume without a restart;
* a short write is looped until the frame is whole (acked and recovered intact);
* a transient fault (once) leaves the shard writable: the next write succeeds;
  a persistent one latches it read-only while reads keep working;
* preallocation failures make open/recovery refuse to start (never a silent
  empty start over real data) and a failed rotation keeps the prior file intact;
* once the fault clears, recovery shows exactly the acked records.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.durable import Durable, WriteOutcome, check_oracle, make_records
from tests.support.fakedisk import FakeDisk, FaultFs


def _setup(shards: int = 2, **kw: object) -> tuple[FakeDisk, FaultFs, Durable]:
    disk = FakeDisk()
    fault = FaultFs(disk)
    h = Durable(fault, shards=shards, **kw)  # type: ignore[arg-type]
    h.open()
    assert h.put_topic("a", {"durability": "fsync"})
    assert h.put_topic("b", {"durability": "fsync"})
    assert h.write("a", make_records("a-ok", 2)).ok
    assert h.write("b", make_records("b-ok", 1)).ok
    return disk, fault, h


def _exactly_acked(h: Durable, topic: str) -> None:
    """Live records of `topic` are exactly the acked batches' records, in order."""
    want = [d for b in h.history.acked(topic) for d in b.datas]
    got = [r["data"] for r in h.read_all(topic) or []]
    import orjson

    assert [orjson.dumps(g) for g in got] == want


@pytest.mark.parametrize("kind", ["EIO", "ESTALE", "EAGAIN"])
@pytest.mark.parametrize("persistent", [False, True], ids=["once", "always"])
def test_pwrite_error_never_acks(kind: str, persistent: bool) -> None:
    disk, fault, h = _setup()
    with h:
        before = h.read_all("a")
        fault.fail("pwrite", 1, kind, persistent=persistent)  # type: ignore[arg-type]
        out = h.write("a", make_records("a-bad", 2))
        assert not out.ok and out.status == 500, out
        assert h.read_all("a") == before, "a failed write is never visible"
        shard = h.shard_of_topic("a")
        if persistent:
            # The partial bytes cannot even be cleared: the shard refuses further writes
            # rather than append after garbage; reads keep working.
            assert shard.read_only
            again = h.write("a", make_records("a-again", 1))
            assert not again.ok and again.status == 500
            assert h.read_all("a") == before
        else:
            # A transient fault: the failed frames were cleared, the next write lands
            # exactly where the failed one would have (no retry of the failed batch).
            assert not shard.read_only
            again = h.write("a", make_records("a-again", 1))
            assert again.ok, again
        errs = check_oracle(h, allow_unacked=False, context=f"{kind} live")
        assert not errs, "\n".join(errs)
        # The fault clears (a healthy device on the way back): exactly the acked records.
        h.restart(fs=disk)
        _exactly_acked(h, "a")
        _exactly_acked(h, "b")
        assert h.write("a", make_records("a-post", 1)).ok
        h.crash_and_recover()
        _exactly_acked(h, "a")
        errs = check_oracle(h, allow_unacked=False, context=f"{kind} after recovery")
        assert not errs, "\n".join(errs)
        h.close()


@pytest.mark.parametrize("keep", [None, 1, 45, 0])
def test_short_write_is_looped_to_completion(keep: int | None) -> None:
    """A pwrite that returns a short count is continued: the frame lands whole, acked.

    A pwrite that makes no progress at all (returns 0) is an error (`write_all`
    raises EIO instead of spinning): that write fails cleanly and the next one lands.
    """
    disk, fault, h = _setup()
    with h:
        fault.fail("pwrite", 1, "short", short_keep=keep)
        out = h.write("a", make_records("a-short", 3, size=300))
        assert fault.rules[0].fired == 1
        if keep == 0:
            assert not out.ok and out.status == 500
            assert not h.shard_of_topic("a").read_only
            assert h.write("a", make_records("a-next", 1)).ok
        else:
            assert out.ok, out
        h.crash_and_recover(fs=disk)
        _exactly_acked(h, "a")
        errs = check_oracle(h, allow_unacked=False, context=f"short keep={keep}")
        assert not errs, "\n".join(errs)
        h.close()


def test_persistent_short_writes_end_in_an_error_not_a_spin_or_an_ack() -> None:
    disk, fault, h = _setup()
    with h:
        fault.fail("pwrite", 1, "short", persistent=True)
        out = h.write("a", make_records("a-short", 2, size=200))
        assert not out.ok and out.status == 500
        # Partial bytes may be left in the page cache; they must never be replayed.
        h.restart(fs=disk)
        _exactly_acked(h, "a")
        assert h.write("a", make_records("a-post", 1)).ok
        h.crash_and_recover()
        errs = check_oracle(h, allow_unacked=False, context="persistent short")
        assert not errs, "\n".join(errs)
        h.close()


@pytest.mark.parametrize("op", ["pwrite", "fdatasync", "fsync_dir", "open", "replace", "listdir"])
def test_open_refuses_to_start_when_the_wal_cannot_be_prepared(op: str) -> None:
    """A fault while opening/preallocating/repairing the WAL fails recovery loudly.

    Over real data: the failed start changes nothing that matters, and a healthy
    rerun recovers every acked record.
    """
    disk, fault, h = _setup()
    with h:
        h.close()
        fault.fail(op, 1, "EIO", persistent=True)  # type: ignore[arg-type]
        with pytest.raises(OSError):
            h.open()
        assert not h.is_open
        h.reopen(fs=disk)
        _exactly_acked(h, "a")
        _exactly_acked(h, "b")
        errs = check_oracle(h, allow_unacked=False, context=f"open fault on {op}")
        assert not errs, "\n".join(errs)
        h.close()


def test_fresh_data_dir_preallocation_failure_refuses_to_start() -> None:
    disk = FakeDisk()
    fault = FaultFs(disk, [("pwrite", 1, "ENOSPC", True)])
    with Durable(fault) as h:
        with pytest.raises(OSError):
            h.open()
        h.reopen(fs=disk)
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("a", 1)).ok
        h.crash_and_recover()
        errs = check_oracle(h, context="fresh dir")
        assert not errs, "\n".join(errs)
        h.close()


def _fill_the_file(h: Durable, file_bytes: int) -> Any:
    """Write small records until the next 600-byte one cannot fit the active file."""
    shard = h.shard_of_topic("a")
    i = 0
    while file_bytes - shard.position[1] > 400:
        assert h.write("a", make_records(f"fill{i}", 1, size=100)).ok
        i += 1
    return shard


@pytest.mark.parametrize("kind", ["EIO"])
def test_rotation_preallocation_failure_latches_and_keeps_the_prior_file(kind: str) -> None:
    file_bytes = 4096
    disk, fault, h = _setup(shards=1, file_bytes=file_bytes)
    with h:
        shard = _fill_the_file(h, file_bytes)
        # The next write does not fit: rotation syncs the full file, then the new
        # file's zero-fill (the first pwrite after this point) fails.
        fault.fail("pwrite", 1, kind)  # type: ignore[arg-type]
        out = h.write("a", make_records("big", 1, size=600))
        assert not out.ok and out.status == 500
        assert shard.read_only, "a rotation failure latches the shard"
        assert h.shard_of_topic("b").read_only  # one shard: b shares it
        h.restart(fs=disk)
        _exactly_acked(h, "a")
        _exactly_acked(h, "b")
        assert h.write("a", make_records("post", 1, size=600)).ok
        h.crash_and_recover()
        _exactly_acked(h, "a")
        errs = check_oracle(h, allow_unacked=False, context=f"rotation {kind}")
        assert not errs, "\n".join(errs)
        h.close()


def _wait_writable(h: Durable, topic: str, timeout: float = 5.0) -> WriteOutcome:
    """Write until the shard takes it (it retries a full disk every 50 ms here)."""
    deadline = time.monotonic() + timeout
    while True:
        out = h.write(topic, make_records("resumed", 1))
        if out.ok or time.monotonic() > deadline:
            return out
        assert out.status == 507, out
        time.sleep(0.02)


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "until-cleared"])
def test_disk_full_on_pwrite_is_507_and_writes_resume_when_space_returns(
    persistent: bool,
) -> None:
    disk, fault, h = _setup()
    with h:
        before = h.read_all("a")
        rule = fault.fail("pwrite", 1, "ENOSPC", persistent=persistent)
        out = h.write("a", make_records("a-full", 2))
        assert not out.ok and out.status == 507 and out.code == "insufficient_storage", out
        shard = h.shard_of_topic("a")
        assert shard.disk_full and not shard.read_only
        assert h.read_all("a") == before, "a refused write is never visible"
        # While full: refused at once with 507, and reads go on.
        if persistent:
            again = h.write("a", make_records("a-again", 1))
            assert not again.ok and again.status == 507
            assert h.read_all("b") is not None
            fault.rules.remove(rule)  # space returns
        resumed = _wait_writable(h, "a")
        assert resumed.ok, resumed
        assert not shard.disk_full
        h.crash_and_recover(fs=disk)
        _exactly_acked(h, "a")
        errs = check_oracle(h, allow_unacked=False, context="disk full")
        assert not errs, "\n".join(errs)
        h.close()


def test_disk_full_at_rotation_is_507_keeps_the_log_and_resumes() -> None:
    file_bytes = 4096
    disk, fault, h = _setup(shards=1, file_bytes=file_bytes)
    with h:
        shard = _fill_the_file(h, file_bytes)
        files = sorted(n for n in disk.listdir(shard.dir) if n.startswith("wal-"))
        # The next write needs a new file, and there is no room for one.
        rule = fault.fail("pwrite", 1, "ENOSPC", persistent=True)
        out = h.write("a", make_records("big", 1, size=600))
        assert not out.ok and out.status == 507, out
        assert shard.disk_full and not shard.read_only
        # No partial file was left behind.
        assert sorted(n for n in disk.listdir(shard.dir) if n.startswith("wal-")) == files
        fault.rules.remove(rule)
        resumed = _wait_writable(h, "a")
        assert resumed.ok and not shard.disk_full
        assert h.write("a", make_records("post", 1, size=600)).ok
        h.crash_and_recover(fs=disk)
        _exactly_acked(h, "a")
        _exactly_acked(h, "b")
        errs = check_oracle(h, allow_unacked=False, context="rotation ENOSPC")
        assert not errs, "\n".join(errs)
        h.close()


def test_disk_class_writes_acknowledged_before_the_disk_filled_wait_and_land() -> None:
    """disk-class writes are acknowledged when queued: if the disk fills before they
    are written they are kept, in order, and written once space returns."""
    disk, fault, h = _setup()
    with h:
        assert h.put_topic("d", {"durability": "disk"})
        # The first write logs (and syncs) the topic's seq reservation; the next ones
        # are acknowledged as soon as they are queued.
        assert h.write("d", make_records("d-first", 1)).ok
        rule = fault.fail("pwrite", 1, "ENOSPC", persistent=True)
        staged = h.submit([("d", make_records("d-early", 3), None)])
        pw = staged[0].pw
        assert pw is not None and pw.ok and pw.published  # acknowledged at enqueue
        h.spin()  # the coalesced frames go to the writer, which finds the disk full
        shard = h.shard_of_topic("d")
        deadline = time.monotonic() + 5
        while not shard.disk_full and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shard.disk_full and not shard.read_only
        fault.rules.remove(rule)
        # The retained frames are written on the next retry, then the state clears.
        deadline = time.monotonic() + 5
        while shard.disk_full and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not shard.disk_full
        assert h.wait(staged)[0].ok
        assert h.write("d", make_records("d-late", 1)).ok
        h.restart(fs=disk)
        got = [r["data"] for r in h.read_all("d") or []]
        assert [g["u"] for g in got] == [
            "d-first.0",
            "d-early.0",
            "d-early.1",
            "d-early.2",
            "d-late.0",
        ]
        h.close()


@pytest.mark.parametrize("nth", [1, 2], ids=["frames-part", "reservation-part"])
def test_a_large_write_failing_in_either_part_never_acks_and_leaves_nothing(nth: int) -> None:
    """A large `disk` write is one WAL entry written in two parts: its frames from
    their own buffer, then the head reservation (docs/HTTP_INPUT.md "Large bodies").
    A failure in either part fails the whole entry, and the part that did land is
    cleared: the write is never visible, the next one lands in its place."""
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1, file_bytes=4 * 1024 * 1024) as h:
        h.open()
        assert h.put_topic("d", {"durability": "disk"})
        assert h.put_topic("e", {"durability": "disk"})
        assert h.write("d", make_records("d-ok", 2)).ok
        assert h.settle(sync=True)
        time.sleep(0.02)  # let the writer's periodic sync and SyncMark pass
        big = make_records("e-big", 3, size=400_000)  # ~1.2 MiB: a part of its own
        fault.fail("pwrite", nth, "EIO")
        out = h.write("e", big)
        assert fault.rules[0].fired == 1
        assert not out.ok and out.status == 500, out
        assert h.read_all("e") == []
        assert not h.shard_of_topic("e").read_only
        assert h.write("e", make_records("e-next", 1)).ok
        h.restart(fs=disk)
        _exactly_acked(h, "d")
        _exactly_acked(h, "e")
        assert h.write("e", big).ok
        h.crash_and_recover()
        _exactly_acked(h, "e")
        errs = check_oracle(h, allow_unacked=False, context=f"large write, pwrite {nth}")
        assert not errs, "\n".join(errs)
        h.close()


def test_reads_go_on_while_the_disk_is_full_even_when_they_advance_a_floor() -> None:
    """A read applies retention; a floor it advances is logged on the side, so a
    full log neither fails the read nor makes it wait."""
    disk, fault, h = _setup(shards=1)
    with h:
        assert h.put_topic("ttl", {"durability": "fsync", "ttl_ms": 1000})
        assert h.write("ttl", make_records("old", 3)).ok
        h.clock.advance(500)
        assert h.write("ttl", make_records("new", 2)).ok
        rule = fault.fail("pwrite", 1, "ENOSPC", persistent=True)
        full = h.write("a", make_records("refused", 1))
        assert full.status == 507 and h.shard_of_topic("a").disk_full
        h.clock.advance(700)  # the first three expire: the read advances the TTL floor
        got = h.read_all("ttl")
        assert got is not None and [r["data"]["u"] for r in got] == ["new.0", "new.1"]
        fault.rules.remove(rule)
        h.close()
