"""The OpenAPI 3.1 description of the HTTP API, built as Python data.

The server never imports this module: `GET /v0/openapi.json` serves the committed
package file `topics/http/openapi.json` (:mod:`topics.http.openapi`), which
``scripts/openapi`` (``python -m topics.http.openapi_doc``) writes from
:func:`build`. tests/http/test_openapi.py fails while the file and :func:`build`
differ, and holds the document to the app's route table and to real responses;
tests/e2e/test_schemathesis.py sends property-based requests drawn from it to a
live server (docs/API.md, "The OpenAPI document").

Conventions the whole document follows, all of them the server's behaviour:

* An optional body field sent as JSON `null` counts as absent, so its schema
  admits `null`; a required one does not.
* Fields the server does not know are ignored, so request objects stay open;
  response objects are closed (`additionalProperties: false`) wherever
  docs/API.md lists their fields exhaustively.
* Integers are written as JSON integers: `2`, not `2.0` (which JSON Schema counts
  as an integer too, but the server refuses where it wants one).
* Byte limits (`node`, `tag`, keys) are written as `maxLength`: exact for
  ASCII; the server counts UTF-8 bytes.
* A query boolean takes `true`/`1` or `false`/`0`, any other value meaning the
  default, so it is a string parameter.
* An event-stream response's `schema` describes one event, as
  `{"event", "data", "id"?}` with `data` a JSON text (`contentSchema`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from topics import __version__

__all__ = ["build", "render", "DOCUMENT_PATH", "main"]

J = dict[str, Any]

#: Where the served document lives (package data, next to this module).
DOCUMENT_PATH = Path(__file__).with_name("openapi.json")

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
TOPIC_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"
ROUTER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:>-]{0,254}$"
# `lease_` + hex of a u64 (leading zeros allowed); `""` skips the check for its seq.
LEASE_FENCE_PATTERN = r"^(lease_0*[0-9a-fA-F]{1,16})?$"
WID_PATTERN = r"^wid_[A-Za-z0-9_-]{22}$"

JSON = "application/json"
SSE = "text/event-stream"
PROMETHEUS = "text/plain; version=0.0.4"

# ----------------------------------------------------------------- schema helpers


def ref(name: str) -> J:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: J, required: tuple[str, ...] = (), *, closed: bool = True, **kw: Any) -> J:
    """An object schema; closed (no other properties) unless `closed` is false."""
    s: J = {"type": "object", "properties": props}
    if required:
        s["required"] = list(required)
    if closed:
        s["additionalProperties"] = False
    s.update(kw)
    return s


def nullable(s: J) -> J:
    """`s` or JSON `null` (an optional body field the server reads as absent)."""
    out = dict(s)
    if "$ref" in out or "anyOf" in out:
        return {"anyOf": [out, {"type": "null"}]}
    typ = out.get("type")
    if isinstance(typ, str):
        out["type"] = [typ, "null"]
    elif isinstance(typ, list) and "null" not in typ:
        out["type"] = [*typ, "null"]
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    if "type" not in out and "enum" not in out:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def u64(description: str | None = None, **kw: Any) -> J:
    s: J = {"type": "integer", "minimum": 0, "maximum": U64_MAX, **kw}
    if description:
        s["description"] = description
    return s


def u32(description: str | None = None, **kw: Any) -> J:
    s: J = {"type": "integer", "minimum": 0, "maximum": U32_MAX, **kw}
    if description:
        s["description"] = description
    return s


def text(description: str | None = None, **kw: Any) -> J:
    s: J = {"type": "string", **kw}
    if description:
        s["description"] = description
    return s


def flag(description: str | None = None) -> J:
    s: J = {"type": "boolean"}
    if description:
        s["description"] = description
    return s


def number(description: str | None = None, **kw: Any) -> J:
    s: J = {"type": "number", **kw}
    if description:
        s["description"] = description
    return s


SEQ = u64()
TS_MS = {"type": "integer", "minimum": 0, "description": "ms since the Unix epoch"}
ANY: J = {"description": "any JSON value"}

# --------------------------------------------------------------------- schemas


def schemas() -> J:
    s: J = {}
    s["Error"] = obj(
        {
            "error": obj(
                {
                    "code": text("stable value to branch on (docs/API.md, 3.3)"),
                    "message": text("for humans; may change"),
                    "detail": {
                        "type": "object",
                        "description": "structured context; left out when there is none",
                    },
                },
                ("code", "message"),
            )
        },
        ("error",),
        description="The error envelope every failure carries (docs/API.md, 3.1).",
    )
    s["Performance"] = obj(
        {
            "server_total_ms": number("time spent in the server", minimum=0),
            "wal_append_ms": number("a write: until the batch was committed", minimum=0),
            "fsync_ms": number("a write (0 unless fsync class); an fsync queue's ack", minimum=0),
            "records_scanned": u64("a diff: slots examined"),
            "cold_segments_read": u64("a diff that read cold-tier segments: how many"),
            "throttle_wait_ms": number("a write the pressure governor paced", minimum=0),
        },
        ("server_total_ms",),
        description="Timing figures; informational (docs/API.md, 1).",
    )
    s["TopicName"] = text(
        "1-255 ASCII characters; case-sensitive", pattern=TOPIC_PATTERN, maxLength=255
    )
    s["RouterName"] = text(
        "a topic name that may also hold `>`", pattern=ROUTER_PATTERN, maxLength=255
    )
    s["NodeFilter"] = nullable(
        {
            "anyOf": [
                text("one node"),
                {"type": "array", "items": {"type": "string"}, "description": "several nodes"},
            ],
            "description": "skip records whose `$node` is one of these",
        }
    )
    s["TagPredicate"] = {
        "description": (
            'A tag test (docs/API.md, 10): `["tag", "Eq", v]`, `["tag", "Glob", "p*"]` '
            '(a prefix; `"*"` alone matches any tag), or a bare string (`Eq`, or `Glob` '
            "when it ends in `*`). Records without a tag never match."
        ),
        "anyOf": [
            {"type": "string"},
            {
                "type": "array",
                "prefixItems": [{"const": "tag"}, {"const": "Eq"}, {"type": "string"}],
                "minItems": 3,
                "maxItems": 3,
            },
            {
                "type": "array",
                "prefixItems": [
                    {"const": "tag"},
                    {"const": "Glob"},
                    {"type": "string", "pattern": r"\*$"},
                ],
                "minItems": 3,
                "maxItems": 3,
            },
        ],
    }
    s["TopicConfigInput"] = obj(
        {
            "type": nullable({"enum": ["log", "queue"], "description": "fixed once created"}),
            "ttl_ms": nullable(u64("records expire once older (0: off)")),
            "cap_records": nullable(u64("keep only the newest seqs (0: off)")),
            "cap_bytes": nullable(u64("keep live bytes at or under this (0: off)")),
            "discard": nullable({"enum": ["old", "reject"]}),
            "durability": nullable(
                {"enum": ["ephemeral", "memory", "disk", "fsync"], "description": "from `durable`"}
            ),
            "durable": nullable(flag("read only without `durability`: true means fsync")),
            "priority": {
                "type": ["integer", "null"],
                "minimum": I32_MIN,
                "maximum": I32_MAX,
                "description": "manual priority, clamped to [-1000, 1000] when used",
            },
            "auto_priority": nullable(flag()),
            "auto_create": nullable(flag("read only in a creating write's inline config")),
            "idempotency_window_ms": nullable(u64()),
            "dedupe_node": nullable(flag()),
            "lease_ms": nullable(u64("queue: default lease; stored clamped to 100-86400000")),
            "claim_jitter_ms": nullable(u64("queue: claim window; stored clamped to <= 5000")),
            "max_deliveries": nullable(u64("queue: deliveries before dead-lettering (0: none)")),
            "dead_letter": {
                "type": ["string", "null"],
                "pattern": TOPIC_PATTERN,
                "description": "queue: where exhausted jobs go; not the queue itself",
            },
            "leases_durable": nullable(flag("queue: log lease changes")),
        },
        closed=False,
        description=(
            "A topic config (docs/API.md, 5). Every field is optional; a PUT replaces the "
            "whole config, so a left-out field takes its default."
        ),
    )
    s["TopicConfig"] = obj(
        {
            "type": {"enum": ["log", "queue"]},
            "ttl_ms": u64(),
            "cap_records": u64(),
            "cap_bytes": u64(),
            "discard": {"enum": ["old", "reject"]},
            "durable": flag("durability == fsync"),
            "durability": {"enum": ["ephemeral", "memory", "disk", "fsync"]},
            "priority": {"type": ["integer", "null"], "minimum": I32_MIN, "maximum": I32_MAX},
            "auto_priority": flag(),
            "auto_create": flag(),
            "idempotency_window_ms": u64(),
            "dedupe_node": flag(),
            "lease_ms": {"type": "integer", "minimum": 100, "maximum": 86_400_000},
            "claim_jitter_ms": {"type": "integer", "minimum": 0, "maximum": 5000},
            "max_deliveries": u64(),
            "dead_letter": {"type": ["string", "null"]},
            "leases_durable": flag(),
        },
        (
            "type",
            "ttl_ms",
            "cap_records",
            "cap_bytes",
            "discard",
            "durable",
            "durability",
            "priority",
            "auto_priority",
            "auto_create",
            "idempotency_window_ms",
            "dedupe_node",
            "lease_ms",
            "claim_jitter_ms",
            "max_deliveries",
            "dead_letter",
            "leases_durable",
        ),
        description="A stored topic config: all 17 fields, always.",
    )
    s["RecordInput"] = obj(
        {
            "data": ANY,
            "tag": nullable(text("at most 256 bytes", maxLength=256)),
            "node": nullable(text("at most 128 bytes; overrides the batch node", maxLength=128)),
            "meta": {
                "description": "any JSON; at most 16384 bytes serialised and, as an object, 64 keys",
                "anyOf": [
                    {"type": "object", "maxProperties": 64},
                    {"type": ["array", "string", "number", "boolean", "null"]},
                ],
            },
        },
        ("data",),
        closed=False,
        description="A record to append (docs/API.md, 4). `data` + `meta` at most 1 MiB.",
    )
    record_props: J = {
        "$seq": SEQ,
        "$ts": TS_MS,
        "$node": text(),
        "$tag": text(),
        "data": ANY,
        "meta": ANY,
    }
    s["Record"] = obj(
        record_props,
        ("$seq", "$ts", "data"),
        description="A stored record (docs/API.md, 4); absent fields are left out.",
    )
    s["FrameRecord"] = obj(
        record_props,
        ("$seq", "$ts"),
        description="A record in a stream frame; `data` is left out with `include_data: false`.",
    )
    s["Tombstone"] = obj(
        {
            "gap_from": SEQ,
            "gap_to": SEQ,
            "reason": {
                "enum": [
                    "cap",
                    "ttl",
                    "mixed",
                    "source_trim",
                    "recreated",
                    "corrupt",
                    "from_seq_too_old",
                ]
            },
            "missed_estimate": u64("diff only"),
            "earliest_seq": SEQ,
            "head_seq": SEQ,
        },
        ("gap_from", "gap_to", "reason", "earliest_seq", "head_seq"),
        description="Seqs lost before the reader got them (docs/API.md, 9).",
    )
    s["QueueCounters"] = obj(
        {"ready": u64(), "in_flight": u64(), "dead_lettered": u64()},
        ("ready", "in_flight", "dead_lettered"),
    )
    job: J = {
        "$seq": SEQ,
        "lease_id": text(pattern=r"^lease_[0-9a-f]+$"),
        "deadline": TS_MS,
        "$ts": TS_MS,
        "$tag": text(),
        "deliveries": {"type": "integer", "minimum": 1},
        "data": ANY,
        "meta": ANY,
    }
    job_fields = ("$seq", "lease_id", "deadline", "$ts", "deliveries", "data")
    s["Job"] = obj(job, job_fields, description="A leased job (docs/API.md, 14.1).")
    s["WorkJob"] = obj(
        {"topic": ref("TopicName"), **job},
        ("topic", *job_fields),
        description="A job as a /work stream sends it: the job plus its queue's name.",
    )
    s["TopicPut"] = obj(
        {
            "topic": ref("TopicName"),
            "created": flag(),
            "config": ref("TopicConfig"),
            "performance": ref("Performance"),
        },
        ("topic", "created", "config", "performance"),
    )
    s["TopicState"] = obj(
        {
            "topic": ref("TopicName"),
            "type": {"enum": ["log", "queue"]},
            "head_seq": SEQ,
            "earliest_seq": SEQ,
            "next_seq": {"type": "integer", "minimum": 1},
            "count": u64("live records"),
            "bytes": u64("their size"),
            "config": ref("TopicConfig"),
            "effective_priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "last_write_ts": {"type": ["integer", "null"]},
            "last_read_ts": {"type": ["integer", "null"]},
            "queue": ref("QueueCounters"),
            "performance": ref("Performance"),
        },
        (
            "topic",
            "type",
            "head_seq",
            "earliest_seq",
            "next_seq",
            "count",
            "bytes",
            "config",
            "effective_priority",
            "last_write_ts",
            "last_read_ts",
            "performance",
        ),
        description="A topic's state (docs/API.md, 6.2); `queue` on queue topics only.",
    )
    s["TopicList"] = obj(
        {
            "topics": {
                "type": "array",
                "items": obj(
                    {
                        "topic": ref("TopicName"),
                        "head_seq": SEQ,
                        "earliest_seq": SEQ,
                        "count": u64(),
                        "bytes": u64(),
                        "durable": flag(),
                        "effective_priority": {
                            "type": "integer",
                            "minimum": -1000,
                            "maximum": 1000,
                        },
                    },
                    (
                        "topic",
                        "head_seq",
                        "earliest_seq",
                        "count",
                        "bytes",
                        "durable",
                        "effective_priority",
                    ),
                ),
            },
            "next_cursor": text("present when more names follow"),
            "performance": ref("Performance"),
        },
        ("topics", "performance"),
    )
    s["TopicDeleted"] = obj(
        {
            "topic": text(),
            "deleted": flag("false when there was no such topic"),
            "routers_removed": {"type": "array", "items": ref("RouterName")},
            "performance": ref("Performance"),
        },
        ("topic", "deleted", "routers_removed", "performance"),
    )
    s["WriteRequest"] = obj(
        {
            "records": {
                "type": "array",
                "minItems": 1,
                "maxItems": 10000,
                "items": ref("RecordInput"),
            },
            "node": nullable(text("the node of every record without one", maxLength=128)),
            "idempotency_key": nullable(
                text("wins over the Idempotency-Key header", maxLength=256)
            ),
            "create": nullable(flag("true: create if absent; false: 404 if absent")),
            "config": {
                "type": ["object", "null"],
                "description": "a topic config (TopicConfigInput), applied and checked only "
                "when this write creates the topic; otherwise it is ignored",
            },
            "disable_backpressure": nullable(flag("never refused by the pressure governor")),
        },
        ("records",),
        closed=False,
        description="An atomic batch (docs/API.md, 7.1).",
    )
    s["WriteAck"] = obj(
        {
            "topic": ref("TopicName"),
            "first_seq": SEQ,
            "last_seq": SEQ,
            "seqs": {"type": "array", "items": SEQ, "description": "absent with return_seqs=false"},
            "head_seq": SEQ,
            "count": u64("records in this batch"),
            "created": flag(),
            "deduped": flag("a replay of an earlier write with the same key"),
            "performance": ref("Performance"),
        },
        (
            "topic",
            "first_seq",
            "last_seq",
            "head_seq",
            "count",
            "created",
            "deduped",
            "performance",
        ),
    )
    s["DiffRequest"] = obj(
        {
            "from_seq": nullable(u64("records with $seq > from_seq")),
            "limit": nullable(u32("0 means 256; above 1000 means 1000")),
            "node": ref("NodeFilter"),
            "include_tags": nullable(flag()),
            "include_meta": nullable(flag()),
            "wait_ms": nullable(u32("long-poll; at most 30000 is used")),
            "max_batch_bytes": nullable(u64("0 means 1048576; at most 8388608 is used")),
        },
        closed=False,
        description="A diff (docs/API.md, 8.1); an empty body means all defaults.",
    )
    s["DiffResult"] = obj(
        {
            "topic": ref("TopicName"),
            "records": {"type": "array", "items": ref("Record")},
            "next_from_seq": SEQ,
            "head_seq": SEQ,
            "earliest_seq": SEQ,
            "caught_up": flag(),
            "tombstone": {"anyOf": [ref("Tombstone"), {"type": "null"}]},
            "lag": u64(),
            "performance": ref("Performance"),
        },
        (
            "topic",
            "records",
            "next_from_seq",
            "head_seq",
            "earliest_seq",
            "caught_up",
            "tombstone",
            "lag",
            "performance",
        ),
    )
    s["DeleteRecordsRequest"] = obj(
        {
            "before_seq": nullable(u64("delete live records with $seq < before_seq")),
            "match": nullable(ref("TagPredicate")),
        },
        closed=False,
        anyOf=[
            {"required": ["before_seq"], "properties": {"before_seq": {"type": "integer"}}},
            {"required": ["match"], "properties": {"match": {"not": {"type": "null"}}}},
        ],
        description="At least one of the two; with both, a record must satisfy both.",
    )
    s["DeleteRecordsResult"] = obj(
        {
            "topic": ref("TopicName"),
            "deleted": u64("records this call removed"),
            "earliest_seq": SEQ,
            "head_seq": SEQ,
            "count": u64(),
            "bytes": u64(),
            "performance": ref("Performance"),
        },
        ("topic", "deleted", "earliest_seq", "head_seq", "count", "bytes", "performance"),
    )
    s["ClaimRequest"] = obj(
        {
            "node": text("the worker; 1-128 bytes", minLength=1, maxLength=128),
            "max": nullable(u32("0 means 1; above 1000 means 1000")),
            "lease_ms": nullable(u64("clamped to 100-86400000; default: the queue's")),
        },
        ("node",),
        closed=False,
    )
    s["ClaimResult"] = obj(
        {
            "topic": ref("TopicName"),
            "claimed": {"type": "array", "items": ref("Job")},
            "count": u64(),
            "ready": u64(),
            "performance": ref("Performance"),
        },
        ("topic", "claimed", "count", "ready", "performance"),
    )
    batch: J = {
        "node": text("the worker holding the leases", minLength=1),
        "seqs": {"type": "array", "maxItems": 1000, "items": SEQ},
        "lease_ids": nullable(
            {
                "type": "array",
                "items": {"type": "string", "pattern": LEASE_FENCE_PATTERN},
                "description": 'empty, or one entry per seq (`""`: no check for that seq)',
            }
        ),
    }
    s["AckRequest"] = obj(batch, ("node", "seqs"), closed=False)
    s["NackRequest"] = obj(
        {**batch, "delay_ms": nullable(u64("claimable again after this; at most 86400000"))},
        ("node", "seqs"),
        closed=False,
    )
    s["ExtendRequest"] = obj(
        {**batch, "lease_ms": u64("new deadline: now + this, clamped to 100-86400000")},
        ("node", "seqs", "lease_ms"),
        closed=False,
    )
    skipped = {"type": "array", "items": SEQ, "description": "seqs not matched, in order"}
    for name, done in (("AckResult", "acked"), ("NackResult", "nacked")):
        s[name] = obj(
            {
                "topic": ref("TopicName"),
                done: u64(),
                "skipped": skipped,
                "ready": u64(),
                "in_flight": u64(),
                "performance": ref("Performance"),
            },
            ("topic", done, "skipped", "ready", "in_flight", "performance"),
        )
    s["ExtendResult"] = obj(
        {
            "topic": ref("TopicName"),
            "extended": u64(),
            "skipped": skipped,
            "deadlines": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": TS_MS,
                "description": "seq (decimal) -> its new deadline",
            },
            "performance": ref("Performance"),
        },
        ("topic", "extended", "skipped", "deadlines", "performance"),
    )
    router_props: J = {
        "router": ref("RouterName"),
        "source": ref("TopicName"),
        "dest": ref("TopicName"),
        "preserve_node": flag(),
        "preserve_tag": flag(),
        "filter": {
            "anyOf": [
                {
                    "type": "array",
                    "prefixItems": [
                        {"const": "tag"},
                        {"enum": ["Eq", "Glob"]},
                        {"type": "string"},
                    ],
                    "minItems": 3,
                    "maxItems": 3,
                },
                {"type": "null"},
            ]
        },
        "allow_cycle": flag(),
        "guarantee": {"enum": ["at_least_once", "exactly_once"]},
    }
    router_fields = (
        "router",
        "source",
        "dest",
        "preserve_node",
        "preserve_tag",
        "filter",
        "allow_cycle",
        "guarantee",
    )
    s["RouterRequest"] = obj(
        {
            "source": ref("TopicName"),
            "dest": {"allOf": [ref("TopicName")], "description": "different from source"},
            "preserve_node": nullable(flag("false drops $node from copies")),
            "preserve_tag": nullable(flag("false drops $tag from copies")),
            "create_dest": nullable(flag("false: the dest must exist")),
            "filter": nullable(ref("TagPredicate")),
            "allow_cycle": nullable(flag("skip the cycle check")),
            "guarantee": nullable({"enum": ["at_least_once", "exactly_once"]}),
        },
        ("source", "dest"),
        closed=False,
        description="A router (docs/API.md, 11.1); missing topics are created.",
    )
    s["RouterPut"] = obj(
        {
            **router_props,
            "created": flag(),
            "performance": ref("Performance"),
        },
        (*router_fields, "created", "performance"),
    )
    s["RouterState"] = obj(
        {
            **router_props,
            "forwarded_total": u64("source seqs dealt with so far"),
            "performance": ref("Performance"),
        },
        (*router_fields, "forwarded_total", "performance"),
    )
    s["RouterList"] = obj(
        {
            "routers": {
                "type": "array",
                "items": obj(
                    {
                        "router": ref("RouterName"),
                        "source": ref("TopicName"),
                        "dest": ref("TopicName"),
                        "guarantee": {"enum": ["at_least_once", "exactly_once"]},
                        "forwarded_total": u64(),
                    },
                    ("router", "source", "dest", "guarantee", "forwarded_total"),
                ),
            },
            "next_cursor": text("present when more names follow"),
            "performance": ref("Performance"),
        },
        ("routers", "performance"),
    )
    s["RouterDeleted"] = obj(
        {
            "router": text(),
            "deleted": flag("false when there was no such router"),
            "performance": ref("Performance"),
        },
        ("router", "deleted", "performance"),
    )
    s["WatchRequest"] = obj(
        {
            "topics": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 256,
                "additionalProperties": nullable(
                    obj(
                        {
                            "from_seq": nullable(u64("default 0")),
                            "tail": nullable(flag("start at the head; from_seq is ignored")),
                        },
                        closed=False,
                    )
                ),
                "description": "topic name -> where its stream starts",
            },
            "node": ref("NodeFilter"),
            "limit": nullable(u32("records per frame; 0 means 256; at most 1000")),
            "max_batch_bytes": nullable(u64("0 means 1048576; at most 8388608")),
            "heartbeat_ms": nullable(u64("clamped to 1000-60000; default 15000")),
            "include_meta": nullable(flag()),
            "include_tags": nullable(flag()),
            "include_data": nullable(flag()),
            "consistency": nullable({"enum": ["eventual", "strong"]}),
        },
        ("topics",),
        closed=False,
        description="A watch session (docs/API.md, 12.1).",
    )
    s["WatchCreated"] = obj(
        {
            "wid": text(pattern=WID_PATTERN),
            "stream_url": text(pattern=r"^/v0/watch/wid_[A-Za-z0-9_-]{22}$"),
            "session_ttl_ms": u64(),
            "topics": {
                "type": "object",
                "additionalProperties": obj(
                    {"from_seq": SEQ, "head_seq": SEQ, "earliest_seq": SEQ},
                    ("from_seq", "head_seq", "earliest_seq"),
                ),
            },
            "performance": ref("Performance"),
        },
        ("wid", "stream_url", "session_ttl_ms", "topics", "performance"),
    )

    def event(name: str, data: J, *, with_id: bool = True) -> J:
        props: J = {
            "event": {"const": name},
            "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
        }
        if with_id:
            props["id"] = {"type": "string"}
        props["retry"] = {"type": "integer"}
        return obj(props, ("event", "data"))

    s["WatchEvent"] = {
        "description": (
            "One event of a watch stream (docs/API.md, 12.3). The stream opens with "
            "`retry: 2000`; `: hb` comments break silences."
        ),
        "anyOf": [
            event(
                "record",
                obj(
                    {
                        "topic": text(),
                        "from_seq": SEQ,
                        "head_seq": SEQ,
                        "records": {"type": "array", "items": ref("FrameRecord")},
                        "to_seq": SEQ,
                    },
                    ("topic", "from_seq", "head_seq", "records", "to_seq"),
                ),
            ),
            event(
                "tombstone",
                obj(
                    {
                        "topic": text(),
                        "reason": {"type": "string"},
                        "gap_from": SEQ,
                        "gap_to": SEQ,
                        "earliest_seq": SEQ,
                        "head_seq": SEQ,
                    },
                    ("topic", "reason", "gap_from", "gap_to", "earliest_seq", "head_seq"),
                ),
            ),
            event(
                "caught-up",
                obj({"topic": text(), "head_seq": SEQ}, ("topic", "head_seq")),
            ),
            event(
                "topic-deleted",
                obj(
                    {"topic": text(), "head_seq": {"const": 0}, "reason": {"const": "deleted"}},
                    ("topic", "head_seq", "reason"),
                ),
            ),
            event(
                "error",
                obj(
                    {"code": {"const": "server_shutting_down"}, "message": text()},
                    ("code", "message"),
                ),
            ),
        ],
    }
    s["WorkEvent"] = {
        "description": (
            "One event of a /work stream (docs/API.md, 14.6): a `job` (its id is the seq) "
            "or a final `error`. The stream opens with `retry: 2000`."
        ),
        "anyOf": [
            event("job", ref("WorkJob")),
            event(
                "error",
                obj(
                    {
                        "code": {"enum": [409, 403, "server_shutting_down"]},
                        "error": text(),
                        "topic": text(),
                    },
                    ("code", "error", "topic"),
                ),
            ),
        ],
    }
    s["Health"] = obj(
        {"status": {"const": "ok"}, "version": text(), "uptime_ms": u64()},
        ("status", "version", "uptime_ms"),
    )
    s["Ready"] = obj(
        {
            "status": {"enum": ["ready", "degraded"]},
            "wal_replay_complete": {"const": True},
            "topics": u64(),
            "writable": {"const": False, "description": "degraded only"},
            "degraded": obj(
                {
                    "disk_full": {"type": "array", "items": {"type": "string"}},
                    "read_only": {"type": "array", "items": {"type": "string"}},
                },
                description="WAL shard directories that cannot take writes",
            ),
        },
        ("status", "wal_replay_complete", "topics"),
    )
    s["Metrics"] = obj(
        {
            "topics": u64(),
            "topics_ephemeral": u64(),
            "topics_memory": u64(),
            "topics_disk": u64(),
            "topics_fsync": u64(),
            "routers": u64(),
            "records_live": u64(),
            "bytes_live": u64(),
            "queue_topics": u64(),
            "queue_leases_in_flight": u64(),
            "sse_connections": u64(),
            "watch_sessions": u64(),
            "ready": flag(),
            "replay_progress": number(minimum=0, maximum=1),
            "uptime_ms": u64(),
            "wal": {"type": "object", "description": "the write-ahead log's figures"},
            "storage": {"type": "object", "description": "indexes, segments, checkpoints"},
            "scheduler": {"type": "object", "description": "docs/SCHEDULER.md"},
            "kafka": {"type": "object", "description": "while the Kafka listener runs"},
        },
        (
            "topics",
            "topics_ephemeral",
            "topics_memory",
            "topics_disk",
            "topics_fsync",
            "routers",
            "records_live",
            "bytes_live",
            "queue_topics",
            "queue_leases_in_flight",
            "sse_connections",
            "watch_sessions",
            "ready",
            "replay_progress",
            "uptime_ms",
        ),
        description=(
            "The JSON form of the metrics (docs/API.md, 15.3). A prefix-restricted key gets "
            "its own share and none of `wal`, `storage`, `scheduler`, `kafka`."
        ),
    )
    return s


# ------------------------------------------------------------------- responses


def error_response(description: str, codes: list[str], *, retry_after: int | None = None) -> J:
    """A response carrying the error envelope whose `code` is one of `codes`."""
    schema: J = {
        "allOf": [ref("Error")],
        "properties": {"error": {"properties": {"code": {"enum": codes}}}},
    }
    r: J = {"description": description, "content": {JSON: {"schema": schema}}}
    if retry_after is not None:
        r["headers"] = {"Retry-After": {"$ref": f"#/components/headers/RetryAfter{retry_after}"}}
    return r


def common_responses() -> J:
    return {
        "Unauthorized": error_response(
            "No bearer token, or one that matches no key (auth on).", ["unauthorized"]
        ),
        "Forbidden": error_response(
            "The key lacks the route's scope, or a name is outside its prefixes "
            "(docs/API.md, 2.2 and 2.3).",
            ["forbidden"],
        ),
        "NotAcceptable": error_response(
            "`Accept` rules out text/event-stream.", ["not_acceptable"]
        ),
        "PayloadTooLarge": error_response(
            "The body is over TOPICS_MAX_BODY_BYTES, or 1 MiB or more and too dense to "
            "parse; a write whose log frames would not fit one WAL file.",
            ["payload_too_large"],
        ),
        "UriTooLong": error_response(
            "The request target (path and query) is over 8192 bytes.", ["uri_too_long"]
        ),
        "UnsupportedMediaType": error_response(
            "A body without an application/json content type.", ["unsupported_media_type"]
        ),
        "Throttled": error_response(
            "A resource cap (`detail {limit, max}`), the WAL ingest queue is full, or the "
            "server is saturated (docs/API.md, 16).",
            ["throttled"],
            retry_after=1,
        ),
        "HeadersTooLarge": error_response(
            "More than 100 header fields, or more than 32768 bytes of them.",
            ["headers_too_large"],
        ),
        "Internal": error_response(
            "The change could not be logged, stored data cannot be read, or a bug.",
            ["internal"],
        ),
        "Unavailable": error_response(
            "Recovery is still running (`not_ready`, `detail {replay_progress}`); the "
            "connection caps are reached (`too_many_connections`); a read needed the "
            "object-store cold tier and it failed (`cold_tier_unavailable`).",
            ["not_ready", "too_many_connections", "cold_tier_unavailable"],
            retry_after=1,
        ),
        "ProbeUnavailable": error_response(
            "The connection caps are reached.", ["too_many_connections"], retry_after=1
        ),
        "InsufficientStorage": error_response(
            "The disk holding the WAL is full; nothing was applied.",
            ["insufficient_storage"],
            retry_after=5,
        ),
    }


def rref(name: str) -> J:
    return {"$ref": f"#/components/responses/{name}"}


def ok(schema: J, description: str, links: J | None = None) -> J:
    r: J = {"description": description, "content": {JSON: {"schema": schema}}}
    if links:
        r["links"] = links
    return r


def links(name: str, pointer: str, *op_ids: str) -> J:
    """Links to `op_ids`, whose path parameter `name` is this response's `pointer`."""
    return {
        op_id: {"operationId": op_id, "parameters": {name: f"$response.body#{pointer}"}}
        for op_id in op_ids
    }


