"""What a metadata snapshot holds, and how the engine is rebuilt from it.

The snapshot body (one msgpack map inside `meta/snapshot.NNNN.bin`, see
:mod:`topics.storage.snapshot`) is the engine's metadata at one instant of the
event loop (docs/FORMATS.md, "Snapshots")::

    v               1
    taken_ms        engine clock at capture
    next_topic_id   ids below it were assigned before the capture
    router_ops      router frames numbered at or below it are reflected here
    topics          list of topic maps (below)
    routers         router states (the RouterCreate body: definition, cursor,
                    dest_base, forwarded_total, source/dest instance ids)
    wal             shard directory (relative to the data dir) ->
                    [file, byte offset, frame index] where replay starts
    flips           [[topic id, [[first seq, count], ...]], ...]: records deleted
                    before the capture whose `.idx` flag is flipped only after
                    this snapshot is durable (recovery deletes them again)

    topic map: id, name, epoch, config (wire form), created_ms, head, last_ts,
    l_cap, l_ttl, l_trim, delete_below, last_write_ms, last_read_ms,
    ckpt (last seq in a segment), count, bytes, reserved (disk-class durable
    head reservation, 0 = exact), queue (lease projection of a
    `leases_durable` queue, or null), lost (seq ranges `[[first, last], ...]`
    that `topics repair` recorded as destroyed by damage), segs (`[[first seq,
    entries], ...]` of the hot segments the snapshot relies on, added by the
    checkpointer when it writes the snapshot)

Replay from the recorded positions applies only frames logged after the
capture; the few frame kinds that are not naturally idempotent on a state that
already includes them are filtered by `next_topic_id` (TopicCreate) and
`router_ops` (RouterCreate/RouterDelete).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topics.engine.events import LeaseProjection, RouterPut, TopicRestored
from topics.engine.routers import router_event
from topics.engine.topic import Topic
from topics.engine.topic_config import parse_topic_config
from topics.storage.eventcodec import router_body, router_from_body

if TYPE_CHECKING:
    from topics.engine.core import Engine

__all__ = [
    "SNAPSHOT_VERSION",
    "capture_meta",
    "topic_meta",
    "topic_restored",
    "router_states",
]

SNAPSHOT_VERSION = 1


def _queue_meta(p: LeaseProjection) -> dict[str, Any]:
    return {
        "leases": [list(x) for x in p.leases],
        "deliveries": [list(x) for x in p.deliveries],
        "delayed": [list(x) for x in p.delayed],
        "reclaim": list(p.reclaim),
        "claim_cursor": p.claim_cursor,
        "next_lease_id": p.next_lease_id,
        "dead_lettered": p.dead_lettered,
    }


def _queue_projection(m: dict[str, Any]) -> LeaseProjection:
    return LeaseProjection(
        leases=tuple(
            (int(s), str(node), int(lease_id), int(deadline))
            for s, node, lease_id, deadline in m.get("leases", [])
        ),
        deliveries=tuple((int(s), int(n)) for s, n in m.get("deliveries", [])),
        delayed=tuple((int(r), int(s)) for r, s in m.get("delayed", [])),
        reclaim=tuple(int(s) for s in m.get("reclaim", [])),
        claim_cursor=int(m.get("claim_cursor", 1)),
        next_lease_id=int(m.get("next_lease_id", 1)),
        dead_lettered=int(m.get("dead_lettered", 0)),
    )


def topic_meta(t: Topic, reserved: int) -> dict[str, Any]:
    """The snapshot map of one topic instance."""
    cfg = t.config
    q = t.queue if cfg.leases_durable and cfg.durability != "ephemeral" else None
    return {
        "id": t.topic_id,
        "name": t.name,
        "epoch": t.epoch,
        "config": cfg.to_wire(),
        "created_ms": t.created_ms,
        "head": t.head_seq,
        "last_ts": t.last_ts,
        "l_cap": t.l_cap,
        "l_ttl": t.l_ttl,
        "l_trim": t.l_trim,
        "delete_below": t.delete_below,
        "lost": [list(r) for r in t.lost],
        "last_write_ms": t.last_write_ms,
        "last_read_ms": t.last_read_ms,
        "ckpt": t.ckpt_seq,
        "count": t.live_count,
        "bytes": t.live_bytes,
        "reserved": reserved,
        "queue": _queue_meta(q.projection()) if q is not None else None,
    }


def capture_meta(
    engine: Engine,
    reserved: dict[int, int],
    router_ops: int,
    *,
    exact_heads: bool = False,
) -> dict[str, Any]:
    """The snapshot body (without `wal`) for the engine's state right now.

    `reserved` maps topic id -> durable head reservation of `disk` topics; with
    `exact_heads` (a clean shutdown) no reservation is recorded, so the next start
    keeps each head exactly.
    """
    topics = [
        topic_meta(t, 0 if exact_heads else reserved.get(t.topic_id, 0))
        for t in engine.topics.values()
    ]
    routers: list[dict[str, Any]] = []
    if engine.routers is not None:

        def topic_id(name: str) -> int:
            t = engine.topics.get(name)
            return t.topic_id if t is not None else 0

        routers = [router_body(router_event(r, topic_id)) for r in engine.routers.routers()]
    return {
        "v": SNAPSHOT_VERSION,
        "taken_ms": engine.clock.now_ms(),
        "next_topic_id": engine.next_topic_id,
        "router_ops": router_ops,
        "topics": topics,
        "routers": routers,
    }


def topic_restored(m: dict[str, Any]) -> TopicRestored:
    """The event that restores a topic instance from its snapshot map (no records
    yet; recovery attaches its segments and replays the WAL after it)."""
    name = str(m["name"])
    lw, lr = m.get("last_write_ms"), m.get("last_read_ms")
    qm = m.get("queue")
    return TopicRestored(
        topic_id=int(m["id"]),
        name=name,
        config=parse_topic_config(m.get("config"), name),
        epoch=int(m.get("epoch", 1)),
        created_ms=int(m.get("created_ms", 0)),
        head_seq=int(m.get("head", 0)),
        last_ts=int(m.get("last_ts", 0)),
        l_cap=int(m.get("l_cap", 0)),
        l_ttl=int(m.get("l_ttl", 0)),
        l_trim=int(m.get("l_trim", 0)),
        delete_below=int(m.get("delete_below", 0)),
        lost=tuple((int(a), int(b)) for a, b in m.get("lost") or []),
        last_write_ms=int(lw) if lw is not None else None,
        last_read_ms=int(lr) if lr is not None else None,
        queue=_queue_projection(qm) if qm else None,
    )


def router_states(body: dict[str, Any]) -> list[RouterPut]:
    """The routers a snapshot body records, as events."""
    return [router_from_body(dict(st)) for st in body.get("routers") or []]
