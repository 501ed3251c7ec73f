"""LocalSegmentStore (durable put, ranged reads, idempotent delete) and TopicTier."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.segreader import SegmentReader, sealed_parts

from topics.storage.fs import RealFs
from topics.storage.segment import SegmentRangeError
from topics.storage.segstore import (
    LocalSegmentStore,
    SegmentPart,
    SegmentStore,
    Tier,
    TopicTier,
)

DATA, IDX = SegmentPart.DATA, SegmentPart.IDX


def test_local_store_satisfies_the_protocol(tmp_path: Path) -> None:
    store: SegmentStore = LocalSegmentStore(RealFs(), str(tmp_path))
    assert store.list() == []


def test_put_read_len_exists_list(tmp_path: Path) -> None:
    fs = RealFs()
    root = tmp_path / "hot" / "topics" / "0000000000000001"
    store = LocalSegmentStore(fs, str(root))
    data, idx = sealed_parts(tmp_path, 101, 3)
    assert not store.exists(101, DATA)
    store.put(101, data, idx)
    store.put(1, b"d" * 50, b"i" * 20)
    assert store.list() == [1, 101]
    assert store.exists(101, DATA) and store.exists(101, IDX) and not store.exists(7, DATA)
    assert store.len(101, DATA) == len(data) and store.len(101, IDX) == len(idx) == 60
    assert store.read_range(101, IDX, 0, 60) == idx
    assert store.read_range(101, DATA, 5, 10) == data[5:15]
    assert store.read_range(101, DATA, len(data), 0) == b""
    assert sorted(p.name for p in root.iterdir()) == [
        "seg-0000000000000001.data",
        "seg-0000000000000001.idx",
        "seg-0000000000000101.data",
        "seg-0000000000000101.idx",
    ]  # no .tmp left behind
    # what the store wrote is a readable segment
    with SegmentReader(fs, str(root), 101) as r:
        assert r.verify() == 3
    with pytest.raises(SegmentRangeError):
        store.read_range(101, DATA, len(data) - 3, 4)  # never a silent short read
    with pytest.raises(SegmentRangeError):
        store.read_range(101, DATA, -1, 4)
    with pytest.raises(FileNotFoundError):
        store.read_range(7, DATA, 0, 1)
    with pytest.raises(FileNotFoundError):
        store.len(7, IDX)


def test_delete_is_idempotent_and_removes_tmp(tmp_path: Path) -> None:
    store = LocalSegmentStore(RealFs(), str(tmp_path))
    store.put(5, b"d" * 10, b"i" * 20)
    (tmp_path / "seg-0000000000000005.data.tmp").write_bytes(b"x")
    store.delete(5)
    store.delete(5)
    store.delete(99)
    assert store.list() == [] and list(tmp_path.iterdir()) == []


def test_put_is_idempotent_and_never_pairs_a_stale_idx(tmp_path: Path) -> None:
    store = LocalSegmentStore(RealFs(), str(tmp_path))
    store.put(1, b"first", b"i" * 20)
    store.put(1, b"other", b"j" * 20)  # complete already: skipped, no rewrite
    assert store.read_range(1, DATA, 0, 5) == b"first"
    # a stray .idx (crash after a delete removed .data) must not pair with new data
    (tmp_path / "seg-0000000000000002.idx").write_bytes(b"stale" * 4)
    assert store.list() == [1]
    store.put(2, b"data2", b"k" * 20)
    assert store.read_range(2, IDX, 0, 20) == b"k" * 20
    # a stray .data is replaced by the put
    (tmp_path / "seg-0000000000000003.data").write_bytes(b"old")
    (tmp_path / "seg-0000000000000003.idx.tmp").write_bytes(b"torn")
    assert store.list() == [1, 2]
    store.put(3, b"new", b"m" * 20)
    assert store.read_range(3, DATA, 0, 3) == b"new" and store.list() == [1, 2, 3]


def test_topic_tier_prefers_hot(tmp_path: Path) -> None:
    fs = RealFs()
    hot = LocalSegmentStore(fs, str(tmp_path / "hot"))
    cold = LocalSegmentStore(fs, str(tmp_path / "cold"))
    tier = TopicTier(hot, cold)
    hot.put(1, b"h", b"i" * 20)
    cold.put(1, b"c", b"i" * 20)  # mid-relocation: both copies
    cold.put(2, b"c", b"i" * 20)
    hot.put(3, b"h", b"i" * 20)
    (tmp_path / "hot" / "seg-0000000000000002.data").write_bytes(b"partial")  # incomplete hot copy
    assert tier.resolve(1) is Tier.HOT
    assert tier.resolve(2) is Tier.COLD
    assert tier.resolve(3) is Tier.HOT and tier.resolve(4) is None
    assert tier.resolve_store(1) is hot and tier.resolve_store(2) is cold
    assert tier.resolve_store(4) is None
    assert tier.list() == [(1, Tier.HOT), (2, Tier.COLD), (3, Tier.HOT)]
    hot.delete(1)
    assert tier.resolve(1) is Tier.COLD


def test_topic_tier_without_cold_is_all_hot(tmp_path: Path) -> None:
    hot = LocalSegmentStore(RealFs(), str(tmp_path))
    tier = TopicTier(hot)
    hot.put(1, b"h", b"i" * 20)
    assert tier.resolve(1) is Tier.HOT and tier.resolve(2) is None
    assert tier.store(Tier.HOT) is hot and tier.list() == [(1, Tier.HOT)]
    with pytest.raises(LookupError):
        tier.store(Tier.COLD)
