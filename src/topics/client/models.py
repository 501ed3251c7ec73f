"""Typed results of :mod:`topics.client`: plain frozen dataclasses built from the
JSON the server answers (docs/API.md names every field; each class says which
section). Times are integer milliseconds since the Unix epoch, durations
integer milliseconds, sizes bytes (docs/API.md, "1. Basics"). Fields the
server leaves out are None here; `raw` keeps the answer as received, minus the
`performance` block, for anything a class does not expose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "TopicConfig",
    "QueueCounters",
    "TopicState",
    "TopicInfo",
    "TopicPage",
    "PutTopicResult",
    "DeleteTopicResult",
    "AppendResult",
    "Record",
    "Tombstone",
    "CaughtUp",
    "TopicDeleted",
    "Event",
    "DiffPage",
    "DeleteRecordsResult",
    "Router",
    "RouterInfo",
    "RouterPage",
    "DeleteRouterResult",
    "Job",
    "ClaimResult",
    "AckResult",
    "NackResult",
    "ExtendResult",
    "Health",
    "Readiness",
    "WatchStart",
    "WatchSession",
]


def _strip(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "performance"}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's config, all 17 fields (docs/API.md, "5. The topic config object").

    The defaults are the server's. `ttl_ms`, `idempotency_window_ms`,
    `lease_ms` and `claim_jitter_ms` are milliseconds, `cap_bytes` bytes; `0`
    turns a cap or the TTL off. A PUT replaces the whole config, so a field
    left at its default here goes back to the default on the server.
    """

    type: str = "log"
    ttl_ms: int = 0
    cap_records: int = 0
    cap_bytes: int = 0
    discard: str = "old"
    durable: bool = False
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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopicConfig:
        """The config from its JSON object; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, all 17 fields."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueCounters:
    """A queue topic's job counts (docs/API.md, "14.7 Queue counters and dead-letter copies")."""

    ready: int
    in_flight: int
    dead_lettered: int


@dataclass(frozen=True, slots=True)
class TopicState:
    """`GET /v0/topics/:topic` (docs/API.md, "6.2 `GET /v0/topics/:topic`")."""

    topic: str
    type: str
    head_seq: int
    earliest_seq: int
    next_seq: int
    count: int
    bytes: int
    config: TopicConfig
    effective_priority: int
    last_write_ts: int | None
    last_read_ts: int | None
    queue: QueueCounters | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicState:
        q = d.get("queue")
        return cls(
            topic=str(d["topic"]),
            type=str(d.get("type", "log")),
            head_seq=int(d["head_seq"]),
            earliest_seq=int(d["earliest_seq"]),
            next_seq=int(d.get("next_seq", int(d["head_seq"]) + 1)),
            count=int(d["count"]),
            bytes=int(d["bytes"]),
            config=TopicConfig.from_dict(d.get("config") or {}),
            effective_priority=int(d.get("effective_priority", 0)),
            last_write_ts=_opt_int(d.get("last_write_ts")),
            last_read_ts=_opt_int(d.get("last_read_ts")),
            queue=QueueCounters(int(q["ready"]), int(q["in_flight"]), int(q["dead_lettered"]))
            if isinstance(q, Mapping)
            else None,
            raw=_strip(d),
        )


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """One entry of `GET /v0/topics` (docs/API.md, "6.3 `GET /v0/topics`")."""

    topic: str
    head_seq: int
    earliest_seq: int
    count: int
    bytes: int
    durable: bool
    effective_priority: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicInfo:
        return cls(
            topic=str(d["topic"]),
            head_seq=int(d["head_seq"]),
            earliest_seq=int(d["earliest_seq"]),
            count=int(d["count"]),
            bytes=int(d["bytes"]),
            durable=bool(d.get("durable", False)),
            effective_priority=int(d.get("effective_priority", 0)),
        )


@dataclass(frozen=True, slots=True)
class TopicPage:
    """One page of topics; `next_cursor` is None on the last page (docs/API.md, "8.3 List cursors")."""

    topics: list[TopicInfo]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class PutTopicResult:
    """`PUT /v0/topics/:topic`: `created` is False when an existing topic's config was replaced."""

    topic: str
    created: bool
    config: TopicConfig