def bad_request(codes: list[str] | None = None, description: str = "The request is invalid.") -> J:
    return error_response(description, codes or ["invalid_request"])


# ----------------------------------------------------------------- parameters


def qbool(name: str, default: bool, description: str) -> J:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": (
            f"{description} `true`/`1` or `false`/`0`; any other value means the default "
            f"({'true' if default else 'false'})."
        ),
        "schema": {"type": "string", "examples": ["true", "false"]},
    }


def query(name: str, description: str, schema: J | None = None, required: bool = False) -> J:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def path_param(name: str, description: str, schema: J, example: str | None = None) -> J:
    p: J = {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }
    if example is not None:
        p["example"] = example
    return p


#: A path name the server takes whatever it is (a DELETE of a name that cannot exist).
ANY_NAME: J = {"type": "string", "minLength": 1, "pattern": "^[^/]+$"}
LOG_PARAM = path_param("topic", "The topic name.", ref("TopicName"), "metrics.cpu")
QUEUE_PARAM = path_param("topic", "The queue's name.", ref("TopicName"), "billing.jobs")
ROUTER_PARAM = path_param("router", "The router name.", ref("RouterName"), "clicks->lake")
PAGE_SIZE = query(
    "page_size",
    "Names per page: default 100, clamped to 1-1000; an unparsable value means 100.",
    {"type": "string", "examples": ["100"]},
)
CURSOR = query(
    "cursor",
    "The `next_cursor` of the previous page (opaque); empty means the first page.",
)

