"""Segments the snapshot relies on when a topic's head runs past its records.

After a power loss a `disk` topic's head jumps to its durable reservation: the
seqs in between are holes that were never written. A checkpoint writes them as
header-only frames, and a later one drops those segments again once every entry
is deleted (docs/FORMATS.md, "Segment files", "Holes"). So a snapshot's `head`
can lie far beyond its last segment, and the segment files a crashed checkpoint
leaves above the listed ones (a `.data` without its `.idx`, a short pair) were
never relied on. The snapshot's own list of its segments (`segs`) says what it
relies on (docs/FORMATS.md, "Segments the snapshot relies on"); these tests replay
the crash sequences that were once refused as damage, sweep the crash points
around them, and check that real damage to a listed segment, or (for a snapshot
written before it listed its segments) to one below its head, is still refused.
Entries such a checkpoint appended past the listed ones are cut at recovery (the
WAL still holds their records): a torn `.idx` byte there is never served.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

import pytest

from tests.fault.conftest import CRASH_FLAVOURS, flavour_id
from tests.support.durable import DATA_DIR, Durable, check_oracle, make_records, segmented_topic
from tests.support.fakedisk import FakeDisk, crash_points
from topics.errors import TopicsError
from topics.storage.checkpoint import CheckpointFailed
from topics.storage.segment import scan_segments, topic_dir
from topics.storage.snapshot import load_latest, next_snapshot_number, write_snapshot
from topics.storage.topicstore import SegmentDamage

META = posixpath.join(DATA_DIR, "meta")
SEG = 8
TOPICS = (("f1", "fsync"), ("f2", "fsync"), ("d1", "disk"))


def _open(disk: FakeDisk) -> Durable:
    """The property test's setup (tests/property/test_durable_state_machine.py)."""
    h = Durable(disk, shards=2, file_bytes=8 * 1024, sync_interval_s=30.0, segment_max_events=SEG)
    h.open()
    for name, cls in TOPICS:
        assert h.put_topic(name, {"durability": cls})
    assert h.settle(sync=True)
    return h


def _crash_in_checkpoint(
    h: Durable, disk: FakeDisk, after: int, mode: str = "drop_all", seed: int = 0
) -> None:
    """Power loss `after` fs ops into a checkpoint (now when 0; at its end when it is
    shorter), then recover: the property test's `crash_during_checkpoint`."""
    disk.crash_after(after, mode, None, seed)  # type: ignore[arg-type]
    try:
        h.checkpoint()
    except (CheckpointFailed, OSError, TopicsError):
        pass
    h.crash_and_recover(mode=mode, seed=seed)


def _snap_topic(disk: FakeDisk, name: str) -> dict[str, object]:
    found = load_latest(disk, META)
    assert found is not None
    (m,) = [m for m in found[1]["topics"] if m["name"] == name]
    return dict(m)


def _files(disk: FakeDisk, h: Durable, name: str) -> list[str]:
    d = topic_dir(DATA_DIR, h.eng().require(name).topic_id)
    return sorted(disk.listdir(d)) if disk.exists(d) else []


def _check(h: Durable, ctx: str) -> None:
    errs = check_oracle(h, must_survive=("fsync",), context=ctx)
    assert not errs, "\n".join(errs)


@pytest.fixture
def h(disk: FakeDisk) -> Iterator[Durable]:
    h = _open(disk)
    yield h
    h.shutdown()


