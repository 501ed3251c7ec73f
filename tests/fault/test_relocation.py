"""Relocation of sealed segments to the cold tier (docs/FORMATS.md, "Relocation").

Sealed segments beyond the hot-retention bound are copied to the cold dir, their
new tier is recorded by the next snapshot, readers move to the cold copy and the
hot copy is deleted after a later snapshot. A crash after any file operation of
that sequence loses nothing, shows no deleted record again, and a restart
finishes the move."""

from __future__ import annotations

import posixpath
from collections.abc import Callable

import pytest

from tests.support.durable import DATA_DIR, Durable, fingerprint_equal, make_records
from tests.support.fakedisk import FakeDisk
from topics.storage.segment import topic_dir

COLD = "/cold"


def _segs(disk: FakeDisk, d: str) -> list[int]:
    names = disk.listdir(d) if disk.exists(d) else []
    return sorted(int(n[4:20]) for n in names if n.endswith(".idx"))


def _tiers(h: Durable, tid: int) -> dict[int, str]:
    assert h.storage is not None
    st = h.storage.checkpointer.stores[tid]
    return {g.first_seq: g.tier.value for g in st.segs}


def _values(h: Durable, topic: str) -> list[str]:
    return [r["data"]["u"] for r in h.read_all(topic) or []]


def _setup(h: Durable, n: int = 42, tagged: tuple[int, ...] = ()) -> int:
    """Topic `a` with records `a.0`.. (seq = index + 1); those at `tagged` indexes
    carry the tag `gone` (for a delete by match)."""
    assert h.put_topic("a", {"durability": "fsync"})
    recs = make_records("a", n)
    for i in tagged:
        recs[i]["tag"] = "gone"
    assert h.write("a", recs).ok
    assert h.settle()
    return h.eng().require("a").topic_id


def test_segments_beyond_retention_move_to_cold_and_stay_readable() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=5, cold_dir=COLD, hot_retain_segments=2) as h:
        h.open()
        tid = _setup(h)
        h.checkpoint()  # 8 sealed + 1 active; 6 copied and committed as cold
        tiers = _tiers(h, tid)
        assert [f for f, t in tiers.items() if t == "cold"] == [1, 6, 11, 16, 21, 26]
        assert [f for f, t in tiers.items() if t == "hot"] == [31, 36, 41]
        hot_d, cold_d = topic_dir(DATA_DIR, tid), topic_dir(COLD, tid)
        assert _segs(disk, cold_d) == [1, 6, 11, 16, 21, 26]
        # The hot copies stay until the next snapshot (which lists them as cold) ...
        assert _segs(disk, hot_d) == [1, 6, 11, 16, 21, 26, 31, 36, 41]
        assert _values(h, "a") == [f"a.{i}" for i in range(42)]
        h.checkpoint()
        # ... and are gone after it.
        assert _segs(disk, hot_d) == [31, 36, 41]
        assert _values(h, "a") == [f"a.{i}" for i in range(42)]
        live = h.fingerprint()
        h.restart()
        assert fingerprint_equal(h.fingerprint(), live) == []
        assert _tiers(h, tid)[1] == "cold"
        assert _values(h, "a") == [f"a.{i}" for i in range(42)]
        h.close()


def test_hot_retain_bytes_is_stricter_when_smaller() -> None:
    disk = FakeDisk()
    with Durable(
        disk, segment_max_events=5, cold_dir=COLD, hot_retain_segments=4, hot_retain_bytes=1
    ) as h:
        h.open()
        tid = _setup(h, 18)
        h.checkpoint()  # segments 1, 6, 11 sealed (16 active): the byte bound keeps none
        assert {f: t for f, t in _tiers(h, tid).items()} == {
            1: "cold",
            6: "cold",
            11: "cold",
            16: "hot",
        }
        h.close()


def test_without_a_cold_dir_nothing_moves() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=5, hot_retain_segments=0) as h:
        h.open()
        tid = _setup(h, 20)
        h.checkpoint()
        assert set(_tiers(h, tid).values()) == {"hot"}
        assert h.storage is not None and h.storage.checkpointer.relocator is None
        h.close()


