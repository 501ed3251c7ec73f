"""Records on their way in (validation) and handed out to routers and queues.

A record's `data` and `meta` are serialised once, at write time, with orjson;
the stored frames keep those bytes and reads splice them into responses without
re-parsing (the rendering itself is :mod:`topics.engine.frames`).
:class:`Payload` is one record as a router forward or a queue job needs it.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

import orjson

from topics.config import Limits
from topics.errors import TopicsError, bad_request
from topics.format.frame import native_prepare_records

__all__ = [
    "NewRecord",
    "Payload",
    "prepare_records",
    "PreparedRecords",
    "iter_write_body",
    "iter_density_check",
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
    """Parse one request JSON document strictly (docs/HTTP_INPUT.md, "JSON").

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
    """Compact UTF-8 JSON, the form record sizes are counted in (docs/API.md, "4. Records").

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


class PreparedRecords(list[NewRecord]):
    """A write's records already validated by :func:`iter_write_body`.

    :func:`prepare_records` hands such a list back unchanged (after checking the
    batch `node`, which :func:`iter_write_body` has applied already).
    """


def _check_batch_node(batch_node: Any, max_node_bytes: int) -> str | None:
    if batch_node is None:
        return None
    if not isinstance(batch_node, str):
        raise bad_request("node must be a string")
    if _utf8_len(batch_node, "node") > max_node_bytes:
        raise bad_request(f"node exceeds {max_node_bytes} bytes")
    return batch_node or None


def _batch_too_large(max_batch: int, count: int) -> TopicsError:
    return TopicsError(
        400, "batch_too_large", f"a write carries at most {max_batch} records (got {count})"
    )


#: The record caps of a default server (docs/API.md, "16. Limits and the knobs that
#: shape the API").
_DEFAULT_LIMITS = Limits()


def prepare_records(
    records: Any, batch_node: Any, limits: Limits = _DEFAULT_LIMITS
) -> list[NewRecord]:
    """Validate a write's `records` array into :class:`NewRecord` values, under the
    record caps of `limits` (`max_batch_records`, `max_record_bytes`, `max_meta_bytes`,
    `max_meta_keys`, `max_tag_bytes`, `max_node_bytes`).

    The rules are those of docs/API.md, "7.1 `POST /v0/topics/:topic`".

    Raises TopicsError: `400 invalid_request` (missing/empty `records`, missing
    `data`, bad tag/node/meta), `400 batch_too_large` (> `max_batch_records`),
    `400 record_too_large` (`data` + `meta` > `max_record_bytes`); a `data` or
    `meta` nested deeper than :data:`MAX_STORED_DEPTH` levels is `400
    invalid_request` too (docs/HTTP_INPUT.md "JSON"). A :class:`PreparedRecords`
    list is returned as it is.
    """
    if type(records) is PreparedRecords:
        _check_batch_node(batch_node, limits.max_node_bytes)
        return records
    if not isinstance(records, list) or not records:
        raise bad_request("records must be a non-empty array")
    if len(records) > limits.max_batch_records:
        raise _batch_too_large(limits.max_batch_records, len(records))
    node = _check_batch_node(batch_node, limits.max_node_bytes)
    fast = native_prepare(records, node, limits)
    if fast is not None:
        return fast
    out: list[NewRecord] = []
    _prepare_each(records, node, out, 0, None, limits)
    return out


def native_prepare(
    records: list[Any], batch_node: str | None, limits: Limits
) -> list[NewRecord] | None:
    """The compiled loop's records (`format/_codec.c`), or None when it is not built,
    `records` is not a list, or a record is anything but the common valid case (the
    Python loop then judges the write; docs/ARCHITECTURE.md, "Compiled code")."""
    if native_prepare_records is None or type(records) is not list:
        return None
    return native_prepare_records(
        records,
        batch_node,
        NewRecord,
        orjson.dumps,
        limits.max_record_bytes,
        limits.max_meta_bytes,
        limits.max_meta_keys,
        limits.max_tag_bytes,
        limits.max_node_bytes,
    )


# orjson.dumps builds its output in a buffer with room to spare and then shrinks
# it; for outputs past the small-object allocator the spare room stays resident
# next to every record kept (about 1.6x the record for 6 KiB records). An exact
# copy, made while the buffer is still hot, keeps only the record's own size
# and lets the next dumps reuse the freed buffer.
_EXACT_COPY_BYTES = 512


def _prepare_each(
    records: list[Any],
    batch_node: str | None,
    out: list[NewRecord],
    first: int,
    inherit: list[int] | None,
    limits: Limits,
) -> None:
    """Validate `records` (numbered from `first` in messages) and append them to `out`.

    With `inherit` given, a record without a `node` of its own gets `batch_node`
    now and its index in `out` is appended to `inherit` (the batch node is not
    known yet).
    """
    append = out.append
    dumps = orjson.dumps
    max_record_bytes, max_node_bytes = limits.max_record_bytes, limits.max_node_bytes
    max_meta_bytes, max_meta_keys = limits.max_meta_bytes, limits.max_meta_keys
    max_tag_bytes = limits.max_tag_bytes
    for j, rec in enumerate(records):
        i = first + j
        if type(rec) is not dict:
            raise bad_request(f"records[{i}] must be an object")
        try:
            data = dumps(rec["data"])
        except KeyError:
            raise bad_request(f"records[{i}].data is required") from None
        except orjson.JSONEncodeError:
            data = _dumps(rec["data"], f"records[{i}].data")  # raises the 400
        size = len(data)
        if size > _EXACT_COPY_BYTES:
            data = bytes(memoryview(data))
        meta: bytes | None = None
        meta_v = rec.get("meta")
        if meta_v is not None:
            meta = _dumps(meta_v, f"records[{i}].meta")
            if len(meta) > _EXACT_COPY_BYTES:
                meta = bytes(memoryview(meta))
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
            if inherit is not None:
                inherit.append(len(out))
            append(NewRecord(data, None, batch_node, None, size))
            continue
        tag = _opt_str(rec, "tag", max_tag_bytes, f"records[{i}].tag")
        node = rec.get("node")
        if node is not None:
            node = _opt_str(rec, "node", max_node_bytes, f"records[{i}].node")
        else:
            if inherit is not None:
                inherit.append(len(out))
            node = batch_node
        append(NewRecord(data, meta, node, tag, size))


# -- large write bodies, a piece at a time --------------------------------------------

INCREMENTAL_MIN_BYTES = 1 << 20  # smaller write bodies are parsed in one go
CHUNK_BYTES = 256 * 1024  # about this much of the records array is parsed per step
_MAX_HEAD_BYTES = 64 * 1024  # `"records": [` must start within this prefix
_MAX_TRIES = 8  # wrong guesses tolerated per boundary before parsing in one go
_SCAN_WINDOW = 1 << 20  # bytes searched for a boundary at a time
_SCAN_OVERLAP = 256  # windows overlap so a boundary across their edge is still seen

_WS = rb"[ \t\n\r]*"
_RECORDS_KEY = re.compile(rb'"records"' + _WS + rb":" + _WS + rb"\[" + _WS)
# The end of one record object and the start of the next: `}` `,` `{"data":` (or
# another record field first). Inside a record the same bytes can occur (nested
# objects, strings); such a guess is caught because that piece does not parse.
_BOUNDARY = re.compile(
    rb"\}" + _WS + rb"," + _WS + rb"(?=\{" + _WS + rb'"(?:data|meta|tag|node)"' + _WS + rb":)"
)
# Tried when no record starts with a record field: the start of any object (nested
# arrays of objects make more wrong guesses, each caught the same way).
_ANY_BOUNDARY = re.compile(rb"\}" + _WS + rb"," + _WS + rb"(?=\{)")


def _parse_list(raw: bytes | bytearray, start: int, end: int) -> list[Any] | None:
    """`raw[start:end]` parsed as the inside of a JSON array, or None if it is not one.

    It is parsed one level down (`[[...]]`), where the records array sits in the
    whole body, so the nesting limit counts exactly as in a whole parse.
    """
    buf = bytearray(b"[[")
    buf += memoryview(raw)[start:end]
    buf += b"]]"
    try:
        value = orjson.loads(buf)
    except orjson.JSONDecodeError:
        return None
    return value[0] if type(value) is list and len(value) == 1 else None


def _head(raw: bytes | bytearray) -> tuple[dict[str, Any], int] | None:
    """The members before `"records": [` (a dict) and where the array's contents start."""
    for tries, m in enumerate(_RECORDS_KEY.finditer(raw, 0, _MAX_HEAD_BYTES)):
        if tries >= _MAX_TRIES:
            break
        # Valid only when the key sits at the top level: then the members before
        # it, closed with a stand-in value, form a whole object.
        try:
            head = orjson.loads(bytes(raw[: m.start()]) + b'"records":0}')
        except orjson.JSONDecodeError:
            continue
        if type(head) is dict:
            return head, m.end()
    return None


