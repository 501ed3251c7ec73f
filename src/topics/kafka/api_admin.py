"""CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords (docs/KAFKA.md, "Partitions").

A topic has N partitions, each its own `/v0` topic, and replication factor 1. CreateTopics
configs are `/v0` topic config fields (:func:`topic_config_from_kafka`) and
need the `admin` scope on the name (and on a `dead_letter` topic's name);
DeleteTopics needs `delete`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_ADMIN, SCOPE_DELETE
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.api_metadata import NODE_ID
from topics.kafka.backend import BackendError
from topics.kafka.naming import MAX_PARTITIONS, kafka_name_ok, partition_name

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = [
    "topic_config_from_kafka",
    "create_topics",
    "refuse_create_topics",
    "delete_topics",
    "refuse_delete_topics",
    "create_partitions",
    "refuse_create_partitions",
    "delete_records",
    "refuse_delete_records",
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


def _create_result(CR: Any, name: str, err: int, msg: str | None, count: int) -> Any:
    """One CreateTopics result entry."""
    ok = err == E.NONE
    return CR(
        name=name,
        error_code=err,
        error_message=msg,
        num_partitions=count if ok else -1,
        replication_factor=1 if ok else -1,
        configs=[] if ok else None,
    )


def _taken(backend: Any, names: list[str]) -> str | None:
    """The first of `names` that already exists as a `/v0` topic, or None."""
    return next((n for n in names if backend.partition(n) is not None), None)


async def _create_run(backend: Any, names: list[str], body: dict[str, Any]) -> None:
    """Create every topic of `names` with `body`; on a refusal, delete the ones
    this call created and raise the refusal (:class:`BackendError`)."""
    made: list[str] = []
    try:
        for n in names:
            await backend.create(n, body)
            made.append(n)
    except BackendError:
        for n in made:
            await backend.delete(n)
        raise


async def create_topics(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """CreateTopics: create (or with `validate_only` check) each topic with its partitions.

    A topic of N partitions is N `/v0` topics (docs/KAFKA.md, "Partitions"),
    created with the same config. Per topic: TOPIC_AUTHORIZATION_FAILED,
    INVALID_TOPIC_EXCEPTION (a bad name, or one ending in `:<n>`),
    INVALID_PARTITIONS (not 1..MAX_PARTITIONS, or explicit assignments that do
    not number 0..N-1), INVALID_REPLICATION_FACTOR (not 1),
    TOPIC_ALREADY_EXISTS (the topic, or one of its partition names, exists),
    INVALID_CONFIG, or an engine refusal through
    :data:`~topics.kafka.errors.ENGINE_ERRORS`.
    """
    R = P.RESPONSES[P.CREATE_TOPICS]
    CR = R.CreatableTopicResult
    backend = broker.backend
    out = []
    for t in req.topics:
        err, msg = E.NONE, None
        name = t.name
        stored = conn.stored(name)
        count = t.num_partitions if t.num_partitions != -1 else 1
        if t.assignments:
            count = len(t.assignments)
        if not broker.allowed(conn, SCOPE_ADMIN, stored):
            err, msg = E.TOPIC_AUTHORIZATION_FAILED, "the key lacks admin on this name"
        elif not kafka_name_ok(name) or not backend.valid_name(stored):
            err, msg = (
                E.INVALID_TOPIC_EXCEPTION,
                "invalid topic name (a name ending in :<n> names a partition)",
            )
        elif not 1 <= count <= MAX_PARTITIONS or (
            t.assignments and sorted(a.partition_index for a in t.assignments) != list(range(count))
        ):
            err, msg = E.INVALID_PARTITIONS, f"partitions must number 1 to {MAX_PARTITIONS}"
        elif t.replication_factor not in (-1, 1):
            err, msg = E.INVALID_REPLICATION_FACTOR, "a single node: replication factor 1"
        elif backend.partition(stored) is not None:
            err, msg = E.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        elif clash := _taken(backend, [partition_name(stored, i) for i in range(1, count)]):
            err, msg = (
                E.TOPIC_ALREADY_EXISTS,
                f"{clash!r} already exists as a topic of its own, so it cannot become a partition",
            )
        else:
            try:
                body = topic_config_from_kafka([(c.name, c.value) for c in t.configs])
                dl = body.get("dead_letter")
                if isinstance(dl, str):
                    dl = body["dead_letter"] = conn.namespace + dl
                if isinstance(dl, str) and not broker.allowed(conn, SCOPE_ADMIN, dl):
                    # A queue dead-letters into (and creates) that topic: the
                    # key must be allowed the name as well as the topic's own.
                    err, msg = (
                        E.TOPIC_AUTHORIZATION_FAILED,
                        "the key may not use this dead_letter topic",
                    )
                elif req.validate_only:
                    backend.check_config(stored, body)
                else:
                    await _create_run(
                        backend, [partition_name(stored, i) for i in range(count)], body
                    )
            except ValueError as exc:
                err, msg = E.INVALID_CONFIG, str(exc)
            except BackendError as exc:
                err, msg = E.from_engine(E.CREATE, exc.code, exc.status), exc.message
        out.append(_create_result(CR, name, err, msg, count))
    return R(throttle_time_ms=0, topics=out)


def refuse_create_topics(broker: Broker, req: Any, code: int) -> Any:
    """CreateTopics with `code` on every topic."""
    R = P.RESPONSES[P.CREATE_TOPICS]
    CR = R.CreatableTopicResult
    return R(topics=[CR(name=t.name, error_code=code, error_message=None) for t in req.topics])


async def delete_topics(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DeleteTopics: delete each named topic with every partition, one result each.

    UNKNOWN_TOPIC_OR_PARTITION when absent; INVALID_TOPIC_EXCEPTION for a
    partition name; an engine refusal through
    :data:`~topics.kafka.errors.ENGINE_ERRORS`.
    """
    R = P.RESPONSES[P.DELETE_TOPICS]
    DR = R.DeletableTopicResult
    backend = broker.backend
    out = []
    for name in req.topic_names:
        err, msg = E.NONE, None
        stored = conn.stored(name)
        if not broker.allowed(conn, SCOPE_DELETE, stored):
            err = E.TOPIC_AUTHORIZATION_FAILED
        elif not kafka_name_ok(name):
            err, msg = E.INVALID_TOPIC_EXCEPTION, "a name ending in :<n> names a partition"
        else:
            try:
                if not await backend.delete(stored):
                    err = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    for extra in backend.partition_topics(stored):
                        await backend.delete(extra)
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