def test_reservation_holes_past_the_newest_segment_are_not_missing_entries(
    disk: FakeDisk, h: Durable
) -> None:
    """The newest segment holds seq 1, the head is the reservation (257): seqs
    2..257 are holes no checkpoint wrote, not entries missing from the segment."""
    assert h.write("d1", [{"data": {"u": 1}}]).ok
    _crash_in_checkpoint(h, disk, 14)  # seg-1 written, its snapshot never
    assert _files(disk, h, "d1") == ["seg-0000000000000001.data", "seg-0000000000000001.idx"]
    assert [r["$seq"] for r in h.read_all("d1") or []] == [1]
    assert h.eng().require("d1").head_seq == 257
    assert h.delete_records("d1", {"before_seq": 2})[1] and h.settle(sync=True)
    h.checkpoint()  # nothing left to write: the holes are below the earliest seq
    m = _snap_topic(disk, "d1")
    assert m["head"] == 257 and all(a + n - 1 <= 1 for a, n in m["segs"]), m
    _crash_in_checkpoint(h, disk, 0)
    t = h.eng().require("d1")
    assert h.read_all("d1") == [] and t.head_seq == 257
    out = h.write("d1", [{"data": {"u": 2}}])
    assert out.ok and out.first_seq == 258
    _check(h, "after the second crash")
    h.close()


def _holes_dropped(h: Durable, disk: FakeDisk) -> None:
    """Leave d1 with seqs 1..8 in seg-1 and a durable snapshot whose head (264) lies
    past them: the hole segments 9..264 were written by one checkpoint, dropped by
    the next, and the power loss after that makes the next checkpoint write them
    again (the engine's checkpointed seq comes back as 8)."""
    assert h.write("d1", [{"data": {"u": i}} for i in range(4)]).ok
    h.restart()
    assert h.write("d1", [{"data": {"u": 10 + i}} for i in range(4)]).ok
    _crash_in_checkpoint(h, disk, 0)
    assert h.eng().require("d1").head_seq == 264
    h.checkpoint()  # seg-1 filled, seg-9 .. seg-257: holes only
    assert len(_files(disk, h, "d1")) == 2 * 33
    h.checkpoint()  # every hole segment dropped
    assert _files(disk, h, "d1") == ["seg-0000000000000001.data", "seg-0000000000000001.idx"]
    _crash_in_checkpoint(h, disk, 0)
    m = _snap_topic(disk, "d1")
    assert (m["head"], m["ckpt"], m["segs"]) == (264, 264, [[1, 8]])
    assert h.eng().require("d1").ckpt_seq == 8


def test_stray_half_of_a_rewritten_hole_segment_is_not_damage(disk: FakeDisk, h: Durable) -> None:
    """The exact sequence: the checkpoint writing the holes again is cut after
    seg-9.data is created; its `.idx` never made it to disk."""
    _holes_dropped(h, disk)
    _crash_in_checkpoint(h, disk, 7, "subset", 0)
    assert [r["$seq"] for r in h.read_all("d1") or []] == list(range(1, 9))
    assert h.eng().require("d1").head_seq == 264
    _check(h, "after the cut checkpoint")
    h.checkpoint()
    h.restart()
    assert [r["$seq"] for r in h.read_all("d1") or []] == list(range(1, 9))
    h.close()


def _probe_hole_rewrite() -> int:
    """Fs ops of the checkpoint that writes the holes again."""
    disk = FakeDisk()
    h = _open(disk)
    try:
        _holes_dropped(h, disk)
        start = disk.ops
        h.checkpoint()
        return disk.ops - start
    finally:
        h.shutdown()


@pytest.mark.parametrize(
    "flavour", [("subset", None, 0), *CRASH_FLAVOURS], ids=lambda f: flavour_id(f)
)
def test_power_loss_anywhere_while_holes_are_rewritten_is_never_damage(
    flavour: tuple[str, str | None, int],
) -> None:
    mode, damage, seed = flavour
    for k in crash_points(_probe_hole_rewrite(), samples=10):
        disk = FakeDisk()
        h = _open(disk)
        try:
            _holes_dropped(h, disk)
            if k == 0:
                disk.crash(mode, damage, seed)  # type: ignore[arg-type]
            else:
                disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
            try:
                h.checkpoint()
            except (CheckpointFailed, OSError, TopicsError):
                pass
            if not disk.frozen:
                h.crash(mode, damage, seed)
            h.crash_and_recover()  # raised SegmentDamage before the fix
            ctx = f"crash point {k} {flavour_id(flavour)}"
            assert [r["$seq"] for r in h.read_all("d1") or []] == list(range(1, 9)), ctx
            _check(h, ctx)
            h.checkpoint()
            h.crash_and_recover()
            assert [r["$seq"] for r in h.read_all("d1") or []] == list(range(1, 9)), ctx
            h.close()
        finally:
            h.shutdown()