# ------------------------------------------------------------------ operations

BEARER = [{"bearerAuth": []}]
SSE_AUTH = [{"bearerAuth": []}, {"tokenQuery": []}]
PUBLIC: list[J] = []


def op(
    op_id: str,
    tag: str,
    summary: str,
    description: str,
    responses: J,
    *,
    params: list[J] | None = None,
    body: J | None = None,
    body_required: bool = True,
    security: list[J] | None = None,
    secured: bool = True,
    body_route: bool = False,
    example: Any = None,
) -> J:
    """One operation; adds the statuses every operation of its kind can answer."""
    o: J = {"operationId": op_id, "tags": [tag], "summary": summary, "description": description}
    if params:
        o["parameters"] = params
    if body is not None:
        media: J = {"schema": body}
        if example is not None:
            media["example"] = example
        o["requestBody"] = {"required": body_required, "content": {JSON: media}}
    if security is not None:
        o["security"] = security
    r = dict(responses)
    if body_route:
        r.setdefault("413", rref("PayloadTooLarge"))
        r.setdefault("415", rref("UnsupportedMediaType"))
    if secured:
        r.setdefault("401", rref("Unauthorized"))
        r.setdefault("429", rref("Throttled"))
    r.setdefault("414", rref("UriTooLong"))
    r.setdefault("431", rref("HeadersTooLarge"))
    r.setdefault("500", rref("Internal"))
    r.setdefault("503", rref("Unavailable"))
    o["responses"] = dict(sorted(r.items()))
    return o


