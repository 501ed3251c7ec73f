"""fsck (topics.storage.check): clean dirs, torn tails, mid-log damage, segments, snapshots."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.support.segreader import SegmentReader

from topics.format.frame import (
    DELETE,
    TOPIC_CREATE,
    encode_control,
    encode_record,
)
from topics.storage.check import CORRUPT, INFO, WARNING, check
from topics.storage.fs import RealFs
from topics.storage.segment import SegmentWriter, segment_paths, topic_dir
from topics.storage.snapshot import snapshot_name, write_snapshot
from topics.storage.wal import ShardScan, WalEntry, WalShard, scan_shard

TOPIC = 7
FILE = 64 * 1024


class Waiter:
    """Counts completions from the WAL writer thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ok: list[bool] = []

    def cb(self, e: WalEntry, ok: bool, fsync_ms: float) -> None:
        with self.cond:
            self.ok.append(ok)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.ok) >= n, timeout), self.ok
        assert all(self.ok)


def wal_frames(topic: int, n: int, first_seq: int = 1) -> list[bytes]:
    """A TopicCreate, `n` Appends (some with node/tag/meta) and a Delete."""
    out = [encode_control(TOPIC_CREATE, topic, {"name": f"t{topic}", "config": {}, "epoch": 1})]
    for i in range(n):
        seq = first_seq + i
        out.append(
            encode_record(
                topic,
                seq,
                1000 + seq,
                "node-a" if i % 2 else None,
                "tag-x" if i % 3 == 0 else None,
                b'{"i":%d,"pad":"%s"}' % (seq, b"p" * (i % 5)),
                b'{"m":%d}' % seq if i % 4 == 1 else None,
                durable=True,
            )
        )
    out.append(
        encode_control(
            DELETE, topic, {"bound": n + 1, "before_seq": 2, "match": None, "seqs": None}
        )
    )
    return out


def write_wal(d: Path, frames: list[bytes], *, file_bytes: int = FILE) -> None:
    shard, _ = WalShard.open(RealFs(), str(d), file_bytes=file_bytes)
    w = Waiter()
    for fr in frames:
        shard.submit(WalEntry(fr, 1, sync=True, done=w.cb))
    w.wait(len(frames))
    shard.close()


def seg_record(topic: int, seq: int) -> bytes:
    return encode_record(
        topic,
        seq,
        1000 + seq,
        None,
        "tag-x" if seq % 2 else None,
        b'{"s":%d}' % seq,
        None,
        durable=True,
        segment=True,
    )


def write_segment(root: Path, topic: int, first: int, n: int, *, seal: bool) -> None:
    d = topic_dir(str(root), topic)
    w = SegmentWriter(RealFs(), d, first)
    for seq in range(first, first + n):
        fr = seg_record(topic, seq)
        w.append(fr, 1000 + seq, fr[4])
    if seal:
        w.seal()
    else:
        w.flush()
        w.close()


@dataclass
class DataDir:
    root: Path
    wal_dirs: list[Path] = field(default_factory=list)
    frames_per_shard: list[int] = field(default_factory=list)

    def wal_file(self, shard: int = 0) -> Path:
        return sorted(self.wal_dirs[shard].glob("wal-*.log"))[0]

    def seg(self, topic: int, first: int) -> tuple[Path, Path]:
        p = segment_paths(topic_dir(str(self.root), topic), first)
        return Path(p.data), Path(p.idx)

    def frame_offsets(self, shard: int = 0) -> list[tuple[int, int]]:
        """(offset, size) of each valid frame of a shard."""
        sc = scan_shard(RealFs(), str(self.wal_dirs[shard]))
        return [(f.offset, f.size) for _, f in sc.frames]

    def scan(self, shard: int = 0) -> ShardScan:
        return scan_shard(RealFs(), str(self.wal_dirs[shard]))

    def end(self, shard: int = 0) -> tuple[Path, int]:
        """The file holding the logical end of a shard and the end's byte offset: bytes
        written there were never synced (they lie past the newest SyncMark)."""
        sc = self.scan(shard)
        assert sc.end_file is not None and sc.torn is None and not sc.damage
        assert sc.end_offset > sc.mark > 0  # the last write was synced and marked
        return self.wal_dirs[shard] / sc.end_file, sc.end_offset


