"""WAL and segment frames: encoding and a decoder that never raises (docs/FORMATS.md).

Pure functions over bytes; no I/O. All integers are little-endian; the checksum
is XXH3-64 (hash seed 0).

WAL frame (one per record, or per control operation)::

    off  size      field
    0    4         frame_len u32   bytes after this field: 34 + node_len + tag_len + data_len + 8
    4    1         type      u8    1 Append .. 13 Lost (FRAME_TYPES)
    5    1         flags     u8    bit0 has_tag, bit1 has_node, bit2 durable, bit3 has_meta
    6    8         topic_id  u64
    14   8         seq       u64
    22   8         ts        u64   server commit time, ms
    30   2         node_len  u16
    32   2         tag_len   u16
    34   4         data_len  u32
    38   node_len  node            UTF-8
    .    tag_len   tag             UTF-8
    .    data_len  payload         Append: data JSON, or meta_len u32 | meta | data (has_meta)
    .    8         checksum  u64   XXH3-64 over bytes [4, checksum offset)

A whole frame is `frame_len + 4` bytes; the smallest is 46 (`frame_len` 42).

Segment `.data` frame: the same with the `type` byte removed. `frame_len` counts
from `flags`; the record fields `[flags .. payload]` are the WAL frame's bytes
`[5, crc_off)` copied verbatim; the checksum covers `[4, crc_off)` of the segment
frame. Smallest: 45 bytes (`frame_len` 41).

Invariant: a decoder returns a :class:`Frame` only when all of these hold (the
FORMATS.md rules, checked in this order): `frame_len` fits in the remaining
bytes, `frame_len >= minimum`, the three lengths add up to `frame_len`, the type
is known, the checksum matches, and (ours, only rejecting frames the encoders
never produce) a node/tag length is 0 unless its flag is set, node/tag decode as
UTF-8, and an Append payload with `has_meta` holds `meta_len u32` with
`meta_len <= data_len - 4`. Anything else is :class:`Torn` (the valid prefix ends
at its offset), and a `frame_len` of 0 or the exact end of the buffer is
:class:`End`. 1-3 trailing bytes are `End` when all zero (preallocated space),
else `Torn`. Decoders never raise, for any input.

Encoders derive `has_node`/`has_tag` from `node`/`tag` being not None (an empty
string is encoded as present) and raise :class:`FrameError` when a field does not
fit its width or a string is not encodable as UTF-8.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt
import xxhash

#: A record to encode, indexable as `(data, meta, node, tag, ...)`: the engine's
#: validated record tuple (data and meta as raw JSON bytes, node and tag or None).
RecordTuple = Sequence[Any]

__all__ = [
    "APPEND",
    "TOPIC_CREATE",
    "TOPIC_DELETE",
    "ROUTER_CREATE",
    "ROUTER_DELETE",
    "DELETE",
    "EVICT_WATERMARK",
    "CHECKPOINT_MARK",
    "CONFIG_UPDATE",
    "LEASE",
    "HEAD_WATERMARK",
    "SYNC_MARK",
    "LOST",
    "FRAME_TYPES",
    "CONTROL_TYPES",
    "TYPE_NAMES",
    "F_HAS_TAG",
    "F_HAS_NODE",
    "F_DURABLE",
    "F_HAS_META",
    "HEADER",
    "SEG_HEADER",
    "WAL_HDR",
    "SEG_HDR",
    "CHECKSUM",
    "META_LEN",
    "MIN_FRAME_LEN",
    "MIN_FRAME_SIZE",
    "SEG_MIN_FRAME_LEN",
    "SEG_MIN_FRAME_SIZE",
    "TORN_SHORT_PREFIX",
    "TORN_OVERRUN",
    "TORN_TOO_SHORT",
    "TORN_LENGTHS",
    "TORN_TYPE",
    "TORN_CHECKSUM",
    "TORN_FLAGS",
    "TORN_UTF8",
    "TORN_META",
    "TORN_OFFSET",
    "TORN_UNREADABLE",
    "checksum",
    "Buf",
    "RecordFields",
    "F_RECORD_MASK",
    "check_frame",
    "native_render",
    "frame_fields",
    "plain_data",
    "SEG_FRAME_OVERHEAD",
    "SEG_HEADER_DTYPE",
    "frame_len_for",
    "segment_data_lens",
    "FrameError",
    "Frame",
    "Torn",
    "End",
    "ScanResult",
    "encode_frame",
    "encode_record",
    "encode_appends",
    "encode_batch",
    "python_encode_batch",
    "native_encode_batch",
    "native_segment_frames",
    "native_prepare_records",
    "BatchLayout",
    "FrameBuf",
    "layout_batch",
    "seal_batch",
    "encode_control",
    "decode_frame",
    "iter_frames",
    "scan",
    "wal_to_segment",
    "decode_segment_frame",
    "iter_segment_frames",
    "scan_segment",
    "WAL_COLS_DTYPE",
    "ColumnScan",
    "scan_columns",
    "find_next_frame",
]

# -- frame types ---------------------------------------------------------------

APPEND = 1
TOPIC_CREATE = 2
TOPIC_DELETE = 3
ROUTER_CREATE = 4
ROUTER_DELETE = 5
DELETE = 6
EVICT_WATERMARK = 7
CHECKPOINT_MARK = 8
CONFIG_UPDATE = 9
LEASE = 10
HEAD_WATERMARK = 11
#: ours: the writer's record that the bytes of this file before `synced` were durable
SYNC_MARK = 12
#: ours: written by `topics repair` in place of bytes that could not be read
LOST = 13

TYPE_NAMES: dict[int, str] = {
    APPEND: "Append",
    TOPIC_CREATE: "TopicCreate",
    TOPIC_DELETE: "TopicDelete",
    ROUTER_CREATE: "RouterCreate",
    ROUTER_DELETE: "RouterDelete",
    DELETE: "Delete",
    EVICT_WATERMARK: "EvictWatermark",
    CHECKPOINT_MARK: "CheckpointMark",
    CONFIG_UPDATE: "ConfigUpdate",
    LEASE: "Lease",
    HEAD_WATERMARK: "HeadWatermark",
    SYNC_MARK: "SyncMark",
    LOST: "Lost",
}
#: Every known type byte.
FRAME_TYPES: frozenset[int] = frozenset(TYPE_NAMES)
HEADER_TYPE_MAX = max(FRAME_TYPES)
#: Types whose payload is one msgpack map (everything but Append).
CONTROL_TYPES: frozenset[int] = FRAME_TYPES - {APPEND}

# -- flag bits -----------------------------------------------------------------

F_HAS_TAG = 0x01
F_HAS_NODE = 0x02
F_DURABLE = 0x04
F_HAS_META = 0x08  # ours: Append payload is meta_len u32 | meta | data
F_BATCH_MORE = 0x10  # ours: more frames of the same write follow this one

#: Bytes a frame is read from: a file's bytes, a buffer, or a map of a segment file.
Buf = bytes | bytearray | memoryview | mmap.mmap

# -- layouts -------------------------------------------------------------------

#: frame_len, type, flags, topic_id, seq, ts, node_len, tag_len, data_len (38 bytes).
HEADER = struct.Struct("<IBBQQQHHI")
#: Header bytes before node/tag/payload (the engine's renderers start there).
WAL_HDR = 38
#: The same without `type` (segment `.data` frames, 37 bytes).
SEG_HEADER = struct.Struct("<IBQQQHHI")
SEG_HDR = 37
#: The trailing XXH3-64.
CHECKSUM = struct.Struct("<Q")
#: The `meta_len` prefix of a has_meta Append payload.
META_LEN = struct.Struct("<I")
_U32 = struct.Struct("<I")

_CRC = CHECKSUM.size
_FIXED = HEADER.size - 4  # header bytes counted by frame_len (34)
_SEG_FIXED = SEG_HEADER.size - 4  # 33
#: Smallest valid `frame_len` of a WAL frame (header rest + checksum).
MIN_FRAME_LEN = _FIXED + _CRC  # 42
#: Smallest whole WAL frame in bytes.
MIN_FRAME_SIZE = MIN_FRAME_LEN + 4  # 46
SEG_MIN_FRAME_LEN = _SEG_FIXED + _CRC  # 41
SEG_MIN_FRAME_SIZE = SEG_MIN_FRAME_LEN + 4  # 45

checksum = xxhash.xxh3_64_intdigest
"""XXH3-64 (hash seed 0) of a bytes-like object -> int."""

NativeRender = Callable[
    [list[bytes], Buf, int, object, object, object, object, int, bool, bool, bool, bool],
    "tuple[int, str] | None",
]
native_render: NativeRender | None
try:
    from topics.format._render import render as native_render
except ImportError:  # not built (no C compiler at install time): Python renders
    native_render = None
"""The compiled record renderer (`_render.c`), or None where it was not built.

