"""The classic group protocol and the group admin APIs.

FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup: this node is
always the coordinator; membership and rebalancing live in
:class:`~topics.kafka.groups.Coordinator` (docs/KAFKA.md "Consumer groups").
ListGroups, DescribeGroups, DeleteGroups, OffsetDelete read and remove groups
and their committed offsets (docs/KAFKA.md "Admin APIs").

Groups are per tenant (the connection's `tenant`), and every group API needs
the `read` scope (GROUP_AUTHORIZATION_FAILED otherwise). A group exists while
it has members, or committed offsets (state `Empty`). Transaction
coordinators are not offered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_READ
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.api_metadata import NODE_ID
from topics.kafka.backend import BackendError
from topics.kafka.groups import COMPLETING, DEAD, EMPTY, STABLE, Group, subscribed_topics

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
    "list_groups",
    "describe_groups",
    "refuse_describe_groups",
    "delete_groups",
    "refuse_delete_groups",
    "offset_delete",
    "refuse_offset_delete",
]

log = logging.getLogger("topics.kafka")

#: ACL operations a key with the `read` scope has on its groups: READ (3),
#: DELETE (6), DESCRIBE (8). The codec carries authorized operations as a set of
#: operation numbers (None = not requested, -2147483648 on the wire).
GROUP_OPS = frozenset({3, 6, 8})
#: The group type ListGroups v5 reports: every group here speaks the classic protocol.
GROUP_TYPE = "classic"


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
        client_host="/" + conn.peer.rsplit(":", 1)[0],
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


# ------------------------------------------------------------------- admin


def _state(broker: Broker, tenant: str, group_id: str) -> tuple[Group | None, str]:
    """The live group (or None) and its Kafka state: a group known only by
    committed offsets is `Empty`, an unknown one `Dead`."""
    g = broker.groups.group(tenant, group_id)
    if g is not None and g.members:
        return g, g.state
    if g is not None or broker.offsets.has_group(tenant, group_id):
        return g, EMPTY
    return None, DEAD


def list_groups(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """ListGroups: the caller's tenant's groups, with protocol type and (v4+) state.

    A group is listed while it has members or committed offsets; one known
    only by its offsets is `Empty` with protocol type "" (a simple consumer
    group). `states_filter` (v4+) and `types_filter` (v5+, every group is
    `classic`) are matched without regard to case. A key without the `read`
    scope sees no groups (error NONE, as Kafka filters by permission).
    """
    R = P.RESPONSES[P.LIST_GROUPS]
    LG = R.ListedGroup
    if not broker.group_allowed(conn):
        return R(throttle_time_ms=0, error_code=E.NONE, groups=[])
    tenant = conn.tenant
    ids = {g.key[1] for g in broker.groups.tenant_groups(tenant)}
    ids |= broker.offsets.groups(tenant)
    states = {s.lower() for s in (req.states_filter or [])} if v >= 4 else set()
    types = {t.lower() for t in (req.types_filter or [])} if v >= 5 else set()
    out = []
    for gid in sorted(ids):
        g, state = _state(broker, tenant, gid)
        if state == DEAD or (states and state.lower() not in states):
            continue
        if types and GROUP_TYPE not in types:
            continue
        ptype = (g.protocol_type if g is not None else None) or ""
        out.append(LG(group_id=gid, protocol_type=ptype, group_state=state, group_type=GROUP_TYPE))
    return R(throttle_time_ms=0, error_code=E.NONE, groups=out)


def describe_groups(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DescribeGroups: state, protocol and members of each group asked for.

    Members carry `member_id`, `client_id`, `client_host` (`/ip`), and, once
    the group is `Stable`, the metadata of the chosen protocol and the
    assignment the leader gave them (empty bytes in other states, as Kafka).
    `protocol_data` is the chosen protocol in `Stable` and
    `CompletingRebalance`, "" otherwise. An unknown group is state `Dead` with
    error NONE; GROUP_AUTHORIZATION_FAILED without the `read` scope,
    INVALID_GROUP_ID for "". `authorized_operations` (v3+) is the READ,
    DELETE and DESCRIBE bitfield when asked for, -2147483648 when not.
    """
    R = P.RESPONSES[P.DESCRIBE_GROUPS]
    DG = R.DescribedGroup
    DM = DG.DescribedGroupMember
    ask_ops = v >= 3 and bool(req.include_authorized_operations)
    out = []
    for gid in req.groups:
        err, msg = E.NONE, None
        if not broker.group_allowed(conn):
            err, msg = E.GROUP_AUTHORIZATION_FAILED, "the key lacks the read scope"
        elif not gid:
            err, msg = E.INVALID_GROUP_ID, "the group id is empty"
        if err != E.NONE:
            out.append(
                DG(
                    error_code=err,
                    error_message=msg,
                    group_id=gid,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=None,
                )
            )
            continue
        g, state = _state(broker, conn.tenant, gid)
        members = []
        ptype, pdata = "", ""
        if g is not None and g.members:
            ptype = g.protocol_type or ""
            full = state == STABLE
            if state in (STABLE, COMPLETING):
                pdata = g.protocol_name or ""
            for m in g.members.values():
                meta = dict(m.protocols).get(g.protocol_name or "", b"") if full else b""
                members.append(
                    DM(
                        member_id=m.member_id,
                        group_instance_id=None,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=meta,
                        member_assignment=m.assignment if full else b"",
                    )
                )
        out.append(
            DG(
                error_code=E.NONE,
                error_message=None,
                group_id=gid,
                group_state=state,
                protocol_type=ptype,
                protocol_data=pdata,
                members=members,
                authorized_operations=set(GROUP_OPS) if ask_ops else None,
            )
        )
    return R(throttle_time_ms=0, groups=out)


