"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, DescribeCluster, DescribeLogDirs.

Topic configs are the `/v0` topic config (docs/API.md, "5. The topic config
object") of the Kafka topic's partition 0, seen through Kafka names
(docs/KAFKA.md, "Admin APIs"):

* settable: `retention.ms` (`ttl_ms`, -1 = off), `retention.bytes`
  (`cap_bytes`, -1 = off), `cleanup.policy` (only `delete`), and the `/v0`
  fields under their own names (`durability`, `cap_records`, `discard`, ...),
  parsed by :func:`~topics.kafka.api_admin.topic_config_from_kafka` as in
  CreateTopics;
* read-only: what the server decides for every topic (`max.message.bytes`,
  `message.timestamp.type`, `segment.bytes`, ...) and the `/v0` `type`, fixed
  at creation. Setting one to the value it already has is accepted (so a
  describe-then-alter round trip works); any other value is INVALID_CONFIG
  saying why.

An alter replaces the config of every partition topic (`T`, `T:1`, ...) with
one full `/v0` PUT each. The BROKER resource (name "0" or "") is a small
read-only set.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_ADMIN, SCOPE_READ, SCOPE_WRITE
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.api_admin import topic_config_from_kafka
from topics.kafka.api_metadata import CLUSTER_ID, NODE_ID, cluster_ops
from topics.kafka.backend import BackendError, KafkaBackend
from topics.kafka.naming import kafka_name_ok, partition_name

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = [
    "describe_configs",
    "refuse_describe_configs",
    "alter_configs",
    "incremental_alter_configs",
    "refuse_alter_configs",
    "refuse_incremental_alter_configs",
    "describe_cluster",
    "describe_log_dirs",
    "refuse_describe_log_dirs",
]

# Resource types (Kafka's ConfigResource.Type).
TOPIC = 2
BROKER = 4

# Config sources (DescribeConfigs v1+ `config_source`).
SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG: set on this topic
SOURCE_STATIC_BROKER = 4  # STATIC_BROKER_CONFIG: the server's configuration
SOURCE_DEFAULT = 5  # DEFAULT_CONFIG

# Config types (DescribeConfigs v3+ `config_type`).
BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7

# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Entry:
    """One config as DescribeConfigs shows it.

    `default` is the value when nothing is set; `why` says why a read-only
    entry cannot be changed; `v0_name` is the `/v0` field a Kafka name maps to
    (listed as a synonym); `broker_name` the server-level name of a
    server-decided entry (listed as a synonym).
    """

    name: str
    value: str | None
    default: str | None
    source: int
    read_only: bool
    type: int
    doc: str
    why: str = ""
    v0_name: str | None = None
    v0_value: str | None = None
    broker_name: str | None = None


class Refused(Exception):
    """A resource refused as a whole: Kafka error code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ------------------------------------------------------------------ the tables

#: `/v0` fields listed under their own names: (name, type, doc). Their
#: defaults are the engine's (:meth:`KafkaBackend.default_config`).
#: `ttl_ms` and `cap_bytes` are shown as `retention.ms` / `retention.bytes`,
#: and `durable` (an alias of `durability` = fsync) is not listed; all three
#: are still accepted by the alter APIs (docs/API.md, "5. The topic config
#: object").
_V0_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("type", STRING, "log or queue; fixed when the topic is created"),
    ("cap_records", LONG, "keep only the newest cap_records seqs (0 = off)"),
    ("discard", STRING, "over a cap: evict the oldest records (old) or refuse the write"),
    ("durability", STRING, "ephemeral, memory, disk or fsync: when a write is acknowledged"),
    ("priority", INT, "manual delivery priority (null = none)"),
    ("auto_priority", BOOLEAN, "recently read topics rank higher without a priority"),
    ("auto_create", BOOLEAN, "whether a creating write may create the topic"),
    ("idempotency_window_ms", LONG, "how long idempotency keys are remembered"),
    ("dedupe_node", BOOLEAN, "false turns off the readers' node filter"),
    ("lease_ms", LONG, "queue: default lease length"),
    ("claim_jitter_ms", LONG, "queue: window in which concurrent claims are served together"),
    ("max_deliveries", LONG, "queue: deliveries after which a job is dead-lettered (0 = no limit)"),
    ("dead_letter", STRING, "queue: where exhausted jobs go"),
    ("leases_durable", BOOLEAN, "queue: log lease changes so they survive a restart"),
)
_V0_DEFAULTS = KafkaBackend.default_config()
_V0_NAMES = frozenset(n for n, *_ in _V0_FIELDS)

#: Names the alter APIs accept besides the listed ones: `/v0` aliases.
_ALIASES = {"ttl_ms": "retention.ms", "cap_bytes": "retention.bytes", "durable": "durability"}

_COMPACTION = (
    "cleanup.policy={!r} is not supported: there is no log compaction here; "
    "the only policy is delete (retention by time and size)"
)


def _render(value: Any) -> str | None:
    """A `/v0` config value as a Kafka config string."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _off(value: Any) -> str:
    """A `/v0` 0-means-off integer as a Kafka -1-means-off string."""
    return str(value) if isinstance(value, int) and value > 0 else "-1"


def _entry(
    name: str, value: str | None, default: str | None, typ: int, doc: str, **kw: Any
) -> Entry:
    """A settable entry; its source is the topic when it differs from the default."""
    src = SOURCE_DEFAULT if value == default else SOURCE_TOPIC
    return Entry(name, value, default, src, False, typ, doc, **kw)


def _fixed(
    name: str, value: str, typ: int, doc: str, why: str, *, source: int = SOURCE_DEFAULT, **kw: Any
) -> Entry:
    """A read-only entry the server decides."""
    return Entry(name, value, value, source, True, typ, doc, why, **kw)


def topic_entries(broker: Broker, conn: ConnState, body: dict[str, Any]) -> list[Entry]:
    """Every config of a topic whose `/v0` config object is `body`, Kafka names first."""
    backend = broker.backend
    cfg = backend.node.config
    ns = conn.namespace
    ttl, cap = body.get("ttl_ms"), body.get("cap_bytes")
    kafka = [
        _entry(
            "cleanup.policy",
            "delete",
            "delete",
            LIST,
            "delete: records go by retention.ms and retention.bytes; compaction is not supported",
        ),
        _fixed(
            "compression.type",
            "producer",
            STRING,
            "every producer codec is accepted; records are stored decoded",
            "the server decodes every batch; the codec is the producer's choice",
        ),
        _fixed(
            "max.message.bytes",
            str(backend.max_record_bytes),
            INT,
            "the largest record (value plus headers as stored)",
            "the server's record limit (TOPICS_MAX_RECORD_BYTES) applies to every topic",
            source=SOURCE_STATIC_BROKER,
            broker_name="message.max.bytes",
        ),
        _fixed(
            "message.timestamp.type",
            "LogAppendTime",
            STRING,
            "every record is stamped with its commit time",
            "the server stamps every record with its commit time",
            broker_name="log.message.timestamp.type",
        ),
        _fixed(
            "min.insync.replicas",
            "1",
            INT,
            "a single node: every write is in sync once it is acknowledged",
            "there is one node; durability is chosen per topic with durability",
        ),
        _entry(
            "retention.bytes",
            _off(cap),
            "-1",
            LONG,
            "keep live payload bytes at or under this (-1 = no limit): /v0 cap_bytes",
            v0_name="cap_bytes",
            v0_value=_render(cap),
        ),
        _entry(
            "retention.ms",
            _off(ttl),
            "-1",
            LONG,
            "a record expires once it is older than this (-1 = never): /v0 ttl_ms",
            v0_name="ttl_ms",
            v0_value=_render(ttl),
        ),
        _fixed(
            "segment.bytes",
            str(cfg.segment_max_bytes),
            INT,
            "storage segments are sealed at this size",
            "segments are sized for the whole server (TOPICS_SEGMENT_MAX_BYTES)",
            source=SOURCE_STATIC_BROKER,
            broker_name="log.segment.bytes",
        ),
        _fixed(
            "segment.ms",
            str(cfg.segment_max_age_ms),
            LONG,
            "storage segments are sealed at this age",
            "segments are sized for the whole server (TOPICS_SEGMENT_MAX_AGE_MS)",
            source=SOURCE_STATIC_BROKER,
            broker_name="log.roll.ms",
        ),
        _fixed(
            "unclean.leader.election.enable",
            "false",
            BOOLEAN,
            "a single node has no other replica to elect",
            "there is one node",
        ),
    ]
    v0 = []
    for name, typ, doc in _V0_FIELDS:
        default = _render(_V0_DEFAULTS[name])
        raw = body.get(name)
        if name == "dead_letter" and isinstance(raw, str) and ns and raw.startswith(ns):
            raw = raw[len(ns) :]
        value = _render(raw)
        if name == "type":
            v0.append(
                Entry(
                    name,
                    value,
                    default,
                    SOURCE_DEFAULT if value == default else SOURCE_TOPIC,
                    True,
                    typ,
                    doc,
                    "a topic's type is fixed when it is created",
                )
            )
        else:
            v0.append(_entry(name, value, default, typ, doc))
    return kafka + v0


def broker_entries(broker: Broker, conn: ConnState) -> list[Entry]:
    """The read-only configs of BROKER "0": server settings (with the variable that
    sets them) and the fixed behaviour of a single node."""
    backend = broker.backend
    cfg = backend.node.config
    host, port = broker.advertised
    proto = "SASL_PLAINTEXT" if broker.auth_enabled else "PLAINTEXT"
    why = "the server is configured through its environment at startup"

    def static(name: str, value: object, typ: int, doc: str) -> Entry:
        return Entry(name, str(value), str(value), SOURCE_STATIC_BROKER, True, typ, doc, why)

    def fixed(name: str, value: str, typ: int, doc: str) -> Entry:
        return Entry(name, value, value, SOURCE_DEFAULT, True, typ, doc, why)

    return [
        static(
            "advertised.listeners", f"{proto}://{host}:{port}", STRING, "TOPICS_KAFKA_ADVERTISED"
        ),
        fixed(
            "auto.create.topics.enable", "true", BOOLEAN, "Metadata creates a topic on first use"
        ),
        static("broker.id", NODE_ID, INT, "the only node"),
        fixed("compression.type", "producer", STRING, "every producer codec is accepted"),
        static(
            "connections.max.idle.ms",
            cfg.kafka_idle_timeout_ms,
            LONG,
            "TOPICS_KAFKA_IDLE_TIMEOUT_MS",
        ),
        fixed("default.replication.factor", "1", INT, "a single node"),
        fixed("delete.topic.enable", "true", BOOLEAN, "DeleteTopics is served"),
        fixed("log.cleanup.policy", "delete", LIST, "compaction is not supported"),
        fixed(
            "log.message.timestamp.type", "LogAppendTime", STRING, "records carry their commit time"
        ),
        fixed("log.retention.bytes", "-1", LONG, "a topic keeps everything unless configured"),
        fixed("log.retention.ms", "-1", LONG, "a topic keeps everything unless configured"),
        static("log.segment.bytes", cfg.segment_max_bytes, INT, "TOPICS_SEGMENT_MAX_BYTES"),
        static("message.max.bytes", backend.max_record_bytes, INT, "TOPICS_MAX_RECORD_BYTES"),
        fixed("min.insync.replicas", "1", INT, "a single node"),
        fixed("num.partitions", "1", INT, "partitions of an auto-created topic"),
        fixed("offsets.topic.replication.factor", "1", INT, "a single node"),
        static(
            "socket.request.max.bytes",
            cfg.kafka_max_frame_bytes,
            INT,
            "TOPICS_KAFKA_MAX_FRAME_BYTES",
        ),
    ]


# ------------------------------------------------------------------ describe


def _synonyms(e: Entry) -> list[tuple[str, str | None, int]]:
    """The entry's synonyms, most specific first (DescribeConfigs v1+)."""
    out = [(e.name, e.value, e.source)]
    if e.v0_name is not None:
        out.append((e.v0_name, e.v0_value, e.source))
    if e.broker_name is not None:
        out.append((e.broker_name, e.value, e.source))
    if e.source == SOURCE_TOPIC:
        out.append((e.name, e.default, SOURCE_DEFAULT))
    return out


def _describe_one(broker: Broker, conn: ConnState, res: Any) -> list[Entry]:
    """The entries of one resource; raises :class:`Refused`."""
    rtype, name = res.resource_type, res.resource_name
    if rtype == BROKER:
        if name not in ("", str(NODE_ID)):
            raise Refused(E.INVALID_REQUEST, f"this server is broker {NODE_ID}, not {name!r}")
        return broker_entries(broker, conn)
    stored, body = _topic_resource(broker, conn, rtype, name, (SCOPE_READ, SCOPE_ADMIN))
    return topic_entries(broker, conn, body)


def _topic_resource(
    broker: Broker, conn: ConnState, rtype: int, name: str, scopes: tuple[str, ...]
) -> tuple[str, dict[str, Any]]:
    """The stored name and `/v0` config of the TOPIC resource `name`, for a key
    holding any of `scopes` on it; raises :class:`Refused` (INVALID_REQUEST for
    another resource type, TOPIC_AUTHORIZATION_FAILED, INVALID_TOPIC_EXCEPTION,
    UNKNOWN_TOPIC_OR_PARTITION)."""
    if rtype != TOPIC:
        raise Refused(
            E.INVALID_REQUEST, f"resource type {rtype} is not supported (TOPIC or BROKER)"
        )
    stored = conn.stored(name)
    if not any(broker.allowed(conn, sc, stored) for sc in scopes):
        raise Refused(
            E.TOPIC_AUTHORIZATION_FAILED, f"the key lacks {' or '.join(scopes)} on this topic"
        )
    if not kafka_name_ok(name):
        raise Refused(E.INVALID_TOPIC_EXCEPTION, "a name ending in :<n> names a partition")
    body = broker.backend.config_body(stored)
    if body is None:
        raise Refused(E.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    return stored, body


def describe_configs(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DescribeConfigs: the configs of each TOPIC or BROKER resource asked for.

    `configuration_keys` (null or empty = all) filters by name; synonyms are
    listed with `include_synonyms` (v1+), documentation with
    `include_documentation` (v3+). `config_source` is DYNAMIC_TOPIC_CONFIG
    (1) for a value that differs from its default, STATIC_BROKER_CONFIG (4)
    for a server setting, DEFAULT_CONFIG (5) otherwise (`is_default` in v0).
    Per resource: TOPIC_AUTHORIZATION_FAILED without `read` or `admin` on the
    topic, INVALID_TOPIC_EXCEPTION for a partition name,
    UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST for another broker id or
    resource type (docs/KAFKA.md, "Admin APIs").
    """
    R = P.RESPONSES[P.DESCRIBE_CONFIGS]
    DR = R.DescribeConfigsResult
    CR = DR.DescribeConfigsResourceResult
    SR = CR.DescribeConfigsSynonym
    synonyms = v >= 1 and bool(req.include_synonyms)
    docs = v >= 3 and bool(req.include_documentation)
    out = []
    for res in req.resources:
        err, msg = E.NONE, None
        try:
            entries = _describe_one(broker, conn, res)
        except Refused as exc:
            err, msg, entries = exc.code, exc.message, []
        keys = res.configuration_keys
        if keys:
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        configs = [
            CR(
                name=e.name,
                value=e.value,
                read_only=e.read_only,
                config_source=e.source,
                is_default=e.source == SOURCE_DEFAULT,
                is_sensitive=False,
                synonyms=[SR(name=n, value=val, source=s) for n, val, s in _synonyms(e)]
                if synonyms
                else [],
                config_type=e.type,
                documentation=e.doc if docs else None,
            )
            for e in entries
        ]
        out.append(
            DR(
                error_code=err,
                error_message=msg,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return R(throttle_time_ms=0, results=out)


def refuse_describe_configs(broker: Broker, req: Any, code: int) -> Any:
    """DescribeConfigs with `code` on every resource."""
    R = P.RESPONSES[P.DESCRIBE_CONFIGS]
    DR = R.DescribeConfigsResult
    return R(
        results=[
            DR(
                error_code=code,
                error_message=None,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=[],
            )
            for r in req.resources
        ]
    )


# --------------------------------------------------------------------- alter


_REVERT = object()  # what a DELETE changes a /v0 field to


class _Plan:
    """The `/v0` fields one alter request sets or reverts, checked as they are added."""

    def __init__(self, broker: Broker, conn: ConnState, entries: list[Entry]) -> None:
        self.broker = broker
        self.conn = conn
        self.entries = {e.name: e for e in entries}
        self.changes: dict[str, Any] = {}  # /v0 field -> new value
        self.reverts: set[str] = set()  # /v0 fields back to their default
        # /v0 field -> (the config name that touched it, its new value or _REVERT)
        self.by: dict[str, tuple[str, Any]] = {}

    def _touch(self, name: str, field: str, value: Any) -> None:
        """Record that `name` changes `field` to `value`; two names of one field
        (`retention.ms` and `ttl_ms`) must agree."""
        first, was = self.by.setdefault(field, (name, value))
        if first != name and was != value:
            raise Refused(E.INVALID_CONFIG, f"{name} and {first} both change /v0 {field}")

    def _read_only(self, e: Entry, value: str | None) -> None:
        """A read-only entry may only be "set" to the value it has."""
        if value != e.value:
            raise Refused(E.INVALID_CONFIG, f"{e.name} is read-only: {e.why}")

    def set(self, name: str, value: str | None) -> None:
        """SET `name` to `value` (a null value reverts it to its default)."""
        if value is None:
            self.delete(name)
            return
        e = self.entries.get(name)
        if e is not None and e.read_only:
            self._read_only(e, value)
            return
        if name == "cleanup.policy":
            if {p.strip() for p in value.split(",")} != {"delete"}:
                raise Refused(E.INVALID_CONFIG, _COMPACTION.format(value))
            return
        if e is None and name not in _ALIASES:
            raise Refused(E.INVALID_CONFIG, f"unknown topic config {name!r}")
        try:
            sub = topic_config_from_kafka([(name, value)])
        except ValueError as exc:
            raise Refused(E.INVALID_CONFIG, f"{name}={value!r}: {exc}") from None
        dl = sub.get("dead_letter")
        if isinstance(dl, str):
            dl = sub["dead_letter"] = self.conn.namespace + dl
            if not self.broker.allowed(self.conn, SCOPE_ADMIN, dl):
                raise Refused(
                    E.TOPIC_AUTHORIZATION_FAILED, "the key may not use this dead_letter topic"
                )
        for field, v in sub.items():
            self._touch(name, field, v)
            self.changes[field] = v

    def delete(self, name: str) -> None:
        """Revert `name` to its default (IncrementalAlterConfigs DELETE)."""
        e = self.entries.get(name)
        if e is not None and e.read_only:
            self._read_only(e, e.default)
            return
        if name == "cleanup.policy":
            return
        if e is None and name not in _ALIASES:
            raise Refused(E.INVALID_CONFIG, f"unknown topic config {name!r}")
        field = {"retention.ms": "ttl_ms", "retention.bytes": "cap_bytes"}.get(name, name)
        fields = ["durability", "durable"] if field in ("durability", "durable") else [field]
        for f in fields:
            self._touch(name, f, _REVERT)
            self.reverts.add(f)

    def body(self, base: dict[str, Any]) -> dict[str, Any]:
        """`base` with the changes and reverts applied: a full `/v0` config body."""
        out = {k: v for k, v in base.items() if k not in self.reverts}
        if "durable" in self.changes and "durability" not in self.changes:
            out.pop("durability", None)  # durable=true|false decides the class again
        out.update(self.changes)
        return out


def _alter_target(broker: Broker, conn: ConnState, res: Any) -> tuple[str, dict[str, Any]] | None:
    """The stored name and current `/v0` config of a TOPIC resource to alter, or
    None for the BROKER resource (nothing to change); raises :class:`Refused`."""
    rtype, name = res.resource_type, res.resource_name
    if rtype == BROKER:
        if name not in ("", str(NODE_ID)):
            raise Refused(E.INVALID_REQUEST, f"this server is broker {NODE_ID}, not {name!r}")
        if res.configs:
            raise Refused(
                E.INVALID_REQUEST,
                "broker configs are read-only: the server is configured through its "
                "environment at startup",
            )
        return None
    return _topic_resource(broker, conn, rtype, name, (SCOPE_ADMIN,))


async def _apply(broker: Broker, stored: str, body: dict[str, Any], validate_only: bool) -> None:
    """Check `body` for every partition topic of `stored`, then (unless
    `validate_only`) PUT it to each; raises :class:`Refused`."""
    backend = broker.backend
    names = [stored, *backend.partition_topics(stored)]
    try:
        for n in names:
            backend.check_config(n, body)
        if not validate_only:
            for n in names:
                await backend.reconfigure(n, body)
    except BackendError as exc:
        raise Refused(E.from_engine(E.ALTER, exc.code, exc.status), exc.message) from None


def _no_repeats(configs: Any) -> None:
    seen: set[str] = set()
    for c in configs:
        if c.name in seen:
            raise Refused(E.INVALID_REQUEST, f"config {c.name!r} is named twice")
        seen.add(c.name)


async def _alter(broker: Broker, conn: ConnState, req: Any, incremental: bool) -> Any:
    key = P.INCREMENTAL_ALTER_CONFIGS if incremental else P.ALTER_CONFIGS
    R = P.RESPONSES[key]
    AR = R.AlterConfigsResourceResponse
    out = []
    for res in req.resources:
        err, msg = E.NONE, None
        try:
            target = _alter_target(broker, conn, res)
            if target is not None:
                stored, current = target
                _no_repeats(res.configs)
                plan = _Plan(broker, conn, topic_entries(broker, conn, current))
                for c in res.configs:
                    op = c.config_operation if incremental else OP_SET
                    if op == OP_SET:
                        plan.set(c.name, c.value)
                    elif op == OP_DELETE:
                        plan.delete(c.name)
                    elif op in (OP_APPEND, OP_SUBTRACT):
                        raise Refused(
                            E.INVALID_CONFIG,
                            f"{c.name}: APPEND and SUBTRACT need a list config; there is none to change",
                        )
                    else:
                        raise Refused(E.INVALID_REQUEST, f"{c.name}: unknown operation {op}")
                if incremental:
                    base = {k: v for k, v in current.items() if k != "durable"}
                else:
                    base = {"type": current["type"]}  # fixed; everything else is replaced
                await _apply(broker, stored, plan.body(base), bool(req.validate_only))
        except Refused as exc:
            err, msg = exc.code, exc.message
        out.append(
            AR(
                error_code=err,
                error_message=msg,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return R(throttle_time_ms=0, responses=out)


async def alter_configs(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """AlterConfigs: replace the settable configs of each topic (unnamed ones revert
    to their defaults) on every partition, or with `validate_only` only check.

    Needs `admin` on the topic. Per resource: TOPIC_AUTHORIZATION_FAILED
    (also for a `dead_letter` outside the key's names),
    INVALID_TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PARTITION, INVALID_CONFIG (an
    unknown name, a bad value, a read-only config given another value,
    `cleanup.policy` other than `delete`, two names of one `/v0` field that
    disagree), INVALID_REQUEST (a name given twice; a BROKER resource with
    configs; another broker id or resource type), or an engine refusal
    through :data:`~topics.kafka.errors.ENGINE_ERRORS` (docs/KAFKA.md, "Admin APIs").
    """
    return await _alter(broker, conn, req, incremental=False)


async def incremental_alter_configs(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """IncrementalAlterConfigs: SET or DELETE (back to the default) single configs
    of each topic on every partition; the others keep their values.

    APPEND and SUBTRACT are INVALID_CONFIG (there is no list config to
    change); otherwise the errors of :func:`alter_configs`.
    """
    return await _alter(broker, conn, req, incremental=True)


def _refuse_alter(key: int, req: Any, code: int) -> Any:
    R = P.RESPONSES[key]
    AR = R.AlterConfigsResourceResponse
    return R(
        responses=[
            AR(
                error_code=code,
                error_message=None,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
            for r in req.resources
        ]
    )


def refuse_alter_configs(broker: Broker, req: Any, code: int) -> Any:
    """AlterConfigs with `code` on every resource."""
    return _refuse_alter(P.ALTER_CONFIGS, req, code)


def refuse_incremental_alter_configs(broker: Broker, req: Any, code: int) -> Any:
    """IncrementalAlterConfigs with `code` on every resource."""
    return _refuse_alter(P.INCREMENTAL_ALTER_CONFIGS, req, code)


# ------------------------------------------------------------------- cluster


def describe_cluster(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DescribeCluster: this node as the only broker and the controller.

    `cluster_authorized_operations` is filled in when asked for (from the
    key's scopes), -2147483648 otherwise. Asking for the controllers
    (`endpoint_type` 2, v1+) is UNSUPPORTED_ENDPOINT_TYPE, as on a Kafka broker.
    """
    R = P.RESPONSES[P.DESCRIBE_CLUSTER]
    B = R.DescribeClusterBroker
    host, port = broker.advertised
    if v >= 1 and req.endpoint_type != 1:
        return R(
            throttle_time_ms=0,
            error_code=E.UNSUPPORTED_ENDPOINT_TYPE,
            error_message="only brokers are described (endpoint type 1)",
            endpoint_type=req.endpoint_type,
            cluster_id=CLUSTER_ID,
            controller_id=-1,
            brokers=[],
            authorized_operations=None,
        )
    ops = cluster_ops(conn) if req.include_cluster_authorized_operations else None
    return R(
        throttle_time_ms=0,
        error_code=E.NONE,
        error_message=None,
        endpoint_type=1,
        cluster_id=CLUSTER_ID,
        controller_id=NODE_ID,
        brokers=[B(broker_id=NODE_ID, host=host, port=port, rack=None, is_fenced=False)],
        authorized_operations=ops,
    )


def _visible(broker: Broker, conn: ConnState, stored: str) -> bool:
    return any(broker.allowed(conn, s, stored) for s in (SCOPE_READ, SCOPE_WRITE, SCOPE_ADMIN))


def describe_log_dirs(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DescribeLogDirs: one log directory (the data directory, "(memory)" for a
    memory-mode node) holding every partition the key may see, or the ones asked for.

    A partition's size is the payload bytes of its live records; offset lags
    are 0 (one replica);
    `total_bytes` / `usable_bytes` (v4+) are the data directory's file system
    figures (-1 in memory mode). Needs the `admin` scope:
    CLUSTER_AUTHORIZATION_FAILED otherwise (at the top in v3+, as an empty
    answer before). Topics asked for that do not exist or are not visible
    are left out, as Kafka does.
    """
    R = P.RESPONSES[P.DESCRIBE_LOG_DIRS]
    DR = R.DescribeLogDirsResult
    TT = DR.DescribeLogDirsTopic
    PP = TT.DescribeLogDirsPartition
    p = conn.principal
    if p is None or not p.has(SCOPE_ADMIN):
        return R(throttle_time_ms=0, error_code=E.CLUSTER_AUTHORIZATION_FAILED, results=[])
    backend = broker.backend
    ns = conn.namespace
    wanted: list[tuple[str, list[int] | None]]
    if req.topics is None:
        wanted = [(n[len(ns) :], None) for n in backend.names() if n.startswith(ns) and n != ns]
    else:
        wanted = [(t.topic, list(t.partitions)) for t in req.topics]
    topics = []
    for name, parts in wanted:
        stored = conn.stored(name)
        if not kafka_name_ok(name) or not _visible(broker, conn, stored):
            continue
        count = backend.partition_count(stored)
        idxs = range(count) if parts is None else sorted({i for i in parts if 0 <= i < count})
        if not idxs:
            continue
        topics.append(
            TT(
                name=name,
                partitions=[
                    PP(
                        partition_index=i,
                        partition_size=backend.live_bytes(partition_name(stored, i)),
                        offset_lag=0,
                        is_future_key=False,
                    )
                    for i in idxs
                ],
            )
        )
    node = backend.node
    total = usable = -1
    if node.durable:
        path = os.path.abspath(node.config.data_dir)
        try:
            du = shutil.disk_usage(path)
            total, usable = du.total, du.free
        except OSError:
            pass
    else:
        path = "(memory)"
    result = DR(
        error_code=E.NONE,
        log_dir=path,
        topics=topics,
        total_bytes=total,
        usable_bytes=usable,
        is_cordoned=False,
    )
    return R(throttle_time_ms=0, error_code=E.NONE, results=[result])


def refuse_describe_log_dirs(broker: Broker, req: Any, code: int) -> Any:
    """DescribeLogDirs with `code` at the top (v3+) and no log directory."""
    return P.RESPONSES[P.DESCRIBE_LOG_DIRS](error_code=code, results=[])
