"""Checkpoints: WAL frames into segments, delete flags, drops, snapshots, WAL pruning.

Everything runs through the real Engine + WalJournal + Checkpointer + recovery on a
FakeDisk (:class:`tests.support.durable.Durable`). The fingerprint compared across
restarts covers records (seq, ts, node, tag, data, meta), head, earliest, count,
bytes and the read-path tombstone of every topic.
"""

from __future__ import annotations

import mmap
import posixpath
from dataclasses import replace
from typing import Any

import pytest

from tests.fault.conftest import CRASH_FLAVOURS, flavour_id
from tests.support.durable import (
    DATA_DIR,
    Durable,
    check_oracle,
    fingerprint_equal,
    make_records,
)
from tests.support.fakedisk import FakeDisk, crash_points
from topics.engine.frames import FrameCorrupt
from topics.errors import TopicsError
from topics.format.idx import DELETED
from topics.storage.catalog import load_catalog
from topics.storage.checkpoint import CheckpointFailed
from topics.storage.segment import scan_segments, topic_dir
from topics.storage.snapshot import list_snapshots


def _rich(prefix: str, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        r: dict[str, Any] = {"data": {"u": f"{prefix}.{i}", "v": [i, "é" * (i % 3)]}}
        if i % 2:
            r["tag"] = f"t{i % 3}"
        if i % 3 == 0:
            r["node"] = f"n{i % 2}"
        if i % 4 == 1:
            r["meta"] = {"k": i}
        out.append(r)
    return out


def _segments(disk: FakeDisk, h: Durable, topic: str) -> list[int]:
    tid = h.eng().require(topic).topic_id
    return [first for first, _p in scan_segments(disk, topic_dir(DATA_DIR, tid)).segments]


def test_checkpoint_moves_records_into_segments_and_restart_reads_them_back() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=16) as h:
        h.open()
        for name, cls in (("f", "fsync"), ("d", "disk"), ("m", "memory"), ("e", "ephemeral")):
            assert h.put_topic(name, {"durability": cls})
            for k in range(5):
                assert h.write(name, _rich(f"{name}{k}", 10)).ok
        assert h.delete_records("f", {"match": ["tag", "Eq", "t1"]})[1]
        live = h.fingerprint()
        rep = h.checkpoint()
        assert rep.snapshot == 1 and rep.records == 150 and rep.sealed >= 9
        # Same answers from segments as from memory; chunks freed except the ephemeral's.
        assert not fingerprint_equal(h.fingerprint(), live)
        eng = h.eng()
        for name in ("f", "d", "m"):
            t = eng.require(name)
            assert t.ckpt_seq == t.head_seq == 50 and t.chunk_bytes() == 0
            assert len(_segments(disk, h, name)) == 4  # 16 + 16 + 16 + 2
        assert eng.require("e").chunk_bytes() > 0 and not _segments(disk, h, "e")
        h.restart()
        fp = h.fingerprint()
        for name in ("f", "d", "m"):
            assert fp[name] == live[name], name
        assert fp["e"]["records"] == [] and fp["e"]["head"] == 50
        errs = check_oracle(h, must_survive=("fsync", "disk", "memory"))
        assert not errs, "\n".join(errs)
        h.close()


def test_delete_after_checkpoint_flips_the_idx_flag_and_survives_wal_pruning() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=4096, segment_max_events=8) as h:
        h.open()
        assert h.put_topic("t", {"durability": "fsync"})
        for k in range(6):
            assert h.write("t", _rich(f"a{k}", 6)).ok
        h.checkpoint()
        assert h.delete_records("t", {"match": ["tag", "Eq", "t1"]})[1]
        victims = sorted(s for (tn, s) in h.history.deleted if tn == "t")
        assert victims
        h.checkpoint()  # flips the flags: the Delete frame is durable behind the marks
        tid = h.eng().require("t").topic_id
        raw = disk.snapshot_durable()
        for s in victims:
            first = max(f for f in _segments(disk, h, "t") if f <= s)
            idx = raw[posixpath.join(topic_dir(DATA_DIR, tid), f"seg-{first:016d}.idx")]
            assert idx[(s - first) * 20 + 16] == DELETED, s
        for k in range(20):  # rotate the WAL several times, then prune it twice
            assert h.write("t", make_records(f"b{k}", 3, size=100)).ok
        h.checkpoint()
        h.checkpoint()
        wal = sorted(n for n in disk.listdir(posixpath.join(DATA_DIR, "wal")) if n.endswith(".log"))
        assert wal and wal[0] != "wal-0000000000000000.log", "absorbed WAL files were pruned"
        live = h.fingerprint()
        h.crash_and_recover()
        assert not fingerprint_equal(h.fingerprint(), live)
        errs = check_oracle(h)
        assert not errs, "\n".join(errs)
        h.close()