def build_data_dir(
    tmp_path: Path, *, shards: int = 1, appends: int = 10, file_bytes: int = FILE
) -> DataDir:
    """A real data dir: WAL shard(s), topic 7 with a sealed and an active segment
    (seqs 1..5 and 6..8, seq 3 deleted), topic 9 with one segment, two snapshots.
    """
    root = tmp_path / "data"
    dd = DataDir(root)
    for s in range(shards):
        d = root / "wal" if shards == 1 else root / "wal" / f"shard-{s:02d}"
        frames = wal_frames(TOPIC + s, appends)
        write_wal(d, frames, file_bytes=file_bytes)
        dd.wal_dirs.append(d)
        dd.frames_per_shard.append(len(frames))
    write_segment(root, TOPIC, 1, 5, seal=True)
    write_segment(root, TOPIC, 6, 3, seal=False)
    write_segment(root, 9, 1, 2, seal=True)
    r = SegmentReader(RealFs(), topic_dir(str(root), TOPIC), 1)
    r.mark_deleted([3])
    r.close()
    meta = str(root / "meta")
    write_snapshot(RealFs(), meta, 1, {"next_topic_id": 10, "blob": b"\x00"})
    write_snapshot(RealFs(), meta, 2, {"next_topic_id": 11})
    return dd


def flip(path: Path, offset: int, mask: int = 0x40) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= mask
    path.write_bytes(bytes(raw))


