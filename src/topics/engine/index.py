"""Per-topic slot index: a growable numpy structured array, base + offset.

Slot `i` holds seq `base_seq + i`; lookup is arithmetic, never a hash. The first
four fields mirror the 20-byte `.idx` entry of a segment file
(`offset u32, len u32, ts u64, flags u8` + 3 pad bytes); the rest are in-memory
only:

* `loc` - where the record's frame lives: a segment or an in-memory chunk of
  WAL-encoded frames, both registered in the topic's source table
  (:mod:`topics.engine.frames`), or :data:`LOC_HOLE` for a seq that never had
  a record (failed write, padding, trim hole);
* `hops` - router hop count (0 for records loaded from disk);
* `bytes` - payload bytes for accounting (`data` + `meta`, docs/API.md, "4. Records"; 0
  once deleted);
* `node` - interned node id, 0 = no node, :data:`NODE_UNKNOWN` = the frame
  has a node that has not been read yet (records loaded from disk).

`offset`/`len` locate the frame inside its source. `flags` is the frame's own
flags byte (bit0 has_tag, bit1 has_node, bit2 durable, bit3 has_meta), or
:data:`DELETED` (0xD5), the value a delete flips in a sealed segment's `.idx`
(docs/FORMATS.md, "Segment files"). No frame ever carries 0xD5 (bits 6 and 7 are unused).

Memory: 30 bytes a slot, and the array grows by a quarter when full, so a topic
costs at most about 38 bytes per retained seq (bounded by the entry
count, not by payload volume).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "SLOT_DTYPE",
    "SlotArray",
    "SlotIndex",
    "LOC_HOLE",
    "NODE_UNKNOWN",
]


#: `loc` of a seq with no frame at all (always flagged DELETED).
LOC_HOLE = 0xFFFFFFFF
#: `node` of a slot whose frame has a node that was not read yet.
NODE_UNKNOWN = 0xFFFFFFFF


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

    __slots__ = ("_arr", "_start", "_n", "base_seq")

    def __init__(self, base_seq: int = 1, capacity: int = 16) -> None:
        self._arr: SlotArray = np.zeros(capacity, SLOT_DTYPE)
        self._start = 0
        self._n = 0
        self.base_seq = base_seq

    @classmethod
    def from_rows(cls, base_seq: int, rows: SlotArray) -> SlotIndex:
        """An index over `rows` (slot `i` is seq `base_seq + i`), adopting the array."""
        idx = cls(base_seq, 0)
        idx._arr = rows
        idx._n = len(rows)
        return idx

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

    def _reserve(self, extra: int) -> None:
        need = self._start + self._n + extra
        cap = len(self._arr)
        if need <= cap:
            return
        if self._start and self._n + extra <= cap // 2:
            # Plenty of dead room at the front: slide the window down.
            self._arr[: self._n] = self._arr[self._start : self._start + self._n]
            self._start = 0
            return
        want = self._n + extra
        arr = np.zeros(max(16, want + want // 4), SLOT_DTYPE)
        arr[: self._n] = self._arr[self._start : self._start + self._n]
        self._arr = arr
        self._start = 0

    def append_rows(self, rows: SlotArray) -> None:
        """Append `len(rows)` slots (a SLOT_DTYPE array)."""
        k = len(rows)
        self._reserve(k)
        e = self._start + self._n
        self._arr[e : e + k] = rows
        self._n += k

    def pop_front(self, count: int) -> None:
        """Drop the first `count` slots (clamped to the slot count)."""
        count = min(count, self._n)
        if count <= 0:
            return
        self._start += count
        self._n -= count
        self.base_seq += count
        if self._n == 0:
            self._start = 0

    def clear_to(self, next_seq: int) -> None:
        """Drop every slot and restart the window at `next_seq`."""
        self._start = 0
        self._n = 0
        self.base_seq = next_seq
        if len(self._arr) > 1024:
            self._arr = np.zeros(16, SLOT_DTYPE)

    def nbytes(self) -> int:
        """Bytes held by the numpy array (capacity, not just live slots)."""
        return int(self._arr.nbytes)