`native_render(out, buf, base, seqs, offs, lens, tss, hdr, verify, include_tags,
include_meta, include_data)` appends each record's wire object to `out` and
returns None, or `(i, reason)` for the first frame i that does not verify
(docs/ARCHITECTURE.md, "Compiled code").
"""

NativeEncodeBatch = Callable[[int, int, int, list[Any], bool], tuple[bytes, list[int]]]
NativeSegmentFrames = Callable[[list[Any], object, object, object], bytes]
NativePrepareRecords = Callable[..., "list[Any] | None"]
native_encode_batch: NativeEncodeBatch | None
native_segment_frames: NativeSegmentFrames | None
native_prepare_records: NativePrepareRecords | None
try:
    from topics.format._codec import encode_batch as native_encode_batch
    from topics.format._codec import prepare_records as native_prepare_records
    from topics.format._codec import segment_frames as native_segment_frames
except ImportError:  # not built: the Python loops encode
    native_encode_batch = native_segment_frames = native_prepare_records = None
"""The compiled codec loops (`_codec.c`), or None where they were not built:
`native_encode_batch` behind :func:`encode_batch`, `native_segment_frames` behind
:func:`topics.storage.segment.segment_blob`, and `native_prepare_records`, the
common case of :func:`topics.engine.records.prepare_records` (docs/ARCHITECTURE.md,
"Compiled code").
"""

# -- reading one record frame in place --------------------------------------------
#
# A WAL frame and a segment frame differ only in the WAL's `type` byte, so the
# record fields sit at the same distance before the end of either header (`hdr`,
# :data:`WAL_HDR` or :data:`SEG_HDR`): flags 33 bytes back, seq 24, the three
# lengths (node_len u16, tag_len u16, data_len u32) the last 8.

_FLAGS_BACK = 33
_SEQ_BACK = 24
_LENS_BACK = 8
_LENS = struct.Struct("<HHI")
_U64 = struct.Struct("<Q")

#: `(node, tag, data, meta)` of one record frame (data and meta as raw JSON bytes).
RecordFields = tuple[str | None, str | None, bytes, bytes | None]

#: Flags that change how a record renders (a frame without them is "plain").
F_RECORD_MASK = F_HAS_TAG | F_HAS_NODE | F_HAS_META


def check_frame(buf: Buf, o: int, ln: int, seq: int, hdr: int) -> str | None:
    """Why the `ln` bytes at `buf[o:]` are not seq `seq`'s valid frame, or None.

    Checks the length prefix, the seq and the XXH3-64 (docs/FORMATS.md, "Frames");
    `hdr` is the header size of the frame's kind.
    """
    if ln < hdr + _CRC or o < 0 or o + ln > len(buf):
        return "frame outside the file"
    if _U32.unpack_from(buf, o)[0] != ln - 4:
        return "frame_len does not match the indexed length"
    if _U64.unpack_from(buf, o + hdr - _SEQ_BACK)[0] != seq:
        return "frame carries another seq"
    end = o + ln - _CRC
    if checksum(buf[o + 4 : end]) != _U64.unpack_from(buf, end)[0]:
        return "checksum mismatch"
    return None


#: Bytes of a segment frame besides node, tag and payload (header and checksum).
SEG_FRAME_OVERHEAD = SEG_HDR + _CRC

#: :data:`SEG_HEADER` as a packed numpy record, for decoding many headers at once.
SEG_HEADER_DTYPE = np.dtype(
    [
        ("frame_len", "<u4"),
        ("flags", "u1"),
        ("topic_id", "<u8"),
        ("seq", "<u8"),
        ("ts", "<u8"),
        ("node_len", "<u2"),
        ("tag_len", "<u2"),
        ("data_len", "<u4"),
    ]
)
assert SEG_HEADER_DTYPE.itemsize == SEG_HEADER.size


def frame_len_for(node_len: int, tag_len: int, data_len: int, *, segment: bool = False) -> int:
    """The `frame_len` field a frame with these three lengths carries (bytes after it)."""
    return (_SEG_FIXED if segment else _FIXED) + node_len + tag_len + data_len + _CRC


def segment_data_lens(data: Buf, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """`data_len` of the segment frames starting at `offsets` of `data` (0 when cut off).

    Vectorised: the payload size of records whose `.idx` entry alone cannot give
    it (those carrying a node or a tag).
    """
    raw = np.frombuffer(data, np.uint8)
    at = offsets + (SEG_HDR - _LENS_BACK + 4)
    ok = at + 4 <= len(raw)
    out = np.zeros(len(offsets), np.int64)
    good = at[ok]
    if len(good):
        out[ok] = np.ascontiguousarray(raw[good[:, None] + np.arange(4)]).view("<u4")[:, 0]
    return out


def plain_data(buf: Buf, o: int, ln: int, hdr: int) -> Buf | None:
    """The data bytes of a frame that carries no node, tag or meta; None otherwise."""
    if buf[o + hdr - _FLAGS_BACK] & F_RECORD_MASK:
        return None
    return buf[o + hdr : o + ln - _CRC]


def frame_fields(buf: Buf, o: int, ln: int, hdr: int) -> RecordFields:
    """Node, tag, data and meta of the (verified) frame of `ln` bytes at `buf[o:]`.

    The frame's own flags byte says what it carries (an `.idx` flags byte is only a
    hint: a torn delete flip can spoil it).
    """
    flags = buf[o + hdr - _FLAGS_BACK]
    nl, tl, _dl = _LENS.unpack_from(buf, o + hdr - _LENS_BACK)
    p = o + hdr
    node = bytes(buf[p : p + nl]).decode() if flags & F_HAS_NODE else None
    p += nl
    tag = bytes(buf[p : p + tl]).decode() if flags & F_HAS_TAG else None
    p += tl
    end = o + ln - _CRC
    if flags & F_HAS_META:
        ml = _U32.unpack_from(buf, p)[0]
        meta: bytes | None = bytes(buf[p + 4 : p + 4 + ml])
        data = bytes(buf[p + 4 + ml : end])
    else:
        meta = None
        data = bytes(buf[p:end])
    return node, tag, data, meta


# -- Torn reasons (stable strings: logged, counted, asserted in tests) -----------

TORN_SHORT_PREFIX = "short length prefix"
TORN_OVERRUN = "frame_len overruns the buffer"
TORN_TOO_SHORT = "frame_len below the minimum"
TORN_LENGTHS = "lengths inconsistent with frame_len"
TORN_TYPE = "unknown frame type"
TORN_CHECKSUM = "checksum mismatch"
TORN_FLAGS = "node/tag length without its flag"
TORN_UTF8 = "node/tag not UTF-8"
TORN_META = "meta_len inconsistent with data_len"
TORN_OFFSET = "offset outside the buffer"
#: Safety net only: the decoder itself hit an unexpected error (never for bytes input).
TORN_UNREADABLE = "buffer not decodable"


class FrameError(ValueError):
    """A frame cannot be encoded (field too wide, bad type) or a payload is garbage."""


class Frame(NamedTuple):
    """One decoded, checksum-valid frame (immutable; a tuple, cheap to build in bulk).

    `offset` is where the frame starts in the decoded buffer and `size` its whole
    length in bytes (length prefix and checksum included), so the next frame
    starts at :attr:`end`. `ts` is ms; `node`/`tag` are None when their flag is
    clear; `payload` is the raw body (use :attr:`data`/:attr:`meta` for an
    Append, :meth:`control` otherwise). Segment frames decode with
    `type == APPEND`.
    """

    type: int
    flags: int
    topic_id: int
    seq: int
    ts: int
    node: str | None
    tag: str | None
    payload: bytes
    offset: int
    size: int

    @property
    def end(self) -> int:
        """Offset just past this frame."""
        return self.offset + self.size

    @property
    def durable(self) -> bool:
        return bool(self.flags & F_DURABLE)

    @property
    def data(self) -> bytes:
        """An Append record's `data` JSON bytes. Raises FrameError for control frames."""
        if self.type != APPEND:
            raise FrameError(f"{TYPE_NAMES.get(self.type, self.type)} frame has no record data")
        p = self.payload
        if self.flags & F_HAS_META:
            return p[4 + _U32.unpack_from(p)[0] :]
        return p

    @property
    def meta(self) -> bytes | None:
        """An Append record's `meta` JSON bytes, None without has_meta.

        Raises FrameError for control frames.
        """
        if self.type != APPEND:
            raise FrameError(f"{TYPE_NAMES.get(self.type, self.type)} frame has no record meta")
        if not self.flags & F_HAS_META:
            return None
        p = self.payload
        return p[4 : 4 + _U32.unpack_from(p)[0]]

    def control(self) -> dict[Any, Any]:
        """The msgpack map body of a control frame (types 2-11).

        Raises FrameError for an Append frame or when the payload is not exactly
        one msgpack map.
        """
        if self.type not in CONTROL_TYPES:
            raise FrameError(f"{TYPE_NAMES.get(self.type, self.type)} frame has no control body")
        try:
            body = msgpack.unpackb(self.payload, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several unrelated types on garbage
            raise FrameError(f"control payload is not msgpack: {e}") from None
        if not isinstance(body, dict):
            raise FrameError(f"control payload is a {type(body).__name__}, not a map")
        return body


@dataclass(frozen=True, slots=True)
class Torn:
    """The bytes at `offset` are not a valid frame: the valid prefix ends here."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class End:
    """Clean end of data at `offset`: end of buffer or zeroed (preallocated) space."""

    offset: int


class ScanResult(NamedTuple):
    """The valid prefix of a buffer.

    `frames` are every frame from `start` up to the first non-frame,
    `end_offset` is where that prefix ends (truncate a shard there) and `torn`
    the reason when it ended on a damaged frame rather than on :class:`End`.
    """

    frames: list[Frame]
    end_offset: int
    torn: Torn | None


# -- encoding ------------------------------------------------------------------


def _text(s: str | None, what: str) -> bytes:
    if s is None:
        return b""
    try:
        return s.encode()
    except UnicodeEncodeError:
        raise FrameError(f"{what} is not encodable as UTF-8") from None


def encode_frame(
    type: int,
    topic_id: int,
    seq: int,
    ts: int,
    payload: bytes,
    *,
    node: str | None = None,
    tag: str | None = None,
    flags: int = 0,
) -> bytes:
    """One WAL frame of any known `type` with a ready payload -> frame bytes.

    `flags` supplies durable/has_meta; has_node/has_tag are set from `node`/`tag`
    (not None). Raises FrameError for an unknown type, a value outside its field
    width (u64 ids/seq/ts, u16 node/tag bytes, u32 frame_len), non-UTF-8-encodable
    text, or a has_meta Append payload whose meta_len does not fit.
    """
    if type not in FRAME_TYPES:
        raise FrameError(f"unknown frame type {type!r}")
    flags &= ~(F_HAS_NODE | F_HAS_TAG)
    if type == APPEND and flags & F_HAS_META:
        if len(payload) < 4 or _U32.unpack_from(payload)[0] > len(payload) - 4:
            raise FrameError("has_meta payload does not start with a fitting meta_len")
    return _frame(False, type, flags, topic_id, seq, ts, node, tag, (bytes(payload),))


def encode_record(
    topic_id: int,
    seq: int,
    ts: int,
    node: str | None,
    tag: str | None,
    data: bytes,
    meta: bytes | None,
    *,
    durable: bool,
    segment: bool = False,
) -> bytes:
    """One record frame (`data`/`meta` are compact JSON bytes): a WAL Append frame,
    or with `segment` its segment `.data` frame, equal to
    `wal_to_segment(encode_record(...))`.

    `ts` is ms. The payload is `data`, or `meta_len u32 | meta | data` when
    `meta` is not None. Raises FrameError as :func:`encode_frame`.
    """
    flags = F_DURABLE if durable else 0
    if meta is None:
        return _frame(segment, APPEND, flags, topic_id, seq, ts, node, tag, (data,))
    try:
        meta_len = _U32.pack(len(meta))
    except struct.error as e:
        raise FrameError(f"frame field out of range: {e}") from None
    return _frame(
        segment, APPEND, flags | F_HAS_META, topic_id, seq, ts, node, tag, (meta_len, meta, data)
    )


def _frame(
    seg: bool,
    type: int,
    flags: int,
    topic_id: int,
    seq: int,
    ts: int,
    node: str | None,
    tag: str | None,
    payload: tuple[bytes, ...],
) -> bytes:
    """A WAL frame of `type` whose payload is the concatenation of `payload`, or
    (`seg`) a record's segment frame (which has no type byte).

    The has_node/has_tag flags are added to `flags` from what is given.
    """
    if node is not None:
        flags |= F_HAS_NODE
    if tag is not None:
        flags |= F_HAS_TAG
    nb, tb = _text(node, "node"), _text(tag, "tag")
    nl, tl = len(nb), len(tb)
    dl = sum(map(len, payload))
    try:
        if seg:
            head = SEG_HEADER.pack(
                _SEG_FIXED + nl + tl + dl + _CRC, flags, topic_id, seq, ts, nl, tl, dl
            )
        else:
            head = HEADER.pack(
                _FIXED + nl + tl + dl + _CRC, type, flags, topic_id, seq, ts, nl, tl, dl
            )
    except struct.error as e:
        raise FrameError(f"frame field out of range: {e}") from None
    body = b"".join((head, nb, tb, *payload))
    return body + CHECKSUM.pack(checksum(memoryview(body)[4:]))


def encode_appends(
    topic_id: int, first_seq: int, ts: int, records: Iterable[RecordTuple], durable: bool
) -> bytes:
    """Append frames for a batch, seqs `first_seq, first_seq + 1, ...`, all at `ts` (ms).

    Byte-identical to concatenating :func:`encode_record` per record. Raises
    FrameError as :func:`encode_frame` (nothing is returned for a partial batch).
    """
    return encode_batch(topic_id, first_seq, ts, records, durable)[0]


def encode_batch(
    topic_id: int, first_seq: int, ts: int, records: Iterable[RecordTuple], durable: bool
) -> tuple[bytes, list[int]]:
    """:func:`encode_appends` plus the byte size of each frame, in order.

    Runs the compiled encoder (`_codec.c`) where it was built and the records are
    tuples, else :func:`python_encode_batch`; both give the same bytes and raise
    FrameError alike.
    """
    if native_encode_batch is not None:
        recs = records if type(records) is list else list(records)
        try:
            return native_encode_batch(topic_id, first_seq, ts, recs, durable)
        except OverflowError as e:
            raise FrameError(f"frame field out of range: {e}") from None
        except UnicodeEncodeError:
            raise FrameError("node/tag is not encodable as UTF-8") from None
        except TypeError:  # records of another shape: the reference loop takes them
            records = recs
    return python_encode_batch(topic_id, first_seq, ts, records, durable)


def python_encode_batch(
    topic_id: int, first_seq: int, ts: int, records: Iterable[RecordTuple], durable: bool
) -> tuple[bytes, list[int]]:
    """The reference encoder of :func:`encode_batch`: a Python loop per record."""
    pack, crc_pack = HEADER.pack, CHECKSUM.pack
    join = b"".join
    parts: list[bytes] = []
    sizes: list[int] = []
    append = parts.append
    size = sizes.append
    base = F_DURABLE if durable else 0
    last_node: str | None = None
    last_nb = b""
    seq = first_seq
    records = list(records)
    last = first_seq + len(records) - 1
    try:
        for r in records:
            data, meta, node, tag = r[0], r[1], r[2], r[3]
            # Every frame but the last of a write says "more follow", so recovery can
            # drop a write torn part way through (batches are all-or-nothing).
            flags = base | F_BATCH_MORE if seq != last else base
            if node is None:
                nb = b""
            else:
                flags |= F_HAS_NODE
                if node is not last_node:  # a batch usually shares one node string
                    last_nb = node.encode()
                    last_node = node
                nb = last_nb
            if tag is None:
                tb = b""
            else:
                flags |= F_HAS_TAG
                tb = tag.encode()
            nl, tl = len(nb), len(tb)
            if meta is None:
                dl = len(data)
                head = pack(
                    _FIXED + nl + tl + dl + _CRC, APPEND, flags, topic_id, seq, ts, nl, tl, dl
                )
                body = join((head, nb, tb, data))
            else:
                ml = len(meta)
                dl = 4 + ml + len(data)
                head = pack(
                    _FIXED + nl + tl + dl + _CRC,
                    APPEND,
                    flags | F_HAS_META,
                    topic_id,
                    seq,
                    ts,
                    nl,
                    tl,
                    dl,
                )
                body = join((head, nb, tb, ml.to_bytes(4, "little"), meta, data))
            append(body)
            append(crc_pack(checksum(memoryview(body)[4:])))
            size(len(body) + _CRC)
            seq += 1
    except struct.error as e:
        raise FrameError(f"frame field out of range: {e}") from None
    except UnicodeEncodeError:
        raise FrameError("node/tag is not encodable as UTF-8") from None
    return join(parts), sizes


#: A laid-out batch's frames: an anonymous mmap for a large batch (its pages are
#: only touched, so zero-filled, as the frames are written into them), else a
#: bytearray.
FrameBuf = bytearray | mmap.mmap

#: Batches of at least this many bytes are laid out in an anonymous mmap.
LAYOUT_MMAP_BYTES = 1 << 20
#: :func:`layout_batch` yields after writing about this many bytes of frames...
LAYOUT_STEP_BYTES = 1 << 20
#: ... and after sizing this many records.
LAYOUT_STEP_RECORDS = 2048

# flags, topic_id, seq, ts: the header fields :func:`seal_batch` fills in (offset 5).
_SEAL = struct.Struct("<BQQQ")
_SEAL_AT = 5


@dataclass(eq=False, slots=True)
class BatchLayout:
    """A write's Append frames laid out before its seqs are known (:func:`layout_batch`).

    `buf` holds the frames back to back with `frame_len`, `type`, the three
    lengths, node, tag and payload in place; `flags`, `topic_id`, `seq`, `ts`
    and the checksum are zero until :func:`seal_batch` fills them in. `sizes[i]`
    is frame i's whole size in bytes, `flags[i]` its has_tag/has_node/has_meta
    bits. `records` is the sequence it was laid out from; `sealed` is set once
    :func:`seal_batch` has used it (a layout is sealed at most once).
    """

    records: Sequence[RecordTuple]
    buf: FrameBuf
    sizes: list[int]
    flags: list[int]
    sealed: bool = field(default=False)


def layout_batch(
    records: Sequence[RecordTuple],
    *,
    step_bytes: int = LAYOUT_STEP_BYTES,
    step_records: int = LAYOUT_STEP_RECORDS,
) -> Generator[None, None, BatchLayout]:
    """Lay out the Append frames of `records` a piece at a time, before staging.

    A generator: it yields after sizing every `step_records` records and after
    writing about every `step_bytes` bytes of frames, so the caller can let
    other work run, and returns the :class:`BatchLayout`. Only the records'
    fields are read (a pure function of them: nothing about the topic, the
    seqs or the time is needed). `buf` is written once, in place: no joined
    copy of the frames is ever made. :func:`seal_batch` then turns it into the
    exact bytes :func:`encode_batch` returns.

    Raises FrameError (nothing is returned) when a node or tag is not
    encodable as UTF-8 or a length does not fit its field.
    """
    records = list(records) if not isinstance(records, list) else records
    hs, crc = HEADER.size, _CRC
    sizes: list[int] = []
    flags: list[int] = []
    total = 0
    last_node: str | None = None
    last_nb = b""
    try:
        for i, r in enumerate(records):
            data, meta, node, tag = r[0], r[1], r[2], r[3]
            f = 0
            nl = 0
            if node is not None:
                f = F_HAS_NODE
                if node is not last_node:
                    last_nb = node.encode()
                    last_node = node
                nl = len(last_nb)
            tl = 0
            if tag is not None:
                f |= F_HAS_TAG
                tl = len(tag.encode())
            dl = len(data)
            if meta is not None:
                f |= F_HAS_META
                dl += 4 + len(meta)
            size = hs + nl + tl + dl + crc
            sizes.append(size)
            flags.append(f)
            total += size
            if i % step_records == step_records - 1:
                yield
    except UnicodeEncodeError:
        raise FrameError("node/tag is not encodable as UTF-8") from None
    buf: FrameBuf = mmap.mmap(-1, total) if total >= LAYOUT_MMAP_BYTES else bytearray(total)
    pack_head, pack_u32 = HEADER.pack_into, _U32.pack_into
    o = 0
    since = 0
    try:
        for r, size in zip(records, sizes, strict=True):
            data, meta, node, tag = r[0], r[1], r[2], r[3]
            nb = b"" if node is None else (last_nb if node is last_node else node.encode())
            if node is not None:
                last_node, last_nb = node, nb
            tb = b"" if tag is None else tag.encode()
            nl, tl = len(nb), len(tb)
            p = o + hs
            # frame_len, type and the lengths; flags, topic_id, seq, ts stay 0 for now.
            pack_head(buf, o, size - 4, APPEND, 0, 0, 0, 0, nl, tl, size - hs - nl - tl - crc)
            if nl:
                buf[p : p + nl] = nb
                p += nl
            if tl:
                buf[p : p + tl] = tb
                p += tl
            if meta is not None:
                ml = len(meta)
                pack_u32(buf, p, ml)
                p += 4
                buf[p : p + ml] = meta
                p += ml
            buf[p : p + len(data)] = data
            o += size
            since += size
            if since >= step_bytes:
                since = 0
                yield
    except struct.error as e:
        raise FrameError(f"frame field out of range: {e}") from None
    return BatchLayout(records, buf, sizes, flags)


def seal_batch(
    layout: BatchLayout, topic_id: int, first_seq: int, ts: int, durable: bool
) -> FrameBuf:
    """Fill in a layout's flags, topic id, seqs, ts and checksums, in place; returns its buffer.

    Seqs are `first_seq, first_seq + 1, ...`, all at `ts` (ms); every frame but
    the last carries the more-of-this-write flag, as :func:`encode_batch` does,
    whose bytes the result then equals. Marks the layout `sealed` first.
    Raises FrameError when the layout was sealed already or a value does not
    fit its u64 field.
    """
    if layout.sealed:
        raise FrameError("this batch layout was sealed already")
    layout.sealed = True
    buf, sizes, flags = layout.buf, layout.sizes, layout.flags
    base = F_DURABLE if durable else 0
    more = base | F_BATCH_MORE
    last = len(sizes) - 1
    pack, pack_crc, xx = _SEAL.pack_into, CHECKSUM.pack_into, checksum
    o = 0
    try:
        with memoryview(buf) as mv:
            for i, size in enumerate(sizes):
                end = o + size - _CRC
                fl = flags[i] | (more if i != last else base)
                pack(buf, o + _SEAL_AT, fl, topic_id, first_seq + i, ts)
                pack_crc(buf, end, xx(mv[o + 4 : end]))
                o = end + _CRC
    except struct.error as e:
        raise FrameError(f"frame field out of range: {e}") from None
    return buf


def encode_control(
    type: int,
    topic_id: int,
    body: Mapping[Any, Any],
    *,
    seq: int = 0,
    ts: int = 0,
    durable: bool = False,
) -> bytes:
    """One control frame (types 2-13) whose payload is `body` as a msgpack map.

    `topic_id` is 0 when the operation is not about one topic; `seq` is 0 except
    for Lease (the job seq) and HeadWatermark (the reserved head). Raises
    FrameError for a non-control type, a body msgpack cannot pack, or a field
    out of range.
    """
    if type not in CONTROL_TYPES:
        raise FrameError(f"{type!r} is not a control frame type")
    try:
        payload = msgpack.packb(dict(body), use_bin_type=True)
    except Exception as e:  # TypeError/ValueError/OverflowError from the packer
        raise FrameError(f"control body cannot be packed: {e}") from None
    return _frame(
        False, type, F_DURABLE if durable else 0, topic_id, seq, ts, None, None, (payload,)
    )


# -- decoding ------------------------------------------------------------------


def _view(buf: Buf) -> memoryview:
    try:
        mv = memoryview(buf)
        if mv.ndim == 1 and mv.format == "B" and mv.c_contiguous:
            return mv
        return memoryview(mv.tobytes())
    except Exception:  # not a buffer at all: treat as nothing to read
        return memoryview(b"")


def _decode(mv: memoryview, off: int, seg: bool) -> Frame | Torn | End:
    n = len(mv)
    if off == n:
        return End(off)
    if off < 0 or off > n:
        return Torn(off, TORN_OFFSET)
    rem = n - off
    if rem < 4:
        if any(mv[off:]):
            return Torn(off, TORN_SHORT_PREFIX)
        return End(off)
    frame_len: int = _U32.unpack_from(mv, off)[0]
    if frame_len == 0:
        return End(off)
    if frame_len > rem - 4:
        return Torn(off, TORN_OVERRUN)
    if seg:
        if frame_len < SEG_MIN_FRAME_LEN:
            return Torn(off, TORN_TOO_SHORT)
        _, flags, topic_id, seq, ts, nl, tl, dl = SEG_HEADER.unpack_from(mv, off)
        typ = APPEND
        if _SEG_FIXED + nl + tl + dl + _CRC != frame_len:
            return Torn(off, TORN_LENGTHS)
        p = off + SEG_HEADER.size
    else:
        if frame_len < MIN_FRAME_LEN:
            return Torn(off, TORN_TOO_SHORT)
        _, typ, flags, topic_id, seq, ts, nl, tl, dl = HEADER.unpack_from(mv, off)
        if _FIXED + nl + tl + dl + _CRC != frame_len:
            return Torn(off, TORN_LENGTHS)
        if typ not in FRAME_TYPES:
            return Torn(off, TORN_TYPE)
        p = off + HEADER.size
    crc_off = off + 4 + frame_len - _CRC
    if checksum(mv[off + 4 : crc_off]) != CHECKSUM.unpack_from(mv, crc_off)[0]:
        return Torn(off, TORN_CHECKSUM)
    if (nl and not flags & F_HAS_NODE) or (tl and not flags & F_HAS_TAG):
        return Torn(off, TORN_FLAGS)
    try:
        node = str(mv[p : p + nl], "utf-8") if flags & F_HAS_NODE else None
        p += nl
        tag = str(mv[p : p + tl], "utf-8") if flags & F_HAS_TAG else None
        p += tl
    except UnicodeDecodeError:
        return Torn(off, TORN_UTF8)
    if typ == APPEND and flags & F_HAS_META:
        if dl < 4 or _U32.unpack_from(mv, p)[0] > dl - 4:
            return Torn(off, TORN_META)
    return Frame(
        typ, flags, topic_id, seq, ts, node, tag, mv[p : p + dl].tobytes(), off, frame_len + 4
    )


def _safe(mv: memoryview, off: int, seg: bool) -> Frame | Torn | End:
    try:
        return _decode(mv, off, seg)
    except Exception:  # unreachable by construction (fuzzed); the contract is "never raise"
        return Torn(off if isinstance(off, int) else 0, TORN_UNREADABLE)


def decode_frame(buf: Buf, off: int = 0) -> Frame | Torn | End:
    """Decode the WAL frame starting at byte `off` of `buf`.

    Returns a :class:`Frame` (valid), :class:`End` (`off` is the end of `buf`, or
    `frame_len` is 0, or only 1-3 zero bytes remain) or :class:`Torn` (anything
    else; `reason` is one of the ``TORN_*`` strings). Never raises.
    """
    return _safe(_view(buf), off, False)


def decode_segment_frame(buf: Buf, off: int = 0) -> Frame | Torn | End:
    """Decode the segment `.data` frame at `off`: same outcomes as :func:`decode_frame`.

    The Frame's `type` is APPEND. Never raises.
    """
    return _safe(_view(buf), off, True)


def _scan(buf: Buf, start: int, seg: bool) -> ScanResult:
    mv = _view(buf)
    frames: list[Frame] = []
    off = start
    while True:
        r = _safe(mv, off, seg)
        if isinstance(r, Frame):
            frames.append(r)
            off += r.size
        elif isinstance(r, Torn):
            return ScanResult(frames, off, r)
        else:
            return ScanResult(frames, off, None)


def scan(buf: Buf, start: int = 0) -> ScanResult:
    """Decode WAL frames from `start` up to the first End or Torn, never skipping past it.

    `end_offset` is where a shard is truncated. Never raises.
    """
    return _scan(buf, start, False)


def scan_segment(buf: Buf, start: int = 0) -> ScanResult:
    """:func:`scan` for segment `.data` frames."""
    return _scan(buf, start, True)


# The header fields after `frame_len`, as numpy fields (HEADER, vectorised).
_HEADER_FIELDS: list[tuple[str, str]] = [
    ("type", "u1"),
    ("flags", "u1"),
    ("topic_id", "<u8"),
    ("seq", "<u8"),
    ("ts", "<u8"),
    ("nl", "<u2"),
    ("tl", "<u2"),
    ("dl", "<u4"),
]
#: One row per valid WAL frame of a buffer (see :func:`scan_columns`).
WAL_COLS_DTYPE = np.dtype([("off", "<i8"), ("size", "<u4"), *_HEADER_FIELDS])
# The 38 header bytes of a WAL frame as one packed numpy record.
_HDR_DTYPE = np.dtype([("frame_len", "<u4"), *_HEADER_FIELDS])
assert _HDR_DTYPE.itemsize == HEADER.size
_U32_DTYPE = np.dtype([("v", "<u4")])


class ColumnScan(NamedTuple):
    """:class:`ScanResult` in columns: `cols` is a WAL_COLS_DTYPE array of the valid prefix."""

    cols: npt.NDArray[np.void]
    end_offset: int
    torn: Torn | None


def scan_columns(buf: Buf, start: int = 0) -> ColumnScan:
    """:func:`scan` without building a Frame per record: header fields as numpy columns.

    Accepts exactly the frames :func:`scan` accepts and ends where it ends, with
    the same :class:`Torn` (the frame that ends the prefix is decoded by the
    same rules). Payloads are not copied: a row gives `off`/`size` into `buf`.
    A sequential pass follows the length prefixes and checks each checksum;
    the other rules are checked on all headers at once. Never raises.
    """
    try:
        return _scan_columns(_view(buf), start)
    except Exception:  # unreachable by construction (the property test); never raise
        res = scan(buf, start)
        cols = np.zeros(len(res.frames), WAL_COLS_DTYPE)
        for i, fr in enumerate(res.frames):
            cols[i] = (fr.offset, fr.size, fr.type, fr.flags, fr.topic_id, fr.seq, fr.ts, 0, 0, 0)
        return ColumnScan(cols, res.end_offset, res.torn)


def _gather_fields(
    mv: memoryview, o: npt.NDArray[np.int64], dtype: np.dtype[Any]
) -> npt.NDArray[np.void]:
    """Decode a packed record of type `dtype` at each byte offset `o` of `mv`, vectorised.

    Offsets are grouped by their remainder modulo 8; inside a group every field
    sits at one alignment, so each field is one fancy index into an aligned view
    of the buffer.
    """
    out = np.zeros(len(o), dtype)
    a8 = o & 7
    order = np.argsort(a8, kind="stable")
    bounds = np.searchsorted(a8[order], np.arange(9))
    spec = dtype.fields
    assert spec is not None
    fields = [(name, spec[name][0], spec[name][1]) for name in dtype.names or ()]
    views: dict[tuple[str, int], npt.NDArray[Any]] = {}
    for a in range(8):
        lo, hi = int(bounds[a]), int(bounds[a + 1])
        if lo == hi:
            continue
        sel = order[lo:hi]
        og = o[sel]
        for name, dt, rel in fields:
            w = dt.itemsize
            al = (a + rel) % w
            key = (dt.str, al)
            view = views.get(key)
            if view is None:
                view = views[key] = np.frombuffer(mv, dt, count=(len(mv) - al) // w, offset=al)
            out[name][sel] = view[(og + (rel - al)) // w]
    return out


def _scan_columns(mv: memoryview, start: int) -> ColumnScan:
    n = len(mv)
    offs: list[int] = []
    add = offs.append
    u32 = _U32.unpack_from
    u64 = CHECKSUM.unpack_from
    xx = xxhash.xxh3_64_intdigest
    off = start
    if 0 <= off <= n:
        while True:
            rem = n - off
            if rem < 4:
                break
            fl = u32(mv, off)[0]
            if fl < MIN_FRAME_LEN or fl > rem - 4:
                break
            crc_off = off + fl - 4
            if xx(mv[off + 4 : crc_off]) != u64(mv, crc_off)[0]:
                break
            add(off)
            off += fl + 4
    k = len(offs)
    if k:
        o = np.array(offs, dtype=np.int64)
        h = _gather_fields(mv, o, _HDR_DTYPE)
        nl = h["nl"].astype(np.int64)
        tl = h["tl"].astype(np.int64)
        dl = h["dl"].astype(np.int64)
        flags = h["flags"]
        typ = h["type"]
        bad = (_FIXED + nl + tl + dl + _CRC) != h["frame_len"]
        bad |= (typ < APPEND) | (typ > HEADER_TYPE_MAX)
        bad |= ((nl > 0) & ((flags & F_HAS_NODE) == 0)) | ((tl > 0) & ((flags & F_HAS_TAG) == 0))
        meta_rows = np.flatnonzero((typ == APPEND) & ((flags & F_HAS_META) != 0) & ~bad)
        if len(meta_rows):
            short = dl[meta_rows] < 4
            p = o[meta_rows] + HEADER.size + nl[meta_rows] + tl[meta_rows]
            ok = ~short
            ml = np.zeros(len(meta_rows), dtype=np.int64)
            if np.any(ok):
                ml[ok] = _gather_fields(mv, p[ok], _U32_DTYPE)["v"]
            bad[meta_rows] |= short | (ml > dl[meta_rows] - 4)
        text_rows = np.flatnonzero(((flags & (F_HAS_NODE | F_HAS_TAG)) != 0) & ~bad)
        for i in text_rows.tolist():
            p0 = offs[i] + HEADER.size
            a, b = int(nl[i]), int(tl[i])
            try:
                if flags[i] & F_HAS_NODE:
                    str(mv[p0 : p0 + a], "utf-8")
                if flags[i] & F_HAS_TAG:
                    str(mv[p0 + a : p0 + a + b], "utf-8")
            except UnicodeDecodeError:
                bad[i] = True
        first_bad = np.flatnonzero(bad)
        if len(first_bad):
            k = int(first_bad[0])
            off = offs[k]
            h = h[:k]
            o = o[:k]
        cols = np.zeros(k, WAL_COLS_DTYPE)
        cols["off"] = o
        cols["size"] = h["frame_len"] + 4
        for f, _t in _HEADER_FIELDS:
            cols[f] = h[f]
    else:
        cols = np.zeros(0, WAL_COLS_DTYPE)
    r = _safe(mv, off, False)
    if isinstance(r, Frame):  # pragma: no cover - the two decoders disagree
        raise AssertionError(f"scan_columns stopped before a valid frame at {off}")
    return ColumnScan(cols, off, r if isinstance(r, Torn) else None)


_RESYNC_WINDOW = 1 << 22


def find_next_frame(buf: Buf, start: int, stop: int | None = None) -> int | None:
    """The offset of the first valid WAL frame starting in `[start, stop)`, or None.

    Used after an invalid frame to find out whether valid frames follow it (a
    torn tail has none; damage usually has). Candidates are filtered in numpy
    windows (a plausible `frame_len`, a known type, lengths that add up) and
    each survivor is decoded in full, checksum included. Never raises.
    """
    try:
        mv = _view(buf)
        n = len(mv)
        stop = n if stop is None else min(stop, n)
        a = np.frombuffer(mv, np.uint8)
        lo = max(start, 0)
        while lo < stop:
            hi = min(lo + _RESYNC_WINDOW, stop)
            # A header is 38 bytes: candidates need them all inside the buffer.
            top = min(hi, n - HEADER.size + 1)
            if top <= lo:
                return None
            p = np.arange(lo, top, dtype=np.int64)
            t = a[p + 4]
            p = p[(t >= APPEND) & (t <= HEADER_TYPE_MAX)]
            if len(p):
                fl = (
                    a[p].astype(np.int64)
                    | (a[p + 1].astype(np.int64) << 8)
                    | (a[p + 2].astype(np.int64) << 16)
                    | (a[p + 3].astype(np.int64) << 24)
                )
                keep = (fl >= MIN_FRAME_LEN) & (fl <= n - p - 4)
                p, fl = p[keep], fl[keep]
            if len(p):
                nl = a[p + 30].astype(np.int64) | (a[p + 31].astype(np.int64) << 8)
                tl = a[p + 32].astype(np.int64) | (a[p + 33].astype(np.int64) << 8)
                dl = (
                    a[p + 34].astype(np.int64)
                    | (a[p + 35].astype(np.int64) << 8)
                    | (a[p + 36].astype(np.int64) << 16)
                    | (a[p + 37].astype(np.int64) << 24)
                )
                p = p[_FIXED + nl + tl + dl + _CRC == fl]
            for off in p.tolist():
                if isinstance(_safe(mv, off, False), Frame):
                    return int(off)
            lo = hi
        return None
    except Exception:  # pragma: no cover - the contract is "never raise"
        return None


def _iter(buf: Buf, start: int, seg: bool) -> Iterator[Frame]:
    mv = _view(buf)
    off = start
    while True:
        r = _safe(mv, off, seg)
        if not isinstance(r, Frame):
            return
        yield r
        off += r.size


def iter_frames(buf: Buf, start: int = 0) -> Iterator[Frame]:
    """Yield WAL frames from `start`, stopping silently at End or Torn (use :func:`scan` for why)."""
    return _iter(buf, start, False)


def iter_segment_frames(buf: Buf, start: int = 0) -> Iterator[Frame]:
    """:func:`iter_frames` for segment `.data` frames."""
    return _iter(buf, start, True)


# -- segments ------------------------------------------------------------------


def wal_to_segment(wal_frame_bytes: Buf) -> bytes:
    """Convert exactly one whole, valid WAL Append frame into its segment frame.

    Drops the type byte, copies `[flags .. payload]` as one byte range, and
    rewrites `frame_len` (one less) and the checksum. The source is fully
    validated first (a corrupt frame is never re-checksummed into a valid one).
    Raises FrameError when the input is not exactly one valid Append frame.
    """
    mv = _view(wal_frame_bytes)
    r = _safe(mv, 0, False)
    if not isinstance(r, Frame):
        raise FrameError(f"not a valid WAL frame: {r}")
    if r.size != len(mv):
        raise FrameError(f"{len(mv) - r.size} bytes after the frame")
    if r.type != APPEND:
        raise FrameError(f"{TYPE_NAMES[r.type]} frame is not a record")
    crc_off = r.size - _CRC
    body = b"".join((_U32.pack(r.size - 5), mv[5:crc_off]))
    return body + CHECKSUM.pack(checksum(memoryview(body)[4:]))


assert HEADER.size == WAL_HDR and SEG_HEADER.size == SEG_HDR
