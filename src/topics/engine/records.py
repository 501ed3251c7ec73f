"""Records on their way in (validation) and handed out to routers and queues.

A record's `data` and `meta` are serialised once, at write time, with orjson;
the stored frames keep those bytes and reads splice them into responses without
re-parsing (DESIGN §3; the rendering itself is :mod:`topics.engine.frames`).
:class:`Payload` is one record as a router forward or a queue job needs it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from topics.errors import TopicsError, bad_request

__all__ = [
    "NewRecord",
    "Payload",
    "prepare_records",
    "loads",
    "json_bytes",
    "MAX_KEY_BYTES",
]

MAX_KEY_BYTES = 256


MAX_JSON_DEPTH = 1024  # orjson's parse limit: deeper documents are refused (400)
MAX_STORED_DEPTH = 254  # orjson serialises at most this many nested arrays/objects


def _orjson_parses_big_ints() -> bool:
    try:
        return isinstance(orjson.loads(b"18446744073709551616"), float)
    except orjson.JSONDecodeError:
        return False


# Recent orjson releases read integers wider than 64 bits as floats themselves;
# older ones refuse them, and only then is the stdlib parser consulted.
_NEEDS_FALLBACK = not _orjson_parses_big_ints()


def _big_int(text: str) -> int | float:
    v = int(text)  # ValueError past the interpreter's digit limit
    if -(2**63) <= v < 2**64:
        return v
    return float(v)  # OverflowError past the largest double


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:32]} overflows a double")
    return v


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def loads(body: bytes | str) -> Any:
    """Parse one request JSON document strictly (API §1.5; docs/HTTP_INPUT.md "JSON").

    Integers beyond 64 bits become floats. Refused with ValueError (the message
    says why and where), so the caller answers ``400 invalid_request``:

    * text that is not JSON, or has a UTF-8 byte order mark;
    * nesting deeper than :data:`MAX_JSON_DEPTH` (1024) arrays/objects;
    * a lone UTF-16 surrogate escape such as ``"\\ud800"`` in any string or key,
      or surrogate code points encoded in the UTF-8 bytes;
    * a number that overflows a double (``1e400``, ``-1e400``), and ``NaN`` /
      ``Infinity``.

    What this returns can always be serialised again, except that values nested
    deeper than :data:`MAX_STORED_DEPTH` are refused by :func:`json_bytes`.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if not _NEEDS_FALLBACK:
            raise
        err = exc
    # An older orjson refusing a wide integer: the stdlib parser, held to the same rules.
    try:
        value = json.loads(
            body,
            parse_int=_big_int,
            parse_float=_finite_float,
            parse_constant=_reject_constant,
        )
        orjson.dumps(value)  # surrogates cannot be encoded; depth is bounded
    except (ValueError, OverflowError, RecursionError, TypeError):
        raise err from None
    return value


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON (SEMANTICS §1.3 byte accounting form).

    Raises ValueError when `value` cannot be serialised (nested deeper than
    :data:`MAX_STORED_DEPTH`, or a string with a lone surrogate).
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"value cannot be stored as JSON: {exc}") from None


class NewRecord(NamedTuple):
    """A validated record ready to stage: raw JSON bytes plus accounting size."""

    data: bytes
    meta: bytes | None
    node: str | None
    tag: str | None
    nbytes: int
    hops: int = 0


class Payload(NamedTuple):
    """One record handed out (router forwarding, queue jobs): origin fields and its wire object.

    `frag` is the full wire object for the most common projection
    (`include_meta` true, `include_tags` false). `data` and `meta` are slices of
    `frag` (`[d0:d1]`, `[m0:m1]`), so a record is one exact-size bytes object.
    """

    node: str | None
    tag: str | None
    frag: bytes
    d0: int
    d1: int
    m0: int = 0
    m1: int = 0

    @property
    def data(self) -> bytes:
        """The record's `data` as compact JSON bytes."""
        return self.frag[self.d0 : self.d1]

    @property
    def meta(self) -> bytes | None:
        """The record's `meta` as compact JSON bytes, or None when absent."""
        return self.frag[self.m0 : self.m1] if self.m1 else None

    @classmethod
    def build(
        cls, seq: int, ts: int, node: str | None, tag: str | None, data: bytes, meta: bytes | None
    ) -> Payload:
        """Render the default fragment for (seq, ts) and remember where data/meta sit."""
        if node is None:
            head = b'{"$seq":%d,"$ts":%d,"data":' % (seq, ts)
        else:
            head = b'{"$seq":%d,"$ts":%d,"$node":%b,"data":' % (seq, ts, orjson.dumps(node))
        d0 = len(head)
        d1 = d0 + len(data)
        if meta is None:
            return cls(node, tag, head + data + b"}", d0, d1)
        m0 = d1 + 8  # len(b',"meta":')
        return cls(node, tag, head + data + b',"meta":' + meta + b"}", d0, d1, m0, m0 + len(meta))


