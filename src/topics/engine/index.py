"""Per-topic slot index: a growable numpy structured array, base + offset.

Slot `i` holds seq `base_seq + i`; lookup is arithmetic, never a hash. The first
four fields mirror the 20-byte `.idx` entry of the segment seed
(`offset u32, len u32, ts u64, flags u8` + 3 pad bytes); the rest are in-memory
only: `loc` (which segment file, or the WAL / memory sentinels), `hops` (router
hop count), `bytes` (payload bytes for accounting, 0 once deleted) and `node`
(interned node id, 0 = none) so reads can filter by node without touching
payloads.

Payload objects for the same slots live in a parallel Python list that shares the
array's start offset; both are compacted together.

Flags: bit0 has_tag, bit1 has_node, bit2 durable; the whole byte equal to
:data:`DELETED` (0xD5) marks a deleted slot, the value the seed flips in a sealed
segment's `.idx` (SEMANTICS §17).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "SLOT_DTYPE",
    "IDX_ENTRY_DTYPE",
    "SlotIndex",
    "DELETED",
    "F_HAS_TAG",
    "F_HAS_NODE",
    "F_DURABLE",
    "LOC_MEMORY",
    "LOC_WAL",
]

F_HAS_TAG = 0x01
F_HAS_NODE = 0x02
F_DURABLE = 0x04
DELETED = 0xD5

LOC_MEMORY = 0xFFFFFFFF
LOC_WAL = 0xFFFFFFFE

#: The on-disk `.idx` entry: 20 bytes, little-endian (segment seed).
IDX_ENTRY_DTYPE = np.dtype(
    [("offset", "<u4"), ("len", "<u4"), ("ts", "<u8"), ("flags", "u1"), ("pad", "V3")]
)
assert IDX_ENTRY_DTYPE.itemsize == 20

#: The in-memory slot: the `.idx` fields plus location, hops, bytes and node id.
SLOT_DTYPE = np.dtype(
    [
        ("offset", "<u4"),
        ("len", "<u4"),
        ("ts", "<u8"),
        ("flags", "u1"),
        ("hops", "u1"),
        ("loc", "<u4"),
        ("bytes", "<u4"),
        ("node", "<u4"),
    ]
)

SlotArray = npt.NDArray[np.void]


class SlotIndex:
    """Dense seq -> slot map for one topic instance.

    `base_seq` is the seq of the first physically retained slot; `end_seq` the
    last (== the topic's published head). Appends go to the back, reclaim pops
    from the front; both are amortised O(1) per slot.
    """

    __slots__ = ("_arr", "_start", "_n", "base_seq", "payloads")

    def __init__(self, base_seq: int = 1, capacity: int = 16) -> None:
        self._arr: SlotArray = np.zeros(capacity, SLOT_DTYPE)
        self._start = 0
        self._n = 0
        self.base_seq = base_seq
        self.payloads: list[Any] = []  # parallel to _arr[_start:_start+_n] via the same offset

    def __len__(self) -> int:
        return self._n

    @property
    def end_seq(self) -> int:
        """Seq of the last slot (base_seq - 1 when empty)."""
        return self.base_seq + self._n - 1

    def view(self) -> SlotArray:
        """The live window of slots (a numpy view; do not keep across mutations)."""
        return self._arr[self._start : self._start + self._n]

    def window(self, pos: int, count: int) -> SlotArray:
        """Slots at positions [pos, pos + count) relative to base_seq."""
        s = self._start + pos
        return self._arr[s : s + count]

    def payload(self, pos: int) -> Any:
        return self.payloads[self._start + pos]

    def set_payload(self, pos: int, value: Any) -> None:
        self.payloads[self._start + pos] = value

    def payload_slice(self, pos: int, count: int) -> list[Any]:
        s = self._start + pos
        return self.payloads[s : s + count]

    def _reserve(self, extra: int) -> None:
        need = self._start + self._n + extra
        cap = len(self._arr)
        if need <= cap:
            return
        if self._start and self._n + extra <= cap // 2:
            # Plenty of dead room at the front: slide the window down.
            self._arr[: self._n] = self._arr[self._start : self._start + self._n]
            del self.payloads[: self._start]
            self._start = 0
            return
        new_cap = max(16, 2 * (self._n + extra))
        arr = np.zeros(new_cap, SLOT_DTYPE)
        arr[: self._n] = self._arr[self._start : self._start + self._n]
        del self.payloads[: self._start]
        self._arr = arr
        self._start = 0

    def append_rows(self, rows: SlotArray, payloads: list[Any]) -> None:
        """Append `len(rows)` slots (a SLOT_DTYPE array) and their payloads."""
        k = len(rows)
        self._reserve(k)
        e = self._start + self._n
        self._arr[e : e + k] = rows
        self.payloads.extend(payloads)
        self._n += k

    def append_one(
        self, ts: int, flags: int, hops: int, nbytes: int, node: int, payload: Any
    ) -> None:
        """Append a single slot (the memory location sentinel, offset/len 0)."""
        self._reserve(1)
        e = self._start + self._n
        self._arr[e] = (0, 0, ts, flags, hops, LOC_MEMORY, nbytes, node)
        self.payloads.append(payload)
        self._n += 1

    def pop_front(self, count: int) -> None:
        """Drop the first `count` slots (clamped to the slot count)."""
        count = min(count, self._n)
        if count <= 0:
            return
        s = self._start
        for i in range(s, s + count):
            self.payloads[i] = None
        self._start += count
        self._n -= count
        self.base_seq += count
        if self._n == 0:
            self._start = 0
            self.payloads.clear()

    def clear_to(self, next_seq: int) -> None:
        """Drop every slot and restart the window at `next_seq`."""
        self._start = 0
        self._n = 0
        self.payloads.clear()
        self.base_seq = next_seq
        if len(self._arr) > 1024:
            self._arr = np.zeros(16, SLOT_DTYPE)

    def nbytes(self) -> int:
        """Bytes held by the numpy array (capacity, not just live slots)."""
        return int(self._arr.nbytes)
