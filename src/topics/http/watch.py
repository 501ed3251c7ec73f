"""Multiplexed SSE watch: `POST /v0/watch` and `GET /v0/watch/:wid`.

The routes are described in docs/API.md, "12. Watch: multiplexed Server-Sent Events".

The session state and the per-topic drain step live in :mod:`topics.engine.watch`;
this module is the asyncio shell: checks, headers, the park/wake loop,
heartbeats, shutdown and disconnect handling. The frames of one pass over the
session's topics go out together as one write (flushed at once: nothing is held
back waiting for more data); backpressure applies per connection (a slow reader
only stalls its own stream), and a long catch-up is cut into writes of ~64 KiB.

Live delivery is shared (docs/ARCHITECTURE.md, "Live delivery"): a publication
does not wake one task per parked stream. The streams it concerns are served
together by the loop's :class:`~topics.http.fanout.Fanout`, right after the
write's own response; each delivery runs the stream's drain step (the read and
its rendered frame are shared between streams at the same cursor) and writes
the bytes straight to the socket through the connection's direct writer
(:func:`topics.http.server.direct_writer`). A stream falls back to its own task
whenever that is not plain: bytes needed from disk, a write buffer above its
high water mark, more than one pass to drain, HTTP/2.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from topics.auth import bearer, token_from_query
from topics.engine.topic import Topic
from topics.engine.watch import WatchSession, WatchStream, clamp_heartbeat
from topics.errors import TopicsError
from topics.http.app import Ctx
from topics.http.responses import Resp, json_resp
from topics.http.server import DirectBody, direct_writer
from topics.storage.reads import history_gate, read_in_memory, read_pool

log = logging.getLogger("topics.http")

__all__ = ["create_watch", "stream", "SSE_HEADERS", "Waker"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]
HEARTBEAT = b": hb\n\n"
FLUSH_BYTES = 65_536  # a catch-up pass is written out in pieces of about this size
#: Frames a stream may have written that its socket has not taken yet before it
#: is marked lagged (so is a stream whose socket buffer passed its high water
#: mark): live delivery stops buffering for it, and once the socket drained the
#: stream catches up from its cursor (docs/SCHEDULER.md, "Slow consumers").
SSE_QUEUE_FRAMES = 1024
#: How often a lagged stream looks whether its socket drained (s).
LAG_CHECK_S = 0.01


async def create_watch(ctx: Ctx) -> Resp:
    """`POST /v0/watch` (docs/API.md, "12.1 `POST /v0/watch`")."""
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
    """`GET /v0/watch/:wid`: 406 -> 404 -> 401 -> 429, then the stream.

    See docs/API.md, "12.2 `GET /v0/watch/:wid`".
    """
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
    """The stream: drain every topic, send what one pass produced, park until woken.

    Wake-ups come from plain callbacks (topic listeners, the disconnect watcher,
    shutdown, the heartbeat timer) that resolve a future created per park, so a
    wake costs one task step: no `asyncio.Event`, no per-park `asyncio.timeout()`.
    The heartbeat is one `call_later` timer per stream, re-armed only when it
    fires: if a frame went out since, it just sleeps for the remainder.
    """
    app = ctx.app
    send = ctx.send
    w = direct_writer(send)
    direct = w if isinstance(w, DirectBody) else None  # an SSE stream is HTTP/1.1 or h2
    loop = asyncio.get_running_loop()
    ws = WatchStream(ctx.engine, session)
    heartbeat_s = clamp_heartbeat(session.heartbeat_ms) / 1000
    shutting_down = app.shutting_down
    fan = app.fanout()
    # Mutable stream state shared with the callbacks below.
    st = _State(loop)

    def on_topic(t: Topic) -> None:
        if st.parked and direct is not None:
            fan.add(deliver, t)
        else:
            st.wake()

    def deliver(t: Topic) -> bool:
        """A publication on `t`, served from the fan-out (see the module doc)."""
        if st.lagged:
            return False  # the lag check wakes the stream once its socket drained
        if st.unflushed >= SSE_QUEUE_FRAMES and direct is not None:
            # Looked at once per SSE_QUEUE_FRAMES frames, not on every delivery.
            if direct.pending():
                # A slow reader: stop buffering for it; it catches up from its cursor.
                lag(True)
                loop.call_later(LAG_CHECK_S, check_lag)
                return False
            st.unflushed = 0  # everything written so far has left
        d = ws.deliveries.get(t.name)
        if (
            not st.parked
            or direct is None
            or not direct.writable()
            or d is None
            or d.topic is not t
            or d.deleted
        ):
            st.wake()
            return False
        out: list[bytes] = []
        try:
            drained = read_in_memory(partial(ws.pass_sse, t.name, out))
        except Exception:
            log.exception("a watch stream's delivery failed; its task retries it")
            drained = None
        if drained is None:  # needs the disk (nothing changed), or failed: the task's turn
            st.wake()
            return False
        if out:
            direct.write(b"".join(out) if len(out) > 1 else out[0])
            st.last_frame = loop.time()
            st.unflushed += len(out)
        if not drained or d.deleted:
            st.wake()
        return bool(out)

    def check_lag() -> None:
        if not st.lagged:
            return
        if direct is not None and direct.pending() and not st.disconnected and not st.stopping:
            loop.call_later(LAG_CHECK_S, check_lag)
            return
        lag(False)
        st.wake()  # the next pass reads from the cursor: what it missed, or a tombstone

    def lag(on: bool) -> None:
        """Enter or leave lagged mode (counted in the app's SSE lag figures)."""
        if on == st.lagged:
            return
        st.lagged = on
        st.unflushed = 0
        app.sse_lagged += 1 if on else -1
        if on:
            app.sse_lagged_total += 1

    async def body(data: bytes) -> None:
        if direct is not None and direct.writable():
            direct.write(data)
            return
        # The socket is full: the task waits for it to drain, buffering nothing
        # more; publications meanwhile only mark the stream to be woken.
        lagging = direct is not None and direct.full()
        if lagging:
            lag(True)
        try:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            if lagging:
                lag(False)

    def on_heartbeat() -> None:
        left = heartbeat_s - (loop.time() - st.last_frame)
        if left > 0:
            st.timer = loop.call_later(left, on_heartbeat)
        else:
            st.timer = None
            st.heartbeat_due = True
            st.wake()

    def on_shutdown(_f: object) -> None:
        st.stopping = True
        st.wake()

    async def watch_disconnect() -> None:
        while True:
            msg = await ctx.receive()
            if msg["type"] == "http.disconnect":
                st.disconnected = True
                st.wake()
                return

    listening: list[Topic] = ws.topics()
    for t in listening:
        t.listeners.add(on_topic)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(watch_disconnect())]
    if shutting_down is not None:
        if shutting_down.is_set():
            st.stopping = True
        else:
            sd = asyncio.create_task(shutting_down.wait())
            sd.add_done_callback(on_shutdown)
            tasks.append(sd)

    try:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        st.last_frame = loop.time()
        st.timer = loop.call_later(heartbeat_s, on_heartbeat)
        while not st.disconnected:
            st.waker.clear()
            if st.stopping:
                await body(ws.shutdown_frame().to_bytes())
                break
            # One pass over every topic. The frames it produces go out together in
            # one write (flushed, not held back for more data); a long catch-up is
            # cut into writes of about FLUSH_BYTES so backpressure still applies.
            buf: list[bytes] = []
            size = 0
            for name in ws.names():
                while True:
                    n = len(buf)
                    drained = await read_pool.run(partial(ws.pass_sse, name, buf))
                    if not drained:
                        await history_gate.turn()  # a catch-up gives way between passes
                    for i in range(n, len(buf)):
                        size += len(buf[i])
                    if size >= FLUSH_BYTES:
                        await body(b"".join(buf))
                        st.last_frame = loop.time()
                        buf.clear()
                        size = 0
                        if st.disconnected or st.stopping:
                            break
                    if drained:
                        break
                if st.disconnected or st.stopping:
                    break
            if buf and not st.disconnected:
                await body(b"".join(buf) if len(buf) > 1 else buf[0])
                st.last_frame = loop.time()
            if st.disconnected:
                break
            if st.stopping:
                continue  # the shutdown frame is sent at the top of the loop
            if ws.all_deleted:
                break
            if st.heartbeat_due:
                st.heartbeat_due = False
                if loop.time() - st.last_frame >= heartbeat_s:
                    await body(HEARTBEAT)
                    st.last_frame = loop.time()
                st.timer = loop.call_later(
                    max(heartbeat_s - (loop.time() - st.last_frame), 0), on_heartbeat
                )
                continue
            st.parked = True
            try:
                await st.waker.wait()
            finally:
                st.parked = False
        if not st.disconnected:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the peer went away mid-write
    finally:
        lag(False)
        if st.timer is not None:
            st.timer.cancel()
        for t in listening:
            t.listeners.discard(on_topic)
        for task in tasks:
            task.cancel()


