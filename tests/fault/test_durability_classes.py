"""Row 12: each durability class meets its crash contract (SEMANTICS §14).

| class | after a power loss | after a graceful restart |
|---|---|---|
| fsync | every acked record | all |
| disk | all but an un-synced tail; seqs never reused (reservation) | all acked |
| memory | best effort, never fabricated; head may regress | all acked |
| ephemeral | records gone, config kept | records gone, config kept |
"""

from __future__ import annotations

import pytest

from tests.fault.conftest import CRASH_FLAVOURS, flavour_id
from tests.support.durable import Durable, check_oracle, make_records
from tests.support.fakedisk import FakeDisk, crash_points
from topics.errors import TopicsError

CLASSES = ("fsync", "disk", "memory", "ephemeral")
# A sync interval long enough that the writer's periodic sync never runs on its own
# during a test: un-synced frames stay un-synced until a crash drops them.
NO_BG_SYNC = 30.0


def _all_classes(h: Durable, *, check: bool = True) -> None:
    for cls in CLASSES:
        ok = h.put_topic(cls, {"durability": cls})
        assert ok or not check


def test_graceful_restart_keeps_every_acked_record_except_ephemeral() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=2, sync_interval_s=NO_BG_SYNC) as h:
        h.open()
        _all_classes(h)
        for i in range(4):
            for cls in CLASSES:
                assert h.write(cls, make_records(f"{cls}{i}", 2)).ok
        live = {cls: h.read_all(cls) for cls in CLASSES}
        h.restart()
        for cls in ("fsync", "disk", "memory"):
            assert h.read_all(cls) == live[cls], cls
        assert h.read_all("ephemeral") == []
        st = h.state("ephemeral")
        assert st is not None and st["config"]["durability"] == "ephemeral"
        errs = check_oracle(h, must_survive=("fsync", "disk", "memory"), context="restart")
        assert not errs, "\n".join(errs)
        h.close()


def test_power_loss_per_class() -> None:
    """Crash with nothing synced by the writer's timer: fsync survives, disk/memory lose
    at most their un-synced tail, ephemeral keeps only its config; a disk topic never
    re-issues an acked seq, a memory topic may (its head regresses), nothing is fabricated."""
    disk = FakeDisk()
    with Durable(disk, shards=1, sync_interval_s=NO_BG_SYNC) as h:
        h.open()
        _all_classes(h)
        for i in range(3):
            for cls in CLASSES:
                assert h.write(cls, make_records(f"{cls}{i}", 2)).ok
        acked_max = {
            cls: max(max(b.seqs) for b in h.history.acked(cls)) for cls in ("disk", "memory")
        }
        h.crash_and_recover()
        errs = check_oracle(h, context="power loss")
        assert not errs, "\n".join(errs)
        assert h.read_all("ephemeral") == []
        assert h.state("ephemeral") is not None
        # disk: head at least the durable reservation, so new seqs are above every acked one.
        d = h.write("disk", make_records("disk-after", 1))
        assert d.ok and d.first_seq is not None and d.first_seq > acked_max["disk"]
        # memory: best effort; the head may regress but never above an acked head.
        assert h.eng().require("memory").head_seq <= acked_max["memory"] + 1
        m = h.write("memory", make_records("memory-after", 1))
        assert m.ok
        h.restart()
        errs = check_oracle(h, context="after second generation")
        assert not errs, "\n".join(errs)
        for o in (d, m):
            got = [r["$seq"] for r in h.read_all(o.topic) or []]
            assert o.first_seq in got, (
                f"{o.topic} acked after recovery, then lost on a clean restart"
            )
        h.close()


def test_memory_head_may_regress_but_never_fabricates() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1, sync_interval_s=NO_BG_SYNC) as h:
        h.open()
        assert h.put_topic("m", {"durability": "memory"})
        h.settle(sync=True)
        assert h.write("m", make_records("old", 3)).ok
        h.crash_and_recover()  # the un-synced memory frames are gone
        assert h.read_all("m") == []
        assert h.eng().require("m").head_seq == 0
        out = h.write("m", make_records("new", 1))
        assert out.ok and out.first_seq == 1  # the documented regression: seq 1 re-issued
        h.restart()
        recs = h.read_all("m") or []
        assert [r["data"]["u"] for r in recs] == ["new.0"]
        errs = check_oracle(h, context="memory regression")
        assert not errs, "\n".join(errs)
        h.close()


def test_disk_seqs_never_reused_after_power_loss() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1, sync_interval_s=NO_BG_SYNC) as h:
        h.open()
        assert h.put_topic("d", {"durability": "disk"})
        acked: list[int] = []
        for gen in range(3):
            for i in range(5):
                out = h.write("d", make_records(f"g{gen}.{i}", 2))
                assert out.ok
                assert not acked or out.seqs[0] > max(acked), "an acked seq was re-issued"
                acked += out.seqs
            h.crash_and_recover()
            errs = check_oracle(h, context=f"gen {gen}")
            assert not errs, "\n".join(errs)
            assert h.eng().require("d").head_seq >= max(acked)
        h.close()


