"""Row 2: an fdatasync error never acks, never becomes visible, and never orphans later acks.

Faults are injected with FaultFs on the WAL's ``fdatasync`` (once, persistent,
and the fsyncgate flavour where the failed fsync *discards* the file's dirty
pages while the page cache keeps showing them, as Linux does). The contract
(SEMANTICS §14, §18, §19.12; anchors §3.16 #2):

* the failing write returns 500 and its records are never visible — not before
  the restart, not after a power loss, not after a process restart;
* writes acked before it survive;
* the shard latches read-only: later writes to it are refused (500) instead of
  being acked after a "successful" retry; other shards keep working;
* after a restart, every write acked from then on survives a power loss (the
  recovered log never builds on bytes that are not durable).
"""

from __future__ import annotations

import pytest

from tests.support.durable import Durable, GateFs, check_oracle, make_records
from tests.support.fakedisk import FakeDisk, FaultFs

MODES = ["once", "persistent", "fsyncgate"]


def _setup(mode: str) -> tuple[FakeDisk, FaultFs, Durable]:
    disk = FakeDisk()
    fault = FaultFs(disk)
    h = Durable(fault)
    h.open()
    assert h.put_topic("a", {"durability": "fsync"})
    assert h.put_topic("b", {"durability": "fsync"})
    assert h.shard_index("a") != h.shard_index("b")
    assert h.write("a", make_records("a-ok", 2)).ok
    assert h.write("b", make_records("b-ok", 1)).ok
    # Sync the SyncMarks those writes left, so the next fdatasync is the next write's.
    assert h.settle(sync=True)
    fault.fail(
        "fdatasync",
        1,
        "EIO",
        persistent=mode == "persistent",
        fsyncgate=mode == "fsyncgate",
    )
    return disk, fault, h


def _fail_one(h: Durable) -> list[bytes]:
    before = h.read_all("a")
    head_before = h.eng().require("a").head_seq
    out = h.write("a", make_records("a-bad", 2))
    assert not out.ok and out.status == 500, out
    assert out.seqs, "the failed write was staged"
    # Never visible: the records are not readable and nothing else changed.
    assert h.read_all("a") == before
    t = h.eng().require("a")
    # The failed batch's seqs become silent holes (never reused).
    assert t.head_seq in (head_before, out.last_seq)
    assert h.shard_of_topic("a").read_only, "an fdatasync failure latches the shard"
    return out.datas


@pytest.mark.parametrize("mode", MODES)
def test_fsync_eio_fails_batch_and_latches_read_only(mode: str) -> None:
    disk, fault, h = _setup(mode)
    with h:
        _fail_one(h)
        # Later writes to the latched shard are refused, never acked after a retry.
        again = h.write("a", make_records("a-later", 1))
        assert not again.ok and again.status == 500, again
        assert fault.rules[0].fired >= 1
        other = h.write("b", make_records("b-later", 1))
        if mode == "persistent":
            assert not other.ok and other.status == 500
        else:
            assert other.ok, "the other shard keeps accepting writes"
        errs = check_oracle(h, allow_unacked=False, context=f"{mode} live")
        assert not errs, "\n".join(errs)
        h.crash_and_recover(fs=disk)  # the faulty device is replaced on the way back
        errs = check_oracle(h, allow_unacked=False, context=f"{mode} after power loss")
        assert not errs, "\n".join(errs)
        # The recovered WAL accepts writes on both shards again.
        assert h.write("a", make_records("a-post", 1)).ok
        assert h.write("b", make_records("b-post", 1)).ok
        h.crash_and_recover()
        errs = check_oracle(h, allow_unacked=False, context=f"{mode} second power loss")
        assert not errs, "\n".join(errs)
        h.close()


@pytest.mark.parametrize("mode", MODES)
def test_fsync_eio_then_process_restart_never_resurrects_or_orphans(mode: str) -> None:
    """fsync fails, the process restarts (page cache intact), writes resume, power is lost.

    The failed batch must not come back from the page cache on the restart, and the
    writes acked after the restart must survive the power loss: recovery must not
    append after bytes that only the page cache holds (fsyncgate, anchors §3.16 #2).
    """
    disk, fault, h = _setup(mode)
    with h:
        _fail_one(h)
        h.restart(fs=disk)
        errs = check_oracle(h, allow_unacked=False, context=f"{mode} after restart")
        assert not errs, "\n".join(errs)
        out = h.write("a", make_records("a-post", 2))
        assert out.ok, out
        assert h.write("b", make_records("b-post", 1)).ok
        h.crash_and_recover()
        errs = check_oracle(h, allow_unacked=False, context=f"{mode} restart + power loss")
        assert not errs, "\n".join(errs)
        h.close()


