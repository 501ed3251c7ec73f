"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup: the classic group protocol.

This node is always the coordinator; membership and rebalancing live in
:class:`~topics.kafka.groups.Coordinator` (docs/KAFKA.md "Consumer groups").
Groups are per tenant (the connection's key), and every group API needs the
`read` scope (GROUP_AUTHORIZATION_FAILED otherwise). Transaction
coordinators are not offered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_READ
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.api_metadata import NODE_ID

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = [
    "find_coordinator",
    "refuse_find_coordinator",
    "join_group",
    "sync_group",
    "heartbeat",
    "leave_group",
    "refuse_leave_group",
]


def find_coordinator(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """FindCoordinator: this node for a group key (v4+: for each key asked)."""
    R = P.RESPONSES[P.FIND_COORDINATOR]
    host, port = broker.advertised
    p = conn.principal

    def answer(key_type: int) -> tuple[int, str | None]:
        if key_type != 0:
            return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported"
        if p is None or not p.has(SCOPE_READ):
            return E.GROUP_AUTHORIZATION_FAILED, "the key lacks the read scope"
        return E.NONE, None

    if v >= 4:
        coords = []
        for key in req.coordinator_keys:
            err, msg = answer(req.key_type)
            coords.append(
                R.Coordinator(
                    key=key,
                    node_id=NODE_ID if not err else -1,
                    host=host if not err else "",
                    port=port if not err else -1,
                    error_code=err,
                    error_message=msg,
                )
            )
        return R(throttle_time_ms=0, coordinators=coords)
    err, msg = answer(req.key_type if v >= 1 else 0)
    return R(
        throttle_time_ms=0,
        error_code=err,
        error_message=msg,
        node_id=NODE_ID if not err else -1,
        host=host if not err else "",
        port=port if not err else -1,
    )


def refuse_find_coordinator(broker: Broker, req: Any, code: int) -> Any:
    """FindCoordinator with `code` on the response and on every key asked."""
    R = P.RESPONSES[P.FIND_COORDINATOR]
    return R(
        error_code=code,
        node_id=-1,
        host="",
        port=-1,
        coordinators=[
            R.Coordinator(key=k, node_id=-1, host="", port=-1, error_code=code, error_message=None)
            for k in (req.coordinator_keys or [])
        ],
    )


async def join_group(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """JoinGroup: answered when the group's next generation forms."""
    R = P.RESPONSES[P.JOIN_GROUP]
    if not broker.group_allowed(conn):
        return R(
            throttle_time_ms=0,
            error_code=E.GROUP_AUTHORIZATION_FAILED,
            generation_id=-1,
            protocol_name=None,
            leader="",
            member_id=req.member_id,
            members=[],
        )
    res = await broker.groups.join(
        conn.tenant,
        req.group_id,
        req.member_id,
        conn.client_id,
        req.protocol_type,
        [(p.name, bytes(p.metadata)) for p in req.protocols],
        req.session_timeout_ms,
        req.rebalance_timeout_ms if v >= 1 else req.session_timeout_ms,
    )
    M = R.JoinGroupResponseMember
    return R(
        throttle_time_ms=0,
        error_code=res.error,
        generation_id=res.generation,
        protocol_type=res.protocol_type,
        protocol_name=res.protocol_name if v >= 7 else (res.protocol_name or ""),
        leader=res.leader,
        member_id=res.member_id,
        members=[M(member_id=mid, group_instance_id=None, metadata=md) for mid, md in res.members],
    )


async def sync_group(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """SyncGroup: the leader's assignment, handed to each member."""
    R = P.RESPONSES[P.SYNC_GROUP]
    if not broker.group_allowed(conn):
        return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED, assignment=b"")
    res = await broker.groups.sync(
        conn.tenant,
        req.group_id,
        req.generation_id,
        req.member_id,
        [(a.member_id, bytes(a.assignment)) for a in req.assignments],
    )
    return R(
        throttle_time_ms=0,
        error_code=res.error,
        protocol_type=res.protocol_type,
        protocol_name=res.protocol_name,
        assignment=res.assignment,
    )


def heartbeat(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """Heartbeat: keeps the member's session; REBALANCE_IN_PROGRESS asks it to rejoin."""
    R = P.RESPONSES[P.HEARTBEAT]
    if not broker.group_allowed(conn):
        return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED)
    err = broker.groups.heartbeat(conn.tenant, req.group_id, req.generation_id, req.member_id)
    return R(throttle_time_ms=0, error_code=err)


def leave_group(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """LeaveGroup: one member (v0-2) or several (v3+, one error code each)."""
    R = P.RESPONSES[P.LEAVE_GROUP]
    ids = [m.member_id for m in req.members] if v >= 3 else [req.member_id]
    if not broker.group_allowed(conn):
        return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED, members=[])
    codes = broker.groups.leave(conn.tenant, req.group_id, ids)
    if v >= 3:
        MR = R.MemberResponse
        return R(
            throttle_time_ms=0,
            error_code=E.NONE,
            members=[
                MR(member_id=m, group_instance_id=None, error_code=c)
                for m, c in zip(ids, codes, strict=True)
            ],
        )
    return R(throttle_time_ms=0, error_code=codes[0])


def refuse_leave_group(broker: Broker, req: Any, code: int) -> Any:
    """LeaveGroup with `code` and no member results."""
    return P.RESPONSES[P.LEAVE_GROUP](error_code=code, members=[])