def refuse_describe_groups(broker: Broker, req: Any, code: int) -> Any:
    """DescribeGroups with `code` on every group asked for."""
    R = P.RESPONSES[P.DESCRIBE_GROUPS]
    DG = R.DescribedGroup
    return R(
        groups=[
            DG(
                error_code=code,
                error_message=None,
                group_id=gid,
                group_state="",
                protocol_type="",
                protocol_data="",
                members=[],
            )
            for gid in req.groups
        ]
    )


async def delete_groups(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """DeleteGroups: forget each empty group and durably delete its committed offsets.

    Per group: GROUP_AUTHORIZATION_FAILED without the `read` scope,
    INVALID_GROUP_ID for "", NON_EMPTY_GROUP while it has members,
    GROUP_ID_NOT_FOUND when it has neither members nor committed offsets,
    COORDINATOR_NOT_AVAILABLE when the tombstone write fails (the client
    retries; nothing was deleted).
    """
    R = P.RESPONSES[P.DELETE_GROUPS]
    DR = R.DeletableGroupResult
    tenant = conn.tenant
    out = []
    for gid in req.groups_names:
        err = E.NONE
        g = broker.groups.group(tenant, gid)
        if not broker.group_allowed(conn):
            err = E.GROUP_AUTHORIZATION_FAILED
        elif not gid:
            err = E.INVALID_GROUP_ID
        elif g is not None and g.members:
            err = E.NON_EMPTY_GROUP
        elif g is None and not broker.offsets.has_group(tenant, gid):
            err = E.GROUP_ID_NOT_FOUND
        else:
            try:
                await broker.offsets.delete(tenant, gid)
                # A member that joined while the tombstones were written starts
                # the group afresh (without offsets); it is left alone.
                broker.groups.forget(tenant, gid)
            except BackendError as exc:
                log.warning("kafka: deleting group %r failed: %s", gid, exc.message)
                err = E.from_engine(E.COMMIT, exc.code, exc.status)
        out.append(DR(group_id=gid, error_code=err))
    return R(throttle_time_ms=0, results=out)


def refuse_delete_groups(broker: Broker, req: Any, code: int) -> Any:
    """DeleteGroups with `code` on every group."""
    R = P.RESPONSES[P.DELETE_GROUPS]
    DR = R.DeletableGroupResult
    return R(results=[DR(group_id=gid, error_code=code) for gid in req.groups_names])


async def offset_delete(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """OffsetDelete: durably delete the group's committed offsets of the given partitions.

    Top-level: GROUP_AUTHORIZATION_FAILED without the `read` scope,
    INVALID_GROUP_ID for "", GROUP_ID_NOT_FOUND when the group has neither
    members nor committed offsets, COORDINATOR_NOT_AVAILABLE when the
    tombstone write fails. Per partition: TOPIC_AUTHORIZATION_FAILED without
    `read` on the topic; GROUP_SUBSCRIBED_TO_TOPIC when the group has members
    subscribed to the topic (read from their `consumer` join metadata; when
    that cannot be read, every topic counts as subscribed);
    UNKNOWN_TOPIC_OR_PARTITION when the partition neither exists nor has an
    offset. A partition without an offset is otherwise NONE.
    """
    R = P.RESPONSES[P.OFFSET_DELETE]
    TR = R.OffsetDeleteResponseTopic
    PR = TR.OffsetDeleteResponsePartition
    tenant, gid = conn.tenant, req.group_id
    g = broker.groups.group(tenant, gid)
    top = E.NONE
    if not broker.group_allowed(conn):
        top = E.GROUP_AUTHORIZATION_FAILED
    elif not gid:
        top = E.INVALID_GROUP_ID
    elif (g is None or not g.members) and not broker.offsets.has_group(tenant, gid):
        top = E.GROUP_ID_NOT_FOUND
    if top != E.NONE:
        return R(error_code=top, throttle_time_ms=0, topics=[])
    subscribed = subscribed_topics(g) if g is not None and g.members else set()
    codes: dict[tuple[str, int], int] = {}
    doomed: list[tuple[str, int]] = []
    for t in req.topics:
        may = broker.allowed(conn, SCOPE_READ, conn.stored(t.name))
        for p in t.partitions:
            idx = p.partition_index
            key = (t.name, idx)
            if not may:
                codes[key] = E.TOPIC_AUTHORIZATION_FAILED
            elif subscribed is None or t.name in subscribed:
                codes[key] = E.GROUP_SUBSCRIBED_TO_TOPIC
            elif broker.offsets.get(tenant, gid, t.name, idx) is not None:
                codes[key] = E.NONE
                doomed.append(key)
            elif broker.locate(conn, t.name, idx)[1] is None:
                codes[key] = E.UNKNOWN_TOPIC_OR_PARTITION
            else:
                codes[key] = E.NONE
    if doomed:
        try:
            await broker.offsets.delete(tenant, gid, doomed)
        except BackendError as exc:
            log.warning("kafka: deleting offsets of group %r failed: %s", gid, exc.message)
            return R(
                error_code=E.from_engine(E.COMMIT, exc.code, exc.status),
                throttle_time_ms=0,
                topics=[],
            )
    topics = P.partition_codes(TR, PR, req.topics, lambda name, idx: codes[(name, idx)])
    return R(error_code=E.NONE, throttle_time_ms=0, topics=topics)


def refuse_offset_delete(broker: Broker, req: Any, code: int) -> Any:
    """OffsetDelete with `code` at the top and on every partition."""
    R = P.RESPONSES[P.OFFSET_DELETE]
    TR = R.OffsetDeleteResponseTopic
    PR = TR.OffsetDeleteResponsePartition
    topics = P.partition_codes(TR, PR, req.topics, lambda *_: code)
    return R(error_code=code, throttle_time_ms=0, topics=topics)