def test_fsync_eio_on_mixed_batch_fails_every_member() -> None:
    """A group commit mixing an `fsync` and a `disk` write fails both when its sync fails."""
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("f", {"durability": "fsync"})
        assert h.put_topic("d", {"durability": "disk"})
        assert h.write("d", make_records("d0", 1)).ok  # takes the disk reservation
        h.settle(sync=True)
        fault.fail("fdatasync", 1, "EIO")
        outs = h.write_many(
            [("d", make_records("d1", 1), None), ("f", make_records("f1", 1), None)]
        )
        # Whether or not both landed in one batch, no member is acked by a failed sync
        # or after the latch.
        assert not outs[1].ok, outs
        assert h.read_all("f") == []
        h.crash_and_recover(fs=disk)
        errs = check_oracle(h, context="mixed batch")
        assert not errs, "\n".join(errs)
        assert h.read_all("f") == []
        h.close()


def test_fsync_eio_on_disk_reservation_rolls_back() -> None:
    """A disk write whose head reservation cannot be synced fails and reserves nothing."""
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("d", {"durability": "disk"})
        fault.fail("fdatasync", 1, "EIO")
        out = h.write("d", make_records("d0", 3))
        assert not out.ok and out.status == 500
        assert h.journal is not None and h.journal.reserved.get(1, 0) == 0
        h.crash_and_recover(fs=disk)
        assert h.read_all("d") == []
        out = h.write("d", make_records("d1", 1))
        assert out.ok
        h.crash_and_recover()
        errs = check_oracle(h, must_survive=("fsync", "disk"), context="reservation")
        assert not errs, "\n".join(errs)
        h.close()


def _fill_to_near_end(h: Durable, file_bytes: int) -> None:
    """Single-record fsync writes until the active file has 200..1400 bytes of room."""
    shard = h.shard_of_topic("a")
    i = 0
    while file_bytes - shard.position[1] > 1400:
        assert h.write("a", make_records(f"fill{i}", 1, size=60)).ok
        i += 1
    assert file_bytes - shard.position[1] >= 200


@pytest.mark.parametrize("fail_at", ["rotation_sync", "final_sync"])
@pytest.mark.parametrize("gate_mode", [False, True], ids=["eio", "fsyncgate"])
def test_fsync_eio_in_a_batch_that_rotates(fail_at: str, gate_mode: bool) -> None:
    """One group commit: W2 fits the old file, W3 forces a rotation. Fail the old file's
    sync (nothing of W2/W3 may be acked or come back) or the final sync on the new
    file (W2 was made durable by the rotation's sync: acked; W3 failed: gone)."""
    file_bytes = 4096
    disk = FakeDisk()
    gate = GateFs(disk, "none")
    fault = FaultFs(gate)
    with Durable(fault, shards=1, file_bytes=file_bytes) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        _fill_to_near_end(h, file_bytes)
        # Hold the writer inside W1's fdatasync so W2 and W3 queue into one batch.
        gate.arm("fdatasync", 1)
        w1 = h.submit([("a", make_records("w1", 1), None)])
        assert gate.reached.wait(5)
        w23 = h.submit(
            [("a", make_records("w2", 1), None), ("a", make_records("w3", 1, size=1600), None)]
        )
        # fdatasyncs of the [W2, W3] batch: old file (1), new file zero-fill (2),
        # CURRENT.tmp (3), the batch on the new file (4).
        fault.fail("fdatasync", 1 if fail_at == "rotation_sync" else 4, "EIO", fsyncgate=gate_mode)
        gate.release()
        o1 = h.wait(w1)[0]
        o2, o3 = h.wait(w23)
        assert o1.ok
        assert not o3.ok
        if fail_at == "rotation_sync":
            assert not o2.ok
        else:
            assert o2.ok, "W2 was made durable by the rotation's sync"
        assert h.shard_of_topic("a").read_only
        errs = check_oracle(h, allow_unacked=False, context="live")
        assert not errs, "\n".join(errs)
        h.restart(fs=disk)
        errs = check_oracle(h, allow_unacked=False, context="after restart")
        assert not errs, "\n".join(errs)
        assert h.write("a", make_records("post", 1)).ok
        h.crash_and_recover()
        errs = check_oracle(h, allow_unacked=False, context="restart + power loss")
        assert not errs, "\n".join(errs)
        h.close()
