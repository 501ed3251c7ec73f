"""Segment files: append/flush/seal/reopen, the .idx stride, checksums, delete flag, seal triggers."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
from tests.support.segreader import SegmentReader

from topics.format.idx import DELETED, IDX_ENTRY_DTYPE
from topics.storage.fs import RealFs
from topics.storage.segment import (
    SegmentCorrupt,
    SegmentError,
    SegmentRangeError,
    SegmentScan,
    SegmentWriter,
    frame_problem,
    scan_segments,
    segment_name,
    segment_paths,
    topic_dir,
)

_SEG_HEADER = struct.Struct("<IBQQQHHI")  # docs/FORMATS.md "Segment files"


def seg_frame(
    seq: int,
    ts: int,
    data: bytes = b'{"v":1}',
    *,
    flags: int = 0,
    node: bytes = b"",
    tag: bytes = b"",
) -> bytes:
    """A segment frame built straight from docs/FORMATS.md (test-local codec)."""
    frame_len = 33 + len(node) + len(tag) + len(data) + 8
    head = _SEG_HEADER.pack(frame_len, flags, 7, seq, ts, len(node), len(tag), len(data))
    body = head[4:] + node + tag + data
    return head[:4] + body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def frames_for(first: int, n: int, ts0: int = 1000) -> list[bytes]:
    return [seg_frame(first + i, ts0 + i, b'{"i":%d}' % i * (i % 3 + 1)) for i in range(n)]


def write_segment(d: str, first: int, n: int, *, seal: bool = True) -> list[bytes]:
    fs = RealFs()
    w = SegmentWriter(fs, d, first)
    fr = frames_for(first, n)
    for i, f in enumerate(fr):
        assert w.append(f, 1000 + i, i & 0x03) == first + i
    if seal:
        w.seal()
    else:
        w.flush()
        w.close()
    return fr


def poke(path: str, offset: int, data: bytes) -> None:
    f = RealFs().open(path, write=True)
    f.pwrite(data, offset)
    f.close()


def test_names_and_layout(tmp_path: Path) -> None:
    assert segment_name(10001) == "seg-0000000000010001"
    assert topic_dir("/d", 10) == "/d/topics/000000000000000a"
    p = segment_paths("/d/t", 1)
    assert p.data == "/d/t/seg-0000000000000001.data" and p.idx.endswith(".idx")
    with pytest.raises(ValueError):
        segment_name(-1)


def test_frame_helper_matches_the_checker() -> None:
    f = seg_frame(5, 9, b"x", node=b"n", tag=b"t", flags=3)
    assert len(f) == 45 + 3 and frame_problem(f, 5) is None
    assert frame_problem(f, 6) == "frame carries seq 5"
    assert frame_problem(f[:-1] + bytes([f[-1] ^ 1]), 5) == "checksum mismatch"
    assert frame_problem(b"\x00" * 8) is not None


def test_append_flush_seal_reopen_round_trip(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path / "topics" / "0000000000000001")
    w = SegmentWriter(fs, d, 101)
    fr = frames_for(101, 6)
    written = w.append_many(fr[:4], [1000, 1001, 1002, 1003], [0, 1, 2, 3])
    assert w.append(fr[4], 1004, 0) == 105 and w.append(fr[5], 1005, 4) == 106
    assert (w.count, w.next_seq, w.last_seq) == (6, 107, 106)
    assert w.data_bytes == sum(map(len, fr))
    w.flush()
    info = w.seal()
    assert (info.first_seq, info.last_seq, info.count) == (101, 106, 6)
    with pytest.raises(SegmentError):
        w.append(fr[0], 1, 0)

    with SegmentReader(fs, d, 101) as r:
        assert r.mmapped
        idx = r.load_idx()
        assert idx.dtype == IDX_ENTRY_DTYPE and len(idx) == 6
        assert idx[:4].tobytes() == written.tobytes()
        assert idx["offset"].tolist() == np.cumsum([0] + [len(f) for f in fr[:-1]]).tolist()
        assert idx["ts"].tolist() == list(range(1000, 1006))
        assert idx["flags"].tolist() == [0, 1, 2, 3, 0, 4]
        assert [r.read(s) for s in range(101, 107)] == fr
        assert r.read_range(102, 104) == [(102, fr[1]), (103, fr[2]), (104, fr[3])]
        assert r.read_range(104, 103) == [] and r.verify() == 6
        with pytest.raises(SegmentRangeError):
            r.read(107)
        with pytest.raises(SegmentRangeError):
            r.read_range(100, 101)
    # same answers through pread
    with SegmentReader(fs, d, 101, use_mmap=False) as r:
        assert not r.mmapped and [r.read(s) for s in range(101, 107)] == fr
    assert scan_segments(fs, d).segments == [(101, segment_paths(d, 101))]


def test_idx_entry_is_pure_arithmetic(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 50, 9)
    raw = Path(segment_paths(d, 50).idx).read_bytes()
    assert len(raw) == 9 * 20
    with SegmentReader(fs, d, 50) as r:
        for seq in (50, 54, 58):
            off, ln, ts, flags = r.read_entry(seq)
            e = np.frombuffer(raw[(seq - 50) * 20 : (seq - 50 + 1) * 20], IDX_ENTRY_DTYPE)[0]
            assert (off, ln, ts, flags) == (
                int(e["offset"]),
                int(e["len"]),
                int(e["ts"]),
                int(e["flags"]),
            )
            assert Path(segment_paths(d, 50).data).read_bytes()[off : off + ln] == fr[seq - 50]
        for bad in (49, 59):
            with pytest.raises(SegmentRangeError):
                r.read_entry(bad)


def test_sealed_checksum_mismatch_raises_never_skips(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 1, 5)
    off = sum(map(len, fr[:2]))
    poke(segment_paths(d, 1).data, off + 40, b"\xff")  # inside seq 3's payload
    for use_mmap in (True, False):
        with SegmentReader(fs, d, 1, use_mmap=use_mmap) as r:
            assert r.read(2) == fr[1] and r.read(4) == fr[3]
            with pytest.raises(SegmentCorrupt) as ei:
                r.read(3)
            assert ei.value.seq == 3 and ei.value.path == segment_paths(d, 1).data
            with pytest.raises(SegmentCorrupt):
                r.read_range(1, 5)
            with pytest.raises(SegmentCorrupt):
                r.verify()


def test_misdirected_idx_entry_is_corrupt(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    write_segment(d, 1, 3)
    raw = Path(segment_paths(d, 1).idx).read_bytes()
    poke(segment_paths(d, 1).idx, 0, raw[20:40])  # entry for seq 1 now points at seq 2's frame
    with SegmentReader(fs, d, 1) as r, pytest.raises(SegmentCorrupt, match="carries seq 2"):
        r.read(1)


def test_idx_not_multiple_of_stride_is_corrupt(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 1, 3)
    f = fs.open(segment_paths(d, 1).idx, write=True)
    f.truncate(59)
    f.close()
    with SegmentReader(fs, d, 1) as r, pytest.raises(SegmentCorrupt, match="multiple of 20"):
        r.load_idx()
    # the active segment's partial trailing entry is an append in flight: not served
    with SegmentReader(fs, d, 1, sealed=False) as r:
        assert len(r.load_idx()) == 2 and r.read(2) == fr[1]
        with pytest.raises(SegmentRangeError):
            r.read(3)


def test_idx_pointing_past_data_is_corrupt(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 1, 3)
    f = fs.open(segment_paths(d, 1).data, write=True)
    f.truncate(len(fr[0]) + len(fr[1]) + 5)  # stale/short .data
    f.close()
    for use_mmap in (True, False):
        with SegmentReader(fs, d, 1, use_mmap=use_mmap) as r:
            with pytest.raises(SegmentCorrupt, match="past the end of .data") as ei:
                r.load_idx()
            assert ei.value.seq == 3 and ei.value.path == segment_paths(d, 1).idx
            with pytest.raises(SegmentCorrupt):
                r.read(1)  # a bad index is never served, not even its good entries


def test_delete_flag_in_place_survives_reopen_outside_checksum(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 10, 4)
    data_before = Path(segment_paths(d, 10).data).read_bytes()
    with SegmentReader(fs, d, 10) as r:
        r.mark_deleted([11, 13, 13])
        r.mark_deleted([11])  # idempotent
        assert r.load_idx()["flags"][[1, 3]].tolist() == [DELETED, DELETED]
        with pytest.raises(SegmentRangeError):
            r.mark_deleted([14])
        assert not r.all_deleted()
    assert Path(segment_paths(d, 10).data).read_bytes() == data_before
    raw = Path(segment_paths(d, 10).idx).read_bytes()
    assert raw[1 * 20 + 16] == DELETED and raw[3 * 20 + 16] == DELETED and raw[16] != DELETED
    with SegmentReader(fs, d, 10) as r:
        flags = r.load_idx()["flags"].tolist()
        assert flags[1] == DELETED and flags[3] == DELETED and flags[0] != DELETED
        assert r.read(11) == fr[1]  # still verifies: the flag is outside the checksum
        assert [s for s, _ in r.read_range(10, 13, skip_deleted=True)] == [10, 12]
        r.mark_deleted([10, 12])
        assert r.all_deleted()
        assert r.read_range(10, 13, skip_deleted=True) == []
    with SegmentReader(fs, d, 10) as r:
        assert r.all_deleted() and r.verify() == 4


def test_seal_triggers(tmp_path: Path) -> None:
    w = SegmentWriter(RealFs(), str(tmp_path), 1)
    assert not w.should_seal(1, 1, 1, 10**12)  # empty never seals
    fr = frames_for(1, 3, ts0=5_000)
    for i, f in enumerate(fr):
        w.append(f, 5_000 + i, 0)
    size = w.data_bytes
    far = 10**9
    assert w.should_seal(3, far, 0, 5_000)  # count
    assert not w.should_seal(4, far, 0, 5_000)
    assert w.should_seal(far, size, 0, 5_000)  # bytes
    assert not w.should_seal(far, size + 1, 0, 5_000)
    assert w.first_ts == 5_000 and w.age_ms(5_999) == 999
    assert not w.should_seal(far, far, 1_000, 5_999)  # age
    assert w.should_seal(far, far, 1_000, 6_000)
    assert not w.should_seal(far, far, 0, 10**12)  # 0 disables the age trigger
    assert not w.should_seal(far, far, 1_000, 1_000)  # clock behind first ts
    w.close()


def test_writer_rejects_bad_input_and_clobbering(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    w = SegmentWriter(fs, d, 1)
    good = seg_frame(1, 1)
    with pytest.raises(ValueError):
        w.append(good[:-1], 1, 0)  # frame_len no longer matches
    with pytest.raises(ValueError):
        w.append(good, 1, 0x100)
    with pytest.raises(ValueError):
        w.append_many([good], [1, 2], [0])
    assert w.count == 0 and w.data_bytes == 0
    w.append(good, 1, 0)
    w.seal()
    with pytest.raises(FileExistsError):
        SegmentWriter(fs, d, 1)


def test_active_segment_reads_with_pread_and_sees_flushed_appends(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    w = SegmentWriter(fs, d, 1)
    fr = frames_for(1, 4)
    w.append(fr[0], 1, 0)
    w.flush()
    r = SegmentReader(fs, d, 1, sealed=False)
    assert not r.mmapped and r.count == 1 and r.read(1) == fr[0]
    w.append_many(fr[1:], [2, 3, 4], [0, 0, 0])
    # Entries reach .idx only once .data is durable (flush), never before.
    assert r.count == 1 and len(w.idx_bytes()) == 4 * 20
    w.flush()
    assert r.read(4) == fr[3] and r.count == 4 and r.last_seq == 4
    r.close()
    w.close()


def test_resume_truncates_torn_active_tail(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 1, 3, seal=False)
    paths = segment_paths(d, 1)
    good_data = Path(paths.data).read_bytes()
    # a torn 4th append: half a frame in .data, a partial entry in .idx
    torn = seg_frame(4, 2000)
    poke(paths.data, len(good_data), torn[:20])
    poke(paths.idx, 60, b"\x01" * 7)
    w = SegmentWriter.resume(fs, d, 1)
    assert (w.count, w.next_seq, w.data_bytes, w.first_ts) == (3, 4, len(good_data), 1000)
    assert Path(paths.data).read_bytes() == good_data and len(Path(paths.idx).read_bytes()) == 60
    w.append(torn, 2000, 0)
    w.seal()
    with SegmentReader(fs, d, 1) as r:
        assert [f for _, f in r.read_range(1, 4)] == [*fr, torn]


def test_resume_cuts_at_a_bad_frame_and_max_count(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    fr = write_segment(d, 1, 4, seal=False)
    poke(segment_paths(d, 1).data, len(fr[0]) + len(fr[1]) + 40, b"\xff")  # seq 3 torn
    w = SegmentWriter.resume(fs, d, 1)
    assert w.count == 2
    w.close()
    w = SegmentWriter.resume(fs, d, 1, max_count=1)
    assert w.count == 1 and w.data_bytes == len(fr[0])
    w.close()


def test_scan_segments_sorted_ignores_tmp_reports_strays(tmp_path: Path) -> None:
    fs, d = RealFs(), str(tmp_path)
    for first in (21, 1, 11):
        write_segment(d, first, 2)
    (tmp_path / "seg-0000000000000031.data").write_bytes(b"x")  # stray .data
    (tmp_path / "seg-0000000000000041.idx").write_bytes(b"")  # stray .idx
    (tmp_path / "seg-0000000000000051.data.tmp").write_bytes(b"x")
    (tmp_path / "seg-0000000000000051.idx.tmp").write_bytes(b"x")
    (tmp_path / "notes.txt").write_bytes(b"x")
    scan = scan_segments(fs, d)
    segs = scan.segments
    assert [s for s, _ in segs] == [1, 11, 21]
    assert segs[1][1] == segment_paths(d, 11)
    assert [p.rsplit("/", 1)[1] for p in scan.strays] == [
        "seg-0000000000000031.data",
        "seg-0000000000000041.idx",
    ]
    assert len(scan.temps) == 2
    assert scan_segments(fs, str(tmp_path / "missing")) == SegmentScan([], [], [])