def test_deletes_and_retention_across_tiers() -> None:
    """A record delete in a cold segment sticks across restarts (flag in the cold
    `.idx`, and in the hot copy while it waits); eviction drops cold segments."""
    disk = FakeDisk()
    with Durable(disk, segment_max_events=5, cold_dir=COLD, hot_retain_segments=1) as h:
        h.open()
        tid = _setup(h, 30, tagged=(1, 6))
        h.checkpoint()
        assert _tiers(h, tid)[1] == "cold"
        _, ok = h.delete_records("a", {"match": ["tag", "Eq", "gone"]})
        assert ok and h.settle()
        h.checkpoint()  # marks make the delete durable; flags set in both copies
        h.checkpoint()
        want = [f"a.{i}" for i in range(30) if i not in (1, 6)]
        assert _values(h, "a") == want
        h.crash_and_recover()
        assert _values(h, "a") == want
        # Evict below seq 12: cold segments 1 and 6 go from the cold tier.
        assert h.put_topic("a", {"durability": "fsync", "cap_records": 18})
        h.checkpoint()
        h.checkpoint()
        cold_d = topic_dir(COLD, tid)
        assert 1 not in _segs(disk, cold_d) and 6 not in _segs(disk, cold_d)
        h.crash_and_recover()
        assert _values(h, "a") == [f"a.{i}" for i in range(12, 30)]
        h.close()


def test_a_cold_segment_the_snapshot_lists_that_is_gone_refuses_the_start() -> None:
    disk = FakeDisk()
    with Durable(disk, segment_max_events=5, cold_dir=COLD, hot_retain_segments=1) as h:
        h.open()
        tid = _setup(h, 30)
        h.checkpoint()
        h.checkpoint()  # hot copies gone: segment 6 lives only in the cold dir
        cold_d = topic_dir(COLD, tid)
        for ext in ("data", "idx"):
            disk.unlink(posixpath.join(cold_d, f"seg-{6:016d}.{ext}"))
        disk.fsync_dir(cold_d)
        h.shutdown()
        with pytest.raises(OSError, match="cold tier is in neither tier|segment 6"):
            h.open()


def _sweep_setup(h: Durable) -> int:
    tid = _setup(h, 42, tagged=(2,))
    _, ok = h.delete_records("a", {"match": ["tag", "Eq", "gone"]})
    assert ok and h.settle()
    return tid


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drop_all", "subset"])
def test_a_crash_at_every_step_of_a_relocation(mode: str) -> None:
    """Crash after each file operation of the two cycles that copy, commit and then
    delete the hot copies: after the restart every record reads back, the deleted
    one stays deleted, and two more cycles leave each segment in exactly one tier."""
    want = [f"a.{i}" for i in range(42) if i != 2]

    def settled(h: Durable, tid: int, k: int) -> None:
        hot = set(_segs(h.disk, topic_dir(DATA_DIR, tid)))
        cold = set(_segs(h.disk, topic_dir(COLD, tid)))
        assert not hot & cold, f"crash point {k}: in both tiers {hot & cold}"
        assert {f for f, t in _tiers(h, tid).items() if t == "cold"} == cold

    total = crash_sweep(
        mode,
        lambda disk: Durable(disk, segment_max_events=5, cold_dir=COLD, hot_retain_segments=2),
        _sweep_setup,
        2,
        want,
        settled,
    )
    assert total > 60  # copies of 6 segments, two snapshots, 6 hot deletes


def crash_sweep(
    mode: str,
    make: Callable[[FakeDisk], Durable],
    setup: Callable[[Durable], int],
    cycles: int,
    want: list[str],
    settled: Callable[[Durable, int, int], None],
) -> int:
    """Crash after each file operation of `cycles` checkpoint cycles that follow
    `setup` (which returns the topic id); after each crash: recover, read `want`
    back, run two cycles, read it again, call `settled(h, topic id, crash point)`,
    and recover once more. Returns how many operations the cycles made."""

    def run(disk: FakeDisk, crash_at: int | None) -> int:
        with make(disk) as h:
            h.open()
            tid = setup(h)
            start = len(disk.trace)
            if crash_at is not None:
                disk.crash_after(crash_at, mode, seed=crash_at)  # type: ignore[arg-type]
            try:
                for _ in range(cycles):
                    h.checkpoint()
            except Exception:
                pass  # the disk died under the cycle
            total = len(disk.trace) - start
            if crash_at is None:
                h.shutdown()
                return total
            h.crash_and_recover()
            assert _values(h, "a") == want, f"crash point {crash_at}"
            h.checkpoint()
            h.checkpoint()
            assert _values(h, "a") == want, f"crash point {crash_at}"
            settled(h, tid, crash_at)
            h.crash_and_recover()
            assert _values(h, "a") == want, f"crash point {crash_at} (second restart)"
            h.shutdown()
            return total

    total = run(FakeDisk(), None)
    for k in range(1, total + 1):
        run(FakeDisk(), k)
    return total


# -- reclaim ------------------------------------------------------------------