@dataclass(frozen=True, slots=True)
class DeleteTopicResult:
    """`DELETE /v0/topics/:topic`: `deleted` is False when there was no such topic;
    `routers_removed` lists the routers deleted with it, sorted."""

    topic: str
    deleted: bool
    routers_removed: list[str]


@dataclass(frozen=True, slots=True)
class AppendResult:
    """`POST /v0/topics/:topic` (docs/API.md, "7.1 `POST /v0/topics/:topic`").

    `seqs` is None when the write asked for ``return_seqs=False``. `deduped`
    is True when the idempotency key had been seen: nothing was appended and
    the seqs are those of the earlier write (docs/API.md, "7.2 Idempotent
    writes"). `attempts` counts the requests this call sent (retries included).
    """

    topic: str
    first_seq: int
    last_seq: int
    seqs: list[int] | None
    head_seq: int
    count: int
    created: bool
    deduped: bool
    idempotency_key: str | None = None
    attempts: int = 1

    @classmethod
    def from_json(
        cls, d: Mapping[str, Any], *, key: str | None = None, attempts: int = 1
    ) -> AppendResult:
        seqs = d.get("seqs")
        return cls(
            topic=str(d["topic"]),
            first_seq=int(d["first_seq"]),
            last_seq=int(d["last_seq"]),
            seqs=[int(s) for s in seqs] if isinstance(seqs, list) else None,
            head_seq=int(d["head_seq"]),
            count=int(d["count"]),
            created=bool(d.get("created", False)),
            deduped=bool(d.get("deduped", False)),
            idempotency_key=key,
            attempts=attempts,
        )