@pytest.mark.parametrize("part", ["idx", "data"])
def test_a_listed_segment_gone_with_holes_past_it_is_still_damage(
    disk: FakeDisk, h: Durable, part: str
) -> None:
    _holes_dropped(h, disk)
    d = topic_dir(DATA_DIR, h.eng().require("d1").topic_id)
    h.shutdown()
    disk.crash()
    disk.recover()
    path = posixpath.join(d, f"seg-{1:016d}.{part}")
    disk.unlink(path)
    disk.fsync_dir(d)
    image = disk.snapshot_durable()
    with pytest.raises(SegmentDamage, match="seg-0000000000000001"):
        h.reopen()
    assert disk.snapshot_durable() == image


def _middle_deleted(disk: FakeDisk) -> Durable:
    """Topic `s` with three full segments and a short active one, every record of
    the middle segment (seqs 9..16) deleted and its delete flags flipped: the next
    checkpoint drops it."""
    h = Durable(disk, shards=1, segment_max_events=SEG)
    h.open()
    assert h.put_topic("s", {"durability": "fsync"})
    for i in range(3 * SEG + 2):
        rec = make_records(f"s{i}", 1)[0]
        if SEG < i + 1 <= 2 * SEG:
            rec["tag"] = "x"
        assert h.write("s", [rec]).ok
    h.checkpoint()
    assert h.delete_records("s", {"match": ["tag", "Eq", "x"]})[1]
    h.checkpoint()
    return h


MIDDLE_LIVE = [*range(1, SEG + 1), *range(2 * SEG + 1, 3 * SEG + 3)]


def test_a_fully_deleted_segment_between_listed_ones_is_dropped_without_false_damage() -> None:
    disk = FakeDisk()
    with _middle_deleted(disk) as h:
        assert [r["$seq"] for r in h.read_all("s") or []] == MIDDLE_LIVE
        start = disk.ops
        h.checkpoint()
        ops = disk.ops - start
        d = topic_dir(DATA_DIR, h.eng().require("s").topic_id)
        assert [f for f, _p in scan_segments(disk, d).segments] == [1, 2 * SEG + 1, 3 * SEG + 1]
        assert _snap_topic(disk, "s")["segs"] == [[1, SEG], [2 * SEG + 1, SEG], [3 * SEG + 1, 2]]
        h.close()
    for k in crash_points(ops, samples=12):
        for mode, seed in (("drop_all", 0), ("subset", k)):
            disk = FakeDisk()
            with _middle_deleted(disk) as h:
                _crash_in_checkpoint(h, disk, k, mode, seed)
                assert [r["$seq"] for r in h.read_all("s") or []] == MIDDLE_LIVE, (k, mode)
                h.close()


def test_damage_past_a_dropped_segment_is_still_refused() -> None:
    disk = FakeDisk()
    with _middle_deleted(disk) as h:
        h.checkpoint()  # drops seg-9
        d = topic_dir(DATA_DIR, h.eng().require("s").topic_id)
        h.close()
        path = posixpath.join(d, f"seg-{2 * SEG + 1:016d}.idx")
        f = disk.open(path, write=True)
        f.truncate(20 * 3)
        f.fdatasync()
        f.close()
        image = disk.snapshot_durable()
        with pytest.raises(SegmentDamage, match=f"seg-{2 * SEG + 1:016d}"):
            h.reopen()
        assert disk.snapshot_durable() == image


