"""Handlers for topic lifecycle, write, diff and record delete.

The routes are described in docs/API.md, sections 6 ("6. Topics") to 10
("10. Deleting records").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import orjson

from topics.auth import check_config_names
from topics.config import SCOPE_ADMIN
from topics.engine.core import DiffParams, Engine, Replay
from topics.engine.frames import ReadAhead
from topics.engine.topic import PendingWrite, ReadResult, Topic
from topics.errors import TopicsError
from topics.http.app import Ctx, drive
from topics.http.responses import JSON_CT, Resp, json_resp
from topics.node import wait_published as _wait_published
from topics.storage.reads import MAX_WARM_TAG_BYTES, history_gate, read_pool

__all__ = [
    "put_topic",
    "get_topic",
    "list_topics",
    "delete_topic",
    "write",
    "diff",
    "delete_records",
    "wait_published",
    "wait_topic",
]


async def put_topic(ctx: Ctx) -> Resp:
    check_config_names(ctx.principal, ctx.body)  # `dead_letter` is a name too
    t, created = ctx.engine.put_topic(ctx.params["topic"], ctx.body)
    body = {"topic": t.name, "created": created, "config": t.config.to_wire()}
    return json_resp(201 if created else 200, body, ctx.t0)


async def get_topic(ctx: Ctx) -> Resp:
    body = ctx.engine.topic_state(ctx.params["topic"], touch=ctx.qbool("touch", True))
    return json_resp(200, body, ctx.t0)


async def list_topics(ctx: Ctx) -> Resp:
    from topics.engine.core import clamp_page_size

    p = ctx.principal
    body = ctx.engine.list_topics(
        prefix=ctx.query("prefix") or "",
        page_size=clamp_page_size(ctx.query("page_size")),
        cursor=ctx.query("cursor"),
        touch=ctx.qbool("touch", False),
        allow=p.allows_name if p.prefixes else None,
    )
    return json_resp(200, body, ctx.t0)


async def delete_topic(ctx: Ctx) -> Resp:
    name = ctx.params["topic"]
    body = ctx.engine.delete_topic(name, if_empty=ctx.qbool("if_empty", False))
    if not body["deleted"]:
        body = {"topic": name, "deleted": False, "routers_removed": []}
    p = ctx.principal
    if p.prefixes:  # other keys' routers that fed or read this topic stay unnamed
        body["routers_removed"] = [r for r in body["routers_removed"] if p.allows_name(r)]
    return json_resp(200, body, ctx.t0)


async def wait_published(pw: PendingWrite) -> None:
    """Wait until a staged batch has been published (its commit point passed), holding
    the history gate meanwhile (docs/ARCHITECTURE.md, "The read path")."""
    if pw.published:
        return
    with history_gate.write():
        await _wait_published(pw)


async def wait_topic(t: Topic, timeout_s: float, stop: asyncio.Event | None = None) -> bool:
    """Wait for the next publish/delete/config notification on `t` (True) or timeout."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def cb(_t: Topic) -> None:
        if not fut.done():
            fut.set_result(None)

    t.listeners.add(cb)
    try:
        await asyncio.wait_for(fut, timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        t.listeners.discard(cb)


async def write(ctx: Ctx) -> Resp:
    """`POST /v0/topics/:t` (docs/API.md, "7.1 `POST /v0/topics/:topic`")."""
    eng = ctx.engine
    name = ctx.params["topic"]
    req = eng.parse_write(ctx.body, ctx.header(b"idempotency-key"))
    if req.has_config and name not in eng.topics and not ctx.principal.has(SCOPE_ADMIN):
        raise TopicsError(
            403,
            "forbidden",
            "creating a topic with a config needs the admin scope",
            {"topic": name},
        )
    if req.has_config:
        check_config_names(ctx.principal, req.config)
    # A large batch's frames are laid out a piece per loop step; staging then
    # only seals them (docs/HTTP_INPUT.md "Large bodies").
    paced_ms = await ctx.app.node.admit_write(name, req.disable_backpressure)
    await drive(eng.prepare_write(name, req))
    t1 = time.perf_counter()
    res = eng.begin_write(name, req)
    if isinstance(res, dict):
        return json_resp(200, res, ctx.t0)
    if isinstance(res, Replay):
        await wait_published(res.pending)
        return json_resp(200, eng.replay_result(res.pending), ctx.t0)
    await wait_published(res)
    body = eng.write_result(res, ctx.qbool("return_seqs", True))
    return json_resp(201 if res.created else 200, body, ctx.t0, **write_perf(res, t1, paced_ms))


def write_perf(res: PendingWrite, t1: float, paced_ms: float) -> dict[str, float]:
    """The `performance` figures of a committed write (docs/API.md, "1. Basics"):
    `wal_append_ms` since `t1` (perf_counter s), `fsync_ms` for an `fsync` topic,
    and `throttle_wait_ms` when the pressure ladder made it wait (`paced_ms`
    before staging, plus a widened commit window)."""
    out = {
        "wal_append_ms": round((time.perf_counter() - t1) * 1000, 3),
        "fsync_ms": round(res.fsync_ms if res.topic.config.durability == "fsync" else 0.0, 3),
    }
    if res.throttle_ms or paced_ms:
        out["throttle_wait_ms"] = round(res.throttle_ms + paced_ms, 3)
    return out


def _diff_ends(t: Topic, r: ReadResult, t0: float) -> tuple[bytes, bytes]:
    """The bytes of a diff body before and after its records."""
    tomb = b"null" if r.tombstone is None else orjson.dumps(r.tombstone.to_wire())
    total = (time.perf_counter() - t0) * 1000
    head = b'{"topic":' + t.name_json + b',"records":['
    tail = b"".join(
        (
            b'],"next_from_seq":%d,"head_seq":%d,"earliest_seq":%d,"caught_up":%s,"tombstone":'
            % (
                r.next_from_seq,
                r.head_seq,
                r.earliest_seq,
                b"true" if r.caught_up else b"false",
            ),
            tomb,
            b',"lag":%d,"performance":{"server_total_ms":%.3f,"records_scanned":%d%s}}'
            % (
                r.lag,
                total,
                r.scanned,
                b',"cold_segments_read":%d' % r.cold_segments if r.cold_segments else b"",
            ),
        )
    )
    return head, tail


def render_diff(t: Topic, r: ReadResult, t0: float) -> bytes:
    """Splice stored record fragments into a diff response body.

    See docs/API.md, "8.1 `POST /v0/topics/:topic/diff`".
    """
    head, tail = _diff_ends(t, r, t0)
    return b"".join((head, b",".join(r.records), tail))


#: Bytes of records a long diff body carries per piece (see :func:`diff_response`).
DIFF_PIECE_BYTES = 128 * 1024


def diff_response(t: Topic, r: ReadResult, t0: float) -> Resp:
    """The 200 response of a diff pass: one body, or for a long page a body in pieces.

    A page of more than :data:`DIFF_SLICE` records is sent in pieces of about
    :data:`DIFF_PIECE_BYTES`, each joined when it goes out and each a step of
    the history lane (:class:`HistoryGate`), so copying a 1 MiB page into the
    socket never holds the loop in one go. The bytes are those of
    :func:`render_diff`.
    """
    recs = r.records
    if len(recs) <= DIFF_SLICE:
        return Resp(200, render_diff(t, r, t0), [JSON_CT])
    head, tail = _diff_ends(t, r, t0)
    length = len(head) + sum(map(len, recs)) + len(recs) - 1 + len(tail)

    async def pieces() -> AsyncIterator[bytes]:
        n = len(recs)
        i = 0
        sep = head
        while i < n:
            await history_gate.turn()
            j, size = i, 0
            while j < n and size < DIFF_PIECE_BYTES:
                size += len(recs[j])
                j += 1
            yield b"".join((sep, b",".join(recs[i:j]), tail if j >= n else b""))
            sep = b","
            i = j

    return Resp(200, b"", [JSON_CT], pieces=pieces(), length=length)


#: Records a diff renders per step of the loop: a long page is read in slices with
#: the loop free in between, so one client's scan delays another's write ack or
#: live delivery by at most a slice (docs/ARCHITECTURE.md, "The read path").
DIFF_SLICE = 256


async def read_diff(eng: Engine, name: str, p: DiffParams) -> tuple[Topic, ReadResult]:
    """One diff pass of `name` (docs/API.md, "8.1"), read in slices of :data:`DIFF_SLICE`.

    The slices add up to what one pass gives: the budget counts across them and
    only the first may deliver a record larger than it. A slice that would start
    with a tombstone (a floor moved meanwhile) or find the topic gone ends the
    page before it. Raises as :meth:`Engine.diff`.
    """
    first = p if p.limit <= DIFF_SLICE else replace(p, limit=DIFF_SLICE)
    t0 = eng.get(name)
    if first is not p and t0 is not None and t0.head_seq - p.from_seq > DIFF_SLICE:
        await history_gate.turn()  # a long page of history takes its turn
    ahead = ReadAhead()
    t, r = await read_pool.run(partial(eng.diff, name, first), ahead)
    if first is p or len(r.records) < DIFF_SLICE:
        return t, replace(r, cold_segments=ahead.cold_sources())
    tomb = r.tombstone
    records, seqs, scanned = list(r.records), list(r.seqs), r.scanned
    # The first slice ran the read preamble (router drain, retention); the others
    # continue the same page at the same instant.
    now = eng.clock.now_ms()
    while len(records) < p.limit and r.used < p.budget and not r.caught_up:
        await history_gate.turn()
        if eng.get(name) is not t or not t.alive:
            break
        more = await read_pool.run(
            partial(
                t.read_opts,
                r.next_from_seq,
                p,
                now=now,
                limit=min(p.limit - len(records), DIFF_SLICE),
                used=r.used,
            ),
            ahead,
        )
        if more.tombstone is not None:
            break
        records += more.records
        seqs += more.seqs
        scanned += more.scanned
        r = more
        if len(more.records) < DIFF_SLICE:
            break
    return t, replace(
        r,
        records=records,
        seqs=seqs,
        scanned=scanned,
        tombstone=tomb,
        cold_segments=ahead.cold_sources(),
    )


async def diff(ctx: Ctx) -> Resp:
    """`POST /v0/topics/:t/diff` with optional long-poll.

    See docs/API.md, "8.1 `POST /v0/topics/:topic/diff`".
    """
    eng = ctx.engine
    name = ctx.params["topic"]
    p = eng.parse_diff(ctx.body)
    t, r = await read_diff(eng, name, p)
    if p.wait_ms > 0 and not r.records and r.tombstone is None and r.caught_up:
        await wait_topic(t, p.wait_ms / 1000)
        t, r = await read_diff(eng, name, p)
    return diff_response(t, r, ctx.t0)


async def delete_records(ctx: Ctx) -> Resp:
    """`POST /v0/topics/:t/delete` (docs/API.md, "10. Deleting records").

    A `match` delete consults the topic's tag index; when that has to be rebuilt
    from segment files, their bytes are read on the pool first.
    """
    body = ctx.body
    if isinstance(body, dict) and body.get("match") is not None:
        t = ctx.engine.get(ctx.params["topic"])
        if t is not None:
            await read_pool.warm(t.tag_spans(), MAX_WARM_TAG_BYTES)
    op = ctx.engine.begin_delete(ctx.params["topic"], ctx.body)
    if not op.done:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        op.waiters.append(lambda: fut.done() or fut.set_result(None))
        await fut
    return json_resp(200, ctx.engine.delete_result(op), ctx.t0)