@dataclass(frozen=True, slots=True)
class Record:
    """A stored record as a reader gets it (docs/API.md, "4. Records").

    `seq` and `ts` (ms) are the server's `$seq` and `$ts`; `node` and `tag` are
    None when absent (`tag` also when the read did not ask for tags); `meta` is
    None when absent or not asked for. `data` is None both for JSON ``null``
    and for a push frame without data (`include_data=False`).
    """

    topic: str
    seq: int
    ts: int
    data: Any
    node: str | None = None
    tag: str | None = None
    meta: Any = None

    @classmethod
    def from_json(cls, topic: str, d: Mapping[str, Any]) -> Record:
        return cls(
            topic=topic,
            seq=int(d["$seq"]),
            ts=int(d["$ts"]),
            data=d.get("data"),
            node=d.get("$node"),
            tag=d.get("$tag"),
            meta=d.get("meta"),
        )

    def to_json(self) -> dict[str, Any]:
        """The record in the server's shape: `$seq`, `$ts`, `$node`, `$tag`, `data`, `meta`
        (absent fields left out)."""
        out: dict[str, Any] = {"$seq": self.seq, "$ts": self.ts}
        if self.node is not None:
            out["$node"] = self.node
        if self.tag is not None:
            out["$tag"] = self.tag
        out["data"] = self.data
        if self.meta is not None:
            out["meta"] = self.meta
        return out


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Records of `topic` lost before they were read: seqs `gap_from`..`gap_to`, both
    included (docs/API.md, "9. Tombstones"). Never an error.

    `reason` is one of `cap`, `ttl`, `mixed`, `source_trim`, `recreated`,
    `corrupt` and, on a watch stream's first read of a topic,
    `from_seq_too_old`. Reading goes on at `earliest_seq` (after `gap_to` for
    `corrupt`). `missed_estimate` comes with diff reads only (None on a watch).
    """

    topic: str
    gap_from: int
    gap_to: int
    reason: str
    earliest_seq: int
    head_seq: int
    missed_estimate: int | None = None

    @property
    def missed(self) -> int:
        """How many seqs the gap covers."""
        return self.gap_to - self.gap_from + 1

    @classmethod
    def from_json(cls, topic: str, d: Mapping[str, Any]) -> Tombstone:
        return cls(
            topic=topic,
            gap_from=int(d["gap_from"]),
            gap_to=int(d["gap_to"]),
            reason=str(d.get("reason", "")),
            earliest_seq=int(d.get("earliest_seq", int(d["gap_to"]) + 1)),
            head_seq=int(d.get("head_seq", 0)),
            missed_estimate=_opt_int(d.get("missed_estimate")),
        )

    def to_json(self) -> dict[str, Any]:
        """The tombstone object as the server sends it."""
        out: dict[str, Any] = {
            "gap_from": self.gap_from,
            "gap_to": self.gap_to,
            "reason": self.reason,
        }
        if self.missed_estimate is not None:
            out["missed_estimate"] = self.missed_estimate
        out["earliest_seq"] = self.earliest_seq
        out["head_seq"] = self.head_seq
        return out


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """A watch stream read `topic` up to `head_seq` (docs/API.md, "12.3 Frames")."""

    topic: str
    head_seq: int


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    """`topic` was deleted while watched; the watch drops it (docs/API.md, "12.3 Frames")."""

    topic: str


#: What :meth:`topics.client.Client.watch` yields; :meth:`~topics.client.Client.read`
#: yields only :class:`Record` and :class:`Tombstone`.
Event = Record | Tombstone | CaughtUp | TopicDeleted


@dataclass(frozen=True, slots=True)
class DiffPage:
    """One `POST /v0/topics/:topic/diff` answer (docs/API.md, "8.1 `POST /v0/topics/:topic/diff`").

    `next_from_seq` is the cursor for the next read; `caught_up` says whether to
    wait before asking again (an empty `records` alone does not).
    """

    topic: str
    records: list[Record]
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    caught_up: bool
    tombstone: Tombstone | None
    lag: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DiffPage:
        topic = str(d["topic"])
        tomb = d.get("tombstone")
        return cls(
            topic=topic,
            records=[Record.from_json(topic, r) for r in d.get("records") or []],
            next_from_seq=int(d["next_from_seq"]),
            head_seq=int(d["head_seq"]),
            earliest_seq=int(d["earliest_seq"]),
            caught_up=bool(d["caught_up"]),
            tombstone=Tombstone.from_json(topic, tomb) if isinstance(tomb, Mapping) else None,
            lag=int(d.get("lag", 0)),
        )


@dataclass(frozen=True, slots=True)
class DeleteRecordsResult:
    """`POST /v0/topics/:topic/delete`: `deleted` records removed by this call, then the
    topic's state (docs/API.md, "10. Deleting records")."""

    topic: str
    deleted: int
    earliest_seq: int
    head_seq: int
    count: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Router:
    """A router (docs/API.md, "11. Routers").

    `filter` is ``["tag", "Eq"|"Glob", value]`` or None. `created` is set on
    the answer of a PUT (None otherwise); `forwarded_total` on a GET (None
    otherwise).
    """

    router: str
    source: str
    dest: str
    preserve_node: bool
    preserve_tag: bool
    filter: list[str] | None
    allow_cycle: bool
    guarantee: str
    created: bool | None = None
    forwarded_total: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Router:
        f = d.get("filter")
        return cls(
            router=str(d["router"]),
            source=str(d["source"]),
            dest=str(d["dest"]),
            preserve_node=bool(d.get("preserve_node", True)),
            preserve_tag=bool(d.get("preserve_tag", True)),
            filter=[str(x) for x in f] if isinstance(f, list) else None,
            allow_cycle=bool(d.get("allow_cycle", False)),
            guarantee=str(d.get("guarantee", "at_least_once")),
            created=d.get("created"),
            forwarded_total=_opt_int(d.get("forwarded_total")),
        )


@dataclass(frozen=True, slots=True)
class RouterInfo:
    """One entry of `GET /v0/routers` (docs/API.md, "11.3 `GET /v0/routers`")."""

    router: str
    source: str
    dest: str
    guarantee: str
    forwarded_total: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RouterInfo:
        return cls(
            router=str(d["router"]),
            source=str(d["source"]),
            dest=str(d["dest"]),
            guarantee=str(d.get("guarantee", "at_least_once")),
            forwarded_total=int(d.get("forwarded_total", 0)),
        )


@dataclass(frozen=True, slots=True)
class RouterPage:
    """One page of routers; `next_cursor` is None on the last page."""

    routers: list[RouterInfo]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class DeleteRouterResult:
    """`DELETE /v0/routers/:router`: `deleted` is False when there was no such router."""

    router: str
    deleted: bool


