"""The segment `.idx` entry and the record flag bits (docs/FORMATS.md, "Segment files").

Entry `i` of a segment's `.idx` describes seq `first_seq + i`: 20 bytes,
little-endian, `offset u32` (the frame's start in `.data`), `len u32` (the whole
frame), `ts u64` (ms), `flags u8` (the frame's flags byte, or :data:`DELETED`),
3 pad bytes. Pure constants, no I/O.
"""

from __future__ import annotations

import numpy as np

from topics.format.frame import F_DURABLE, F_HAS_META, F_HAS_NODE, F_HAS_TAG, F_RECORD_MASK

__all__ = [
    "IDX_ENTRY_DTYPE",
    "IDX_ENTRY_SIZE",
    "IDX_FLAGS_OFFSET",
    "DELETED",
    "F_HAS_TAG",
    "F_HAS_NODE",
    "F_DURABLE",
    "F_HAS_META",
    "F_RECORD_MASK",
]

#: The `.idx` flags byte of a deleted record or a hole (outside the frame checksum).
DELETED = 0xD5

#: The on-disk `.idx` entry.
IDX_ENTRY_DTYPE = np.dtype(
    [("offset", "<u4"), ("len", "<u4"), ("ts", "<u8"), ("flags", "u1"), ("pad", "V3")]
)
IDX_ENTRY_SIZE = IDX_ENTRY_DTYPE.itemsize
#: Where the flags byte sits inside an entry (the byte a delete flips to :data:`DELETED`).
IDX_FLAGS_OFFSET = 16
assert IDX_ENTRY_DTYPE.fields is not None and IDX_ENTRY_DTYPE.fields["flags"][1] == IDX_FLAGS_OFFSET
assert IDX_ENTRY_SIZE == 20