def test_cap_eviction_drops_whole_sealed_segments_and_never_the_active_one() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=10) as h:
        h.open()
        assert h.put_topic("c", {"durability": "fsync", "cap_records": 25})
        for k in range(10):
            assert h.write("c", make_records(f"c{k}", 10)).ok
        h.checkpoint()
        h.checkpoint()  # the first one wrote segments below the floor; this one drops them
        segs = _segments(disk, h, "c")
        earliest = h.eng().require("c").earliest_seq
        assert earliest == 76 and segs[0] <= earliest and segs[0] > 1
        assert all(f + 9 >= earliest or f == segs[-1] for f in segs)
        live = h.fingerprint()
        h.restart()
        assert not fingerprint_equal(h.fingerprint(), live)
        tomb = h.fingerprint()["c"]["tombstone"]
        assert tomb is not None and tomb["gap_to"] == 75 and tomb["reason"] == "cap"
        h.close()


def test_seal_by_age_uses_the_engine_clock() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=1000) as h:
        h.checkpoint_cfg = replace(
            h.checkpoint_cfg, segment_max_events=1000, segment_max_age_ms=5000
        )
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("x", 3)).ok
        assert h.checkpoint().sealed == 0
        h.clock.advance(6000)
        assert h.write("a", make_records("y", 2)).ok
        rep = h.checkpoint()
        assert rep.sealed == 1
        assert _segments(disk, h, "a") == [1, 4]
        h.close()


def test_the_interval_trigger_reads_the_engine_clock() -> None:
    with Durable(FakeDisk()) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("x", 3)).ok
        assert h.storage is not None
        ck = h.storage.checkpointer
        assert not ck.due()  # the WAL grew, but the interval has not passed
        h.clock.advance(ck.cfg.interval_ms - 1)
        assert not ck.due()
        h.clock.advance(1)
        assert ck.due()
        h.checkpoint()
        assert not ck.due()  # a cycle restarts the interval
        h.close()


def test_topic_delete_removes_its_directory_after_the_next_checkpoint() -> None:
    disk = FakeDisk()
    with Durable(disk) as h:
        h.open()
        assert h.put_topic("gone", {"durability": "fsync"})
        assert h.write("gone", make_records("g", 5)).ok
        h.checkpoint()
        tid = h.eng().require("gone").topic_id
        d = topic_dir(DATA_DIR, tid)
        assert disk.exists(d)
        h.eng().delete_topic("gone")
        assert h.settle()
        h.checkpoint()
        assert not disk.exists(d)
        h.crash_and_recover()
        assert "gone" not in h.eng().topics
        h.close()


def test_corrupt_sealed_segment_is_surfaced_never_skipped() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=5) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("a", 12)).ok
        h.checkpoint()
        tid = h.eng().require("a").topic_id
        path = posixpath.join(topic_dir(DATA_DIR, tid), "seg-0000000000000006.data")
        disk.poke(path, 60, b"\x00")  # inside the first frame's payload
        h.restart()
        eng = h.eng()
        with pytest.raises(FrameCorrupt) as ei:
            h.read_all("a")
        assert ei.value.seq == 6
        # Records before the damaged frame still read; nothing after it is skipped to.
        p = eng.parse_diff({"from_seq": 0, "limit": 5})
        assert [r for r in eng.diff("a", p)[1].seqs] == [1, 2, 3, 4, 5]
        with pytest.raises(FrameCorrupt):
            eng.diff("a", eng.parse_diff({"from_seq": 5, "limit": 1}))
        h.shutdown()


