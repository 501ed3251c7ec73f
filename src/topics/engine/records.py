"""Records on their way in (validation) and out (pre-rendered JSON fragments).

A record's `data` and `meta` are serialised once, at write time, with orjson;
reads splice those bytes into responses and never re-parse a stored payload
(DESIGN §3). :func:`render` builds one wire record object (API §1.6): `$seq`,
`$ts`, `$node` (when present), `$tag` (when asked), `data`, `meta` (when present
and asked), in that order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from topics.errors import TopicsError, bad_request

__all__ = [
    "NewRecord",
    "Payload",
    "prepare_records",
    "render",
    "loads",
    "json_bytes",
    "MAX_KEY_BYTES",
]

MAX_KEY_BYTES = 256


def _big_int(text: str) -> int | float:
    v = int(text)
    return v if -(2**63) <= v < 2**64 else float(v)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def loads(body: bytes | str) -> Any:
    """Parse JSON; integers beyond 64 bits become floats (API §1.5, informative).

    Raises ValueError (orjson.JSONDecodeError or json.JSONDecodeError) when the
    text is not JSON.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        # orjson refuses integers wider than 64 bits; the stdlib parser does not.
        # Only fall back when the stdlib accepts it as strict JSON.
        return json.loads(body, parse_int=_big_int, parse_constant=_reject_constant)


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON (SEMANTICS §1.3 byte accounting form)."""
    return orjson.dumps(value)


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A validated record ready to stage: raw JSON bytes plus accounting size."""

    data: bytes
    meta: bytes | None
    node: str | None
    tag: str | None
    nbytes: int
    hops: int = 0


class Payload:
    """What a slot keeps in memory: origin fields, raw JSON and the default fragment.

    `frag` is the full wire object for the most common projection
    (`include_meta` true, `include_tags` false), built once at publish.
    """

    __slots__ = ("node", "tag", "data", "meta", "frag")

    def __init__(
        self, node: str | None, tag: str | None, data: bytes, meta: bytes | None, frag: bytes
    ) -> None:
        self.node = node
        self.tag = tag
        self.data = data
        self.meta = meta
        self.frag = frag


def render(
    seq: int,
    ts: int,
    p: Payload,
    *,
    include_tags: bool = False,
    include_meta: bool = True,
    include_data: bool = True,
) -> bytes:
    """One record object as JSON bytes (API §1.6 field order)."""
    parts = [b'{"$seq":%d,"$ts":%d' % (seq, ts)]
    if p.node is not None:
        parts.append(b',"$node":' + orjson.dumps(p.node))
    if include_tags and p.tag is not None:
        parts.append(b',"$tag":' + orjson.dumps(p.tag))
    if include_data:
        parts.append(b',"data":' + p.data)
    if include_meta and p.meta is not None:
        parts.append(b',"meta":' + p.meta)
    parts.append(b"}")
    return b"".join(parts)


def default_frag(seq: int, ts: int, node: str | None, data: bytes, meta: bytes | None) -> bytes:
    """The `frag` of :class:`Payload`: include_meta on, include_tags off."""
    if node is None:
        head = b'{"$seq":%d,"$ts":%d,"data":' % (seq, ts)
    else:
        head = b'{"$seq":%d,"$ts":%d,"$node":%b,"data":' % (seq, ts, orjson.dumps(node))
    if meta is None:
        return head + data + b"}"
    return head + data + b',"meta":' + meta + b"}"


def _opt_str(rec: dict[str, Any], key: str, max_bytes: int, what: str) -> str | None:
    v = rec.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"{what} must be a string")
    if len(v.encode()) > max_bytes:
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
    `400 record_too_large` (`data` + `meta` > `max_record_bytes`).
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
        if len(batch_node.encode()) > max_node_bytes:
            raise bad_request(f"node exceeds {max_node_bytes} bytes")
        batch_node = batch_node or None
    out: list[NewRecord] = []
    dumps = orjson.dumps
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise bad_request(f"records[{i}] must be an object")
        if "data" not in rec:
            raise bad_request(f"records[{i}].data is required")
        try:
            data = dumps(rec["data"])
        except TypeError as exc:  # pragma: no cover - JSON input always dumps
            raise bad_request(f"records[{i}].data is not serialisable") from exc
        meta_v = rec.get("meta")
        meta: bytes | None = None
        size = len(data)
        if meta_v is not None:
            meta = dumps(meta_v)
            if len(meta) > max_meta_bytes:
                raise bad_request(f"records[{i}].meta exceeds {max_meta_bytes} bytes")
            if isinstance(meta_v, dict) and len(meta_v) > max_meta_keys:
                raise bad_request(f"records[{i}].meta has more than {max_meta_keys} keys")
            size += len(meta)
        if size > max_record_bytes:
            raise TopicsError(
                400,
                "record_too_large",
                f"records[{i}] data+meta is {size} bytes (max {max_record_bytes})",
            )
        tag = _opt_str(rec, "tag", max_tag_bytes, f"records[{i}].tag") if "tag" in rec else None
        if "node" in rec and rec["node"] is not None:
            node = _opt_str(rec, "node", max_node_bytes, f"records[{i}].node")
        else:
            node = batch_node
        out.append(NewRecord(data, meta, node, tag, size))
    return out


def batch_bytes(records: Sequence[NewRecord]) -> int:
    """Sum of accounting bytes of a batch."""
    return sum(r.nbytes for r in records)