def paths() -> J:
    p: J = {}
    forbidden = rref("Forbidden")
    storage_full = rref("InsufficientStorage")
    topic_404 = error_response("No such topic.", ["topic_not_found"])
    not_a_queue = error_response("A queue route on a `log` topic.", ["not_a_queue"])
    topic_links = links(
        "topic", "/topic", "getTopic", "writeRecords", "diff", "deleteRecords", "deleteTopic"
    )
    read_links = links("topic", "/topic", "getTopic", "diff")
    router_links = links("router", "/router", "getRouter", "deleteRouter")
    no_name = error_response(
        "The path names nothing (an empty name, or one holding `/`): no route matches.",
        ["not_found"],
    )

    p["/v0/topics"] = {
        "get": op(
            "listTopics",
            "topics",
            "List topics",
            "Topics by name (byte order), a page at a time (docs/API.md, 6.3). A "
            "prefix-restricted key sees only its own topics. Scope: read.",
            {
                "200": ok(ref("TopicList"), "A page of topics."),
                "400": bad_request(description="A cursor that does not decode."),
                "403": forbidden,
            },
            params=[
                query("prefix", "Only names starting with this."),
                PAGE_SIZE,
                CURSOR,
                qbool("touch", False, "Count as a read for the listed topics' priority."),
            ],
        )
    }
    p["/v0/topics/{topic}"] = {
        "parameters": [LOG_PARAM],
        "put": op(
            "putTopic",
            "topics",
            "Create or reconfigure a topic",
            "Creates the topic, or replaces the whole config of the existing one "
            "(docs/API.md, 6.1). An empty body (no content type needed) or `null` means all "
            "defaults. The change is logged and synced before the answer. Scope: admin.",
            {
                "200": ok(ref("TopicPut"), "The topic existed; its config now.", topic_links),
                "201": ok(ref("TopicPut"), "The topic was created.", topic_links),
                "400": bad_request(
                    description="An invalid topic name or config; a queue dead-lettering "
                    "into itself."
                ),
                "403": forbidden,
                "409": error_response(
                    "The topic exists with another `type`.", ["topic_exists_incompatible"]
                ),
                "507": storage_full,
            },
            body=nullable(ref("TopicConfigInput")),
            body_required=False,
            body_route=True,
            example={"ttl_ms": 600000, "cap_records": 1000, "durability": "disk"},
        ),
        "get": op(
            "getTopic",
            "topics",
            "A topic's state",
            "Watermarks, counts, config and priority (docs/API.md, 6.2); routers feeding "
            "the topic are caught up first. Never creates anything. Scope: read.",
            {
                "200": ok(ref("TopicState"), "The topic's state."),
                "403": forbidden,
                "404": topic_404,
            },
            params=[qbool("touch", True, "Also mark the topic as read now.")],
        ),
        "delete": op(
            "deleteTopic",
            "topics",
            "Delete a topic",
            "Ends the topic with its records, keys, queue state and every router touching "
            "it (docs/API.md, 6.4). Deleting an absent topic is `200` with "
            "`deleted: false`, whatever the name. Scope: delete.",
            {
                "200": ok(ref("TopicDeleted"), "Deleted, or there was nothing to delete."),
                "403": forbidden,
                "404": no_name,
                "409": error_response(
                    "`if_empty` and the topic holds live records.", ["topic_not_empty"]
                ),
                "507": storage_full,
            },
            params=[
                path_param(
                    "topic",
                    "Any name: one that cannot exist is simply absent.",
                    ANY_NAME,
                    "scratch",
                ),
                qbool("if_empty", False, "Refuse unless the topic has no live records."),
            ],
        ),
        "post": op(
            "writeRecords",
            "records",
            "Append records",
            "Appends an atomic batch with consecutive seqs; the topic is created on first "
            "write unless the body says otherwise (docs/API.md, 7). Scope: write, and admin "
            "too when `config` would create the topic.",
            {
                "200": ok(ref("WriteAck"), "Appended (or replayed for a known key).", read_links),
                "201": ok(ref("WriteAck"), "Appended; this write created the topic.", read_links),
                "400": bad_request(
                    ["invalid_request", "batch_too_large", "record_too_large"],
                    "An invalid body, more than 10000 records, a record over 1 MiB, or a "
                    "batch that could never fit a `discard: reject` topic.",
                ),
                "403": forbidden,
                "404": error_response(
                    "Absent, and `create: false` or an inline `auto_create: false`.",
                    ["topic_not_found"],
                ),
                "422": error_response(
                    "A full `discard: reject` topic cannot take the batch now.", ["topic_full"]
                ),
                "507": storage_full,
            },
            params=[
                qbool("return_seqs", True, "Leave `seqs` out of the answer when false."),
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "description": "Used when the body has no `idempotency_key` "
                    "(docs/API.md, 7.2); at most 256 bytes.",
                    "schema": {"type": "string", "maxLength": 256},
                },
            ],
            body=ref("WriteRequest"),
            body_route=True,
            example={
                "records": [
                    {"data": {"load": 0.42}, "tag": "host:7", "node": "agent-2"},
                    {"data": {"load": 0.47}, "meta": {"trace": "a7e2"}},
                ]
            },
        ),
    }
    p["/v0/topics/{topic}/diff"] = {
        "parameters": [LOG_PARAM],
        "post": op(
            "diff",
            "records",
            "Read records after a cursor",
            "Records with `$seq > from_seq`, with an optional long-poll (docs/API.md, 8.1). "
            "The server keeps no reader state: the client stores `next_from_seq`. An empty "
            "body (no content type needed) or `null` means all defaults. Scope: read.",
            {
                "200": ok(ref("DiffResult"), "Records, watermarks and any tombstone."),
                "400": bad_request(),
                "403": forbidden,
                "404": topic_404,
            },
            body=nullable(ref("DiffRequest")),
            body_required=False,
            body_route=True,
            example={"from_seq": 0, "limit": 100, "include_tags": True, "node": "agent-1"},
        ),
    }
    p["/v0/topics/{topic}/delete"] = {
        "parameters": [LOG_PARAM],
        "post": op(
            "deleteRecords",
            "records",
            "Delete records",
            "Removes live records by seq bound and/or tag, at once for every reader and "
            "without a tombstone (docs/API.md, 10). Scope: delete.",
            {
                "200": ok(ref("DeleteRecordsResult"), "What was removed; the topic after."),
                "400": bad_request(),
                "403": forbidden,
                "404": topic_404,
                "507": storage_full,
            },
            body=ref("DeleteRecordsRequest"),
            body_route=True,
            example={"match": ["tag", "Glob", "host:*"]},
        ),
    }
    queue_errors: J = {"403": forbidden, "404": topic_404, "409": not_a_queue, "507": storage_full}
    p["/v0/topics/{topic}/claim"] = {
        "parameters": [QUEUE_PARAM],
        "post": op(
            "claim",
            "queues",
            "Lease jobs",
            "Leases up to `max` jobs to a worker (docs/API.md, 14.2); fewer, or none, is "
            "normal. With `claim_jitter_ms` the claims of a window are served together. "
            "Scope: read and write.",
            {
                "200": ok(ref("ClaimResult"), "The jobs leased, by seq."),
                "400": bad_request(description="An empty body, no `node`, a bad field."),
                **queue_errors,
            },
            body=ref("ClaimRequest"),
            body_route=True,
            example={"node": "worker-1", "max": 2},
        ),
    }
    queue_extra: dict[str, J] = {"ack": {}, "nack": {"delay_ms": 0}, "extend": {"lease_ms": 60000}}
    for name, what, req, res, summary in (
        ("ack", "Confirms jobs are done: each matched job is deleted.", "Ack", "Ack", "Ack jobs"),
        (
            "nack",
            "Gives jobs back, at once or after `delay_ms`; deliveries are kept.",
            "Nack",
            "Nack",
            "Release jobs",
        ),
        (
            "extend",
            "Moves the deadline of active leases to now + `lease_ms`.",
            "Extend",
            "Extend",
            "Extend leases",
        ),
    ):
        section = {"ack": "14.3", "nack": "14.4", "extend": "14.5"}[name]
        extra = queue_extra[name]
        p[f"/v0/topics/{{topic}}/{name}"] = {
            "parameters": [QUEUE_PARAM],
            "post": op(
                name,
                "queues",
                summary,
                f"{what} A seq matches when `node` holds an active lease on it (and, with a "
                f"lease id, that lease); the others come back in `skipped` "
                f"(docs/API.md, {section}). Scope: write.",
                {
                    "200": ok(ref(f"{res}Result"), "What matched and the queue's counters."),
                    "400": bad_request(
                        ["invalid_request", "batch_too_large"],
                        "A bad body, more than 1000 seqs, or `lease_ids` that is not empty "
                        "and not one entry per seq.",
                    ),
                    **queue_errors,
                },
                body=ref(f"{req}Request"),
                body_route=True,
                example={"node": "worker-1", "seqs": [1], **extra},
            ),
        }
    p["/v0/topics/{topic}/work"] = {
        "parameters": [QUEUE_PARAM],
        "get": op(
            "work",
            "queues",
            "Jobs pushed over Server-Sent Events",
            "Keeps `max` leases outstanding for this connection, claiming more as the worker "
            "acks and at least every 250 ms (docs/API.md, 14.6). Leases this connection "
            "got are released when it closes. `Accept` must allow text/event-stream. Scope: "
            "read and write; the key may come as `?token=`.",
            {
                "200": {
                    "description": "The stream (`Cache-Control: no-store`, "
                    "`X-Accel-Buffering: no`).",
                    "headers": {
                        "Cache-Control": {"$ref": "#/components/headers/NoStore"},
                        "X-Accel-Buffering": {"$ref": "#/components/headers/NoBuffering"},
                    },
                    "content": {SSE: {"schema": ref("WorkEvent")}},
                },
                "400": bad_request(description="`node` missing, empty or over 128 bytes."),
                "403": forbidden,
                "404": topic_404,
                "406": rref("NotAcceptable"),
                "409": not_a_queue,
            },
            params=[
                query(
                    "node",
                    "The worker, 1-128 bytes.",
                    {"type": "string", "minLength": 1, "maxLength": 128, "examples": ["worker-2"]},
                    required=True,
                ),
                query(
                    "max",
                    "Leases to keep: default 1, clamped to 1-1000; unparsable means 1.",
                    {"type": "string", "examples": ["1"]},
                ),
                query(
                    "lease_ms",
                    "Lease length (clamped to 100-86400000); unparsable is ignored.",
                    {"type": "string", "examples": ["30000"]},
                ),
            ],
            security=SSE_AUTH,
        ),
    }
    p["/v0/routers"] = {
        "get": op(
            "listRouters",
            "routers",
            "List routers",
            "Routers by name, a page at a time (docs/API.md, 11.3). A prefix-restricted "
            "key sees only routers whose name, source and dest it may all touch. Scope: read.",
            {
                "200": ok(ref("RouterList"), "A page of routers."),
                "400": bad_request(description="A cursor that does not decode."),
                "403": forbidden,
            },
            params=[
                query("prefix", "Only router names starting with this."),
                query("source", "Only routers from this source topic."),
                query("dest", "Only routers into this dest topic."),
                PAGE_SIZE,
                CURSOR,
            ],
        )
    }
    p["/v0/routers/{router}"] = {
        "parameters": [ROUTER_PARAM],
        "put": op(
            "putRouter",
            "routers",
            "Create or update a router",
            "Copies every record committed to `source` from now on into `dest` "
            "(docs/API.md, 11). An update may change the options, never the source or "
            "dest. Scope: admin.",
            {
                "200": ok(ref("RouterPut"), "Updated.", router_links),
                "201": ok(ref("RouterPut"), "Created.", router_links),
                "400": bad_request(description="A bad body or name; `source` equal to `dest`."),
                "403": forbidden,
                "404": error_response(
                    "`create_dest: false` and the dest does not exist.", ["topic_not_found"]
                ),
                "409": error_response(
                    "The dest already has a router from another source, the router would be "
                    "re-pointed, or the new edge closes a cycle.",
                    ["topic_exists_incompatible", "router_cycle"],
                ),
                "507": storage_full,
            },
            body=ref("RouterRequest"),
            body_route=True,
            example={
                "source": "web.clicks",
                "dest": "lake.clicks",
                "filter": ["tag", "Glob", "de:*"],
                "guarantee": "exactly_once",
            },
        ),
        "get": op(
            "getRouter",
            "routers",
            "A router",
            "Forwards what is pending, then describes the router (docs/API.md, 11.2). Scope: read.",
            {
                "200": ok(ref("RouterState"), "The router and its progress."),
                "403": forbidden,
                "404": error_response("No such router.", ["router_not_found"]),
            },
        ),
        "delete": op(
            "deleteRouter",
            "routers",
            "Delete a router",
            "Stops forwarding at once; copies already made stay (docs/API.md, 11.4). An "
            "absent router is `200` with `deleted: false`. Scope: delete.",
            {
                "200": ok(ref("RouterDeleted"), "Deleted, or there was nothing to delete."),
                "403": forbidden,
                "404": no_name,
                "507": storage_full,
            },
            params=[
                path_param(
                    "router", "Any name: one that cannot exist is simply absent.", ANY_NAME, "a->b"
                )
            ],
        ),
    }
    p["/v0/watch"] = {
        "post": op(
            "createWatch",
            "watch",
            "Create a watch session",
            "Checks a multi-topic subscription and stores it as a session to stream with "
            "`GET /v0/watch/{wid}` (docs/API.md, 12.1). Sessions live in memory. Scope: read.",
            {
                "200": ok(
                    ref("WatchCreated"),
                    "The session and where each topic starts.",
                    links("wid", "/wid", "watchStream"),
                ),
                "400": bad_request(),
                "403": forbidden,
                "404": error_response("A topic that does not exist.", ["topic_not_found"]),
            },
            params=[qbool("lenient", False, "Skip topics that do not exist instead of 404.")],
            body=ref("WatchRequest"),
            body_route=True,
            example={"topics": {"metrics.cpu": {"from_seq": 0}, "billing.jobs": {"tail": True}}},
        )
    }
    p["/v0/watch/{wid}"] = {
        "parameters": [
            path_param("wid", "The session id from `POST /v0/watch`.", text(pattern=WID_PATTERN))
        ],
        "get": op(
            "watchStream",
            "watch",
            "Stream a watch session",
            "Server-Sent Events for every topic of the session (docs/API.md, 12.2-12.3). No "
            "scope is checked; with auth on, only the key that created the session opens "
            "it (bearer header or `?token=`). `Accept` must allow text/event-stream.",
            {
                "200": {
                    "description": "The stream (`Cache-Control: no-store`, "
                    "`X-Accel-Buffering: no`).",
                    "headers": {
                        "Cache-Control": {"$ref": "#/components/headers/NoStore"},
                        "X-Accel-Buffering": {"$ref": "#/components/headers/NoBuffering"},
                    },
                    "content": {SSE: {"schema": ref("WatchEvent")}},
                },
                "401": error_response(
                    "The session belongs to another key (or to one this request lacks).",
                    ["unauthorized"],
                ),
                "404": error_response("Unknown or expired session.", ["not_found"]),
                "406": rref("NotAcceptable"),
            },
            params=[
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "description": "The id of the last event processed: moves the session's "
                    "cursors back to it. Ids that do not decode are ignored.",
                    "schema": {"type": "string"},
                }
            ],
            security=SSE_AUTH,
        ),
    }
    p["/v0/ws"] = {
        "get": op(
            "websocket",
            "websocket",
            "WebSocket upgrade",
            "Subscriptions and writes as JSON text messages over one WebSocket "
            "(docs/API.md, 13); each command checks its own scope. The upgrade needs a bearer "
            "header when auth is on (`?token=` is not read here) and counts against the "
            "streaming connection caps. The message protocol is beyond what OpenAPI "
            "describes.",
            {
                "101": {"description": "Switching to the WebSocket protocol."},
                "400": bad_request(description="A plain GET without an upgrade."),
            },
            security=BEARER,
        )
    }
    probe_extra = " No key is needed unless TOPICS_PROBE_AUTH is on; then any valid key will do."
    for path, op_id, alias in (
        ("/v0/health", "health", False),
        ("/healthz", "healthz", True),
    ):
        p[path] = {
            "get": op(
                op_id,
                "ops",
                "Liveness" + (" (alias of /v0/health)" if alias else ""),
                "Says the process is up (docs/API.md, 15.1)." + probe_extra,
                {
                    "200": ok(ref("Health"), "Up."),
                    "503": rref("ProbeUnavailable"),
                },
                security=[{}, *BEARER],
            )
        }
    for path, op_id, alias in (("/v0/ready", "ready", False), ("/readyz", "readyz", True)):
        p[path] = {
            "get": op(
                op_id,
                "ops",
                "Readiness" + (" (alias of /v0/ready)" if alias else ""),
                "`200` once WAL replay has finished (docs/API.md, 15.2); `status` says "
                "`degraded` while writes cannot be committed." + probe_extra,
                {
                    "200": ok(ref("Ready"), "Ready (or degraded)."),
                    "503": error_response(
                        "Replay still running (`not_ready`), or the connection caps are reached.",
                        ["not_ready", "too_many_connections"],
                        retry_after=1,
                    ),
                },
                security=[{}, *BEARER],
            )
        }
    p["/v0/metrics"] = {
        "get": op(
            "metrics",
            "ops",
            "Metrics",
            "Prometheus text by default; JSON when `Accept` contains application/json "
            "(docs/API.md, 15.3). A prefix-restricted key gets its own share of the "
            "instance. Scope: read (TOPICS_PROBE_AUTH does not apply).",
            {
                "200": {
                    "description": "The metrics.",
                    "content": {
                        PROMETHEUS: {"schema": {"type": "string"}},
                        JSON: {"schema": ref("Metrics")},
                    },
                },
                "403": forbidden,
            },
        )
    }
    p["/v0/openapi.json"] = {
        "get": op(
            "openapi",
            "meta",
            "This document",
            "The OpenAPI description of this server, without authentication (it holds no data).",
            {
                "200": ok(
                    {"type": "object", "required": ["openapi", "info", "paths"]},
                    "The document.",
                ),
                "503": rref("ProbeUnavailable"),
            },
            security=PUBLIC,
            secured=False,
        )
    }
    console_file = {
        "description": "A console file.",
        "headers": {"Cache-Control": {"$ref": "#/components/headers/NoCache"}},
        "content": {
            "text/html; charset=utf-8": {"schema": {"type": "string"}},
            "text/javascript; charset=utf-8": {"schema": {"type": "string"}},
            "text/css; charset=utf-8": {"schema": {"type": "string"}},
            "image/svg+xml": {"schema": {"type": "string"}},
            "image/png": {"schema": {"type": "string", "contentEncoding": "binary"}},
        },
    }
    page = {
        "description": "The console page.",
        "headers": {"Cache-Control": {"$ref": "#/components/headers/NoCache"}},
        "content": {"text/html; charset=utf-8": {"schema": {"type": "string"}}},
    }
    no_file = error_response("No such console file.", ["not_found"])
    for path, op_id in (("/", "consoleRoot"), ("/console", "console")):
        p[path] = {
            "get": op(
                op_id,
                "console",
                "The web console",
                "The browser console's page (docs/CONSOLE.md); public, outside `/v0`.",
                {"200": page, "404": no_file, "503": rref("ProbeUnavailable")},
                security=PUBLIC,
                secured=False,
            )
        }
    p["/console/{file}"] = {
        "parameters": [path_param("file", "A file of the console.", {"type": "string"})],
        "get": op(
            "consoleFile",
            "console",
            "A console file",
            "One of the console's static files; public, outside `/v0`.",
            {"200": console_file, "404": no_file, "503": rref("ProbeUnavailable")},
            security=PUBLIC,
            secured=False,
        ),
    }
    return p