class Waker:
    """A cheap single-waiter event for a loop that only one task parks on.

    :meth:`set` is called from plain callbacks (topic listeners, timers); :meth:`wait`
    creates a future only when it actually has to park. Unlike `asyncio.Event` it
    never looks the running loop up (on Python 3.11 that is a `getpid()` syscall).
    """

    __slots__ = ("_loop", "_set", "_fut")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._fut: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        self._fut = fut = self._loop.create_future()
        try:
            await fut
        finally:
            self._fut = None


class _State:
    """What the wake-up callbacks of one stream share with its loop."""

    __slots__ = (
        "waker",
        "last_frame",
        "disconnected",
        "stopping",
        "heartbeat_due",
        "timer",
        "parked",
        "unflushed",
        "lagged",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.waker = Waker(loop)
        self.last_frame = loop.time()
        self.disconnected = False
        self.stopping = False
        self.heartbeat_due = False
        self.timer: asyncio.TimerHandle | None = None
        self.parked = False  # the task waits on `waker` (not mid-pass, not mid-send)
        # Frames written straight to the socket since its buffer was last empty,
        # and whether the stream is lagged (see SSE_QUEUE_FRAMES).
        self.unflushed = 0
        self.lagged = False

    def wake(self) -> None:
        self.waker.set()
