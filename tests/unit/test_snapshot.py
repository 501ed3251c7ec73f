"""Metadata snapshots: layout, atomic install + prune, fallback past corrupt files, fuzzed decoder."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.storage.fs import RealFile, RealFs
from topics.storage.snapshot import (
    HEADER_SIZE,
    MAGIC,
    SnapshotInvalid,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    load_latest,
    next_snapshot_number,
    snapshot_name,
    write_snapshot,
)

BODY: dict[Any, Any] = {
    "topics": {"orders": 1},
    "watermarks": {1: [0, 5]},
    "routers": [],
    "next_topic_id": 2,
    "blob": b"\x00\x01",
}


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_layout_and_round_trip(tmp_path: Path) -> None:
    fs, meta = RealFs(), str(tmp_path / "meta")
    path = write_snapshot(fs, meta, 7, BODY)
    assert path.endswith("/meta/snapshot.0007.bin") and snapshot_name(12345) == "snapshot.12345.bin"
    raw = Path(path).read_bytes()
    magic, version, body_len = struct.unpack_from("<8sIQ", raw)
    assert (magic, version, HEADER_SIZE) == (MAGIC, 1, 20)
    assert len(raw) == 20 + body_len + 8
    body = raw[20:-8]
    assert int.from_bytes(raw[-8:], "little") == xxhash.xxh3_64_intdigest(body)
    assert raw == encode_snapshot(BODY)
    assert load_latest(fs, meta) == (7, BODY)  # int keys and bytes survive
    assert names(tmp_path / "meta") == ["snapshot.0007.bin"]


def test_prune_keeps_only_newest_valid_previous(tmp_path: Path) -> None:
    fs, meta = RealFs(), str(tmp_path)
    for n in (1, 2, 3):
        write_snapshot(fs, meta, n, {"n": n})
    assert names(tmp_path) == ["snapshot.0002.bin", "snapshot.0003.bin"]
    assert next_snapshot_number(fs, meta) == 4
    # a corrupt snapshot between: the newest *valid* previous one is kept
    (tmp_path / "snapshot.0004.bin").write_bytes(b"garbage")
    write_snapshot(fs, meta, 5, {"n": 5})
    assert names(tmp_path) == ["snapshot.0003.bin", "snapshot.0005.bin"]
    assert load_latest(fs, meta) == (5, {"n": 5})
    # higher numbers are never pruned
    write_snapshot(fs, meta, 9, {"n": 9})
    write_snapshot(fs, meta, 8, {"n": 8})
    assert [n for n, _ in list_snapshots(fs, meta)] == [5, 8, 9]  # 5: newest valid below 8


def test_corrupt_newest_falls_back_and_is_not_deleted(tmp_path: Path) -> None:
    fs, meta = RealFs(), str(tmp_path)
    write_snapshot(fs, meta, 1, {"n": 1})
    write_snapshot(fs, meta, 2, {"n": 2})
    p2 = tmp_path / "snapshot.0002.bin"
    raw = bytearray(p2.read_bytes())
    raw[25] ^= 0x40  # bit rot in the body
    p2.write_bytes(bytes(raw))
    assert load_latest(fs, meta) == (1, {"n": 1})
    assert p2.exists() and p2.read_bytes() == bytes(raw)


@pytest.mark.parametrize(
    "damage",
    ["magic", "version", "body_len_big", "body_len_small", "checksum", "truncate", "empty"],
)
def test_each_invalid_shape_is_skipped(tmp_path: Path, damage: str) -> None:
    fs, meta = RealFs(), str(tmp_path)
    write_snapshot(fs, meta, 1, {"n": 1})
    good = encode_snapshot({"n": 2})
    raw = bytearray(good)
    if damage == "magic":
        raw[0:8] = b"TOPSNAP0"
    elif damage == "version":
        raw[8:12] = (2).to_bytes(4, "little")
    elif damage == "body_len_big":
        raw[12:20] = (2**64 - 1).to_bytes(8, "little")
    elif damage == "body_len_small":
        raw[12:20] = (1).to_bytes(8, "little")
    elif damage == "checksum":
        raw[-1] ^= 1
    elif damage == "truncate":
        raw = raw[:19]
    else:
        raw = bytearray()
    (tmp_path / "snapshot.0002.bin").write_bytes(bytes(raw))
    assert isinstance(decode_snapshot(bytes(raw)), SnapshotInvalid)
    assert load_latest(fs, meta) == (1, {"n": 1})
    assert (tmp_path / "snapshot.0002.bin").exists()


def test_every_truncation_is_rejected() -> None:
    good = encode_snapshot(BODY)
    for cut in range(len(good)):
        assert isinstance(decode_snapshot(good[:cut]), SnapshotInvalid)
    assert decode_snapshot(good) == BODY


def test_valid_frame_around_a_non_map_or_garbage_body() -> None:
    def frame(body: bytes) -> bytes:
        head = struct.pack("<8sIQ", MAGIC, 1, len(body))
        return head + body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")

    assert isinstance(decode_snapshot(frame(b"\x93\x01\x02\x03")), SnapshotInvalid)  # a list
    assert isinstance(decode_snapshot(frame(b"\xc1")), SnapshotInvalid)  # reserved byte
    assert isinstance(decode_snapshot(frame(b"\x80\x80")), SnapshotInvalid)  # extra data
    assert isinstance(decode_snapshot(frame(b"\x81\x91\x01\x02")), SnapshotInvalid)  # list as key
    assert isinstance(decode_snapshot(frame(b"\xa1\xff")), SnapshotInvalid)  # bad UTF-8
    assert decode_snapshot(frame(b"\x80")) == {}


def test_tmp_leftovers_ignored_and_cleaned(tmp_path: Path) -> None:
    fs, meta = RealFs(), str(tmp_path)
    write_snapshot(fs, meta, 1, {"n": 1})
    # a crash after the .tmp fsync, before the rename: a fully valid but uninstalled file
    (tmp_path / "snapshot.0002.bin.tmp").write_bytes(encode_snapshot({"n": 2}))
    (tmp_path / "snapshot.0003.bin.tmp").write_bytes(b"half")
    (tmp_path / "unrelated.txt").write_bytes(b"x")
    assert [n for n, _ in list_snapshots(fs, meta)] == [1]
    assert load_latest(fs, meta) == (1, {"n": 1})
    assert names(tmp_path) == ["snapshot.0001.bin", "unrelated.txt"]


def test_missing_or_empty_meta_dir(tmp_path: Path) -> None:
    fs = RealFs()
    assert load_latest(fs, str(tmp_path / "nope")) is None
    assert load_latest(fs, str(tmp_path)) is None
    assert next_snapshot_number(fs, str(tmp_path)) == 1
    (tmp_path / "snapshot.0001.bin").write_bytes(b"bad")
    assert load_latest(fs, str(tmp_path)) is None


class NoSyncFile(RealFile):
    """A RealFile whose fdatasync fails with EIO."""

    def fdatasync(self) -> None:
        raise OSError(5, "injected EIO")


class FailingFs(RealFs):
    """RealFs that raises EIO on one named operation."""

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        f = super().open(path, create=create, write=write, exclusive=exclusive)
        if self.fail == "fdatasync" and write:
            return NoSyncFile(f.fd, f.path)
        return f

    def replace(self, src: str, dst: str) -> None:
        if self.fail == "replace":
            self._eio()
        super().replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        if self.fail == "fsync_dir":
            self._eio()
        super().fsync_dir(path)

    @staticmethod
    def _eio() -> None:
        raise OSError(5, "injected EIO")


@pytest.mark.parametrize("fail", ["fdatasync", "replace", "fsync_dir"])
def test_failed_write_prunes_nothing(tmp_path: Path, fail: str) -> None:
    meta = str(tmp_path)
    write_snapshot(RealFs(), meta, 1, {"n": 1})
    write_snapshot(RealFs(), meta, 2, {"n": 2})
    with pytest.raises(OSError, match="injected"):
        write_snapshot(FailingFs(fail), meta, 3, {"n": 3})
    left = names(tmp_path)
    assert "snapshot.0001.bin" in left and "snapshot.0002.bin" in left
    assert not any(n.endswith(".tmp") for n in left)
    # only the dir fsync failed after the rename: the new file may be there, old ones too
    expect = (3, {"n": 3}) if fail == "fsync_dir" else (2, {"n": 2})
    assert load_latest(RealFs(), meta) == expect


def test_unencodable_body_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_snapshot(RealFs(), str(tmp_path), 1, {"x": object()})
    assert names(tmp_path) == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_fuzz_garbage_never_raises(raw: bytes) -> None:
    out = decode_snapshot(raw)
    assert isinstance(out, SnapshotInvalid)  # 1 in 2**64 for garbage to carry a valid checksum


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=6), _JSONISH, max_size=4),
    st.data(),
)
def test_decode_fuzz_mutated_snapshots(body: dict[str, Any], data: st.DataObject) -> None:
    good = encode_snapshot(body)
    assert decode_snapshot(good) == body
    raw = bytearray(good)
    kind = data.draw(st.sampled_from(["flip", "cut", "splice"]))
    if kind == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    out = decode_snapshot(bytes(raw))
    assert isinstance(out, SnapshotInvalid)
