"""SlotIndex: base + offset arithmetic, growth, front reclaim, the .idx twin."""

from __future__ import annotations

import numpy as np

from topics.engine.index import SLOT_DTYPE, SlotIndex
from topics.format.idx import DELETED, IDX_ENTRY_DTYPE


def rows(n: int, ts: int = 5) -> np.ndarray:
    r = np.zeros(n, SLOT_DTYPE)
    r["ts"] = ts
    r["bytes"] = np.arange(1, n + 1)
    return r


def test_idx_entry_is_twenty_bytes_little_endian() -> None:
    assert IDX_ENTRY_DTYPE.itemsize == 20
    e = np.zeros(1, IDX_ENTRY_DTYPE)
    e["offset"], e["len"], e["ts"], e["flags"] = 7, 9, 2**40 + 3, DELETED
    raw = e.tobytes()
    assert raw[:4] == (7).to_bytes(4, "little") and raw[4:8] == (9).to_bytes(4, "little")
    assert raw[8:16] == (2**40 + 3).to_bytes(8, "little") and raw[16] == 0xD5
    assert SLOT_DTYPE.itemsize <= 40  # index memory budget per record


def test_append_pop_and_lookup() -> None:
    idx = SlotIndex(1, capacity=4)
    idx.append_rows(rows(10))
    assert len(idx) == 10 and idx.end_seq == 10
    idx.pop_front(3)
    assert idx.base_seq == 4 and len(idx) == 7
    assert int(idx.view()["bytes"][0]) == 4
    idx.append_rows(rows(1, ts=9))
    assert idx.end_seq == 11 and int(idx.window(7, 1)["ts"][0]) == 9
    idx.pop_front(100)
    assert len(idx) == 0 and idx.base_seq == 12


def test_growth_keeps_window_consistent() -> None:
    idx = SlotIndex(1, capacity=2)
    for i in range(1000):
        idx.append_rows(rows(1, ts=i))
        if i % 3 == 0:
            idx.pop_front(1)
    n = len(idx)
    assert idx.base_seq + n - 1 == 1000
    assert list(idx.view()["ts"]) == list(range(1000 - n, 1000))


def test_clear_to() -> None:
    idx = SlotIndex(1)
    idx.append_rows(rows(5))
    idx.clear_to(42)
    assert len(idx) == 0 and idx.base_seq == 42 and idx.end_seq == 41


def test_from_rows_adopts_the_array() -> None:
    r = rows(3, ts=7)
    idx = SlotIndex.from_rows(10, r)
    assert len(idx) == 3 and idx.base_seq == 10 and idx.end_seq == 12
    idx.append_rows(rows(2, ts=8))
    assert list(idx.view()["ts"]) == [7, 7, 7, 8, 8]
