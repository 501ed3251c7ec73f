"""Row 4 (WAL level, through recovery): a torn tail is cut; damage refuses, repair salvages.

A clean workload (topics `a` and `d` on shard 0, `b`, `c` on shard 1, fsync class,
interleaved single-record writes) is stopped without a checkpoint (so the WAL is
still the only copy of the records: a checkpoint would move them into segments
and replay would start after them); then the durable image of shard
0's log file is edited (``FakeDisk.poke``): a torn tail cut inside the length
prefix, the header, the payload or the checksum; `frame_len` huge, below the
minimum or zero; a bit flip in the last frame or in the middle of the log; a
CRC-valid frame carrying a stale seq. A tear of the last frame (never made durable) is cut at startup. Damage to a
frame the log had made durable (bytes before a SyncMark, or in a rotated-out
file, or a missing file) refuses the start with nothing changed on disk; after
`topics repair` every other acknowledged record reads back, the unreadable
seq gets a `corrupt` tombstone, seqs are never reused, and the WAL is writable.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable

import pytest

from tests.support.clock import TestClock
from tests.support.durable import DATA_DIR, Durable, check_oracle, make_records
from tests.support.fakedisk import FakeDisk
from topics.engine.core import DiffParams
from topics.format.frame import APPEND, Frame, encode_record
from topics.storage.journal import shard_dirs
from topics.storage.repair import apply_repair, plan_repair
from topics.storage.wal import WalDamage, scan_shard

ROUNDS = 5


def _build() -> tuple[FakeDisk, Durable, str, list[Frame]]:
    disk = FakeDisk()
    h = Durable(disk)
    h.open()
    for name in ("a", "b", "c", "d"):  # ids 1..4: a, d on shard 0; b, c on shard 1
        assert h.put_topic(name, {"durability": "fsync"})
    assert h.shard_index("a") == h.shard_index("d") == 0
    assert h.shard_index("b") == h.shard_index("c") == 1
    for i in range(ROUNDS):
        for name in ("a", "d", "b", "c"):
            assert h.write(name, make_records(f"{name}{i}", 1, size=40 + 10 * i)).ok
    h.shutdown()  # writers drained and synced; no checkpoint
    d = shard_dirs(DATA_DIR, 2)[0]  # a (id 1) and d (id 4) live on shard 0
    found = scan_shard(disk, d)
    assert found.end_file is not None and found.torn is None
    return disk, h, posixpath.join(d, found.end_file), [f for _n, f in found.frames]


Poke = Callable[[Frame, Frame | None], tuple[int, bytes]]


def _zero_from(cut: Callable[[Frame], int]) -> Poke:
    def poke(fr: Frame, _prev: Frame | None) -> tuple[int, bytes]:
        at = fr.offset + cut(fr)
        return at, bytes(fr.end - at)

    return poke


def _set_len(v: int) -> Poke:
    return lambda fr, _p: (fr.offset, struct.pack("<I", v))


def _flip(where: Callable[[Frame], int]) -> Poke:
    def poke(fr: Frame, _prev: Frame | None) -> tuple[int, bytes]:
        return fr.offset + where(fr), b"\xff"  # combined with xor below

    return poke


def _stale_seq(fr: Frame, prev: Frame | None) -> tuple[int, bytes]:
    """Overwrite frame `fr` with a CRC-valid Append for the previous seq of its topic.

    The replacement is the same size (so the following frames stay aligned).
    """
    assert prev is not None
    data = fr.data
    new = encode_record(
        fr.topic_id, fr.seq - 1, fr.ts, fr.node, fr.tag, data, fr.meta, durable=True
    )
    assert len(new) == fr.size
    return fr.offset, new


TAIL_TEARS: dict[str, Poke] = {
    "in-len-prefix": _zero_from(lambda f: 2),
    "in-header": _zero_from(lambda f: 17),
    "in-payload": _zero_from(lambda f: f.size // 2 + 10),
    "in-checksum": _zero_from(lambda f: f.size - 3),
}
MIDLOG: dict[str, Poke] = {
    "len-huge": _set_len(0xFFFFFFFF),
    "len-below-min": _set_len(10),
    "len-zero": _set_len(0),
    "bit-flip-payload": _flip(lambda f: f.size - 12),
    "bit-flip-header": _flip(lambda f: 15),
    "stale-seq": _stale_seq,
}


def _apply(disk: FakeDisk, path: str, fr: Frame, prev: Frame | None, poke: Poke) -> None:
    at, data = poke(fr, prev)
    if poke is not _stale_seq and len(data) == 1 and data == b"\xff":
        cur = disk.snapshot_durable()[path][at]
        data = bytes([cur ^ 0xFF])
    disk.crash()  # nothing pending after a clean close; edit the durable image while off
    disk.poke(path, at, data)
    disk.recover()


def _expected(frames: list[Frame], upto: int) -> set[tuple[int, int]]:
    return {(f.topic_id, f.seq) for f in frames[:upto] if f.type == APPEND}


def _check(h: Durable, frames: list[Frame], cut: int, name: str, reported: bool) -> None:
    eng = h.eng()
    ids = {t.topic_id: t.name for t in eng.topics.values()}
    want = _expected(frames, cut)
    got: set[tuple[int, int]] = set()
    for tname in ("a", "d"):
        t = eng.topics[tname]
        for r in h.read_all(tname) or []:
            got.add((t.topic_id, r["$seq"]))
    assert got == {x for x in want if x[0] in ids}, name
    # The other shard is untouched.
    assert len(h.read_all("b") or []) == ROUNDS
    assert len(h.read_all("c") or []) == ROUNDS
    errs = check_oracle(h, context=name)
    # Acked records at/after the damage are an explicit, documented loss; everything
    # else the oracle checks (no fabrication, all-or-nothing) must hold.
    errs = [e for e in errs if "lost" not in e and "gap:" not in e]
    assert not errs, "\n".join(errs)
    assert h.report is not None
    if reported:
        assert h.report.torn, f"{name}: damage not reported"


def _after(h: Durable) -> None:
    """The WAL is writable after the truncation, and both survive another power loss."""
    heads = {n: h.eng().topics[n].head_seq for n in ("a", "d")}
    outs = {n: h.write(n, make_records(f"{n}-after", 2)) for n in ("a", "d")}
    for n, o in outs.items():
        assert o.ok, o
        assert o.first_seq == heads[n] + 1, "appends continue at head + 1"
    fp = h.fingerprint()
    h.crash_and_recover()
    assert h.fingerprint() == fp
    h.crash_and_recover()
    assert h.fingerprint() == fp


@pytest.mark.parametrize("tear", list(TAIL_TEARS))
def test_torn_last_frame_is_truncated_never_misread(tear: str) -> None:
    """A write in flight at the crash (past the last SyncMark) is torn: it is cut,
    its bytes kept aside, and every acknowledged record is still there."""
    disk, h, path, frames = _build()
    with h:
        d = posixpath.dirname(path)
        end = scan_shard(disk, d).end_offset
        a = next(f for f in reversed(frames) if f.type == APPEND)
        inflight = encode_record(
            a.topic_id, a.seq + 1, a.ts, None, None, b'"never acked"', None, durable=True
        )
        fr = Frame(APPEND, 0, a.topic_id, a.seq + 1, a.ts, None, None, b"", end, len(inflight))
        at, data = TAIL_TEARS[tear](fr, None)
        disk.crash()
        disk.poke(path, end, inflight)
        disk.poke(path, at, data)
        disk.recover()
        h.reopen()
        _check(h, frames, len(frames), tear, reported=True)
        kept = [n for n in disk.listdir(d) if ".torn-" in n]
        assert kept == [f"{posixpath.basename(path)}.torn-{end}"]
        _after(h)
        h.close()


def _acked(frames: list[Frame]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for f in frames:
        if f.type == APPEND:
            out.setdefault(f.topic_id, []).append(f.seq)
    return out


def _refuses_unchanged(h: Durable, disk: FakeDisk) -> WalDamage:
    image = disk.snapshot_durable()
    with pytest.raises(WalDamage) as ei:
        h.reopen()
    assert disk.snapshot_durable() == image, "a refused start changed the disk"
    return ei.value


def _repair(disk: FakeDisk) -> None:
    plan = plan_repair(disk, DATA_DIR)
    assert plan.shards and plan.ok, plan.lines()
    apply_repair(disk, plan, clock=TestClock(1_700_000_000_000))


def _check_salvage(h: Durable, frames: list[Frame], victim: Frame, name: str) -> None:
    """Every acked record but the victim reads back; reads across it get a tombstone."""
    eng = h.eng()
    by_id = {t.topic_id: t for t in eng.topics.values()}
    for tid, seqs in _acked(frames).items():
        t = by_id[tid]
        got = [r["$seq"] for r in h.read_all(t.name) or []]
        want = [s for s in seqs if (tid, s) != (victim.topic_id, victim.seq)]
        assert got == want, f"{name}: {t.name}"
        assert t.head_seq >= max(seqs), "a seq could be handed out twice"
    t = by_id[victim.topic_id]
    lost = [(a, b) for a, b in t.lost if a <= victim.seq <= b]
    assert lost, f"{name}: the unreadable seq is not recorded as lost"
    _t, r = eng.diff(t.name, DiffParams(from_seq=victim.seq - 1, limit=1000, budget=1 << 20))
    assert r.tombstone is not None and r.tombstone.reason == "corrupt"
    assert r.tombstone.gap_from == victim.seq and r.tombstone.gap_to == lost[0][1]
    # The other shard is untouched.
    assert len(h.read_all("b") or []) == ROUNDS
    assert len(h.read_all("c") or []) == ROUNDS


@pytest.mark.parametrize("damage", [d for d in MIDLOG if d != "stale-seq"])
@pytest.mark.parametrize("where", ["tail", "mid"])
def test_damaged_frame_refuses_to_start_then_repair_salvages(damage: str, where: str) -> None:
    disk, h, path, frames = _build()
    with h:
        appends = [i for i, f in enumerate(frames) if f.type == APPEND]
        i = appends[-1] if where == "tail" else appends[len(appends) // 2]
        victim = frames[i]
        _apply(disk, path, victim, frames[i - 1], MIDLOG[damage])
        err = _refuses_unchanged(h, disk)
        assert posixpath.basename(path) in str(err) and f"[{victim.offset}, " in str(err)
        _repair(disk)
        h.reopen()
        _check_salvage(h, frames, victim, f"{damage}@{where}")
        # The salvage and the tombstone survive a restart and a checkpoint.
        h.checkpoint()
        h.crash_and_recover()
        _check_salvage(h, frames, victim, f"{damage}@{where} after restart")
        _after(h)
        h.close()


def test_stale_seq_frame_is_skipped_never_applied_twice() -> None:
    disk, h, path, frames = _build()
    with h:
        appends = [i for i, f in enumerate(frames) if f.type == APPEND]
        i = appends[len(appends) // 2]
        _apply(disk, path, frames[i], frames[i - 1], _stale_seq)
        h.reopen()
        # A CRC-valid frame with an already-applied seq is skipped, never applied
        # twice; the seq it displaced becomes a silent hole; later frames stay.
        eng = h.eng()
        t = next(t for t in eng.topics.values() if t.topic_id == frames[i].topic_id)
        seqs = [r["$seq"] for r in h.read_all(t.name) or []]
        assert frames[i].seq not in seqs and len(seqs) == len(set(seqs))
        errs = [e for e in check_oracle(h, context="stale") if "lost" not in e and "gap:" not in e]
        assert not errs, "\n".join(errs)
        _after(h)
        h.close()


def test_damage_in_an_older_file_refuses_keeps_every_file_and_repair_salvages() -> None:
    """A bit flip in a rotated-out (fully synced) file: the start is refused with
    every file kept; after repair every other record (before and after the
    damage, in later files too) reads back and the log stays writable."""
    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=1024) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        for i in range(24):
            assert h.write("a", make_records(f"a{i}", 1, size=100)).ok
        h.shutdown()  # no checkpoint: the WAL stays the only copy
        d = shard_dirs(DATA_DIR, 1)[0]
        files = sorted(n for n in disk.listdir(d) if n.startswith("wal-"))
        assert len(files) >= 3
        first = scan_shard(disk, d)
        frames_by_file: dict[str, list[Frame]] = {}
        for name, fr in first.frames:
            frames_by_file.setdefault(name, []).append(fr)
        victim_file = files[1]
        victim = frames_by_file[victim_file][1]
        path = posixpath.join(d, victim_file)
        _apply(disk, path, victim, None, MIDLOG["bit-flip-payload"])
        _refuses_unchanged(h, disk)
        assert sorted(n for n in disk.listdir(d) if n.startswith("wal-")) == files
        _repair(disk)
        h.reopen()
        keep = [fr.seq for _name, fr in first.frames if fr.type == APPEND]
        assert [r["$seq"] for r in h.read_all("a") or []] == [s for s in keep if s != victim.seq]
        assert h.eng().require("a").lost == [(victim.seq, victim.seq)]
        _after_single(h)
        h.close()


def test_missing_middle_file_refuses_and_repair_records_the_gap() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1, file_bytes=1024) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        for i in range(24):
            assert h.write("a", make_records(f"a{i}", 1, size=100)).ok
        h.shutdown()
        d = shard_dirs(DATA_DIR, 1)[0]
        files = sorted(n for n in disk.listdir(d) if n.startswith("wal-"))
        first = scan_shard(disk, d)
        gone = {fr.seq for name, fr in first.frames if name == files[1] and fr.type == APPEND}
        disk.crash()
        disk.recover()
        disk.unlink(posixpath.join(d, files[1]))
        disk.fsync_dir(d)
        _refuses_unchanged(h, disk)
        _repair(disk)
        h.reopen()
        keep = [fr.seq for _n, fr in first.frames if fr.type == APPEND and fr.seq not in gone]
        assert [r["$seq"] for r in h.read_all("a") or []] == keep
        assert h.eng().require("a").lost == [(min(gone), max(gone))]
        _after_single(h)
        h.close()


def _after_single(h: Durable) -> None:
    head = h.eng().require("a").head_seq
    out = h.write("a", make_records("after", 2, size=100))
    assert out.ok and out.first_seq == head + 1
    fp = h.fingerprint()
    h.crash_and_recover()
    assert h.fingerprint() == fp
