"""The engine's log events: every durable mutation as one typed value.

The engine hands each of these to its :class:`~topics.engine.journal.Journal`
(`journal.log(event)`) before, or instead of, making the mutation visible
(docs/ARCHITECTURE.md, "The write path"). Recovery decodes the WAL's frames
and the snapshot's maps back into the same types and hands them to
:meth:`Engine.apply <topics.engine.core.Engine.apply>`, which rebuilds the state
they describe; a recorded stream replayed that way reproduces the engine it was
recorded from (docs/ARCHITECTURE.md, "The event log").

Conventions: seqs are 1-based topic seqs; times are epoch milliseconds (`_ms`,
`ts`); `head_seq` on a topic event is the topic's head when the event was
logged, which orders it among the topic's appends (docs/FORMATS.md, "WAL
frame"). The byte layout of each event in the WAL belongs to storage
(docs/FORMATS.md); nothing here knows it.

Events that carry a live object (`RecordsAppended.write`) or arrays
(`RecordsReplayed`, `SegmentsAttached`) compare by identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from topics.engine.frames import Buf, FrameSource
    from topics.engine.params import Predicate
    from topics.engine.topic import PendingWrite
    from topics.engine.topic_config import TopicConfig

__all__ = [
    "Event",
    "TopicEvent",
    "LeaseKind",
    "LEASE_KINDS",
    "TopicCreated",
    "ConfigChanged",
    "TopicDeleted",
    "RecordsAppended",
    "RecordsReplayed",
    "RecordsDeleted",
    "SeqsDeleted",
    "FloorsAdvanced",
    "LeaseChanged",
    "RouterDef",
    "RouterPut",
    "RouterDeleted",
    "HeadReserved",
    "RecordsLost",
    "LeaseProjection",
    "TopicRestored",
    "SegmentsAttached",
    "TopicIdsUsed",
]

#: What happened to a lease (docs/API.md, "14. Queues").
LeaseKind = Literal["claimed", "released", "extended", "acked"]
LEASE_KINDS: tuple[LeaseKind, ...] = ("claimed", "released", "extended", "acked")


# ------------------------------------------------------------------ topics


@dataclass(frozen=True, slots=True)
class TopicCreated:
    """A topic instance was created.

    `topic_id` is never reused (later instances of the same name get a higher
    one); `config` is the full parsed config; `epoch` the instance epoch (part
    of a router's exactly-once key); `created_ms` the creation time (ms);
    `head_seq` the head at creation (0 for a new instance).
    """

    topic_id: int
    name: str
    config: TopicConfig
    epoch: int = 1
    created_ms: int = 0
    head_seq: int = 0


@dataclass(frozen=True, slots=True)
class ConfigChanged:
    """A topic's config was replaced as a whole (`PUT` on an existing topic).

    `config` is the new config; `head_seq` the head when it changed.
    """

    topic_id: int
    config: TopicConfig
    head_seq: int = 0


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    """A topic instance ended (its records, routers and leases go with it).

    `name` is the instance's name; `head_seq` its head when it was deleted.
    """

    topic_id: int
    name: str
    head_seq: int = 0


# ----------------------------------------------------------------- records


@dataclass(frozen=True, slots=True, eq=False)
class RecordsAppended:
    """A staged batch to make durable: `write` holds the records, their seqs
    (`first_seq`..`last_seq`), commit time `ts` (ms) and WAL Append frames
    (`frames`, one per record, sizes in bytes in `sizes`; docs/FORMATS.md,
    "WAL frame").

    The journal completes its handle at the batch's commit point for the
    topic's durability class (README "Durability and the data directory");
    only then is the batch published. Applied to another engine, the batch is
    published at the same seqs (seqs at or below that engine's head are
    skipped, a jump above it becomes deleted holes).
    """

    write: PendingWrite

    @property
    def topic_id(self) -> int:
        return self.write.topic.topic_id


@dataclass(frozen=True, slots=True, eq=False)
class RecordsReplayed:
    """A run of one topic's logged Append frames, replayed in bulk (recovery).

    `buf` holds the frames; `frames` is a
    :data:`~topics.format.frame.WAL_COLS_DTYPE` array, one row per frame in
    log order (`off`: byte offset of the frame in `buf`, `size`: frame bytes,
    `seq`, `ts` in ms, `flags`, `dl`: data + meta bytes). Frames at or below the
    topic's head are skipped; a jump in seqs becomes deleted holes. The records
    are served from `buf` until a checkpoint copies them into a segment.
    """

    topic_id: int
    buf: Buf
    frames: Any


@dataclass(frozen=True, slots=True)
class RecordsDeleted:
    """A point-in-time record delete (docs/API.md, "10. Deleting records").

    Removes live seqs below `min(before_seq, bound)` (`before_seq` None: no seq
    limit), only those whose tag matches `predicate` when it is given;
    `bound` is the head + 1 when the delete was requested, so records
    published later are never touched. A `before_seq`-only delete raises the
    topic's `delete_below`.
    """

    topic_id: int
    before_seq: int | None
    predicate: Predicate | None
    bound: int
    head_seq: int = 0


@dataclass(frozen=True, slots=True)
class SeqsDeleted:
    """An explicit list of seqs deleted (queue acks, dead-letter moves).

    Seqs that are not live are ignored.
    """

    topic_id: int
    seqs: tuple[int, ...]
    head_seq: int = 0


@dataclass(frozen=True, slots=True)
class FloorsAdvanced:
    """A topic's involuntary floors advanced: records at or below the highest of
    `l_cap`, `l_ttl`, `l_trim` are gone, and reads crossing them get a
    tombstone (docs/API.md, "9. Tombstones"). A floor never moves back.
    """

    topic_id: int
    l_cap: int
    l_ttl: int
    l_trim: int
    head_seq: int = 0


@dataclass(frozen=True, slots=True)
class LeaseChanged:
    """A leases-log event of a `leases_durable` queue (docs/API.md, "14. Queues").

    `kind` is `claimed`, `released`, `extended` or `acked`; `seq` the job;
    `node` the claimer; `lease_id` the lease's fencing id; `deadline_ms` the
    lease deadline (for `released`: the delayed nack's ready time, 0 =
    claimable at once); `deliveries` the job's delivery count.
    """

    topic_id: int
    kind: LeaseKind
    seq: int
    node: str
    lease_id: int
    deadline_ms: int
    deliveries: int
    head_seq: int = 0


# ----------------------------------------------------------------- routers


@dataclass(frozen=True, slots=True)
class RouterDef:
    """What a router is, as its owner defined it (docs/API.md, "11. Routers").

    `source` and `dest` are topic names; `filter` is the tag predicate (None:
    every record); `guarantee` is `"at_least_once"` or `"exactly_once"`.
    """

    name: str
    source: str
    dest: str
    preserve_node: bool = True
    preserve_tag: bool = True
    filter: Predicate | None = None
    allow_cycle: bool = False
    guarantee: str = "at_least_once"

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly_once"


@dataclass(frozen=True, slots=True)
class RouterPut:
    """A router created or updated (docs/API.md, "11. Routers").

    `router` is the definition; the rest is its forwarding state: `cursor`
    (last source seq consumed), `dest_base` (dest head when created),
    `forwarded_total`. `source_id`/`dest_id` are the topic instances it
    connects: applied, the router is installed only while both instances are
    the live ones.
    """

    router: RouterDef
    source_id: int
    dest_id: int
    cursor: int = 0
    dest_base: int = 0
    forwarded_total: int = 0


@dataclass(frozen=True, slots=True)
class RouterDeleted:
    """A router was deleted (its copies stay in the dest)."""

    name: str


# ---------------------------------------------------------------- recovery


@dataclass(frozen=True, slots=True)
class HeadReserved:
    """A durable head for a `disk` or `ephemeral` topic found in the log: the
    head is raised to `head_seq` with deleted holes, so seqs handed out before
    a crash are never handed out again (README "Durability and the data
    directory"). Ignored for other classes and for a topic with staged writes.
    """

    topic_id: int
    head_seq: int


@dataclass(frozen=True, slots=True)
class RecordsLost:
    """Seqs `first_seq`..`last_seq` were destroyed by storage damage (written by
    `topics repair`, docs/FORMATS.md "Repair"): the head passes them and reads
    crossing them get a `corrupt` tombstone. `ts` (ms) stamps the holes."""

    topic_id: int
    first_seq: int
    last_seq: int
    ts: int = 0


@dataclass(frozen=True, slots=True)
class LeaseProjection:
    """The lease state of a `leases_durable` queue at a snapshot (docs/FORMATS.md,
    "Snapshots").

    `leases`: `(seq, node, lease_id, deadline_ms)`; `deliveries`: `(seq,
    count)`; `delayed`: `(ready_at_ms, seq)`; `reclaim`: seqs waiting to be
    claimed again; `claim_cursor`: next never-delivered seq; `next_lease_id`;
    `dead_lettered`: jobs moved to the dead-letter topic so far.
    """

    leases: tuple[tuple[int, str, int, int], ...] = ()
    deliveries: tuple[tuple[int, int], ...] = ()
    delayed: tuple[tuple[int, int], ...] = ()
    reclaim: tuple[int, ...] = ()
    claim_cursor: int = 1
    next_lease_id: int = 1
    dead_lettered: int = 0


@dataclass(frozen=True, slots=True)
class TopicRestored:
    """A topic instance as a snapshot recorded it, without its records
    (docs/FORMATS.md, "Snapshots"; the records come with :class:`SegmentsAttached`
    and the replay).

    `head_seq`, `last_ts` (ms), the floors `l_cap`, `l_ttl`, `l_trim`,
    `delete_below`, the `lost` seq ranges `(first, last)`, `last_write_ms` and
    `last_read_ms` (None: never), and `queue`, the lease projection of a
    `leases_durable` queue (None otherwise).
    """

    topic_id: int
    name: str
    config: TopicConfig
    epoch: int = 1
    created_ms: int = 0
    head_seq: int = 0
    last_ts: int = 0
    l_cap: int = 0
    l_ttl: int = 0
    l_trim: int = 0
    delete_below: int = 0
    lost: tuple[tuple[int, int], ...] = ()
    last_write_ms: int | None = None
    last_read_ms: int | None = None
    queue: LeaseProjection | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SegmentsAttached:
    """Records loaded from a topic's segment files (recovery, before any replay).

    `rows` are slot rows (:data:`~topics.engine.index.SLOT_DTYPE`) for seqs
    `base_seq`.. pointing into `sources` (source id -> segment). Floors already
    set drop what lies below them.
    """

    topic_id: int
    base_seq: int
    rows: Any
    sources: dict[int, FrameSource]


@dataclass(frozen=True, slots=True)
class TopicIdsUsed:
    """Topic ids below `next_topic_id` were handed out; new topics get higher ones."""

    next_topic_id: int


TopicEvent = (
    TopicCreated
    | ConfigChanged
    | TopicDeleted
    | RecordsAppended
    | RecordsReplayed
    | RecordsDeleted
    | SeqsDeleted
    | FloorsAdvanced
    | LeaseChanged
    | HeadReserved
    | RecordsLost
    | TopicRestored
    | SegmentsAttached
)
"""Events about one topic instance (they carry its `topic_id`)."""

Event = TopicEvent | RouterPut | RouterDeleted | TopicIdsUsed
"""Any event :meth:`Engine.apply <topics.engine.core.Engine.apply>` takes."""
