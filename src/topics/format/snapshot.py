"""The snapshot file's bytes (docs/FORMATS.md, "Snapshots"): pure, no I/O.

Layout, little-endian::

    off 0          8         magic     b"TOPSNAP1"
    off 8          4         version   u32 = 1
    off 12         8         body_len  u64
    off 20         body_len  body      one msgpack map
    off 20+len     8         xxh3      u64, XXH3-64 of the body

so a file is exactly `28 + body_len` bytes. :func:`decode_snapshot` is total:
it returns the body or a :class:`SnapshotInvalid` value for any input.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import xxhash

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "SnapshotInvalid",
    "encode_snapshot",
    "decode_snapshot",
]

MAGIC = b"TOPSNAP1"
VERSION = 1
_HEADER = struct.Struct("<8sIQ")
#: Bytes before the body: magic, version, body_len.
HEADER_SIZE = _HEADER.size
_TRAILER = 8


class SnapshotInvalid(Exception):
    """Why some bytes are not a valid snapshot (`reason`).

    Returned as a value by :func:`decode_snapshot`; it is an exception type so
    callers that prefer raising can `raise` it unchanged.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __repr__(self) -> str:
        return f"SnapshotInvalid({self.reason!r})"


def encode_snapshot(body: dict[Any, Any]) -> bytes:
    """The complete file bytes for `body` (msgpack-encodable; tuples load as lists).

    Raises TypeError from msgpack for an unencodable value.
    """
    if not isinstance(body, dict):
        raise TypeError("a snapshot body must be a dict")
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return b"".join(
        (
            _HEADER.pack(MAGIC, VERSION, len(packed)),
            packed,
            xxhash.xxh3_64_intdigest(packed).to_bytes(8, "little"),
        )
    )


def decode_snapshot(buf: bytes | bytearray | memoryview) -> dict[Any, Any] | SnapshotInvalid:
    """Decode a whole snapshot file; never raises (fuzzed with Hypothesis).

    Returns the body dict, or :class:`SnapshotInvalid` naming the first failed
    check: header length, magic, version, `body_len` against the file length,
    checksum, msgpack decoding, or a body that is not a map.
    """
    try:
        raw = bytes(buf)
        if len(raw) < HEADER_SIZE + _TRAILER:
            return SnapshotInvalid(f"truncated: {len(raw)} bytes")
        magic, version, body_len = _HEADER.unpack_from(raw, 0)
        if magic != MAGIC:
            return SnapshotInvalid("bad magic")
        if version != VERSION:
            return SnapshotInvalid(f"unsupported version {version}")
        if body_len != len(raw) - HEADER_SIZE - _TRAILER:
            return SnapshotInvalid(f"body_len {body_len} does not match a {len(raw)}-byte file")
        body = raw[HEADER_SIZE : HEADER_SIZE + body_len]
        if xxhash.xxh3_64_intdigest(body) != int.from_bytes(raw[-_TRAILER:], "little"):
            return SnapshotInvalid("checksum mismatch")
        try:
            value = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types on garbage
            return SnapshotInvalid(f"undecodable body: {type(exc).__name__}")
        if not isinstance(value, dict):
            return SnapshotInvalid("body is not a map")
        return value
    except Exception as exc:  # totality: nothing but a value leaves this function
        return SnapshotInvalid(f"decode error: {type(exc).__name__}")