async def create_partitions(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """CreatePartitions: grow a topic to `count` partitions (never shrink).

    The new partitions are `/v0` topics with partition 0's config
    (docs/KAFKA.md, "Partitions"). Needs `admin` on the topic. Per topic:
    TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS
    (not above the current count, or above MAX_PARTITIONS),
    INVALID_REPLICA_ASSIGNMENT when assignments name another broker,
    TOPIC_ALREADY_EXISTS when a new partition's name is taken, or an engine
    refusal. `validate_only` checks without creating.
    """
    R = P.RESPONSES[P.CREATE_PARTITIONS]
    TR = R.CreatePartitionsTopicResult
    backend = broker.backend
    out = []
    for t in req.topics:
        err, msg = E.NONE, None
        stored = conn.stored(t.name)
        have = backend.partition_count(stored) if kafka_name_ok(t.name) else 0
        new = [partition_name(stored, i) for i in range(have, t.count)]
        if not broker.allowed(conn, SCOPE_ADMIN, stored):
            err = E.TOPIC_AUTHORIZATION_FAILED
        elif have == 0:
            err = E.UNKNOWN_TOPIC_OR_PARTITION
        elif t.count <= have or t.count > MAX_PARTITIONS:
            err = E.INVALID_PARTITIONS
            msg = f"topic {t.name!r} has {have} partitions; the new count must be above it and at most {MAX_PARTITIONS}"
        elif t.assignments and any(list(a.broker_ids) != [NODE_ID] for a in t.assignments):
            err, msg = E.INVALID_REPLICA_ASSIGNMENT, f"the only broker is {NODE_ID}"
        elif (clash := _taken(backend, new)) is not None:
            err = E.TOPIC_ALREADY_EXISTS
            msg = f"{clash!r} already exists as a topic of its own, so it cannot become a partition"
        elif not req.validate_only:
            body = backend.config_body(stored) or {}
            try:
                await _create_run(backend, new, body)
            except BackendError as exc:
                err, msg = E.from_engine(E.CREATE, exc.code, exc.status), exc.message
        out.append(TR(name=t.name, error_code=err, error_message=msg))
    return R(throttle_time_ms=0, results=out)


def refuse_create_partitions(broker: Broker, req: Any, code: int) -> Any:
    """CreatePartitions with `code` on every topic."""
    R = P.RESPONSES[P.CREATE_PARTITIONS]
    TR = R.CreatePartitionsTopicResult
    return R(results=[TR(name=t.name, error_code=code, error_message=None) for t in req.topics])


async def delete_records(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DeleteRecords: delete every record of a partition below an offset.

    Offset `o` deletes the records of seq <= o, a `/v0` delete with
    `before_seq` = o + 1 (docs/API.md, "10. Deleting records"); -1 means the
    high watermark (everything). The answer carries the new low watermark
    (`earliest_seq - 1`). Needs `delete` on the topic. Per partition:
    TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION,
    OFFSET_OUT_OF_RANGE (above the high watermark or below -1), or an engine
    refusal.
    """
    R = P.RESPONSES[P.DELETE_RECORDS]
    TR = R.DeleteRecordsTopicResult
    PR = TR.DeleteRecordsPartitionResult
    backend = broker.backend
    out = []
    for t in req.topics:
        prs = []
        may = broker.allowed(conn, SCOPE_DELETE, conn.stored(t.name))
        for p in t.partitions:
            err, low = E.NONE, -1
            stored, part = broker.locate(conn, t.name, p.partition_index)
            if not may:
                err = E.TOPIC_AUTHORIZATION_FAILED
            elif part is None:
                err = E.UNKNOWN_TOPIC_OR_PARTITION
            elif p.offset > part.head_seq or p.offset < -1:
                err = E.OFFSET_OUT_OF_RANGE
            else:
                upto = part.head_seq if p.offset == -1 else p.offset
                try:
                    await backend.delete_before(stored, upto + 1)
                    after = backend.partition(stored)
                    low = after.earliest_seq - 1 if after is not None else -1
                except BackendError as exc:
                    err = E.from_engine(E.DELETE, exc.code, exc.status)
            prs.append(PR(partition_index=p.partition_index, low_watermark=low, error_code=err))
        out.append(TR(name=t.name, partitions=prs))
    return R(throttle_time_ms=0, topics=out)


def refuse_delete_records(broker: Broker, req: Any, code: int) -> Any:
    """DeleteRecords with `code` on every partition."""
    R = P.RESPONSES[P.DELETE_RECORDS]
    TR = R.DeleteRecordsTopicResult
    PR = TR.DeleteRecordsPartitionResult
    return R(
        topics=[
            TR(
                name=t.name,
                partitions=[
                    PR(partition_index=p.partition_index, low_watermark=-1, error_code=code)
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ]
    )