# -------------------------------------------------------------------- document

DESCRIPTION = """\
The HTTP API of a topics server: named append-only topics read by sequence number,
streamed over Server-Sent Events and WebSocket, copied by routers and leased to
workers as queues. docs/API.md is the reference this document follows.

**Authentication.** With keys configured (TOPICS_API_KEYS) every route but the
probes, this document and the console wants `Authorization: Bearer <key>`, and the
key must hold the route's scope (read, write, delete, admin); a key may also be
limited to name prefixes. The two event-stream routes accept the key as `?token=`
too. With no key configured (dev mode) nothing is checked.

**Errors.** Every failure carries the envelope
`{"error": {"code", "message", "detail"?}}`; branch on `code`. `429` and `503`
carry `Retry-After: 1`, `507` carries `Retry-After: 5`. Any path answers `404
not_found` when nothing matches it and `405 method_not_allowed`, with an `Allow`
header listing the methods it takes, for a method it does not take; a request
the connection layer refuses gets `414`, `431` or
`503 too_many_connections` before any route sees it.

**Bodies.** JSON with a `Content-Type` starting with `application/json`. Unknown
fields are ignored; an optional field sent as `null` counts as absent. Seqs are
unsigned 64-bit integers, times are ms since the epoch, durations are ms; an
integer field takes a JSON integer (`2`), not an integral float (`2.0`). Limits
given in bytes are written as `maxLength`, which is exact for ASCII.
"""