def _size(disk: FakeDisk, path: str) -> int:
    f = disk.open(path)
    try:
        return f.size()
    finally:
        f.close()


def _reclaim_setup(h: Durable) -> int:
    """Topic `a`: 30 records of ~1 KiB in segments of 10; 6 of the first segment's
    (indexes 0-5) and 2 of the second's (10, 11) carry the tag `gone`."""
    assert h.put_topic("a", {"durability": "fsync"})
    recs = make_records("a", 30, size=1000)
    for i in (0, 1, 2, 3, 4, 5, 10, 11):
        recs[i]["tag"] = "gone"
    assert h.write("a", recs).ok
    assert h.settle()
    h.checkpoint()
    _, ok = h.delete_records("a", {"match": ["tag", "Eq", "gone"]})
    assert ok and h.settle()
    return h.eng().require("a").topic_id


def test_a_mostly_deleted_segment_is_rewritten_without_the_deleted_bytes() -> None:
    disk = FakeDisk()
    want = [f"a.{i}" for i in range(30) if i not in (0, 1, 2, 3, 4, 5, 10, 11)]
    with Durable(disk, segment_max_events=10) as h:
        h.open()
        tid = _reclaim_setup(h)
        first = posixpath.join(topic_dir(DATA_DIR, tid), f"seg-{1:016d}.data")
        second = posixpath.join(topic_dir(DATA_DIR, tid), f"seg-{11:016d}.data")
        before = (_size(disk, first), _size(disk, second))
        h.checkpoint()  # the delete's flags reach the .idx files
        assert _values(h, "a") == want
        rep = h.checkpoint()  # 6 of 10 dead: the first is rewritten; the second is not
        assert rep.reclaimed == 1 and rep.reclaimed_bytes > 6 * 1000
        assert _size(disk, first) < before[0] - 6 * 1000
        assert _size(disk, second) == before[1]
        assert _values(h, "a") == want
        assert h.checkpoint().reclaimed == 0  # idempotent: nothing left to reclaim
        live = h.fingerprint()
        h.crash_and_recover()
        assert fingerprint_equal(h.fingerprint(), live) == []
        assert _values(h, "a") == want
        h.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drop_all", "subset"])
def test_a_crash_at_every_step_of_a_rewrite(mode: str) -> None:
    want = [f"a.{i}" for i in range(30) if i not in (0, 1, 2, 3, 4, 5, 10, 11)]

    def setup(h: Durable) -> int:
        tid = _reclaim_setup(h)
        h.checkpoint()  # the delete flags reach the .idx: the next cycle rewrites
        return tid

    def settled(h: Durable, tid: int, k: int) -> None:
        d = topic_dir(DATA_DIR, tid)
        assert not [n for n in h.disk.listdir(d) if n.endswith(".rw")], f"crash point {k}"

    total = crash_sweep(
        mode, lambda disk: Durable(disk, segment_max_events=10), setup, 1, want, settled
    )
    assert total > 8


def test_reclaim_leaves_segments_that_move_to_cold_alone() -> None:
    """A partly deleted segment beyond hot retention is relocated as it is; one kept
    hot is rewritten; both read back the same, before and after a restart."""
    disk = FakeDisk()
    gone = (0, 1, 2, 3, 4, 5, 20, 21, 22, 23, 24, 25)
    want = [f"a.{i}" for i in range(30) if i not in gone]
    with Durable(disk, segment_max_events=10, cold_dir=COLD, hot_retain_segments=1) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        recs = make_records("a", 30, size=1000)
        for i in gone:
            recs[i]["tag"] = "gone"
        assert h.write("a", recs).ok
        assert h.settle()
        h.checkpoint()  # segments 1, 11, 21 sealed; 1 and 11 copied and committed cold
        tid = h.eng().require("a").topic_id
        cold_first = posixpath.join(topic_dir(COLD, tid), f"seg-{1:016d}.data")
        hot_last = posixpath.join(topic_dir(DATA_DIR, tid), f"seg-{21:016d}.data")
        sizes = (_size(disk, cold_first), _size(disk, hot_last))
        _, ok = h.delete_records("a", {"match": ["tag", "Eq", "gone"]})
        assert ok and h.settle()
        for _ in range(3):
            h.checkpoint()
        assert _tiers(h, tid) == {1: "cold", 11: "cold", 21: "hot"}
        assert _size(disk, cold_first) == sizes[0]  # cold segments are not rewritten
        assert _size(disk, hot_last) < sizes[1] - 6 * 1000
        assert _values(h, "a") == want
        h.crash_and_recover()
        assert _values(h, "a") == want
        h.close()
