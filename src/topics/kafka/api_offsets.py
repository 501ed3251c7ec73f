"""OffsetCommit and OffsetFetch: committed consumer-group offsets.

Offsets are kept durably by :class:`~topics.kafka.offsets.OffsetStore`
(docs/KAFKA.md "Consumer groups"): an OffsetCommit is answered after its
fsync. Both APIs need the `read` scope for the group
(GROUP_AUTHORIZATION_FAILED) and on each topic (TOPIC_AUTHORIZATION_FAILED);
committed offsets are per tenant. Offsets are kept under the Kafka names the
client uses (its namespace stripped: docs/KAFKA.md, "Tenant namespaces").

Read your writes: requests of one connection are handled concurrently, but an
OffsetFetch waits for the group's commits that started before it (on any
connection) to finish their durable write, as if a Kafka broker had handled them
one after the other. A client that pipelines a commit and a fetch of the
committed offsets (aiokafka does when a rebalance lands during a commit), or the
next owner of a partition reading after the previous owner's last accepted
commit, gets the committed offset, not the one before it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_READ
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.backend import BackendError

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = ["offset_commit", "refuse_offset_commit", "offset_fetch", "refuse_offset_fetch"]

log = logging.getLogger("topics.kafka")


async def offset_commit(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """OffsetCommit: one durable write for every accepted partition of the request.

    A group check that fails (unknown member, old generation, rebalance) is
    the code of every partition; a failed write is COORDINATOR_NOT_AVAILABLE
    (the client retries).
    """
    R = P.RESPONSES[P.OFFSET_COMMIT]
    TR = R.OffsetCommitResponseTopic
    PR = TR.OffsetCommitResponsePartition
    gate = (
        E.GROUP_AUTHORIZATION_FAILED
        if not broker.group_allowed(conn)
        else (
            broker.groups.commit_check(
                conn.tenant, req.group_id, req.generation_id_or_member_epoch, req.member_id
            )
        )
    )
    codes: dict[tuple[str, int], int] = {}
    entries = []
    for t in req.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if gate != E.NONE:
                codes[key] = gate
            elif not broker.allowed(conn, SCOPE_READ, conn.stored(t.name)):
                codes[key] = E.TOPIC_AUTHORIZATION_FAILED
            elif broker.locate(conn, t.name, p.partition_index)[1] is None:
                codes[key] = E.UNKNOWN_TOPIC_OR_PARTITION
            else:
                codes[key] = E.NONE
                epoch = p.committed_leader_epoch if v >= 6 else -1
                entries.append(
                    (t.name, p.partition_index, (p.committed_offset, p.committed_metadata, epoch))
                )
    if entries:
        try:
            await broker.offsets.commit(conn.tenant, req.group_id, entries)
        except BackendError as exc:
            log.warning("kafka: offset commit for group %r failed: %s", req.group_id, exc.message)
            err = E.from_engine(E.COMMIT, exc.code, exc.status)
            for name, idx, _c in entries:
                codes[(name, idx)] = err
    topics = P.partition_codes(TR, PR, req.topics, lambda name, idx: codes[(name, idx)])
    return R(throttle_time_ms=0, topics=topics)


def refuse_offset_commit(broker: Broker, req: Any, code: int) -> Any:
    """OffsetCommit with `code` on every partition of the request."""
    R = P.RESPONSES[P.OFFSET_COMMIT]
    TR = R.OffsetCommitResponseTopic
    return P.refuse_partitions(R, TR, TR.OffsetCommitResponsePartition, req, code)


async def offset_fetch(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """OffsetFetch: the committed offsets asked for (all of the group's when `topics` is null).

    Answered once the group's commits that started before it have finished
    (module docstring). A partition without a commit has offset -1. Without
    `topics`, only partitions of topics the key may read are listed.
    """
    R = P.RESPONSES[P.OFFSET_FETCH]
    TR = R.OffsetFetchResponseTopic
    PR = TR.OffsetFetchResponsePartition
    if not broker.group_allowed(conn):
        return R(throttle_time_ms=0, topics=[], error_code=E.GROUP_AUTHORIZATION_FAILED)
    await broker.offsets.settled(conn.tenant, req.group_id)
    wanted: list[tuple[str, list[int]]]
    if req.topics is None:
        by: dict[str, list[int]] = {}
        for name, idx in broker.offsets.committed_partitions(conn.tenant, req.group_id):
            if broker.allowed(conn, SCOPE_READ, conn.stored(name)):
                by.setdefault(name, []).append(idx)
        wanted = list(by.items())
    else:
        wanted = [(t.name, list(t.partition_indexes)) for t in req.topics]
    out = []
    for name, idxs in wanted:
        prs = []
        for idx in idxs:
            if not broker.allowed(conn, SCOPE_READ, conn.stored(name)):
                prs.append(
                    PR(
                        partition_index=idx,
                        committed_offset=-1,
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=E.TOPIC_AUTHORIZATION_FAILED,
                    )
                )
                continue
            c = broker.offsets.get(conn.tenant, req.group_id, name, idx)
            off, md, ep = c if c is not None else (-1, "", -1)
            prs.append(
                PR(
                    partition_index=idx,
                    committed_offset=off,
                    committed_leader_epoch=ep,
                    metadata=md if md is not None else "",
                    error_code=E.NONE,
                )
            )
        out.append(TR(name=name, partitions=prs))
    return R(throttle_time_ms=0, topics=out, error_code=E.NONE)


def refuse_offset_fetch(broker: Broker, req: Any, code: int) -> Any:
    """OffsetFetch with `code` on the response and on every group asked (v8+ layout)."""
    R = P.RESPONSES[P.OFFSET_FETCH]
    return R(
        topics=[],
        error_code=code,
        groups=[
            R.OffsetFetchResponseGroup(group_id=g.group_id, topics=[], error_code=code)
            for g in (req.groups or [])
        ],
    )