def build() -> J:
    """The whole document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "topics",
            "version": __version__,
            "summary": "A single-node event-log server",
            "description": DESCRIPTION,
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "servers": [{"url": "/", "description": "the server that serves this document"}],
        "security": BEARER,
        "tags": [
            {"name": "topics", "description": "Topic lifecycle (docs/API.md, 5-6)."},
            {"name": "records", "description": "Write, read and delete records (7-10)."},
            {"name": "queues", "description": "Lease queues (14)."},
            {"name": "routers", "description": "Topic-to-topic copying (11)."},
            {"name": "watch", "description": "Multiplexed Server-Sent Events (12)."},
            {"name": "websocket", "description": "The WebSocket data plane (13)."},
            {"name": "ops", "description": "Health, readiness, metrics (15)."},
            {"name": "meta", "description": "This document."},
            {"name": "console", "description": "The browser console's files."},
        ],
        "paths": paths(),
        "components": {
            "schemas": schemas(),
            "responses": common_responses(),
            "headers": {
                "RetryAfter1": {
                    "description": "Seconds to wait before retrying.",
                    "required": True,
                    "schema": {"type": "integer", "const": 1},
                },
                "RetryAfter5": {
                    "description": "Seconds to wait before retrying.",
                    "required": True,
                    "schema": {"type": "integer", "const": 5},
                },
                "NoStore": {"required": True, "schema": {"const": "no-store"}},
                "NoBuffering": {"required": True, "schema": {"const": "no"}},
                "NoCache": {"required": True, "schema": {"const": "no-cache"}},
            },
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A key of TOPICS_API_KEYS.",
                },
                "tokenQuery": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "token",
                    "description": "The key as a query parameter: the two event-stream "
                    "routes only (the header wins when both are given).",
                },
            },
        },
    }


def render() -> bytes:
    """The document as the bytes of openapi.json (sorted nowhere: the order above)."""
    return (json.dumps(build(), indent=1, ensure_ascii=False) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    """Write openapi.json (or, with `--check`, exit 1 when it is out of date)."""
    args = sys.argv[1:] if argv is None else argv
    want = render()
    if "--check" in args:
        same = DOCUMENT_PATH.exists() and DOCUMENT_PATH.read_bytes() == want
        if not same:
            print(f"{DOCUMENT_PATH} is out of date: run scripts/openapi", file=sys.stderr)
        return 0 if same else 1
    DOCUMENT_PATH.write_bytes(want)
    print(f"wrote {DOCUMENT_PATH} ({len(want)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