@dataclass(frozen=True, slots=True)
class Job:
    """A leased queue job (docs/API.md, "14.1 Jobs and leases").

    `deadline` (ms since the epoch) is when the lease runs out; `deliveries`
    counts this delivery too. Pass `seq` and `lease_id` back to ack, nack or
    extend.
    """

    topic: str
    seq: int
    lease_id: str
    deadline: int
    ts: int
    deliveries: int
    data: Any
    tag: str | None = None
    meta: Any = None

    @classmethod
    def from_json(cls, topic: str, d: Mapping[str, Any]) -> Job:
        return cls(
            topic=str(d.get("topic", topic)),
            seq=int(d["$seq"]),
            lease_id=str(d["lease_id"]),
            deadline=int(d["deadline"]),
            ts=int(d["$ts"]),
            deliveries=int(d.get("deliveries", 1)),
            data=d.get("data"),
            tag=d.get("$tag"),
            meta=d.get("meta"),
        )

    def to_json(self) -> dict[str, Any]:
        """The job in the server's shape (docs/API.md, "14.2 `POST /v0/topics/:topic/claim`")."""
        out: dict[str, Any] = {
            "$seq": self.seq,
            "lease_id": self.lease_id,
            "deadline": self.deadline,
            "$ts": self.ts,
        }
        if self.tag is not None:
            out["$tag"] = self.tag
        out["deliveries"] = self.deliveries
        out["data"] = self.data
        if self.meta is not None:
            out["meta"] = self.meta
        return out


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """`POST /v0/topics/:topic/claim`: the jobs leased (maybe none) and `ready`, the
    claimable jobs left."""

    topic: str
    jobs: list[Job]
    ready: int


@dataclass(frozen=True, slots=True)
class AckResult:
    """`POST .../ack`: `skipped` lists the seqs not acked, in request order
    (docs/API.md, "14.3 `POST /v0/topics/:topic/ack`")."""

    topic: str
    acked: int
    skipped: list[int]
    ready: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class NackResult:
    """`POST .../nack` (docs/API.md, "14.4 `POST /v0/topics/:topic/nack`")."""

    topic: str
    nacked: int
    skipped: list[int]
    ready: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class ExtendResult:
    """`POST .../extend`: `deadlines` maps each extended seq to its new deadline (ms)
    (docs/API.md, "14.5 `POST /v0/topics/:topic/extend`")."""

    topic: str
    extended: int
    skipped: list[int]
    deadlines: dict[int, int]


@dataclass(frozen=True, slots=True)
class Health:
    """`GET /v0/health` (docs/API.md, "15.1 `GET /v0/health`")."""

    status: str
    version: str
    uptime_ms: int


@dataclass(frozen=True, slots=True)
class Readiness:
    """`GET /v0/ready` (docs/API.md, "15.2 `GET /v0/ready`").

    `ready` is True once the log replay is done (`status` "ready", or
    "degraded" when writes cannot be committed: `writable` False and
    `degraded` naming the WAL directories). While replaying, `ready` is False,
    `status` "not_ready" and `replay_progress` runs from 0 to 1.
    """

    ready: bool
    status: str
    topics: int | None = None
    writable: bool = True
    degraded: dict[str, Any] | None = None
    replay_progress: float | None = None


@dataclass(frozen=True, slots=True)
class WatchStart:
    """Where a watched topic starts (docs/API.md, "12.1 `POST /v0/watch`")."""

    from_seq: int
    head_seq: int
    earliest_seq: int


@dataclass(frozen=True, slots=True)
class WatchSession:
    """A watch session: `wid`, the stream path and each topic's start."""

    wid: str
    stream_url: str
    session_ttl_ms: int
    topics: dict[str, WatchStart]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WatchSession:
        return cls(
            wid=str(d["wid"]),
            stream_url=str(d.get("stream_url", f"/v0/watch/{d['wid']}")),
            session_ttl_ms=int(d.get("session_ttl_ms", 0)),
            topics={
                str(k): WatchStart(int(v["from_seq"]), int(v["head_seq"]), int(v["earliest_seq"]))
                for k, v in (d.get("topics") or {}).items()
            },
        )
