"""Handlers for queue claim/ack/nack/extend and the `/work` SSE push stream.

The routes are described in docs/API.md, "14. Queues".

Claims on a topic with `claim_jitter_ms > 0` are coalesced: the first claimer
opens a cohort and waits out the window, later claimers join, and one claim pass
serves them all round-robin (docs/API.md, "14.2 `POST /v0/topics/:topic/claim`").
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from topics.auth import Principal
from topics.engine.queues import Claimer
from topics.engine.topic import Topic
from topics.errors import TopicsError, bad_request
from topics.http.app import Ctx, TopicsApp
from topics.http.responses import Resp, json_resp
from topics.storage.reads import read_pool

__all__ = ["claim", "ack", "nack", "extend", "work", "check_dead_letter"]

WORK_TICK_S = 0.25
WORK_HEARTBEAT_S = 15.0


@dataclass
class _Cohort:
    lease_override: int | None
    claimers: list[Claimer] = field(default_factory=list)
    futures: list[asyncio.Future[list[dict[str, Any]]]] = field(default_factory=list)


def _cohorts(app: TopicsApp) -> dict[str, _Cohort]:
    cohorts: dict[str, _Cohort] = app.claim_cohorts
    return cohorts


async def claim_jobs(
    app: TopicsApp, name: str, claimer: Claimer, lease_override: int | None
) -> list[dict[str, Any]]:
    """Claim through the coalescing path: immediate, or via a jitter cohort."""
    q = app.queues
    t = q.check_queue(name)
    jitter = t.config.claim_jitter_ms
    if jitter <= 0:
        await read_pool.warm(q.claim_spans(name, claimer.max))
        return q.claim_pass(name, [claimer], lease_override)[0]
    cohorts = _cohorts(app)
    cohort = cohorts.get(name)
    fut: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
    if cohort is not None:
        cohort.claimers.append(claimer)
        cohort.futures.append(fut)
        return await fut
    cohort = _Cohort(lease_override, [claimer], [fut])
    cohorts[name] = cohort
    try:
        await asyncio.sleep(jitter / 1000)
    except asyncio.CancelledError:
        # The leader went away: close the cohort anyway so joiners are served and
        # later claims do not join a cohort nobody will ever run.
        if cohorts.get(name) is cohort:
            del cohorts[name]
        fut.cancel()
        with contextlib.suppress(TopicsError):  # joiners already got [] on failure
            _run_cohort(app, name, cohort)
        raise
    if cohorts.get(name) is cohort:
        del cohorts[name]
    await read_pool.warm(q.claim_spans(name, sum(c.max for c in cohort.claimers)))
    return _run_cohort(app, name, cohort)


def _run_cohort(app: TopicsApp, name: str, cohort: _Cohort) -> list[dict[str, Any]]:
    """One claim pass for the whole cohort; resolves the joiners, returns the leader's jobs.

    If the pass fails (topic gone), the leader gets the error and joiners an empty
    result. Jobs claimed for a member that has gone away
    (cancelled future) are released at once instead of waiting for expiry.
    """
    q = app.queues
    try:
        results = q.claim_pass(name, cohort.claimers, cohort.lease_override)
    except TopicsError:
        for f in cohort.futures[1:]:
            if not f.done():
                f.set_result([])
        raise
    orphaned: list[tuple[int, str]] = []
    for i, (f, jobs) in enumerate(zip(cohort.futures, results, strict=True)):
        if f.cancelled():
            orphaned.extend((int(j["$seq"]), str(j["lease_id"])) for j in jobs)
        elif i > 0 and not f.done():
            f.set_result(jobs)
    if orphaned:
        q.release_leases(name, orphaned)
    return results[0]


def check_dead_letter(principal: Principal, t: Topic) -> None:
    """A claim may move jobs into the queue's dead-letter topic: the key must be allowed it.

    A claim pass diverts a job whose deliveries exceed `max_deliveries` into
    `dead_letter`, creating that topic on demand (docs/API.md, "14.7 Queue counters
    and dead-letter copies"). So a claim (or `/work` stream) by a key with name
    prefixes is refused with `403 forbidden` (`detail {"topic": dead_letter}`) when the queue can
    dead-letter into a name outside them, whether or not a job is due to move
    in this pass; nothing is claimed then.
    """
    cfg = t.config
    if cfg.dead_letter is not None and cfg.max_deliveries > 0:
        principal.require_name(cfg.dead_letter)


async def claim(ctx: Ctx) -> Resp:
    q = ctx.app.queues
    node, max_jobs, lease_override = q.parse_claim(ctx.body)
    name = ctx.params["topic"]
    t = q.check_queue(name)
    q.validate_node(node)
    check_dead_letter(ctx.principal, t)
    jobs = await claim_jobs(ctx.app, name, Claimer(node, max_jobs, None), lease_override)
    now = ctx.engine.clock.now_ms()
    body = {
        "topic": t.name,
        "claimed": jobs,
        "count": len(jobs),
        "ready": q.state(t).counters(t, now)["ready"],
    }
    return json_resp(200, body, ctx.t0)


async def ack(ctx: Ctx) -> Resp:
    name = ctx.params["topic"]
    body = ctx.app.queues.ack(name, ctx.body)
    node = ctx.app.node
    if body.get("acked") and node.has_pending_controls():
        # An fsync-class ack deletes its jobs when the Delete frame commits: wait
        # for it (500 if it failed), then report the counters after the delete.
        await node.barrier()
        body.update(ctx.app.queues.counters_now(name))
    extra: dict[str, Any] = {}
    fs = body.pop("_fsync_ms", 0.0) if isinstance(body, dict) else 0.0
    if fs:
        extra["fsync_ms"] = fs
    return json_resp(200, body, ctx.t0, **extra)


async def nack(ctx: Ctx) -> Resp:
    return json_resp(200, ctx.app.queues.nack(ctx.params["topic"], ctx.body), ctx.t0)


async def extend(ctx: Ctx) -> Resp:
    return json_resp(200, ctx.app.queues.extend(ctx.params["topic"], ctx.body), ctx.t0)


def _dead_letter_allowed(principal: Principal, t: Topic) -> bool:
    try:
        check_dead_letter(principal, t)
    except TopicsError:
        return False
    return True


def _accepts_sse(ctx: Ctx) -> bool:
    accept = ctx.header(b"accept")
    return not accept or not accept.strip() or "text/event-stream" in accept or "*/*" in accept


U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
_UINT_RE = re.compile(r"\+?[0-9]+")


def _parse_uint(raw: str | None, maximum: int) -> int | None:
    """An unsigned query integer (decimal, optional `+`), or None when absent/unparsable."""
    if raw is None or _UINT_RE.fullmatch(raw) is None:
        return None
    v = int(raw)
    return v if v <= maximum else None


SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


def _why_work_ends(
    app: TopicsApp, ctx: Ctx, principal: Any, name: str, t: Any
) -> tuple[int | str, str] | None:
    """Why a `/work` stream must end now (its `event: error` code and message), or None."""
    if app.shutting_down.is_set():
        return "server_shutting_down", "server is shutting down; reconnect"
    if not t.alive or ctx.engine.get(name) is not t or not t.config.is_queue:
        return 409, "topic is no longer a queue"
    if principal.prefixes and not _dead_letter_allowed(principal, t):
        # Reconfigured (by another key) to dead-letter outside this key's prefixes.
        return 403, "this key may not access the dead-letter topic of this queue"
    return None


async def work(ctx: Ctx) -> None:
    """`GET /v0/topics/:q/work`: push claimed jobs as SSE `job` frames.

    See docs/API.md, "14.6 `GET /v0/topics/:topic/work`".
    """
    app = ctx.app
    q = app.queues
    if not _accepts_sse(ctx):
        raise TopicsError(406, "not_acceptable", "this endpoint only produces text/event-stream")
    node = ctx.query("node")
    if not node:
        raise bad_request("node is required")
    q.validate_node(node)
    # `max`: u32, unparsable => 1, clamped to [1, 1000]; `lease_ms`: u64, unparsable
    # (including negative) => ignored, i.e. the topic's lease.
    max_jobs = min(max(_parse_uint(ctx.query("max"), U32_MAX) or 1, 1), 1000)
    lease_override = _parse_uint(ctx.query("lease_ms"), U64_MAX)
    name = ctx.params["topic"]
    t = q.check_queue(name)
    principal = ctx.principal
    check_dead_letter(principal, t)
    key = principal.digest
    app.acquire_sse(key)
    conn = q.new_conn_id()
    send = ctx.send
    disconnected = asyncio.Event()
    wake = asyncio.Event()

    def on_topic(_t: Any) -> None:
        wake.set()

    async def watch_disconnect() -> None:
        while True:
            msg = await ctx.receive()
            if msg["type"] == "http.disconnect":
                disconnected.set()
                wake.set()
                return

    t.listeners.add(on_topic)
    watcher = asyncio.create_task(watch_disconnect())
    assert app.shutting_down is not None
    shutdown_wait = asyncio.create_task(app.shutting_down.wait())
    shutdown_wait.add_done_callback(lambda _f: wake.set())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        last_frame = time.monotonic()
        while not disconnected.is_set():
            ended = _why_work_ends(app, ctx, principal, name, t)
            if ended is not None:
                code, message = ended
                frame = orjson.dumps({"code": code, "error": message, "topic": name})
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"event: error\ndata: " + frame + b"\n\n",
                        "more_body": True,  # the final empty body below ends the response
                    }
                )
                break
            wake.clear()  # before claiming: a publish/ack during the claim re-wakes us
            deficit = max_jobs - q.conn_leases(name, conn)
            if deficit > 0:
                try:
                    jobs = await claim_jobs(app, name, Claimer(node, deficit, conn), lease_override)
                except TopicsError:
                    continue  # re-checked at the top of the loop (topic gone / not a queue)
                if jobs and not disconnected.is_set():
                    frames = b"".join(
                        b"id: %d\nevent: job\ndata: %b\n\n"
                        % (j["$seq"], orjson.dumps({"topic": name, **j}))
                        for j in jobs
                    )
                    await send({"type": "http.response.body", "body": frames, "more_body": True})
                    last_frame = time.monotonic()
            timeout = min(WORK_TICK_S, max(0.0, WORK_HEARTBEAT_S - (time.monotonic() - last_frame)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)
            if time.monotonic() - last_frame >= WORK_HEARTBEAT_S:
                await send({"type": "http.response.body", "body": b": hb\n\n", "more_body": True})
                last_frame = time.monotonic()
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass
    finally:
        t.listeners.discard(on_topic)
        watcher.cancel()
        shutdown_wait.cancel()
        if ctx.engine.get(name) is t and t.queue is not None:
            q.release_conn(name, conn)
        app.release_sse(key)
