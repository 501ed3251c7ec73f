"""The classic consumer-group coordinator (JoinGroup / SyncGroup / Heartbeat / LeaveGroup).

Membership is memory-only: after a restart clients simply rejoin. Only
committed offsets are durable (:mod:`topics.kafka.offsets`). Groups are keyed
by (tenant, group id), so two tenants using the same group id never meet.

States follow Kafka's: Empty -> PreparingRebalance -> CompletingRebalance ->
Stable. A JoinGroup is a long-poll held until every known member has rejoined
(or the largest rebalance timeout passes; members that did not rejoin are
dropped). The first join of an empty group waits :data:`INITIAL_DELAY_S` so
members starting together land in one generation. Assignment is done by the
leader client; the coordinator passes the bytes through.

The admin side (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete;
docs/KAFKA.md "Admin APIs") reads groups through :meth:`Coordinator.group` and
:meth:`Coordinator.tenant_groups`, removes an empty one with
:meth:`Coordinator.forget`, and asks :func:`subscribed_topics` which topics
the members of a `consumer` group subscribe to.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topics.kafka import errors as E

__all__ = [
    "Coordinator",
    "Group",
    "Member",
    "JoinResult",
    "SyncResult",
    "INITIAL_DELAY_S",
    "EMPTY",
    "PREPARING",
    "COMPLETING",
    "STABLE",
    "DEAD",
    "subscribed_topics",
]

INITIAL_DELAY_S = 0.3
REAP_INTERVAL_S = 0.25

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"  # what DescribeGroups reports for a group that does not exist


@dataclass(slots=True)
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    join_fut: asyncio.Future[JoinResult] | None = None
    sync_fut: asyncio.Future[SyncResult] | None = None
    assignment: bytes = b""
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True, eq=False)
class Group:
    key: tuple[str, str]
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    delaying: bool = False


def _settle(fut: asyncio.Future[Any] | None, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


class Coordinator:
    """All consumer groups of one server; every method runs on the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.groups: dict[tuple[str, str], Group] = {}
        self._clock = clock
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the session-expiry reaper on the running loop."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for g in self.groups.values():
            if g.timer is not None:
                g.timer.cancel()
            for m in g.members.values():
                _settle(m.join_fut, JoinResult(E.COORDINATOR_NOT_AVAILABLE))
                _settle(m.sync_fut, SyncResult(E.COORDINATOR_NOT_AVAILABLE))

    # ------------------------------------------------------------------ join

    async def join(
        self,
        tenant: str,
        group_id: str,
        member_id: str,
        client_id: str,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_host: str = "",
    ) -> JoinResult:
        """JoinGroup: long-polls until the rebalance completes (or fails fast).

        `client_id` and `client_host` are kept on the member for DescribeGroups.
        """
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id=member_id)
        if session_timeout_ms <= 0 or not protocols:
            return JoinResult(
                E.INVALID_SESSION_TIMEOUT
                if session_timeout_ms <= 0
                else E.INCONSISTENT_GROUP_PROTOCOL,
                member_id=member_id,
            )
        key = (tenant, group_id)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = Group(key)
        if g.members:
            names = {p[0] for p in protocols}
            if g.protocol_type != protocol_type or not all(
                names & {p[0] for p in m.protocols} for m in g.members.values()
            ):
                return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        now = self._clock()
        rebalance_s = (
            rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
        ) / 1000
        if member_id:
            m = g.members.get(member_id)
            if m is None:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            m.protocols = protocols
            m.session_timeout_s = session_timeout_ms / 1000
            m.rebalance_timeout_s = rebalance_s
            m.last_seen = now
        else:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            m = Member(member_id, session_timeout_ms / 1000, rebalance_s, protocols, now)
            g.members[member_id] = m
        m.client_id = client_id
        m.client_host = client_host
        g.protocol_type = protocol_type
        loop = asyncio.get_running_loop()
        _settle(m.join_fut, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id))
        m.join_fut = fut = loop.create_future()
        if g.state != PREPARING:
            self._prepare(g)
        self._try_complete(g)
        res: JoinResult = await fut
        return res

    def _prepare(self, g: Group) -> None:
        """Enter PreparingRebalance: pending syncs are told to rejoin."""
        was_empty = g.state == EMPTY
        g.state = PREPARING
        for m in g.members.values():
            _settle(m.sync_fut, SyncResult(E.REBALANCE_IN_PROGRESS))
            m.sync_fut = None
        if g.timer is not None:
            g.timer.cancel()
        loop = asyncio.get_running_loop()
        if was_empty:
            g.delaying = True
            g.timer = loop.call_later(INITIAL_DELAY_S, self._delay_over, g)
        else:
            g.delaying = False
            wait = max((m.rebalance_timeout_s for m in g.members.values()), default=1.0)
            g.timer = loop.call_later(wait, self._complete, g)

    def _delay_over(self, g: Group) -> None:
        g.delaying = False
        g.timer = None
        if g.state != PREPARING:
            return
        if all(m.join_fut is not None for m in g.members.values()):
            self._complete(g)
        else:
            wait = max((m.rebalance_timeout_s for m in g.members.values()), default=1.0)
            g.timer = asyncio.get_running_loop().call_later(wait, self._complete, g)

    def _try_complete(self, g: Group) -> None:
        if g.state == PREPARING and not g.delaying and g.members:
            if all(m.join_fut is not None for m in g.members.values()):
                self._complete(g)

    def _complete(self, g: Group) -> None:
        """Finish the join phase: drop laggards, pick protocol and leader, answer joins."""
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        if g.state != PREPARING:
            return
        for mid in [mid for mid, m in g.members.items() if m.join_fut is None]:
            del g.members[mid]
        g.generation += 1
        if not g.members:
            g.state = EMPTY
            g.leader = ""
            g.protocol_name = None
            return
        members = list(g.members.values())
        common = set.intersection(*({p[0] for p in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for m in members:
            for name, _ in m.protocols:
                if name in common:
                    votes[name] = votes.get(name, 0) + 1
                    break
        if g.leader not in g.members:
            g.leader = members[0].member_id
        leader_order = [p[0] for p in g.members[g.leader].protocols if p[0] in common]
        best = max(leader_order, key=lambda n: (votes.get(n, 0), -leader_order.index(n)))
        g.protocol_name = best
        g.state = COMPLETING
        everyone = [(m.member_id, dict(m.protocols)[best]) for m in members]
        now = self._clock()
        for m in members:
            fut, m.join_fut = m.join_fut, None
            m.last_seen = now
            _settle(
                fut,
                JoinResult(
                    E.NONE,
                    g.generation,
                    g.protocol_type,
                    best,
                    g.leader,
                    m.member_id,
                    everyone if m.member_id == g.leader else [],
                ),
            )

    # ------------------------------------------------------------------ sync

    async def sync(
        self,
        tenant: str,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: list[tuple[str, bytes]],
    ) -> SyncResult:
        """SyncGroup: the leader's assignments are handed to every member."""
        g = self.groups.get((tenant, group_id))
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if generation != g.generation:
            return SyncResult(E.ILLEGAL_GENERATION)
        m.last_seen = self._clock()
        if g.state == PREPARING:
            return SyncResult(E.REBALANCE_IN_PROGRESS)
        if g.state == STABLE:
            return SyncResult(E.NONE, m.assignment, g.protocol_type, g.protocol_name)
        if member_id == g.leader:
            given = dict(assignments)
            g.state = STABLE
            for other in g.members.values():
                other.assignment = given.get(other.member_id, b"")
                fut, other.sync_fut = other.sync_fut, None
                _settle(
                    fut,
                    SyncResult(E.NONE, other.assignment, g.protocol_type, g.protocol_name),
                )
            return SyncResult(E.NONE, m.assignment, g.protocol_type, g.protocol_name)
        _settle(m.sync_fut, SyncResult(E.REBALANCE_IN_PROGRESS))
        m.sync_fut = fut = asyncio.get_running_loop().create_future()
        return await fut

    # ------------------------------------------------------------- heartbeat

    def heartbeat(self, tenant: str, group_id: str, generation: int, member_id: str) -> int:
        """Heartbeat: keeps the session alive; tells members when to rejoin."""
        return self._member_check(
            self.groups.get((tenant, group_id)), generation, member_id, PREPARING
        )

    def _member_check(self, g: Group | None, generation: int, member_id: str, busy: str) -> int:
        """Keep a known member's session alive; NONE when it may go on.

        UNKNOWN_MEMBER_ID when there is no such group or member, ILLEGAL_GENERATION
        for another generation, REBALANCE_IN_PROGRESS while the group is in state `busy`.
        """
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            return E.UNKNOWN_MEMBER_ID
        m.last_seen = self._clock()
        if generation != g.generation:
            return E.ILLEGAL_GENERATION
        if g.state == busy:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave(self, tenant: str, group_id: str, member_ids: list[str]) -> list[int]:
        """LeaveGroup: one error code per member id; the rest rebalance at once."""
        g = self.groups.get((tenant, group_id))
        codes: list[int] = []
        changed = False
        for mid in member_ids:
            if g is None or mid not in g.members:
                codes.append(E.UNKNOWN_MEMBER_ID)
                continue
            self._remove(g, mid)
            codes.append(E.NONE)
            changed = True
        if g is not None and changed:
            self._after_removal(g)
        return codes

    def _remove(self, g: Group, mid: str) -> None:
        m = g.members.pop(mid)
        _settle(m.join_fut, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=mid))
        _settle(m.sync_fut, SyncResult(E.UNKNOWN_MEMBER_ID))

    def _after_removal(self, g: Group) -> None:
        if not g.members:
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
            g.state = EMPTY
            g.generation += 1
            g.leader = ""
            g.delaying = False
            return
        if g.state == PREPARING:
            self._try_complete(g)
        else:
            self._prepare(g)

    def commit_check(self, tenant: str, group_id: str, generation: int, member_id: str) -> int:
        """May this OffsetCommit proceed? NONE or the Kafka error code.

        A commit without generation and member (assign()-based consumers) is
        accepted while the group has no members.
        """
        g = self.groups.get((tenant, group_id))
        if generation < 0 and not member_id:
            if g is not None and g.members:
                return E.UNKNOWN_MEMBER_ID
            return E.NONE
        # Members of the current generation may still commit while the group
        # prepares a rebalance (revocation commits), not once it completes.
        return self._member_check(g, generation, member_id, COMPLETING)

    # ----------------------------------------------------------------- admin

    def group(self, tenant: str, group_id: str) -> Group | None:
        """The live group, or None (it has no members and was reaped, or never existed)."""
        return self.groups.get((tenant, group_id))

    def tenant_groups(self, tenant: str) -> list[Group]:
        """Every live group of `tenant`."""
        return [g for k, g in self.groups.items() if k[0] == tenant]

    def forget(self, tenant: str, group_id: str) -> bool:
        """Drop a group without members (DeleteGroups); False when it has members."""
        g = self.groups.get((tenant, group_id))
        if g is None:
            return True
        if g.members:
            return False
        if g.timer is not None:
            g.timer.cancel()
        del self.groups[(tenant, group_id)]
        return True

    # --------------------------------------------------------------- expiry

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            self.reap()

    def reap(self) -> None:
        """Expire members whose session timed out (those parked in a join are exempt)."""
        now = self._clock()
        for key, g in list(self.groups.items()):
            dead = [
                mid
                for mid, m in g.members.items()
                if m.join_fut is None and now - m.last_seen > m.session_timeout_s
            ]
            for mid in dead:
                self._remove(g, mid)
            if dead:
                self._after_removal(g)
            if not g.members and g.state == EMPTY and g.timer is None:
                del self.groups[key]


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (every version starts with
    int16 version, then an array of int16-length strings). Raises ValueError."""
    try:
        (count,) = _I32.unpack_from(metadata, 2)
        if count < 0:
            raise ValueError("null topic list")
        at = 6
        out = []
        for _ in range(count):
            (n,) = _I16.unpack_from(metadata, at)
            at += 2
            if n < 0 or at + n > len(metadata):
                raise ValueError("topic name out of bounds")
            out.append(metadata[at : at + n].decode())
            at += n
        return out
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


def subscribed_topics(g: Group) -> set[str] | None:
    """The topics the members of `g` subscribe to, read from their join metadata;
    None when that cannot be known (a protocol type other than `consumer`, or
    metadata that does not parse), which callers treat as "every topic"."""
    if g.protocol_type != "consumer":
        return None
    topics: set[str] = set()
    for m in g.members.values():
        for _name, metadata in m.protocols:
            try:
                topics.update(_subscription_topics(metadata))
            except ValueError:
                return None
    return topics
