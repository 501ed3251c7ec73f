"""Segments the snapshot relies on: damage refuses the start, repair records the loss.

A topic gets three sealed segments of 8 records and a partly filled active one
(checkpointed, so the WAL no longer holds those records). Then one part of a
segment is removed, cut short or made to disagree with its partner. Recovery
refuses with nothing changed on disk (the intact partner is never deleted);
`topics repair` moves the damaged segment to the quarantine and records its
seqs as lost; afterwards every other record reads back, a read across the lost
seqs gets a `corrupt` tombstone for exactly them, and new writes continue above
the old head. A half that the newest snapshot does not rely on (written by an
interrupted checkpoint) is still removed as before.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable

import pytest

from tests.support.clock import TestClock
from tests.support.durable import DATA_DIR, Durable, make_records, segmented_topic
from tests.support.fakedisk import FakeDisk
from topics.engine.core import DiffParams
from topics.storage.check import check
from topics.storage.repair import apply_repair, plan_repair
from topics.storage.segment import scan_segments, topic_dir
from topics.storage.topicstore import SegmentDamage

SEG = 8


def _build() -> tuple[FakeDisk, Durable, str, list[int]]:
    disk = FakeDisk()
    h, d = segmented_topic(disk, SEG)
    firsts = [first for first, _p in scan_segments(disk, d).segments]
    assert firsts == [1, 1 + SEG, 1 + 2 * SEG, 1 + 3 * SEG]
    return disk, h, d, firsts


def _remove(path: str) -> Callable[[FakeDisk], None]:
    def act(disk: FakeDisk) -> None:
        disk.unlink(path)
        disk.fsync_dir(posixpath.dirname(path))

    return act


def _truncate(path: str, keep: int) -> Callable[[FakeDisk], None]:
    def act(disk: FakeDisk) -> None:
        f = disk.open(path, write=True)
        f.truncate(keep)
        f.fdatasync()
        f.close()

    return act


def _poke_idx_len(path: str) -> Callable[[FakeDisk], None]:
    def act(disk: FakeDisk) -> None:
        disk.poke(path, 20 * 3 + 4, b"\x07\x00\x00\x00")  # entry 3's len field

    return act


def _seg(d: str, first: int, ext: str) -> str:
    return posixpath.join(d, f"seg-{first:016d}.{ext}")


CASES: dict[str, Callable[[str, int], Callable[[FakeDisk], None]]] = {
    "idx-missing": lambda d, f: _remove(_seg(d, f, "idx")),
    "data-missing": lambda d, f: _remove(_seg(d, f, "data")),
    "data-short": lambda d, f: _truncate(_seg(d, f, "data"), 100),
    "idx-short": lambda d, f: _truncate(_seg(d, f, "idx"), 20 * 3 + 7),
    "idx-mismatch": lambda d, f: _poke_idx_len(_seg(d, f, "idx")),
    "active-idx-short": lambda d, f: _truncate(_seg(d, 1 + 3 * SEG, "idx"), 20),
    "both-missing": lambda d, f: _both(_remove(_seg(d, f, "data")), _remove(_seg(d, f, "idx"))),
    "both-cut-together": lambda d, f: _cut_together(d, f, 3),
}


def _cut_together(d: str, first: int, keep: int) -> Callable[[FakeDisk], None]:
    """Cut `.idx` to `keep` entries and `.data` to exactly their frames: each file
    alone still looks whole, only the snapshot's record of the count tells."""

    def act(disk: FakeDisk) -> None:
        raw = disk.snapshot_durable()[_seg(d, first, "idx")]
        off, ln = struct.unpack_from("<II", raw, 20 * (keep - 1))
        _truncate(_seg(d, first, "idx"), 20 * keep)(disk)
        _truncate(_seg(d, first, "data"), off + ln)(disk)

    return act