def _strip_segs(disk: FakeDisk) -> None:
    """Install a newer snapshot equal to the newest one without `segs` (what a
    server from before snapshots listed their segments wrote)."""
    found = load_latest(disk, META)
    assert found is not None
    body = found[1]
    for m in body["topics"]:
        m.pop("segs", None)
    write_snapshot(disk, META, next_snapshot_number(disk, META), body)


def _legacy_build(disk: FakeDisk) -> tuple[Durable, str]:
    h, d = segmented_topic(disk, SEG)
    _strip_segs(disk)
    return h, d


def test_snapshot_without_segs_still_loads() -> None:
    disk = FakeDisk()
    h, _d = _legacy_build(disk)
    with h:
        h.reopen()
        assert [r["$seq"] for r in h.read_all("s") or []] == list(range(1, 3 * SEG + 4))
        h.close()


@pytest.mark.parametrize(
    ("first", "part", "keep"),
    [
        (1 + SEG, "idx", None),  # a sealed segment's .idx gone
        (1 + SEG, "data", 100),  # a sealed segment's .data cut short
        (1 + 3 * SEG, "idx", 20),  # the active segment short of the head
    ],
)
def test_snapshot_without_segs_still_refuses_damage_below_its_head(
    first: int, part: str, keep: int | None
) -> None:
    disk = FakeDisk()
    h, d = _legacy_build(disk)
    with h:
        path = posixpath.join(d, f"seg-{first:016d}.{part}")
        if keep is None:
            disk.unlink(path)
            disk.fsync_dir(d)
        else:
            f = disk.open(path, write=True)
            f.truncate(keep)
            f.fdatasync()
            f.close()
        image = disk.snapshot_durable()
        with pytest.raises(SegmentDamage, match=f"seg-{first:016d}"):
            h.reopen()
        assert disk.snapshot_durable() == image


def _holes_appended(disk: FakeDisk) -> tuple[Durable, int]:
    """d1's seq 1 checkpointed into seg-1, then a power loss pads its head with
    holes; returns the open harness and the length of the disk's op trace."""
    h = _open(disk)
    assert h.write("d1", [{"data": {"u": 1}}]).ok
    h.checkpoint()
    assert h.write("d1", [{"data": {"u": 2}}]).ok  # never synced: lost below
    h.crash_and_recover()
    assert h.eng().require("d1").head_seq > SEG
    start = len(disk.trace)
    return h, start


def test_torn_idx_bytes_past_the_listed_entries_are_never_served() -> None:
    """A checkpoint appends holes to the snapshot's active segment and the power
    fails before its snapshot is written; the `.idx` write of those holes was torn
    so that one hole's 0xD5 flag is gone (no frame checksum covers that byte).
    Recovery keeps only the entries the snapshot relies on: the hole stays a hole,
    nothing is served for it, and the WAL (and the head) say the rest."""
    probe = FakeDisk()
    h, start = _holes_appended(probe)
    h.checkpoint()
    tid = h.eng().require("d1").topic_id
    idx = posixpath.join(topic_dir(DATA_DIR, tid), f"seg-{1:016d}.idx")
    k = probe.trace[start:].index(("fdatasync", idx), 1) + 1  # the second: after the holes
    h.shutdown()

    disk = FakeDisk()
    h, _start = _holes_appended(disk)
    with h:
        disk.crash_after(k)
        with pytest.raises((CheckpointFailed, OSError, TopicsError)):
            h.checkpoint()
        h.crash()
        disk.recover()
        raw = disk.snapshot_durable()[idx]
        assert len(raw) == 20 * SEG, "the holes' entries are durable"
        disk.poke(idx, 20 * 4 + 16, b"\x2a")  # seq 5's flags byte, torn
        h.reopen()
        t = h.eng().require("d1")
        assert [r["$seq"] for r in h.read_all("d1") or []] == [1]  # raised before the fix
        assert t.ckpt_seq == 1
        _check(h, "after the torn .idx")
        h.checkpoint()
        h.restart()
        assert [r["$seq"] for r in h.read_all("d1") or []] == [1]
        h.close()