def _utf8_len(v: str, what: str) -> int:
    """UTF-8 length of `v`; a lone surrogate (not encodable) is a 400."""
    try:
        return len(v.encode())
    except UnicodeEncodeError:
        raise bad_request(f"{what} is not valid Unicode (lone surrogate)") from None


def _dumps(value: Any, what: str) -> bytes:
    """orjson.dumps, with the values it refuses (too deep, lone surrogates) as 400s."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise bad_request(f"{what} cannot be stored: {exc}") from None


def _opt_str(rec: dict[str, Any], key: str, max_bytes: int, what: str) -> str | None:
    v = rec.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"{what} must be a string")
    if _utf8_len(v, what) > max_bytes:
        raise bad_request(f"{what} exceeds {max_bytes} bytes")
    return v or None


def prepare_records(
    records: Any,
    batch_node: Any,
    *,
    max_batch: int = 10_000,
    max_record_bytes: int = 1_048_576,
    max_meta_bytes: int = 16_384,
    max_meta_keys: int = 64,
    max_tag_bytes: int = 256,
    max_node_bytes: int = 128,
) -> list[NewRecord]:
    """Validate a write's `records` array (API §4) into :class:`NewRecord` values.

    Raises TopicsError: `400 invalid_request` (missing/empty `records`, missing
    `data`, bad tag/node/meta), `400 batch_too_large` (> `max_batch` records),
    `400 record_too_large` (`data` + `meta` > `max_record_bytes`); a `data` or
    `meta` nested deeper than :data:`MAX_STORED_DEPTH` levels is `400
    invalid_request` too (docs/HTTP_INPUT.md "JSON").
    """
    if not isinstance(records, list) or not records:
        raise bad_request("records must be a non-empty array")
    if len(records) > max_batch:
        raise TopicsError(
            400,
            "batch_too_large",
            f"a write carries at most {max_batch} records (got {len(records)})",
        )
    if batch_node is not None:
        if not isinstance(batch_node, str):
            raise bad_request("node must be a string")
        if _utf8_len(batch_node, "node") > max_node_bytes:
            raise bad_request(f"node exceeds {max_node_bytes} bytes")
        batch_node = batch_node or None
    out: list[NewRecord] = []
    append = out.append
    dumps = orjson.dumps
    for i, rec in enumerate(records):
        if type(rec) is not dict:
            raise bad_request(f"records[{i}] must be an object")
        try:
            data = dumps(rec["data"])
        except KeyError:
            raise bad_request(f"records[{i}].data is required") from None
        except orjson.JSONEncodeError:
            data = _dumps(rec["data"], f"records[{i}].data")  # raises the 400
        size = len(data)
        meta: bytes | None = None
        meta_v = rec.get("meta")
        if meta_v is not None:
            meta = _dumps(meta_v, f"records[{i}].meta")
            if len(meta) > max_meta_bytes:
                raise bad_request(f"records[{i}].meta exceeds {max_meta_bytes} bytes")
            if type(meta_v) is dict and len(meta_v) > max_meta_keys:
                raise bad_request(f"records[{i}].meta has more than {max_meta_keys} keys")
            size += len(meta)
        if size > max_record_bytes:
            raise TopicsError(
                400,
                "record_too_large",
                f"records[{i}] data+meta is {size} bytes (max {max_record_bytes})",
            )
        if len(rec) == 1:  # only "data": the common case
            append(NewRecord(data, None, batch_node, None, size))
            continue
        tag = _opt_str(rec, "tag", max_tag_bytes, f"records[{i}].tag")
        node = rec.get("node")
        if node is not None:
            node = _opt_str(rec, "node", max_node_bytes, f"records[{i}].node")
        else:
            node = batch_node
        append(NewRecord(data, meta, node, tag, size))
    return out


def batch_bytes(records: Sequence[NewRecord]) -> int:
    """Sum of accounting bytes of a batch."""
    return sum(r.nbytes for r in records)
