"""The topic config object: parsing, normalisation and rendering.

The object is described in docs/API.md, "5. The topic config object".

A PUT replaces the whole config, so :func:`parse_topic_config` maps an input
object onto defaults field by field. Unknown fields are ignored; a wrong type is
`400 invalid_request`. Output always carries all 17 fields in the wire order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from topics.engine.names import valid_topic_name
from topics.errors import bad_request

__all__ = ["TopicConfig", "parse_topic_config", "DURABILITY_CLASSES"]

DURABILITY_CLASSES = ("ephemeral", "memory", "disk", "fsync")
LEASE_MIN_MS = 100
LEASE_MAX_MS = 86_400_000
JITTER_MAX_MS = 5_000


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A resolved topic config; `durability` is always one of the four classes."""

    type: str = "log"
    ttl_ms: int = 0
    cap_records: int = 0
    cap_bytes: int = 0
    discard: str = "old"
    durability: str = "disk"
    priority: int | None = None
    auto_priority: bool = True
    auto_create: bool = True
    idempotency_window_ms: int = 120_000
    dedupe_node: bool = True
    lease_ms: int = 30_000
    claim_jitter_ms: int = 0
    max_deliveries: int = 0
    dead_letter: str | None = None
    leases_durable: bool = False

    @property
    def durable(self) -> bool:
        """The legacy alias: true iff the class is `fsync`."""
        return self.durability == "fsync"

    @property
    def is_queue(self) -> bool:
        return self.type == "queue"

    def to_wire(self) -> dict[str, Any]:
        """All 17 fields in wire order (docs/API.md, "5. The topic config object")."""
        return {
            "type": self.type,
            "ttl_ms": self.ttl_ms,
            "cap_records": self.cap_records,
            "cap_bytes": self.cap_bytes,
            "discard": self.discard,
            "durable": self.durable,
            "durability": self.durability,
            "priority": self.priority,
            "auto_priority": self.auto_priority,
            "auto_create": self.auto_create,
            "idempotency_window_ms": self.idempotency_window_ms,
            "dedupe_node": self.dedupe_node,
            "lease_ms": self.lease_ms,
            "claim_jitter_ms": self.claim_jitter_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter": self.dead_letter,
            "leases_durable": self.leases_durable,
        }

    def with_changes(self, **changes: Any) -> TopicConfig:
        return replace(self, **changes)


U64_MAX = (1 << 64) - 1


def _u64(obj: dict[str, Any], key: str, default: int) -> int:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"config.{key} must be a non-negative integer")
    if v < 0 or v > U64_MAX:
        raise bad_request(f"config.{key} out of range")
    return v


def _bool(obj: dict[str, Any], key: str, default: bool) -> bool:
    v = obj.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"config.{key} must be a boolean")
    return v


def parse_topic_config(obj: Any, topic: str | None = None) -> TopicConfig:
    """Validate and normalise a config object onto the defaults.

    `topic` (the topic being configured) enables the queue self-dead-letter check.
    Raises `400 invalid_request` (TopicsError) on a wrong type, an unknown `type`,
    `discard` or `durability`, or a bad `dead_letter` name.
    """
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise bad_request("config must be a JSON object")
    typ = obj.get("type", "log")
    if typ is None:
        typ = "log"
    if typ not in ("log", "queue"):
        raise bad_request('config.type must be "log" or "queue"')
    discard = obj.get("discard", "old")
    if discard is None:
        discard = "old"
    if discard not in ("old", "reject"):
        raise bad_request('config.discard must be "old" or "reject"')
    durable = _bool(obj, "durable", False)
    durability = obj.get("durability")
    if durability is None:
        durability = "fsync" if durable else "disk"
    elif durability not in DURABILITY_CLASSES:
        raise bad_request("config.durability must be one of ephemeral, memory, disk, fsync")
    priority = obj.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise bad_request("config.priority must be an integer or null")
        if not -(2**31) <= priority < 2**31:
            raise bad_request("config.priority out of range")
    lease_ms = min(max(_u64(obj, "lease_ms", 30_000), LEASE_MIN_MS), LEASE_MAX_MS)
    jitter = min(_u64(obj, "claim_jitter_ms", 0), JITTER_MAX_MS)
    dead_letter = obj.get("dead_letter")
    if dead_letter is not None:
        if not isinstance(dead_letter, str) or not valid_topic_name(dead_letter):
            raise bad_request(
                "config.dead_letter must be a valid topic name", {"dead_letter": dead_letter}
            )
        if typ == "queue" and topic is not None and dead_letter == topic:
            raise bad_request(
                "config.dead_letter must differ from the queue itself",
                {"dead_letter": dead_letter},
            )
    return TopicConfig(
        type=typ,
        ttl_ms=_u64(obj, "ttl_ms", 0),
        cap_records=_u64(obj, "cap_records", 0),
        cap_bytes=_u64(obj, "cap_bytes", 0),
        discard=discard,
        durability=durability,
        priority=priority,
        auto_priority=_bool(obj, "auto_priority", True),
        auto_create=_bool(obj, "auto_create", True),
        idempotency_window_ms=_u64(obj, "idempotency_window_ms", 120_000),
        dedupe_node=_bool(obj, "dedupe_node", True),
        lease_ms=lease_ms,
        claim_jitter_ms=jitter,
        max_deliveries=_u64(obj, "max_deliveries", 0),
        dead_letter=dead_letter,
        leases_durable=_bool(obj, "leases_durable", False),
    )
