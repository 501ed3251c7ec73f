"""Multiplexed SSE watch: `POST /v0/watch` and `GET /v0/watch/:wid` (API §8).

The session state and the per-topic drain step live in :mod:`topics.engine.watch`;
this module is the asyncio shell: checks, headers, the park/wake loop,
heartbeats, shutdown and disconnect handling. Every frame goes out as its own
`http.response.body` message, so the ASGI server flushes it at once and applies
backpressure per connection (a slow reader only stalls its own stream).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from topics.engine.topic import Topic
from topics.engine.watch import WatchSession, WatchStream, clamp_heartbeat
from topics.errors import TopicsError
from topics.http.app import Ctx
from topics.http.auth import bearer, token_from_query
from topics.http.responses import Resp, json_resp

__all__ = ["create_watch", "stream", "SSE_HEADERS"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]
HEARTBEAT = b": hb\n\n"


async def create_watch(ctx: Ctx) -> Resp:
    """`POST /v0/watch` (API §8.2)."""
    p = ctx.principal
    body = ctx.app.watches.create(
        ctx.body,
        p.digest,
        bound=p.digest is not None,
        lenient=ctx.qbool("lenient", False),
        allow=p.allows_name if p.prefixes else None,
    )
    return json_resp(200, body, ctx.t0)


def _accepts_sse(ctx: Ctx) -> bool:
    accept = ctx.header(b"accept")
    return not accept or not accept.strip() or "text/event-stream" in accept or "*/*" in accept


def _check_binding(ctx: Ctx, session: WatchSession) -> None:
    """A bound session needs a bearer (header, else `?token=`) of the creating key."""
    if not session.bound:
        return
    token = bearer(ctx.header(b"authorization"))
    if token is None:
        token = token_from_query(ctx.scope.get("query_string", b""))
    p = ctx.app.auth.authenticate(token) if token else None
    if p is None or p.digest is None or p.digest != session.creator:
        raise TopicsError(401, "unauthorized", "this watch session belongs to another key")


async def stream(ctx: Ctx) -> None:
    """`GET /v0/watch/:wid` (API §8.3): 406 -> 404 -> 401 -> 429, then the stream."""
    app = ctx.app
    if not _accepts_sse(ctx):
        raise TopicsError(406, "not_acceptable", "this endpoint only produces text/event-stream")
    reg = app.watches
    clock = ctx.engine.clock
    reg.gc(clock.now_ms())
    session = reg.get(ctx.params["wid"])
    if session is None:
        raise TopicsError(404, "not_found", "unknown or expired watch session")
    _check_binding(ctx, session)
    key = session.creator if session.bound else None
    app.acquire_sse(key)
    session.open_streams += 1
    session.last_access_ms = clock.now_ms()
    try:
        session.rewind(ctx.header(b"last-event-id"))
        await _run(ctx, session)
    finally:
        session.open_streams -= 1
        session.last_access_ms = clock.now_ms()
        app.release_sse(key)


async def _run(ctx: Ctx, session: WatchSession) -> None:
    app = ctx.app
    send = ctx.send
    loop = asyncio.get_running_loop()
    ws = WatchStream(ctx.engine, session)
    heartbeat_s = clamp_heartbeat(session.heartbeat_ms, app.config.test_min_heartbeat_ms) / 1000
    wake = asyncio.Event()
    disconnected = asyncio.Event()
    shutting_down = app.shutting_down

    def on_topic(_t: Topic) -> None:
        wake.set()

    async def watch_disconnect() -> None:
        while True:
            msg = await ctx.receive()
            if msg["type"] == "http.disconnect":
                disconnected.set()
                wake.set()
                return

    listening: list[Topic] = ws.topics()
    for t in listening:
        t.listeners.add(on_topic)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(watch_disconnect())]
    if shutting_down is not None:
        sd = asyncio.create_task(shutting_down.wait())
        sd.add_done_callback(lambda _f: wake.set())
        tasks.append(sd)

    def stopping() -> bool:
        return shutting_down is not None and shutting_down.is_set()

    async def out(body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})

    try:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await out(b"retry: 2000\n\n")
        last_frame = loop.time()
        while not disconnected.is_set():
            wake.clear()
            if stopping():
                await out(ws.shutdown_frame().to_bytes())
                break
            for name in ws.names():
                while not disconnected.is_set() and not stopping():
                    res = ws.pass_topic(name)
                    for fr in res.frames:
                        await out(fr.to_bytes())
                    if res.frames:
                        last_frame = loop.time()
                    if res.drained:
                        break
                if disconnected.is_set() or stopping():
                    break
            if disconnected.is_set():
                break
            if stopping():
                continue  # the shutdown frame is sent at the top of the loop
            if ws.all_deleted:
                break
            timeout = heartbeat_s - (loop.time() - last_frame)
            if timeout > 0 and not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await wake.wait()
            if not wake.is_set() and loop.time() - last_frame >= heartbeat_s:
                await out(HEARTBEAT)
                last_frame = loop.time()
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the peer went away mid-write
    finally:
        for t in listening:
            t.listeners.discard(on_topic)
        for task in tasks:
            task.cancel()