def _both(
    a: Callable[[FakeDisk], None], b: Callable[[FakeDisk], None]
) -> Callable[[FakeDisk], None]:
    def act(disk: FakeDisk) -> None:
        a(disk)
        b(disk)

    return act


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_published_segment_refuses_then_repair_tombstones(case: str) -> None:
    disk, h, d, firsts = _build()
    with h:
        disk.crash()
        disk.recover()
        CASES[case](d, 1 + SEG)(disk)
        image = disk.snapshot_durable()
        report = check(disk, DATA_DIR)
        assert not report.ok and "segment_damage" in [p.kind for p in report.problems], [
            (p.kind, p.detail) for p in report.problems
        ]
        with pytest.raises(SegmentDamage) as ei:
            h.reopen()
        assert "segment damage" in str(ei.value)
        assert disk.snapshot_durable() == image, "a refused start changed the disk"
        plan = plan_repair(disk, DATA_DIR)
        assert plan.ok and plan.segments, plan.lines()
        apply_repair(disk, plan, clock=TestClock())
        report = check(disk, DATA_DIR)
        assert "segment_damage" not in [p.kind for p in report.problems]
        h.reopen()
        t = h.eng().require("s")
        lo, hi = plan.segments[0].ranges[0]
        assert lo in firsts
        got = [r["$seq"] for r in h.read_all("s") or []]
        assert got == [s for s in range(1, 3 * SEG + 4) if not lo <= s <= hi]
        _t, r = h.eng().diff("s", DiffParams(from_seq=lo - 1, limit=1000, budget=1 << 20))
        assert r.tombstone is not None and r.tombstone.reason == "corrupt"
        assert (r.tombstone.gap_from, r.tombstone.gap_to) == (lo, hi)
        head = t.head_seq
        out = h.write("s", make_records("after", 1, size=60))
        assert out.ok and out.first_seq == head + 1
        # Survives a checkpoint and a restart.
        h.checkpoint()
        h.restart()
        assert [r["$seq"] for r in h.read_all("s") or []] == [*got, head + 1]
        assert h.eng().require("s").lost == [(lo, hi)]
        h.close()


def test_unpublished_half_is_removed_as_an_interrupted_checkpoint() -> None:
    disk, h, d, firsts = _build()
    with h:
        disk.crash()
        disk.recover()
        stray = posixpath.join(d, f"seg-{1000:016d}.data")  # beyond the snapshot's ckpt
        f = disk.open(stray, create=True, write=True)
        f.pwrite(b"x" * 50, 0)
        f.fdatasync()
        f.close()
        disk.fsync_dir(d)
        h.reopen()
        assert not disk.exists(stray)
        assert [r["$seq"] for r in h.read_all("s") or []] == list(range(1, 3 * SEG + 4))
        h.close()


@pytest.mark.parametrize("case", ["idx-missing", "data-short", "idx-mismatch"])
def test_segment_the_wal_still_holds_is_rebuilt_from_it(case: str) -> None:
    """A damaged segment written after the fallback snapshot's checkpoint: the WAL
    kept for that snapshot still holds its records, so recovery sets the damaged
    files aside, starts from the fallback snapshot and replays them; nothing is
    lost and nothing is recorded as lost."""
    disk = FakeDisk()
    with Durable(disk, shards=1, segment_max_events=SEG) as h:
        h.open()
        assert h.put_topic("s", {"durability": "fsync"})
        for i in range(SEG + 2):
            assert h.write("s", make_records(f"s{i}", 1, size=60)).ok
        h.checkpoint()  # the fallback: checkpointed up to seq 10
        for i in range(SEG + 2, 3 * SEG + 3):
            assert h.write("s", make_records(f"s{i}", 1, size=60)).ok
        h.checkpoint()  # the newest: relies on seg-17 (seqs 17..24)
        want = [r["$seq"] for r in h.read_all("s") or []]
        assert want == list(range(1, 3 * SEG + 4))
        d = topic_dir(DATA_DIR, h.eng().require("s").topic_id)
        h.shutdown()
        disk.crash()
        disk.recover()
        CASES[case](d, 1 + 2 * SEG)(disk)  # seqs 17..24: after the fallback's head (10)
        h.reopen()
        assert [r["$seq"] for r in h.read_all("s") or []] == want
        assert h.eng().require("s").lost == []
        kept = [n for n in disk.listdir(posixpath.join(DATA_DIR, "quarantine"))]
        assert len(kept) == 1 and kept[0].startswith("rebuild-")
        h.checkpoint()
        h.crash_and_recover()
        assert [r["$seq"] for r in h.read_all("s") or []] == want
        h.close()