def poke(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def kinds(report: object) -> list[str]:
    return [p.kind for p in report.problems]  # type: ignore[attr-defined]


# -- clean -----------------------------------------------------------------------


def test_clean_dir_is_ok_with_counts(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    seen: list[tuple[int, int]] = []
    r = check(RealFs(), str(dd.root), progress=lambda d, t: seen.append((d, t)))
    assert r.ok and r.problems == [], [str(p) for p in r.problems]
    assert r.shards == 1 and r.wal_files == 1 and r.frames == dd.frames_per_shard[0] == 12
    assert r.torn_tails == 0 and r.mid_log_damage == 0 and r.lost_frames == 0
    assert r.topics == 2 and r.segments == 3 and r.records == 10 and r.deleted_records == 1
    assert r.snapshots == 2 and r.valid_snapshots == 2
    total = 1 + 3 + 2
    assert seen[0] == (0, total) and seen[-1] == (total, total) and r.files_checked == total
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_sharded_layout_and_empty_dir(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path, shards=3, appends=4)
    r = check(RealFs(), str(dd.root))
    assert r.ok, [str(p) for p in r.problems]
    assert r.shards == 3 and r.frames == 3 * 6
    empty = tmp_path / "empty"
    empty.mkdir()
    e = check(RealFs(), str(empty))
    assert e.ok and e.shards == 0 and e.segments == 0 and e.snapshots == 0


def test_missing_or_file_data_dir_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check(RealFs(), str(tmp_path / "nope"))
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        check(RealFs(), str(tmp_path / "f"))


def test_mixed_flat_and_sharded_layout_is_a_warning(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path, shards=1, appends=2)
    write_wal(dd.root / "wal" / "shard-00", wal_frames(11, 2))
    r = check(RealFs(), str(dd.root))
    assert r.ok and r.shards == 2 and kinds(r) == ["wal_layout_mixed"]
    assert r.problems[0].severity == WARNING


# -- WAL ---------------------------------------------------------------------------


def test_torn_tail_is_informational(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    path, end = dd.end()
    # One more write after the last SyncMark, never synced: its checksum never landed.
    fr = wal_frames(TOPIC, 1)[1]
    poke(path, end, fr[:-8] + bytes(8))
    r = check(RealFs(), str(dd.root))
    assert r.ok and kinds(r) == ["torn_tail"], [str(p) for p in r.problems]
    p = r.problems[0]
    assert p.severity == INFO and p.offset == end and "checksum" in p.detail
    assert p.path == str(path)
    assert r.torn_tails == 1 and r.frames == 12 and r.mid_log_damage == 0 and r.lost_frames == 0


def test_damaged_last_frame_before_the_sync_mark_is_damage(tmp_path: Path) -> None:
    # The same damage to the last frame of the log is not a torn tail once the frame
    # was synced: the SyncMark after it says it was durable.
    dd = build_data_dir(tmp_path)
    sc = dd.scan()
    off, size = dd.frame_offsets()[-1]
    marks = 0  # only SyncMarks follow: no frame that carries anything
    assert sc.mark >= off + size
    raw = bytearray(dd.wal_file().read_bytes())
    raw[off + size - 8 : off + size] = bytes(8)  # the last frame's checksum is gone
    dd.wal_file().write_bytes(bytes(raw))
    r = check(RealFs(), str(dd.root))
    assert not r.ok and kinds(r) == ["mid_log_damage"]
    p = r.problems[0]
    assert p.severity == CORRUPT and p.offset == off and "checksum" in p.detail
    assert f"bytes [{off}, {off + size})" in p.detail and f"{marks} valid frames follow" in p.detail
    assert "topic 0000000000000007 seqs after 10" in p.detail  # the Delete after seq 10
    assert r.mid_log_damage == 1 and r.torn_tails == 0
    assert r.frames == 11 and r.lost_frames == marks  # only the SyncMark(s) follow


def test_partial_frame_after_the_last_one_is_a_torn_tail(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    path, end = dd.end()
    half = wal_frames(TOPIC, 1)[1][:30]  # a frame cut inside its header, after the last mark
    poke(path, end, half)
    r = check(RealFs(), str(dd.root))
    assert r.ok and kinds(r) == ["torn_tail"] and r.problems[0].offset == end
    assert r.frames == 12 and r.lost_frames == 0


def test_bit_flip_mid_log_is_counted_damage(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    offs = dd.frame_offsets()
    off, size = offs[3]
    marks = 0  # SyncMarks are not counted as frames at risk
    flip(dd.wal_file(), off + size - 12)  # inside the 4th frame's payload
    r = check(RealFs(), str(dd.root))
    assert not r.ok
    assert kinds(r) == ["mid_log_damage"]
    p = r.problems[0]
    assert p.severity == CORRUPT and p.offset == off and "checksum" in p.detail
    # Every valid frame is counted, the 8 after the damage too; those (and the
    # SyncMarks among them) are what the damage puts at risk.
    after = len(offs) - 4
    assert r.mid_log_damage == 1 and r.frames == len(offs) - 1
    assert r.lost_frames == after + marks
    assert f"bytes [{off}, {offs[4][0]})" in p.detail  # up to the next valid frame
    assert f"{after + marks} valid frames follow" in p.detail
    assert "topic 0000000000000007 seqs 3..3" in p.detail  # the 4th frame is Append seq 3


def test_damaged_length_prefix_mid_log_resynchronises(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    offs = dd.frame_offsets()
    marks = 0  # SyncMarks are not counted as frames at risk
    flip(dd.wal_file(), offs[2][0] + 1, 0x7F)  # frame_len of the 3rd frame: overrun/lengths
    r = check(RealFs(), str(dd.root))
    assert kinds(r) == ["mid_log_damage"] and r.lost_frames == len(offs) - 3 + marks
    assert r.frames == len(offs) - 1 and r.problems[0].offset == offs[2][0]
    assert f"bytes [{offs[2][0]}, {offs[3][0]})" in r.problems[0].detail  # resynced at the 4th


def test_zeroed_frame_mid_log_is_damage(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    offs = dd.frame_offsets()
    off, size = offs[5]
    marks = 0  # SyncMarks are not counted as frames at risk
    raw = bytearray(dd.wal_file().read_bytes())
    raw[off : off + size] = bytes(size)
    dd.wal_file().write_bytes(bytes(raw))
    r = check(RealFs(), str(dd.root))
    assert kinds(r) == ["mid_log_damage"] and "zeroed" in r.problems[0].detail
    assert r.problems[0].offset == off and r.problems[0].severity == CORRUPT
    assert r.frames == len(offs) - 1 and r.lost_frames == len(offs) - 6 + marks


def test_two_damaged_regions_count_every_later_frame(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    offs = dd.frame_offsets()
    flip(dd.wal_file(), offs[2][0] + 20)
    flip(dd.wal_file(), offs[7][0] + 20)
    r = check(RealFs(), str(dd.root))
    assert kinds(r) == ["mid_log_damage", "mid_log_damage"] and not r.ok
    assert [p.offset for p in r.problems] == [offs[2][0], offs[7][0]]
    # Frames 3..6 and 8.. survive the resync and are all counted.
    assert r.mid_log_damage == 2 and r.frames == len(offs) - 2
    # Each range names the valid frames after it; lost_frames counts them once.
    first = len(offs) - 3 - 1  # 3..6, 8..
    second = len(offs) - 8  # 8..
    assert f"{first} valid frames follow" in r.problems[0].detail
    assert f"{second} valid frames follow" in r.problems[1].detail
    assert r.lost_frames == first


def test_damage_in_a_rotated_out_file_counts_the_later_files(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path, appends=60, file_bytes=1024)
    files = sorted(dd.wal_dirs[0].glob("wal-*.log"))
    assert len(files) >= 3
    ok = check(RealFs(), str(dd.root))
    assert ok.ok and ok.wal_files == len(files) and ok.frames == 62
    sc = dd.scan()
    name, first = sc.frames[1]
    assert name == files[0].name
    marks = 0  # SyncMarks are not counted as frames at risk
    flip(files[0], first.offset + 20)
    r = check(RealFs(), str(dd.root))
    # One damaged range, in the oldest file; the frames after it, in this and every
    # later file, are still valid frames of the log and are counted as at risk.
    assert not r.ok and kinds(r) == ["mid_log_damage"]
    p = r.problems[0]
    assert p.path == str(files[0]) and p.offset == first.offset and "checksum" in p.detail
    assert "topic 0000000000000007 seqs before 2" in p.detail  # the damaged frame is seq 1
    assert r.wal_files == len(files) and r.frames == 61
    assert r.lost_frames == 60 + marks and f"{60 + marks} valid frames follow" in p.detail


def test_later_file_without_frames_is_part_of_the_log(tmp_path: Path) -> None:
    # A zero-filled later file named at the next frame index is the fresh file of a
    # rotation: nothing to report.
    dd = build_data_dir(tmp_path)
    _, end = dd.end()
    nxt = dd.scan().next_index
    fresh = dd.wal_dirs[0] / f"wal-{nxt:016d}.log"
    fresh.write_bytes(bytes(4096))
    r = check(RealFs(), str(dd.root))
    assert r.ok and r.problems == [], [str(p) for p in r.problems]
    assert r.wal_files == 2 and r.frames == 12 and r.lost_frames == 0
    # Named further on, it says the frames in between are missing: damage.
    fresh.rename(dd.wal_dirs[0] / "wal-0000000000009999.log")
    g = check(RealFs(), str(dd.root))
    assert not g.ok and kinds(g) == ["mid_log_damage"] and g.mid_log_damage == 1
    p = g.problems[0]
    assert p.path == str(dd.wal_file()) and p.offset == end  # after the older file's frames
    assert f"frames {nxt}..9998 are missing" in p.detail
    assert g.frames == 12 and g.lost_frames == 0  # no valid frame after the gap


def test_bad_control_payload_and_seq_regress(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    from topics.format.frame import HEAD_WATERMARK, encode_frame

    extra = [
        encode_frame(HEAD_WATERMARK, TOPIC, 5, 0, b"\xc1"),  # 0xc1 is never valid msgpack
        encode_record(TOPIC, 2, 5000, None, None, b"{}", None, durable=True),  # seq goes back
        encode_record(TOPIC, 20, 5000, None, None, b"not json", None, durable=True),
    ]
    write_wal(dd.wal_dirs[0], extra)
    r = check(RealFs(), str(dd.root))
    assert kinds(r) == ["wal_bad_payload", "wal_seq_regress", "wal_bad_payload"]
    assert not r.ok
    assert r.problems[1].severity == WARNING and r.problems[1].seq == 2


# -- segments ----------------------------------------------------------------------


def test_corrupt_sealed_segment_frame(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    data, _ = dd.seg(TOPIC, 1)
    frame = seg_record(TOPIC, 1)
    flip(data, len(frame) + 40)  # inside seq 2's payload
    r = check(RealFs(), str(dd.root))
    assert not r.ok and kinds(r) == ["segment_frame"]
    p = r.problems[0]
    assert p.seq == 2 and p.offset == len(frame) and "checksum" in p.detail
    assert p.path == str(data)


def test_wrong_seq_and_idx_mismatch_in_sealed_segment(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    _, idx = dd.seg(TOPIC, 1)
    flip(idx, 20 * 1 + 8, 0x01)  # ts of seq 2's entry
    r = check(RealFs(), str(dd.root))
    assert kinds(r) == ["idx_mismatch"] and r.problems[0].seq == 2
    # A whole valid frame of another seq swapped in is caught by its seq field.
    dd2 = build_data_dir(tmp_path / "b")
    data, _ = dd2.seg(9, 1)
    raw = data.read_bytes()
    other = seg_record(9, 3)  # same length as seq 1's frame, checksum-valid
    assert len(other) == len(seg_record(9, 1))
    data.write_bytes(other + raw[len(other) :])
    r2 = check(RealFs(), str(dd2.root), all_sealed=True)
    assert kinds(r2) == ["segment_seq"] and r2.problems[0].seq == 1 and not r2.ok


def test_idx_size_not_multiple_of_20(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    _, idx = dd.seg(TOPIC, 1)  # sealed (not the newest)
    idx.write_bytes(idx.read_bytes() + b"\x01\x02\x03")
    r = check(RealFs(), str(dd.root))
    assert not r.ok and kinds(r) == ["idx_size"] and "not a multiple of 20" in r.problems[0].detail


def test_active_segment_torn_tail_is_informational(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    data, idx = dd.seg(TOPIC, 6)  # newest segment of topic 7: possibly active
    idx.write_bytes(idx.read_bytes() + b"\x00" * 7)
    data.write_bytes(data.read_bytes() + b"half a frame")
    r = check(RealFs(), str(dd.root))
    assert r.ok and kinds(r) == ["segment_torn_tail"]
    assert "partial trailing .idx entry" in r.problems[0].detail
    # The same bytes in a segment declared sealed are corruption.
    s = check(RealFs(), str(dd.root), all_sealed=True)
    assert not s.ok and sorted(kinds(s)) == ["data_trailing", "idx_size"]


def test_active_segment_bad_last_frame_is_tail_but_bad_middle_is_corrupt(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    data, _ = dd.seg(TOPIC, 6)
    n = len(seg_record(TOPIC, 6))
    flip(data, 2 * n + 30)  # seq 8, the last entry
    r = check(RealFs(), str(dd.root))
    assert r.ok and kinds(r) == ["segment_torn_tail"] and r.problems[0].seq == 8
    flip(data, 2 * n + 30)
    flip(data, n + 30)  # seq 7, followed by a good seq 8
    r2 = check(RealFs(), str(dd.root))
    assert not r2.ok and kinds(r2) == ["segment_frame"] and r2.problems[0].seq == 7


def test_idx_entry_past_data_and_overlap(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    data, _ = dd.seg(TOPIC, 1)
    data.write_bytes(data.read_bytes()[:-10])  # sealed .data lost its last bytes
    write_segment(dd.root, 9, 2, 1, seal=True)  # overlaps seg 1 of topic 9 ([1, 2])
    r = check(RealFs(), str(dd.root))
    assert not r.ok
    assert sorted(kinds(r)) == ["idx_entry", "segment_overlap"]


def test_strays_and_temps_are_not_corruption(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    _, idx = dd.seg(9, 1)
    idx.unlink()
    tdir = Path(topic_dir(str(dd.root), TOPIC))
    (tdir / "seg-0000000000000100.data.tmp").write_bytes(b"x")
    (dd.root / "meta" / "snapshot.0003.bin.tmp").write_bytes(b"x")
    (dd.root / "topics" / "000000000000000a.deleted").mkdir()
    r = check(RealFs(), str(dd.root))
    assert r.ok
    assert sorted(kinds(r)) == [
        "segment_stray",
        "tmp_leftover",
        "tmp_leftover",
        "topic_dir_deleted",
    ]
    assert r.segments == 2


# -- snapshots ---------------------------------------------------------------------


class _PruningFs(RealFs):
    """A running server's checkpoint as verify sees it: opening snapshot `victim` finds
    that a newer snapshot was written and `victim` dropped since the listing."""

    def __init__(self, victim: Path, newer: Path) -> None:
        super().__init__()
        self.victim, self.newer = str(victim), newer

    def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == self.victim and Path(path).exists():
            self.newer.write_bytes(Path(path).read_bytes())
            Path(path).unlink()
        return super().open(path, *args, **kwargs)


def test_a_snapshot_pruned_by_a_running_server_is_not_damage(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    meta = dd.root / "meta"
    fs = _PruningFs(meta / snapshot_name(1), meta / snapshot_name(3))
    r = check(fs, str(dd.root))
    assert r.ok, [p.as_dict() for p in r.problems]
    assert kinds(r) == ["snapshot_pruned"]
    assert r.problems[0].severity == INFO
    # The newer snapshot that took its place was checked instead.
    assert r.snapshots == 2 and r.valid_snapshots == 2
    # Gone with nothing newer: that is a lost snapshot, still reported as damage.
    (meta / snapshot_name(3)).unlink()
    fs = _PruningFs(meta / snapshot_name(2), meta / "elsewhere")
    fs.newer = tmp_path / "elsewhere"
    r = check(fs, str(dd.root))
    assert not r.ok and "unreadable" in kinds(r)


class _RemovingFs(RealFs):
    """Opening `trigger` (once) finds `gone` removed, as a running server removes files."""

    def __init__(self, trigger: Path, *gone: Path) -> None:
        super().__init__()
        self.trigger, self.gone, self.done = str(trigger), gone, False

    def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == self.trigger and not self.done:
            self.done = True
            for p in self.gone:
                p.unlink()
        return super().open(path, *args, **kwargs)


def test_a_segment_removed_while_verify_runs_is_not_damage_by_itself(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    data, idx = dd.seg(9, 1)
    r = check(_RemovingFs(idx, data, idx), str(dd.root))
    assert kinds(r)[0] == "segment_gone" and r.problems[0].severity == INFO
    # The snapshots of this dir list no segments, so nothing relies on it: still clean.
    assert r.ok, [p.as_dict() for p in r.problems]


def test_a_wal_file_removed_while_verify_scans_is_scanned_again(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path, appends=40, file_bytes=600)
    files = sorted(p for p in dd.wal_dirs[0].iterdir() if p.name.endswith(".log"))
    assert len(files) >= 3
    # Opening the oldest file finds it removed (a checkpoint covered it): the scan runs
    # again on what is there instead of calling the shard unreadable.
    fs = _RemovingFs(files[0], files[0])
    r = check(fs, str(dd.root))
    assert fs.done
    assert "unreadable" not in kinds(r), [p.as_dict() for p in r.problems]
    assert r.frames > 0


def test_invalid_snapshot_is_reported(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    newest = dd.root / "meta" / snapshot_name(2)
    flip(newest, 22)
    r = check(RealFs(), str(dd.root))
    assert not r.ok and kinds(r) == ["snapshot_invalid"]
    assert r.problems[0].path == str(newest) and "checksum" in r.problems[0].detail
    assert r.snapshots == 2 and r.valid_snapshots == 1
    flip(dd.root / "meta" / snapshot_name(1), 0)  # bad magic
    r2 = check(RealFs(), str(dd.root))
    assert kinds(r2) == ["snapshot_invalid", "snapshot_invalid", "no_valid_snapshot"]
    assert r2.valid_snapshots == 0


def test_report_as_dict_and_str(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)
    flip(dd.root / "meta" / snapshot_name(2), 22)
    r = check(RealFs(), str(dd.root))
    d = r.as_dict()
    assert d["ok"] is False and d["problems"][0]["kind"] == "snapshot_invalid"
    assert str(r.problems[0]).startswith("CORRUPT snapshot_invalid ")


# -- through the Fs seam (FakeDisk crash states, injected read errors) -------------


@pytest.mark.parametrize("damage", ["prefix", "zero_sector", "garble"])
def test_fakedisk_crash_damage_stays_after_the_synced_prefix(damage: str) -> None:
    from tests.support.fakedisk import FakeDisk

    disk = FakeDisk()
    shard, _ = WalShard.open(disk, "/data/wal", file_bytes=8192)
    w = Waiter()
    frames = wal_frames(TOPIC, 6)
    for fr in frames[:4]:
        shard.submit(WalEntry(fr, 1, sync=True, done=w.cb))
    w.wait(4)
    synced_end = sum(len(f) for f in frames[:4])
    # One more multi-frame write that is not synced when the power goes.
    shard.submit(WalEntry(b"".join(frames[4:]), len(frames) - 4, sync=False, done=w.cb))
    w.wait(5)
    disk.crash("torn_last", damage, seed=3)  # type: ignore[arg-type]
    shard.close()
    disk.recover()
    raw = check(disk, "/data")
    # The un-recovered image: the synced prefix is intact; damage inside the
    # un-synced write may be a torn tail or (garble / zeroed sector in the
    # middle of a multi-frame write) look like mid-log damage.
    assert raw.frames >= 4
    assert set(kinds(raw)) <= {"torn_tail", "mid_log_damage"}
    assert all(p.offset is not None and p.offset >= synced_end for p in raw.problems)
    # Recovery cuts the log at its end; fsck is clean afterwards.
    again, found = WalShard.open(disk, "/data/wal", file_bytes=8192)
    again.close()
    after = check(disk, "/data")
    assert after.ok and after.problems == [], [str(p) for p in after.problems]
    assert after.frames == len(found.frames) == raw.frames


def test_fakedisk_poked_mid_log_and_unreadable_file() -> None:
    from tests.support.fakedisk import FakeDisk, FaultFs

    disk = FakeDisk()
    shard, _ = WalShard.open(disk, "/data/wal", file_bytes=8192)
    w = Waiter()
    frames = wal_frames(TOPIC, 5)
    for fr in frames:
        shard.submit(WalEntry(fr, 1, sync=True, done=w.cb))
    w.wait(len(frames))
    shard.close()
    sc = scan_shard(disk, "/data/wal")
    third = sc.frames[2][1]
    assert sc.end_file is not None
    marks = 0  # SyncMarks are not counted as frames at risk
    disk.poke(f"/data/wal/{sc.end_file}", third.offset + 20, b"\xff")
    r = check(disk, "/data")
    assert kinds(r) == ["mid_log_damage"] and r.lost_frames == len(frames) - 3 + marks
    assert r.frames == len(frames) - 1 and r.problems[0].offset == third.offset
    faulty = FaultFs(disk)
    faulty.fail("pread", 1, "EIO")
    r2 = check(faulty, "/data")
    assert not r2.ok and kinds(r2)[0] == "unreadable"