def test_cross_topic_group_commit_keeps_fsync_acks() -> None:
    """A non-durable write batched with a durable one on the same shard never costs the
    durable one its ack or its durability."""
    disk = FakeDisk()
    with Durable(disk, shards=1, sync_interval_s=NO_BG_SYNC) as h:
        h.open()
        for cls in ("fsync", "disk", "memory"):
            assert h.put_topic(cls, {"durability": cls})
        for i in range(5):
            outs = h.write_many(
                [
                    ("memory", make_records(f"m{i}", 1), None),
                    ("fsync", make_records(f"f{i}", 2), None),
                    ("disk", make_records(f"d{i}", 1), None),
                ]
            )
            assert all(o.ok for o in outs), outs
        h.crash_and_recover()
        errs = check_oracle(h, context="group commit")
        assert not errs, "\n".join(errs)
        assert len(h.read_all("fsync") or []) == 10
        h.close()


def _mixed_workload(h: Durable) -> None:
    steps = [
        h.open,
        lambda: _all_classes(h, check=False),
        lambda: h.write("fsync", make_records("f0", 1)),
        lambda: h.write("disk", make_records("d0", 2)),
        lambda: h.write("memory", make_records("m0", 1)),
        lambda: h.write("ephemeral", make_records("e0", 1)),
        lambda: h.write("disk", make_records("d1", 1)),
        lambda: h.write("fsync", make_records("f1", 2)),
        lambda: h.write("memory", make_records("m1", 1)),
        lambda: h.settle(sync=True),
        lambda: h.write("fsync", make_records("f2", 1)),
    ]
    for step in steps:
        if h.disk.frozen:
            return
        try:
            step()
        except (OSError, TopicsError):
            if not h.disk.frozen:
                raise


@pytest.mark.parametrize("flavour", CRASH_FLAVOURS, ids=flavour_id)
def test_mixed_class_crash_sweep(flavour: tuple[str, str | None, int]) -> None:
    """Crash after op k of a mixed-class workload (k sampled; all with EXHAUSTIVE)."""
    mode, damage, seed = flavour
    probe = FakeDisk()
    hp = Durable(probe, shards=2, sync_interval_s=NO_BG_SYNC)
    try:
        _mixed_workload(hp)
        hp.close()
    finally:
        hp.shutdown()
    m = probe.ops
    errs: list[str] = []
    for k in crash_points(m, samples=6):
        disk = FakeDisk()
        h = Durable(disk, shards=2, sync_interval_s=NO_BG_SYNC)
        try:
            if k == 0:
                disk.crash(mode, damage, seed)  # type: ignore[arg-type]
            else:
                disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
            _mixed_workload(h)
            acked_disk = [s for b in h.history.acked("disk") for s in b.seqs]
            if not disk.frozen:
                h.crash(mode, damage, seed)
            h.crash_and_recover()
            ctx = f"k={k} {flavour_id(flavour)}"
            errs += check_oracle(h, context=ctx, atomic_batches=mode != "torn_last")
            if "disk" in h.eng().topics:
                out = h.write("disk", make_records("d-after", 1))
                if out.ok and acked_disk and out.seqs[0] <= max(acked_disk):
                    errs.append(f"disk seq {out.seqs[0]} re-issued [{ctx}]")
            h.close()
        finally:
            h.shutdown()
    assert not errs, "\n".join(errs)


def test_disk_topic_with_cap_keeps_records_across_clean_restart() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("dk", {"durability": "disk", "cap_records": 10})
        assert h.write("dk", make_records("x", 3)).ok
        h.restart()
        assert len(h.read_all("dk") or []) == 3
        assert h.fingerprint()["dk"]["tombstone"] is None
        h.close()


def test_ephemeral_head_preserved_across_clean_restart() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("e", {"durability": "ephemeral"})
        assert h.write("e", make_records("e", 3)).ok
        h.restart()
        assert h.read_all("e") == []
        out = h.write("e", make_records("e2", 1))
        assert out.first_seq == 4
        h.close()


def test_batch_larger_than_a_wal_file_is_refused_before_it_is_acknowledged() -> None:
    """A write is one WAL entry and entries never span files: an oversized `disk`
    batch must be refused up front (413), not acknowledged and then latch the shard."""
    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=8 * 1024) as h:
        h.open()
        assert h.put_topic("d1", {"durability": "disk"})
        assert h.put_topic("f1", {"durability": "fsync"})
        assert h.write("d1", make_records("small", 1)).ok
        big = [{"data": "x" * 2500} for _ in range(4)]
        out = h.write("d1", big)
        assert not out.ok and out.status == 413
        assert h.write("f1", make_records("after", 1)).ok  # the shard still works
        assert h.write("d1", make_records("after", 1)).ok
        h.close()