def test_newest_snapshot_corrupt_falls_back_to_the_previous_one() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1, segment_max_events=8) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync", "ttl_ms": 0})
        assert h.write("a", _rich("a", 10)).ok
        h.checkpoint()
        assert h.write("a", _rich("b", 10)).ok
        assert h.put_topic("a", {"durability": "fsync", "cap_records": 15})
        h.checkpoint()
        live = h.fingerprint()
        snaps = list_snapshots(disk, posixpath.join(DATA_DIR, "meta"))
        assert [n for n, _p in snaps] == [1, 2]
        h.crash()
        disk.recover()
        disk.poke(snaps[-1][1], 30, b"\xff\xff")  # the newest snapshot no longer verifies
        h.reopen()
        assert h.report is not None and h.report.snapshot == 1
        assert not fingerprint_equal(h.fingerprint(), live)
        h.close()


def test_shard_count_change_after_a_crash_keeps_config_order() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=3) as h:
        h.open()
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 1000})
        assert h.write("x", make_records("x", 1)).ok
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 1500})
        h.crash_and_recover(shards=2)  # no checkpoint before the layout change
        assert h.eng().require("x").config.ttl_ms == 1500
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 2000})
        h.crash_and_recover(shards=2)
        assert h.eng().require("x").config.ttl_ms == 2000
        h.crash_and_recover(shards=3)
        assert h.eng().require("x").config.ttl_ms == 2000
        h.close()


def test_cold_tier_segments_are_read_resolved_hot_first_and_dropped() -> None:
    """The TopicTier seam on the real path: a sealed segment moved to the cold dir (as the
    relocator will) is loaded and read from there; a copy in both tiers reads HOT; whole-
    segment drops go through the tier that holds it."""
    disk = FakeDisk()
    cold = "/cold"
    with Durable(disk, segment_max_events=5, cold_dir=cold) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("a", 17)).ok
        h.checkpoint()
        live = h.fingerprint()
        tid = h.eng().require("a").topic_id
        hot_d, cold_d = topic_dir(DATA_DIR, tid), topic_dir(cold, tid)
        disk.makedirs(cold_d)
        snap = disk.snapshot_live()
        for first in (1, 6):  # seg 1 moves to cold; seg 6 is copied (in both tiers)
            for ext in ("data", "idx"):
                name = f"seg-{first:016d}.{ext}"
                f = disk.open(posixpath.join(cold_d, name), create=True, write=True)
                f.pwrite(snap[posixpath.join(hot_d, name)], 0)
                f.fdatasync()
                f.close()
                if first == 1:
                    disk.unlink(posixpath.join(hot_d, name))
        disk.fsync_dir(cold_d)
        disk.fsync_dir(hot_d)
        h.restart()
        assert not fingerprint_equal(h.fingerprint(), live)
        st = h.storage.checkpointer.stores[tid] if h.storage else None
        assert st is not None
        tiers = {s.first_seq: s.tier.value for s in st.segs}
        assert tiers[1] == "cold" and tiers[6] == "hot" and tiers[11] == "hot"
        cat = load_catalog(DATA_DIR, cold, fs=disk)
        assert [(s.first_seq, s.tier) for s in cat["a"].segments][:2] == [(1, "cold"), (6, "hot")]
        # Evict below 12: segments 1 (cold) and 6 go through their tier's store.
        assert h.put_topic("a", {"durability": "fsync", "cap_records": 6})
        h.checkpoint()
        h.checkpoint()
        assert not disk.exists(posixpath.join(cold_d, f"seg-{1:016d}.data"))
        assert not disk.exists(posixpath.join(hot_d, f"seg-{6:016d}.data"))
        h.close()


