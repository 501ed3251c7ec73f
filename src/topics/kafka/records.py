"""Kafka record batches <-> topics records.

Batches are decoded and built with aiokafka's compiled record codec
(`aiokafka.record._crecords`, Cython); checksums are verified with the `crc32c`
C package. Only magic-v2 batches are accepted (every supported client writes
them once Produce >= 3 is advertised).

Field mapping (docs/KAFKA.md "Records"):

* value -> `data`. A JSON object or array is stored as that JSON; a consumer
  gets it back compact (JSON-equal: whitespace and number spelling may
  differ, the document does not). A JSON scalar already in compact form
  (`42`, `true`, `"s"`) is stored as is, byte for byte. Any other UTF-8 value
  is stored as a JSON string holding the text; any other bytes as a JSON
  string holding their base64; a null value as JSON `null`. The last three
  leave a marker in `meta["$kafka"]["value"]` (`"text"`, `"base64"`,
  `"null"`), so a Kafka consumer gets the original bytes back exactly.
* key -> `tag` when it is non-empty UTF-8 of at most the tag limit (256 bytes);
  otherwise the base64 of the key goes to `meta["$kafka"]["key"]`.
* headers -> `meta`: `{name: text}` when the names are unique and every value
  is UTF-8 (or null); otherwise the exact list goes to
  `meta["$kafka"]["headers"]` as `[[name, base64-or-null], ...]`.
* timestamp: the server stamps its commit time (`$ts`), like a Kafka broker
  with `message.timestamp.type=LogAppendTime`; the producer's time is not kept.

Records written over `/v0` map back the same way: `tag` is the key, `data`
(compact JSON) the value, and each `meta` member a header (strings as UTF-8,
other JSON values as their compact JSON; a non-object `meta` becomes one
header named `meta`).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import crc32c
import orjson
from aiokafka.errors import UnsupportedCodecError
from aiokafka.record._crecords.default_records import (
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)

from topics.engine.records import NewRecord
from topics.kafka import errors as E

__all__ = [
    "append_time_batches",
    "RecordError",
    "ProducedBatch",
    "decode_batches",
    "to_new_record",
    "to_new_records",
    "to_kafka",
    "BatchWriter",
]

Header = tuple[str, bytes | None]

_LEN = struct.Struct(">qi")  # baseOffset, batchLength: the batch framing prefix
_BASE = struct.Struct(">q")
_CRC = struct.Struct(">I")
_LOG_APPEND_TIME = 0x08  # attributes bit 3: the timestamp type
_BATCH_OVERHEAD = 61  # v2 batch header bytes before the first record
_MAGIC_AT = 16
_CRC_AT = 17
_ATTR_AT = 21
_MARK = "$kafka"


class RecordError(Exception):
    """A produced batch this broker refuses; `code` is the Kafka error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ProducedBatch(NamedTuple):
    """One decoded v2 batch: producer identity and its records (key, value, headers)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[Any]  # aiokafka DefaultRecord: .key, .value, .headers


def decode_batches(raw: bytes | None) -> list[ProducedBatch]:
    """Split a Produce `records` field into checked v2 batches.

    Raises :class:`RecordError`: CORRUPT_MESSAGE (truncated framing, a magic
    other than 2, a CRC mismatch, undecodable records), UNSUPPORTED_COMPRESSION_TYPE
    (a codec whose library is not installed), INVALID_RECORD (transactional or
    control batches: transactions are not supported).
    """
    if not raw:
        raise RecordError(E.CORRUPT_MESSAGE, "empty record set")
    mv = memoryview(raw)
    n = len(raw)
    pos = 0
    out: list[ProducedBatch] = []
    while pos < n:
        if n - pos < _BATCH_OVERHEAD:
            raise RecordError(E.CORRUPT_MESSAGE, "truncated record batch header")
        _, length = _LEN.unpack_from(raw, pos)
        end = pos + 12 + length
        if length < _BATCH_OVERHEAD - 12 or end > n:
            raise RecordError(E.CORRUPT_MESSAGE, "record batch length out of bounds")
        if raw[pos + _MAGIC_AT] != 2:
            raise RecordError(
                E.CORRUPT_MESSAGE,
                f"record batch magic {raw[pos + _MAGIC_AT]} (only v2 is accepted)",
            )
        chunk = bytes(mv[pos:end])
        batch = DefaultRecordBatch(chunk)
        if crc32c.crc32c(mv[pos + _ATTR_AT : end]) != batch.crc:
            raise RecordError(E.CORRUPT_MESSAGE, "record batch CRC mismatch")
        if batch.is_transactional or batch.is_control_batch:
            raise RecordError(E.INVALID_RECORD, "transactional batches are not supported")
        try:
            recs = list(batch)
        except UnsupportedCodecError as exc:
            raise RecordError(E.UNSUPPORTED_COMPRESSION_TYPE, str(exc)) from None
        except Exception as exc:  # the codec raises several types on bad varints/lengths
            raise RecordError(E.CORRUPT_MESSAGE, f"undecodable records: {exc}") from None
        if len(recs) != batch.last_offset_delta + 1:
            raise RecordError(E.CORRUPT_MESSAGE, "record count does not match the batch header")
        out.append(
            ProducedBatch(batch.producer_id, batch.producer_epoch, batch.base_sequence, recs)
        )
        pos = end
    return out


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: Any) -> bytes | None:
    if not isinstance(s, str):
        return None
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return None


_dumps = orjson.dumps
_loads = orjson.loads
_JSONError = orjson.JSONDecodeError


def _json_data(value: bytes) -> bytes | None:
    """`value` as a record's `data` when it is JSON (module docstring rules): itself
    when it is compact JSON already, a compact copy when it is an object or array
    written otherwise; None when it is not JSON or a scalar written otherwise."""
    try:
        obj = _loads(value)
    except _JSONError:
        return None
    canon = _dumps(obj)
    if canon == value:
        # Keep the producer's exact-size bytes: orjson's output buffer is
        # over-allocated (KiBs) and a batch holds thousands.
        return value
    if type(obj) is dict or type(obj) is list:
        return bytes(memoryview(canon))
    return None


def to_new_record(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    *,
    max_tag_bytes: int,
    max_meta_bytes: int,
    max_record_bytes: int,
) -> NewRecord:
    """Map one Kafka record onto a topics record (module docstring rules).

    Raises :class:`RecordError` MESSAGE_TOO_LARGE when the mapped `meta` or
    `data` + `meta` exceed the server's record limits.
    """
    mark: dict[str, Any] | None = None
    # value -> data
    if value is None:
        data = b"null"
        mark = {"value": "null"}
    elif (json_data := _json_data(value)) is not None:
        data = json_data
    else:
        try:
            data = bytes(memoryview(_dumps(value.decode("utf-8"))))
            mark = {"value": "text"}
        except UnicodeDecodeError:
            data = bytes(memoryview(_dumps(_b64(value))))
            mark = {"value": "base64"}
    # key -> tag
    tag: str | None = None
    if key is not None:
        if key and len(key) <= max_tag_bytes:
            try:
                tag = key.decode("utf-8")
            except UnicodeDecodeError:
                tag = None
        if tag is None:
            if mark is None:
                mark = {}
            mark["key"] = _b64(key)
    # headers -> meta
    meta_obj: dict[str, Any] | None = None
    if headers:
        simple: dict[str, Any] | None = {} if len(headers) < 64 else None
        if simple is not None:
            for name, hv in headers:
                if name in simple or name == _MARK:
                    simple = None
                    break
                if hv is None:
                    simple[name] = None
                    continue
                try:
                    simple[name] = hv.decode("utf-8")
                except UnicodeDecodeError:
                    simple = None
                    break
        if simple is not None:
            meta_obj = simple
        else:
            if mark is None:
                mark = {}
            mark["headers"] = [[name, None if hv is None else _b64(hv)] for name, hv in headers]
    if mark is not None:
        if meta_obj is None:
            meta_obj = {}
        meta_obj[_MARK] = mark
    meta = bytes(memoryview(_dumps(meta_obj))) if meta_obj is not None else None
    size = len(data)
    if meta is not None:
        if len(meta) > max_meta_bytes:
            raise RecordError(
                E.MESSAGE_TOO_LARGE,
                f"headers/key take {len(meta)} bytes of meta (max {max_meta_bytes})",
            )
        size += len(meta)
    if size > max_record_bytes:
        raise RecordError(
            E.MESSAGE_TOO_LARGE, f"record is {size} bytes stored (max {max_record_bytes})"
        )
    return NewRecord(data, meta, None, tag, size)


def to_new_records(
    records: list[Any], *, max_tag_bytes: int, max_meta_bytes: int, max_record_bytes: int
) -> list[NewRecord]:
    """:func:`to_new_record` over a decoded batch, with an inlined common case.

    The fast path covers records without headers whose key is absent or short
    text and whose value is a JSON document or compact JSON scalar; everything
    else goes through :func:`to_new_record`. Raises :class:`RecordError` as it does.
    """
    out: list[NewRecord] = []
    add = out.append
    json_data = _json_data
    new = tuple.__new__
    for r in records:
        value = r.value
        key = r.key
        if value is not None and not r.headers:
            data = json_data(value)
            if data is not None:
                try:
                    tag = None
                    if key is not None:
                        if not key or len(key) > max_tag_bytes:
                            raise ValueError
                        tag = key.decode("utf-8")
                    n = len(data)
                    if n <= max_record_bytes:
                        add(new(NewRecord, (data, None, None, tag, n, 0)))
                        continue
                except ValueError:  # UnicodeDecodeError is a ValueError
                    pass
        add(
            to_new_record(
                key,
                value,
                r.headers,
                max_tag_bytes=max_tag_bytes,
                max_meta_bytes=max_meta_bytes,
                max_record_bytes=max_record_bytes,
            )
        )
    return out


def _header_value(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8")
    return _dumps(v)


def to_kafka(
    tag: str | None, data: bytes, meta: bytes | None
) -> tuple[bytes | None, bytes | None, list[Header]]:
    """(key, value, headers) of a stored record: the inverse of :func:`to_new_record`.

    Records written over `/v0` have no `$kafka` marker: the value is `data`'s
    compact JSON, the key the tag, the headers `meta`'s members. A malformed
    marker (possible only when a `/v0` writer fakes one) falls back to that
    plain mapping field by field; this never raises.
    """
    key = tag.encode("utf-8") if tag is not None else None
    if meta is None:
        return key, data, []
    try:
        m = _loads(meta)
    except _JSONError:
        return key, data, [("meta", meta)]
    if not isinstance(m, dict):
        return key, data, [("meta", meta)]
    value: bytes | None = data
    headers: list[Header] | None = None
    mark = m.get(_MARK)
    if isinstance(mark, dict):
        enc = mark.get("value")
        if enc == "null":
            value = None
        elif enc == "text":
            try:
                s = _loads(data)
                if isinstance(s, str):
                    value = s.encode("utf-8")
            except _JSONError:
                pass
        elif enc == "base64":
            try:
                raw = _unb64(_loads(data))
                if raw is not None:
                    value = raw
            except _JSONError:
                pass
        if key is None and "key" in mark:
            key = _unb64(mark["key"])
        hl = mark.get("headers")
        if isinstance(hl, list):
            headers = []
            for item in hl:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                    headers.append((item[0], None if item[1] is None else _unb64(item[1])))
    if headers is None:
        headers = [(k, _header_value(v)) for k, v in m.items() if k != _MARK]
    return key, value, headers


class BatchWriter:
    """Builds one v2 batch of stored records for a Fetch response.

    Offsets inside the batch are deltas from the first record's offset, which
    becomes the batch's baseOffset (outside the CRC, patched after `build`).
    Gaps (deleted seqs) are legal in v2 batches, as in compacted Kafka topics.
    The batch is typed LogAppendTime (docs/KAFKA.md "Records"): a client reads
    every record's time from the batch's maxTimestamp, so the records of one
    batch must share their `$ts` (see :func:`append_time_batches`).

    `codec` is Kafka's codec id (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd): the
    records section is compressed with it when the batch is built. The byte
    limit applies to the uncompressed records.
    """

    __slots__ = ("_b", "_base", "count", "_limit", "_codec")

    def __init__(self, base_offset: int, max_bytes: int, codec: int = 0) -> None:
        self._b = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, max(max_bytes, 1))
        self._base = base_offset
        self._limit = max_bytes
        self._codec = codec
        self.count = 0

    def add(
        self,
        offset: int,
        ts: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[Header],
    ) -> bool:
        """Append one record; False (nothing added) when it would pass the byte limit.

        The first record is always taken, however large (KIP-74: a fetch returns at
        least one record so a consumer cannot get stuck).
        """
        if (
            self.count
            and self._b.size() + self._b.size_in_bytes(offset - self._base, ts, key, value, headers)
            > self._limit
        ):
            return False
        if self._b.append(offset - self._base, ts, key, value, headers) is None:
            if self.count:
                return False
            # A single record larger than the limit: rebuild with room for it.
            self._b = DefaultRecordBatchBuilder(2, self._codec, 0, -1, -1, -1, (1 << 31) - 1)
            self._b.append(offset - self._base, ts, key, value, headers)
        self.count += 1
        return True

    def size(self) -> int:
        return int(self._b.size())

    def build(self) -> bytes:
        buf = self._b.build()
        _BASE.pack_into(buf, 0, self._base)
        buf[_ATTR_AT + 1] |= _LOG_APPEND_TIME  # the low byte of the attributes
        _CRC.pack_into(buf, _CRC_AT, crc32c.crc32c(memoryview(buf)[_ATTR_AT:]))
        return bytes(buf)


def append_time_batches(
    records: list[tuple[int, int, bytes | None, bytes | None, list[Header]]],
    max_bytes: int,
    codec: int = 0,
) -> bytes:
    """Fetch batches for `(offset, ts, key, value, headers)` records in offset order:
    a new batch wherever the append time changes, so LogAppendTime stays exact per
    record. Stops before the record that would pass `max_bytes` (the first is
    always taken, KIP-74). Each batch is compressed with `codec` (a Kafka codec
    id, see :class:`BatchWriter`)."""
    out: list[bytes] = []
    used = 0
    w: BatchWriter | None = None
    ts_now = None
    for off, ts, key, value, headers in records:
        if w is None or ts != ts_now:
            if w is not None:
                done = w.build()
                out.append(done)
                used += len(done)
            room = max_bytes - used
            if out and room <= _BATCH_OVERHEAD:
                w = None
                break
            w = BatchWriter(off, max(room, 1), codec)
            ts_now = ts
        if not w.add(off, ts, key, value, headers):
            if w.count:
                out.append(w.build())
            w = None
            break
    if w is not None and w.count:
        out.append(w.build())
    return b"".join(out)
