"""Metadata: the topics a key may see, each with its partitions, all led by this node.

Names are the connection's Kafka names: its namespace is stripped and each
topic lists the partitions its stored run holds (docs/KAFKA.md, "Partitions").

A topic is created on first use the way Kafka's `auto.create.topics.enable`
does it (docs/KAFKA.md "Topics, partitions and offsets"): a Metadata request
naming an unknown topic with `allow_auto_topic_creation` creates it with the
default config when the key may write that name. Listing every topic shows
only the names the key may read or write.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_ADMIN, SCOPE_READ, SCOPE_WRITE
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.backend import BackendError
from topics.kafka.naming import kafka_name_ok

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = ["NODE_ID", "CLUSTER_ID", "cluster_ops", "metadata", "refuse_metadata"]

log = logging.getLogger("topics.kafka")

NODE_ID = 0
CLUSTER_ID = "topics-single-node"


#: ACL operations on the cluster, as the codec carries them (a set of
#: operation numbers; None = not requested): DESCRIBE (8), plus CREATE (5),
#: ALTER (7), DESCRIBE_CONFIGS (10), ALTER_CONFIGS (11) with the `admin` scope
#: and IDEMPOTENT_WRITE (12) with `write`.
_OPS_DESCRIBE = frozenset({8})
_OPS_ADMIN = frozenset({5, 7, 10, 11})
_OPS_WRITE = frozenset({12})


def cluster_ops(conn: ConnState) -> set[int]:
    """The cluster operations the connection's key may perform (Metadata, DescribeCluster)."""
    p = conn.principal
    ops = set(_OPS_DESCRIBE)
    if p is not None and p.has(SCOPE_ADMIN):
        ops |= _OPS_ADMIN
    if p is not None and p.has(SCOPE_WRITE):
        ops |= _OPS_WRITE
    return ops


def broker_list(broker: Broker, R: Any) -> list[Any]:
    """This node as the only broker, at its advertised address (`R`: the entry type)."""
    host, port = broker.advertised
    return [R(node_id=NODE_ID, host=host, port=port, rack=None)]


def _visible(broker: Broker, conn: ConnState, name: str) -> bool:
    return broker.allowed(conn, SCOPE_READ, name) or broker.allowed(conn, SCOPE_WRITE, name)


async def metadata(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """Metadata: brokers, cluster id and the requested (or every visible) topic.

    Per topic: TOPIC_AUTHORIZATION_FAILED for a named topic the key may
    neither read nor write, INVALID_TOPIC_EXCEPTION for an invalid name,
    UNKNOWN_TOPIC_OR_PARTITION for an absent one not auto-created.
    """
    R = P.RESPONSES[P.METADATA]
    T = R.MetadataResponseTopic
    Part = T.MetadataResponsePartition
    backend = broker.backend
    names: list[str]
    requested = req.topics
    ns = conn.namespace
    if requested is None or (v == 0 and not requested):
        names = [
            n[len(ns) :]
            for n in backend.names()
            if n.startswith(ns) and len(n) > len(ns) and _visible(broker, conn, n)
        ]
        explicit = False
    else:
        names = [t.name for t in requested if t.name is not None]
        explicit = True
    auto = bool(req.allow_auto_topic_creation) if v >= 4 else True
    topics = []
    for name in names:
        err = E.NONE
        stored = conn.stored(name)
        if explicit and not _visible(broker, conn, stored):
            err = E.TOPIC_AUTHORIZATION_FAILED
        elif not kafka_name_ok(name) or not backend.valid_name(stored):
            err = E.INVALID_TOPIC_EXCEPTION
        elif backend.partition(stored) is None:
            err = E.UNKNOWN_TOPIC_OR_PARTITION
            if auto and broker.allowed(conn, SCOPE_WRITE, stored):
                try:
                    await backend.create(stored, {})
                    err = E.NONE
                except BackendError as exc:
                    log.info("kafka: auto-create of %r refused: %s", stored, exc.message)
                    err = E.from_engine(E.AUTO_CREATE, exc.code, exc.status)
        parts = []
        if err == E.NONE:
            parts = [
                Part(
                    error_code=E.NONE,
                    partition_index=i,
                    leader_id=NODE_ID,
                    leader_epoch=0,
                    replica_nodes=[NODE_ID],
                    isr_nodes=[NODE_ID],
                    offline_replicas=[],
                )
                for i in range(backend.partition_count(stored))
            ]
        topics.append(T(error_code=err, name=name, is_internal=False, partitions=parts))
    asked = 8 <= v <= 10 and bool(req.include_cluster_authorized_operations)
    return R(
        throttle_time_ms=0,
        brokers=broker_list(broker, R.MetadataResponseBroker),
        cluster_id=CLUSTER_ID,
        controller_id=NODE_ID,
        topics=topics,
        authorized_operations=cluster_ops(conn) if asked else None,
    )


def refuse_metadata(broker: Broker, req: Any, code: int) -> Any:
    """Metadata with `code` on the response and on every requested topic."""
    R = P.RESPONSES[P.METADATA]
    T = R.MetadataResponseTopic
    return R(
        brokers=broker_list(broker, R.MetadataResponseBroker),
        topics=[T(error_code=code, name=t.name, partitions=[]) for t in (req.topics or [])],
        error_code=code,
    )