def test_catalog_lists_topics_floors_and_segments() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=10) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.put_topic("b", {"durability": "disk"})
        assert h.write("a", make_records("a", 25)).ok
        assert h.write("b", make_records("b", 5)).ok
        assert h.delete_records("a", {"before_seq": 4})[1]
        h.checkpoint()
        cat = load_catalog(DATA_DIR, fs=disk)
        assert set(cat) == {"a", "b"}
        a = cat["a"]
        assert a.earliest_seq == 4 and a.evict_floor == 1 and a.head_seq == 25
        assert [(s.first_seq, s.last_seq, s.sealed) for s in a.segments] == [
            (4, 13, True),
            (14, 23, True),
            (24, 25, False),
        ]
        assert all(s.tier == "hot" for s in a.segments)
        h.close()


# -- power loss at every fs op of a checkpoint ----------------------------------


def _ckpt_workload(h: Durable) -> None:
    h.open()
    assert h.put_topic("a", {"durability": "fsync"})
    assert h.put_topic("b", {"durability": "fsync", "cap_records": 12})
    for k in range(3):
        assert h.write("a", _rich(f"a{k}", 4)).ok
        assert h.write("b", _rich(f"b{k}", 6)).ok
    h.checkpoint()
    assert h.delete_records("a", {"match": ["tag", "Eq", "t1"]})[1]
    assert h.write("a", _rich("a3", 5)).ok
    assert h.write("b", _rich("b3", 5)).ok


def _probe_ops() -> tuple[int, int]:
    disk = FakeDisk()
    h = Durable(disk, segment_max_events=5)
    try:
        _ckpt_workload(h)
        before = disk.ops
        h.checkpoint()
        after = disk.ops
        h.close()
    finally:
        h.shutdown()
    return before, after


@pytest.mark.parametrize("flavour", CRASH_FLAVOURS, ids=flavour_id)
def test_power_loss_anywhere_in_a_checkpoint_loses_nothing(
    flavour: tuple[str, str | None, int],
) -> None:
    start, end = _probe_ops()
    mode, damage, seed = flavour
    for k in crash_points(end - start, samples=8):
        disk = FakeDisk()
        h = Durable(disk, segment_max_events=5)
        try:
            _ckpt_workload(h)
            want = h.fingerprint()
            if k == 0:
                disk.crash(mode, damage, seed)  # type: ignore[arg-type]
            else:
                disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
            try:
                h.checkpoint()
            except (CheckpointFailed, OSError, TopicsError):
                pass
            ctx = f"k={k}/{end - start} {flavour_id(flavour)} after {disk.trace[-1:]}"
            if not disk.frozen:
                h.crash(mode, damage, seed)
            h.crash_and_recover()
            got = h.fingerprint()
            # Everything was acknowledged (fsync) before the checkpoint began: the state
            # after recovery is exactly the state before it, caps and deletes included.
            errs = [f"{d} [{ctx}]" for d in fingerprint_equal(want, got)]
            # And the next checkpoint and recovery still agree.
            h.checkpoint()
            h.crash_and_recover()
            errs += [
                f"after next checkpoint: {d} [{ctx}]"
                for d in fingerprint_equal(want, h.fingerprint())
            ]
            assert not errs, "\n".join(errs)
            h.close()
        finally:
            h.shutdown()


def test_verify_accepts_a_checkpointed_dir_and_flags_a_missing_replay_start() -> None:
    from topics.storage.check import check
    from topics.storage.snapshot import decode_snapshot

    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=4096, segment_max_events=6) as h:
        h.open()
        assert h.put_topic("t", {"durability": "fsync"})
        for k in range(12):
            assert h.write("t", _rich(f"k{k}", 4)).ok
        assert h.delete_records("t", {"match": ["tag", "Eq", "t1"]})[1]
        h.checkpoint()
        assert h.write("t", _rich("z", 3)).ok
        h.checkpoint()
        for k in range(12):  # the WAL rotates past the file the newest snapshot names
            assert h.write("t", make_records(f"pad{k}", 4, size=200)).ok
        h.shutdown()  # no final checkpoint: snapshot 2 stays the newest
    rep = check(disk, DATA_DIR)
    assert rep.ok, [str(p) for p in rep.corruption]
    assert rep.deleted_records > 0 and rep.valid_snapshots == 2
    snaps = list_snapshots(disk, posixpath.join(DATA_DIR, "meta"))
    f = disk.open(snaps[-1][1])
    body = decode_snapshot(f.pread(f.size(), 0))
    f.close()
    assert isinstance(body, dict)
    name = body["wal"]["wal"][0]
    wal_dir = posixpath.join(DATA_DIR, "wal")
    files = sorted(n for n in disk.listdir(wal_dir) if n.endswith(".log"))
    assert files[-1] != name
    disk.unlink(posixpath.join(wal_dir, name))
    rep = check(disk, DATA_DIR)
    assert "snapshot_wal_missing" in [p.kind for p in rep.corruption]


