"""Log events as WAL control frames, and back (docs/FORMATS.md, "WAL frame").

The journal encodes every control event (:mod:`topics.engine.events`) with
:func:`control_frame`; recovery decodes each control frame it replays with
:func:`decode_control` into the same event types, which
:meth:`Engine.apply <topics.engine.core.Engine.apply>` then applies. Appends are
not here: a batch's Append frames are laid out when it is staged, and replay
hands runs of them over in bulk (:class:`~topics.engine.events.RecordsReplayed`).

Every topic control body carries `h`, the topic's head when the event was
logged (the event's `head_seq`), which orders it among the topic's appends.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from topics.engine.events import (
    LEASE_KINDS,
    ConfigChanged,
    Event,
    FloorsAdvanced,
    LeaseChanged,
    RecordsDeleted,
    RecordsLost,
    RouterDef,
    RouterDeleted,
    RouterPut,
    SeqsDeleted,
    TopicCreated,
    TopicDeleted,
)
from topics.engine.topic_config import parse_topic_config
from topics.format.frame import (
    CONFIG_UPDATE,
    DELETE,
    EVICT_WATERMARK,
    LEASE,
    LOST,
    ROUTER_CREATE,
    ROUTER_DELETE,
    TOPIC_CREATE,
    TOPIC_DELETE,
    Frame,
    FrameError,
)

__all__ = ["ControlFrame", "control_frame", "decode_control", "router_body", "router_from_body"]

#: `(frame type, topic id, body, seq, ts)` of a control frame.
ControlFrame = tuple[int, int, dict[str, Any], int, int]


def router_body(ev: RouterPut) -> dict[str, Any]:
    """The RouterCreate body (also a snapshot's router state) of `ev`."""
    d = ev.router
    return {
        **asdict(d),
        "filter": list(d.filter) if d.filter is not None else None,
        "source_id": ev.source_id,
        "dest_id": ev.dest_id,
        "cursor": ev.cursor,
        "dest_base": ev.dest_base,
        "forwarded_total": ev.forwarded_total,
    }


def router_from_body(b: dict[str, Any]) -> RouterPut:
    """The event of a RouterCreate body or snapshot router state.

    Raises KeyError when `name`, `source` or `dest` is missing.
    """
    given = {f.name: b[f.name] for f in fields(RouterDef) if f.name in b}
    filt = b.get("filter")
    given["filter"] = (str(filt[0]), str(filt[1])) if filt else None
    return RouterPut(
        RouterDef(**given),
        source_id=int(b.get("source_id", -1)),
        dest_id=int(b.get("dest_id", -1)),
        cursor=int(b.get("cursor", 0)),
        dest_base=int(b.get("dest_base", 0)),
        forwarded_total=int(b.get("forwarded_total", 0)),
    )


def control_frame(ev: Event) -> ControlFrame:
    """The control frame of `ev`; RouterPut/RouterDelete bodies lack the journal's
    `op` number. Raises TypeError for an event with no control frame (appends,
    and the recovery-only events)."""
    if isinstance(ev, TopicCreated):
        body: dict[str, Any] = {
            "name": ev.name,
            "config": ev.config.to_wire(),
            "epoch": ev.epoch,
            "h": ev.head_seq,
        }
        return TOPIC_CREATE, ev.topic_id, body, 0, ev.created_ms
    if isinstance(ev, ConfigChanged):
        return CONFIG_UPDATE, ev.topic_id, {"config": ev.config.to_wire(), "h": ev.head_seq}, 0, 0
    if isinstance(ev, TopicDeleted):
        return TOPIC_DELETE, ev.topic_id, {"name": ev.name, "h": ev.head_seq}, 0, 0
    if isinstance(ev, RecordsDeleted):
        body = {
            "bound": ev.bound,
            "before_seq": ev.before_seq,
            "match": list(ev.predicate) if ev.predicate is not None else None,
            "seqs": None,
            "h": ev.head_seq,
        }
        return DELETE, ev.topic_id, body, 0, 0
    if isinstance(ev, SeqsDeleted):
        body = {
            "bound": ev.head_seq + 1,
            "before_seq": None,
            "match": None,
            "seqs": list(ev.seqs),
            "h": ev.head_seq,
        }
        return DELETE, ev.topic_id, body, 0, 0
    if isinstance(ev, FloorsAdvanced):
        body = {"l_cap": ev.l_cap, "l_ttl": ev.l_ttl, "l_trim": ev.l_trim, "h": ev.head_seq}
        return EVICT_WATERMARK, ev.topic_id, body, 0, 0
    if isinstance(ev, LeaseChanged):
        body = {
            "kind": ev.kind,
            "node": ev.node,
            "lease_id": ev.lease_id,
            "deadline": ev.deadline_ms,
            "deliveries": ev.deliveries,
            "h": ev.head_seq,
        }
        return LEASE, ev.topic_id, body, ev.seq, 0
    if isinstance(ev, RouterPut):
        return ROUTER_CREATE, 0, router_body(ev), 0, 0
    if isinstance(ev, RouterDeleted):
        return ROUTER_DELETE, 0, {"name": ev.name}, 0, 0
    raise TypeError(f"{type(ev).__name__} has no control frame")


def decode_control(fr: Frame) -> Event | None:
    """The event a replayed control frame records, or None when it records none
    (marks, head watermarks) or its body cannot be read.

    A TopicCreate's `ts` is the creation time; a Lease frame's `seq` the job.
    Raises KeyError/TypeError/ValueError when a readable body lacks a field its
    type requires (never written that way), except for Lost frames, which
    `topics repair` writes and which are skipped when malformed.
    """
    try:
        body = fr.control()
    except FrameError:
        return None
    typ = fr.type
    tid = fr.topic_id
    h = int(body.get("h", 0))
    if typ == TOPIC_CREATE:
        name = str(body["name"])
        cfg = parse_topic_config(body.get("config"), name)
        return TopicCreated(tid, name, cfg, int(body.get("epoch", 1)), fr.ts, h)
    if typ == CONFIG_UPDATE:
        return ConfigChanged(tid, parse_topic_config(body.get("config"), None), h)
    if typ == TOPIC_DELETE:
        return TopicDeleted(tid, str(body.get("name", "")), h)
    if typ == DELETE:
        seqs = body.get("seqs")
        if seqs:
            return SeqsDeleted(tid, tuple(int(s) for s in seqs), h)
        m = body.get("match")
        before = body.get("before_seq")
        return RecordsDeleted(
            tid,
            None if before is None else int(before),
            (str(m[0]), str(m[1])) if m else None,
            int(body["bound"]),
            h,
        )
    if typ == EVICT_WATERMARK:
        return FloorsAdvanced(
            tid,
            int(body.get("l_cap", 0)),
            int(body.get("l_ttl", 0)),
            int(body.get("l_trim", 0)),
            h,
        )
    if typ == LEASE:
        kind = str(body["kind"])
        if kind not in LEASE_KINDS:
            return None
        return LeaseChanged(
            tid,
            kind,
            fr.seq,
            str(body["node"]),
            int(body["lease_id"]),
            int(body["deadline"]),
            int(body["deliveries"]),
            h,
        )
    if typ == ROUTER_CREATE:
        return router_from_body(body)
    if typ == ROUTER_DELETE:
        return RouterDeleted(str(body.get("name")))
    if typ == LOST:
        try:
            return RecordsLost(tid, int(body["first"]), int(body["last"]), fr.ts)
        except (KeyError, TypeError, ValueError):
            return None
    return None
