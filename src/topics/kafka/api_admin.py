"""CreateTopics and DeleteTopics (docs/KAFKA.md "Topics, partitions and offsets").

Every topic has exactly one partition and replication factor 1. CreateTopics
configs are `/v0` topic config fields (:func:`topic_config_from_kafka`) and
need the `admin` scope on the name (and on a `dead_letter` topic's name);
DeleteTopics needs `delete`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_ADMIN, SCOPE_DELETE
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.backend import BackendError

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = [
    "topic_config_from_kafka",
    "create_topics",
    "refuse_create_topics",
    "delete_topics",
    "refuse_delete_topics",
]

_INT_FIELDS = {
    "ttl_ms",
    "cap_records",
    "cap_bytes",
    "idempotency_window_ms",
    "lease_ms",
    "claim_jitter_ms",
    "max_deliveries",
    "priority",
}
_BOOL_FIELDS = {"durable", "auto_priority", "auto_create", "dedupe_node", "leases_durable"}
_STR_FIELDS = {"type", "discard", "durability", "dead_letter"}


def topic_config_from_kafka(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """CreateTopics configs -> a `/v0` topic config body (docs/API.md, "5. The topic config object").

    `/v0` field names are taken as they are (`durability=fsync`,
    `cap_records=1000`, ...); `retention.ms` and `retention.bytes` map to
    `ttl_ms` and `cap_bytes` (-1 = off); `cleanup.policy` must be `delete`;
    other dotted Kafka names are accepted and ignored. Raises ValueError for
    an unknown plain name or a value of the wrong type.
    """
    body: dict[str, Any] = {}
    for name, value in configs:
        if name in _INT_FIELDS:
            body[name] = None if value is None else int(value)
        elif name in _BOOL_FIELDS:
            if value not in ("true", "false"):
                raise ValueError(f"{name} must be true or false")
            body[name] = value == "true"
        elif name in _STR_FIELDS:
            body[name] = value
        elif name == "retention.ms":
            v = int(value or "-1")
            body["ttl_ms"] = max(v, 0)
        elif name == "retention.bytes":
            v = int(value or "-1")
            body["cap_bytes"] = max(v, 0)
        elif name == "cleanup.policy":
            if value != "delete":
                raise ValueError("only cleanup.policy=delete is supported")
        elif "." in name:
            continue
        else:
            raise ValueError(f"unknown topic config {name!r}")
    return body


def _create_result(CR: Any, name: str, err: int, msg: str | None) -> Any:
    """One CreateTopics result entry."""
    ok = err == E.NONE
    return CR(
        name=name,
        error_code=err,
        error_message=msg,
        num_partitions=1 if ok else -1,
        replication_factor=1 if ok else -1,
        configs=[] if ok else None,
    )


async def create_topics(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """CreateTopics: create (or with `validate_only` check) each topic, one result each.

    Per topic: TOPIC_AUTHORIZATION_FAILED, INVALID_TOPIC_EXCEPTION,
    INVALID_PARTITIONS (not one partition), INVALID_REPLICATION_FACTOR (not
    1), TOPIC_ALREADY_EXISTS, INVALID_CONFIG, or an engine refusal through
    :data:`~topics.kafka.errors.ENGINE_ERRORS`.
    """
    R = P.RESPONSES[P.CREATE_TOPICS]
    CR = R.CreatableTopicResult
    backend = broker.backend
    out = []
    for t in req.topics:
        err, msg = E.NONE, None
        name = t.name
        if not broker.allowed(conn, SCOPE_ADMIN, name):
            err, msg = E.TOPIC_AUTHORIZATION_FAILED, "the key lacks admin on this name"
        elif not backend.valid_name(name):
            err, msg = E.INVALID_TOPIC_EXCEPTION, "invalid topic name"
        elif t.num_partitions not in (-1, 1) or (
            t.assignments and [a.partition_index for a in t.assignments] != [0]
        ):
            err, msg = E.INVALID_PARTITIONS, "every topic has exactly one partition"
        elif t.replication_factor not in (-1, 1):
            err, msg = E.INVALID_REPLICATION_FACTOR, "a single node: replication factor 1"
        elif backend.partition(name) is not None:
            err, msg = E.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        else:
            try:
                body = topic_config_from_kafka([(c.name, c.value) for c in t.configs])
                dl = body.get("dead_letter")
                if isinstance(dl, str) and not broker.allowed(conn, SCOPE_ADMIN, dl):
                    # A queue dead-letters into (and creates) that topic: the
                    # key must be allowed the name as well as the topic's own.
                    err, msg = (
                        E.TOPIC_AUTHORIZATION_FAILED,
                        "the key may not use this dead_letter topic",
                    )
                elif req.validate_only:
                    backend.check_config(name, body)
                else:
                    await backend.create(name, body)
            except ValueError as exc:
                err, msg = E.INVALID_CONFIG, str(exc)
            except BackendError as exc:
                err, msg = E.from_engine(E.CREATE, exc.code, exc.status), exc.message
        out.append(_create_result(CR, name, err, msg))
    return R(throttle_time_ms=0, topics=out)


def refuse_create_topics(broker: Broker, req: Any, code: int) -> Any:
    """CreateTopics with `code` on every topic."""
    R = P.RESPONSES[P.CREATE_TOPICS]
    CR = R.CreatableTopicResult
    return R(topics=[CR(name=t.name, error_code=code, error_message=None) for t in req.topics])


async def delete_topics(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DeleteTopics: delete each named topic instance, one result each.

    UNKNOWN_TOPIC_OR_PARTITION when absent; an engine refusal through
    :data:`~topics.kafka.errors.ENGINE_ERRORS`.
    """
    R = P.RESPONSES[P.DELETE_TOPICS]
    DR = R.DeletableTopicResult
    out = []
    for name in req.topic_names:
        err, msg = E.NONE, None
        if not broker.allowed(conn, SCOPE_DELETE, name):
            err = E.TOPIC_AUTHORIZATION_FAILED
        else:
            try:
                if not await broker.backend.delete(name):
                    err = E.UNKNOWN_TOPIC_OR_PARTITION
            except BackendError as exc:
                err, msg = E.from_engine(E.DELETE, exc.code, exc.status), exc.message
        out.append(DR(name=name, error_code=err, error_message=msg))
    return R(throttle_time_ms=0, responses=out)


def refuse_delete_topics(broker: Broker, req: Any, code: int) -> Any:
    """DeleteTopics with `code` on every topic (by name, or by id in v6+ layouts)."""
    R = P.RESPONSES[P.DELETE_TOPICS]
    DR = R.DeletableTopicResult
    names = list(req.topic_names or []) + [t.name for t in (req.topics or [])]
    return R(responses=[DR(name=n, error_code=code) for n in names])