def test_active_segment_torn_to_nothing_is_still_readable_after_the_next_checkpoint() -> None:
    """A crash inside a checkpoint can leave a new segment pair with no durable entry (its
    records are still in the WAL). Recovery resumes it empty; the next checkpoint appends
    to it, so it must be a registered source of the topic (a read once failed on it)."""
    disk = FakeDisk()
    with Durable(disk, shards=1, segment_max_events=5) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("a", 5)).ok
        h.checkpoint()  # seg 1, full
        assert h.write("a", make_records("b", 3)).ok  # seqs 6-8: WAL only
        want = h.fingerprint()
        tid = h.eng().require("a").topic_id
        d = topic_dir(DATA_DIR, tid)
        h.crash()
        disk.recover()
        # What a checkpoint cut short after creating seg 6 leaves: both names, no entry.
        for ext in ("data", "idx"):
            disk.open(posixpath.join(d, f"seg-0000000000000006.{ext}"), create=True, write=True)
        disk.fsync_dir(d)
        h.reopen()
        assert not fingerprint_equal(h.fingerprint(), want)
        h.checkpoint()  # appends seqs 6-8 to the empty active segment
        assert not fingerprint_equal(h.fingerprint(), want)
        h.crash_and_recover()
        assert not fingerprint_equal(h.fingerprint(), want)
        h.close()


def test_no_valid_snapshot_refuses_to_start_with_nothing_changed() -> None:
    """Snapshots that exist but none verifies: the topics and segments they name
    cannot be found, so the start is refused rather than served half empty."""
    from topics.storage.recovery import SnapshotDamage

    disk = FakeDisk()
    with Durable(disk, shards=1, segment_max_events=8) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", _rich("a", 10)).ok
        h.checkpoint()
        assert h.write("a", _rich("b", 10)).ok
        h.checkpoint()
        h.crash()
        disk.recover()
        snaps = list_snapshots(disk, posixpath.join(DATA_DIR, "meta"))
        assert len(snaps) == 2
        for _n, path in snaps:
            disk.poke(path, 30, b"\xff\xff")
        image = disk.snapshot_durable()
        with pytest.raises(SnapshotDamage) as ei:
            h.reopen()
        assert "none of the 2 snapshots" in str(ei.value)
        assert disk.snapshot_durable() == image


def test_large_writes_laid_out_in_an_mmap_are_checkpointed_and_read_back() -> None:
    """Frames sealed in place in an anonymous mmap (large writes, docs/HTTP_INPUT.md
    "Large bodies") are copied into segments like any other in-memory frames."""
    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=4 * 1024 * 1024, segment_max_events=4) as h:
        h.open()
        for name, cls in (("f", "fsync"), ("d", "disk"), ("m", "memory")):
            assert h.put_topic(name, {"durability": cls})
            for k in range(2):  # the harness lays out every other write ahead
                assert h.write(name, make_records(f"{name}{k}", 5, size=250_000)).ok
        eng = h.eng()
        bufs = [s.buf for n in "fdm" for s in eng.require(n).sources.values()]
        assert sum(isinstance(b, mmap.mmap) for b in bufs) >= 3
        live = h.fingerprint()
        rep = h.checkpoint()
        assert rep.records == 30
        for name in "fdm":
            t = eng.require(name)
            assert t.ckpt_seq == t.head_seq == 10 and t.chunk_bytes() == 0
        assert not fingerprint_equal(h.fingerprint(), live)
        h.restart()
        assert not fingerprint_equal(h.fingerprint(), live)
        h.crash_and_recover()
        errs = check_oracle(h, must_survive=("fsync", "disk", "memory"))
        assert not errs, "\n".join(errs)
        h.close()