def _tail(raw: bytes | bytearray, start: int) -> tuple[int, dict[str, Any]] | None:
    """The `]` closing the records array (searched from the end) and the members after it."""
    end = len(raw)
    for _ in range(_MAX_TRIES):
        k = raw.rfind(b"]", start, end)
        if k < 0 or len(raw) - k > _MAX_HEAD_BYTES:
            return None
        end = k
        rest = bytes(raw[k + 1 :]).strip(b" \t\n\r")
        if rest == b"}":
            return k, {}
        if rest[:1] != b"," or rest[1:].lstrip(b" \t\n\r")[:1] != b'"':
            continue
        try:
            tail = orjson.loads(b"{" + rest[1:])
        except orjson.JSONDecodeError:
            continue
        if type(tail) is dict:
            return k, tail
    return None


def iter_write_body(
    raw: bytes | bytearray,
    limits: Limits = _DEFAULT_LIMITS,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> Generator[None, None, dict[str, Any] | None]:
    """Parse a write body a piece of its `records` array at a time.

    A generator: it yields after each piece of about `chunk_bytes` (bytes) so the
    caller can let other work run, and returns the body as a dict whose
    `records` is a :class:`PreparedRecords` list (the same records, errors and
    batch `node` handling as :func:`loads` followed by :func:`prepare_records`).
    Only one piece is held as Python objects at a time, so memory stays near
    the size of `raw` plus the records' compact JSON (docs/HTTP_INPUT.md
    "Large bodies").

    Returns None when the body is not laid out so (no top-level `"records": [`
    near the start, more than 64 KiB after the array, a duplicate `records`
    key) or is not valid JSON: the caller then parses it in one go with
    :func:`loads`, which also gives the authoritative error. Raises TopicsError
    (`400 batch_too_large`, `400 invalid_request`, `400 record_too_large`)
    exactly as :func:`prepare_records` would for the whole body.
    """
    head = _head(raw)
    if head is None:
        return None
    body, pos = head
    found = _tail(raw, pos)
    if found is None:
        return None
    stop, tail = found
    if "records" in tail:
        return None  # a later duplicate wins in a whole parse: leave it to that
    max_batch = limits.max_batch_records
    out = PreparedRecords()
    inherit: list[int] = []
    count = 0
    error: TopicsError | None = None
    while True:
        piece: list[Any] | None = None
        end = stop
        lo = pos + chunk_bytes
        tries = 0
        while piece is None and lo < stop:
            # Look for the next record boundary a window at a time, so a body whose
            # records never match is not scanned to its end at every step.
            hi = min(stop, lo + _SCAN_WINDOW)
            for pattern in (_BOUNDARY, _ANY_BOUNDARY):
                m = pattern.search(raw, lo, hi)
                while m is not None:
                    piece = _parse_list(raw, pos, m.start() + 1)
                    if piece is not None:
                        end = m.end()
                        break
                    tries += 1
                    if tries >= _MAX_TRIES:
                        return None
                    m = pattern.search(raw, m.end(), hi)
                if piece is not None:
                    break
            lo = max(lo + 1, hi - _SCAN_OVERLAP) if hi < stop else stop
        if piece is None:  # the rest of the array
            piece = _parse_list(raw, pos, stop)
            if piece is None:
                return None
        if not piece:
            return None  # an empty array: the whole parse reports it
        first = count
        count += len(piece)
        if error is None and count <= max_batch:
            try:
                _prepare_each(piece, None, out, first, inherit, limits)
            except TopicsError as exc:
                error = exc  # reported once the whole body is known to be JSON
        del piece
        if end == stop:
            break
        pos = end
        yield
    body.update(tail)
    if count > max_batch:
        raise _batch_too_large(max_batch, count)
    batch_node = _check_batch_node(body.get("node"), limits.max_node_bytes)
    if error is not None:
        raise error
    if batch_node is not None:
        for i in inherit:
            out[i] = out[i]._replace(node=batch_node)
    body["records"] = out
    return body


# -- bodies parsed in one go: bounded object growth -----------------------------------

DENSITY_CHECK_MIN_BYTES = 1 << 20  # smaller bodies are parsed without counting
MAX_PARSE_GROWTH = 8  # estimated Python objects may be at most this many times the text
_CONTAINER_COST = 128  # bytes a parsed object or array costs, about (dicts are 64-232)
_ITEM_COST = 64  # bytes a comma-separated value or member costs, about (with list growth)
_COUNT_STEP = 4 << 20  # bytes counted per step


def iter_density_check(raw: bytes | bytearray | str) -> Generator[None, None, None]:
    """Refuse a large body whose parse would multiply its size in memory (413).

    A generator that yields every 4 MiB counted, so the caller can let other
    work run. Parsing `{},{},...` turns every 3 bytes into a 64-byte dict; for a
    body of 1 MiB or more the objects a whole parse would create are estimated
    from its `{`, `[` and `,` counts (each counted as if it were structure, even
    inside strings) and the body is refused when the estimate passes
    :data:`MAX_PARSE_GROWTH` (8) times its size. Raises TopicsError `413
    payload_too_large` (docs/HTTP_INPUT.md "Large bodies").
    """
    n = len(raw)
    if n < DENSITY_CHECK_MIN_BYTES:
        return
    count: Any = raw.count  # str.count or bytes.count, with tokens of the same type
    brace, bracket, comma = ("{", "[", ",") if isinstance(raw, str) else (b"{", b"[", b",")
    containers = items = 0
    for start in range(0, n, _COUNT_STEP):
        end = start + _COUNT_STEP
        containers += count(brace, start, end) + count(bracket, start, end)
        items += count(comma, start, end)
        if end < n:
            yield
    estimate = containers * _CONTAINER_COST + items * _ITEM_COST
    if estimate > MAX_PARSE_GROWTH * n:
        raise TopicsError(
            413,
            "payload_too_large",
            f"body too dense to parse: {containers} objects/arrays and {items} values "
            f"in {n} bytes would take about {estimate >> 20} MiB",
        )


_NBYTES = operator.itemgetter(4)  # NewRecord.nbytes, read without a Python frame per record


def batch_bytes(records: Sequence[NewRecord]) -> int:
    """Sum of accounting bytes of a batch (docs/API.md, "4. Records")."""
    return sum(map(_NBYTES, records))
