"""The WebSocket data plane: `GET /v0/ws` (docs/API.md, "13. WebSocket").

One connection runs three tasks: the reader (commands, handled in order), the
delivery loop (every subscription drained through the same read pipeline as
diff and SSE, :func:`topics.engine.watch.drain_step`) and the writer. Outbound
messages pass through a 4-slot :class:`Outbox`; producers reserve a slot
*before* reading/serialising, so a slow client backpressures at its socket
instead of piling JSON up in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from topics.auth import check_config_names
from topics.config import SCOPE_ADMIN, SCOPE_READ, SCOPE_WRITE
from topics.engine.core import DEFAULT_BUDGET as WS_DEFAULT_BUDGET
from topics.engine.core import Replay
from topics.engine.params import boolean
from topics.engine.records import iter_density_check, loads
from topics.engine.topic import Topic
from topics.engine.watch import (
    WS_DEFAULT_LIMIT,
    Delivery,
    ReadOpts,
    TopicStart,
    drain_step,
    parse_read_opts,
    parse_topic_starts,
    render_ws,
)
from topics.errors import TopicsError
from topics.http.app import Ctx, drive
from topics.http.responses import perf
from topics.http.server import direct_writer
from topics.http.topics import wait_published, write_perf
from topics.http.watch import Waker
from topics.storage.reads import history_gate, read_in_memory, read_pool

__all__ = ["websocket", "Outbox", "OUTBOX_SLOTS"]

log = logging.getLogger("topics.http")

OUTBOX_SLOTS = 4
SHUTDOWN_FLUSH_S = 5.0
_PUBLISH_FIELDS = (
    ("topic", str),
    ("node", str),
    ("idempotency_key", str),
    ("create", bool),
    ("config", dict),
    ("disable_backpressure", bool),
    ("return_seqs", bool),
)


class WsError(Exception):
    """A command failure answered with `{"op":"error", ...}`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Outbox:
    """A tiny bounded outbound queue: at most `slots` messages reserved, queued or in flight.

    Messages leave in the order they were queued, one send at a time. :meth:`send`
    hands a message to the socket from the caller's own task when nothing is queued
    or being sent (one task step per delivered message instead of two);
    otherwise it queues it for :meth:`run`.
    """

    def __init__(self, send: Any, slots: int = OUTBOX_SLOTS) -> None:
        self._send = send
        self._sem = asyncio.Semaphore(slots)
        self._q: deque[bytes] = deque()
        self._ready = Waker(asyncio.get_running_loop())
        self._idle = asyncio.Event()
        self._idle.set()
        self._sending = False
        self._held = 0  # slots reserved and not yet released (queued or in flight included)

    async def reserve(self) -> None:
        """Wait for a free slot (before building the message that will fill it)."""
        await self._sem.acquire()
        self._held += 1

    def unreserve(self) -> None:
        self._held -= 1
        self._sem.release()

    def quiet(self) -> bool:
        """Nothing reserved, queued or being sent: a message written around the outbox
        now cannot overtake one of its own."""
        return not self._held

    def push(self, msg: bytes) -> None:
        """Queue a message into a slot taken with :meth:`reserve`."""
        self._q.append(msg)
        self._idle.clear()
        self._ready.set()

    async def put(self, msg: bytes) -> None:
        await self.reserve()
        self.push(msg)

    async def send(self, msg: bytes) -> None:
        """Send a message in a slot taken with :meth:`reserve`: at once, from this task,
        when the outbox is idle, else queued behind what is ahead of it."""
        if self._q or self._sending:
            self.push(msg)
            return
        await self._emit(msg)

    async def _emit(self, msg: bytes) -> None:
        self._sending = True
        self._idle.clear()
        try:
            await self._send({"type": "websocket.send", "text": msg.decode()})
        finally:
            self._sending = False
            self.unreserve()
            if self._q:
                self._ready.set()  # queued meanwhile: run() takes it from here
            else:
                self._idle.set()

    async def flushed(self) -> None:
        """Wait until every queued message has been handed to the socket."""
        await self._idle.wait()

    async def run(self) -> None:
        q = self._q
        while True:
            while not q or self._sending:
                if not q and not self._sending:
                    self._idle.set()
                self._ready.clear()
                await self._ready.wait()
            await self._emit(q.popleft())


@dataclass(slots=True, eq=False)
class Subscription:
    delivery: Delivery
    cursor: int
    opts: ReadOpts


def _msg(op: str, request_id: Any, **fields: Any) -> bytes:
    return orjson.dumps({"op": op, "request_id": request_id, **fields})


def _error(request_id: Any, code: str, message: str) -> bytes:
    """An `error` message; never fails to render (hostile text is escaped, see ws.py docs)."""
    try:
        return _msg("error", request_id, code=code, message=message)
    except (orjson.JSONEncodeError, UnicodeEncodeError):
        text = message.encode("utf-8", "backslashreplace").decode()
        return _msg("error", None, code=code, message=text)


def _echoable(request_id: Any) -> bool:
    """Whether `request_id` can be echoed back (orjson writes at most 254 nesting levels)."""
    try:
        orjson.dumps(request_id)
    except orjson.JSONEncodeError:
        return False
    return True


def _describe(value: Any) -> str:
    """A short, always printable description of a client value for error messages."""
    if isinstance(value, str):
        return repr(value[:64])
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return f"a JSON {'object' if isinstance(value, dict) else 'array'}"


class Connection:
    """State of one WebSocket connection."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.app = ctx.app
        self.engine = ctx.engine
        self.principal = ctx.principal
        self.outbox = Outbox(ctx.send)
        self.subs: dict[str, Subscription] = {}
        loop = asyncio.get_running_loop()
        self.wake = Waker(loop)
        self.direct: Any = direct_writer(ctx.send)  # a DirectWs, or None (test transports)
        self.fan = ctx.app.fanout()
        self.parked = False  # the delivery task waits on `wake`, between two passes

    def on_topic(self, t: Topic) -> None:
        if self.parked and self.direct is not None:
            self.fan.add(self.deliver_now, t)
        else:
            self.wake.set()

    def deliver_now(self, t: Topic) -> bool:
        """A publication on `t`, served from the loop's fan-out (topics.http.fanout):
        the subscription's drain step runs here and its messages go straight to the
        socket, when the delivery task is parked and nothing of the outbox is pending;
        otherwise the task is woken to do it. True when it wrote."""
        direct = self.direct
        sub = self.subs.get(t.name)
        if (
            not self.parked
            or not self.outbox.quiet()
            or not direct.writable()
            or sub is None
            or sub.delivery.topic is not t
        ):
            self.wake.set()
            return False
        try:
            step = read_in_memory(
                partial(
                    drain_step, self.engine, sub.delivery, sub.cursor, sub.opts, relabel_first=False
                )
            )
        except Exception:
            log.exception("a WebSocket delivery failed; its task retries it")
            step = None
        if step is None:  # needs the disk (nothing changed), or failed: the task's turn
            self.wake.set()
            return False
        sub.cursor = step.cursor
        if step.events:
            direct.write(*[render_ws(ev) for ev in step.events])
        if not step.drained or sub.delivery.deleted:
            self.wake.set()
        return bool(step.events)

    # ------------------------------------------------------------- reader

    async def reader(self) -> None:
        while True:
            msg = await self.ctx.receive()
            typ = msg["type"]
            if typ == "websocket.disconnect":
                return
            if typ != "websocket.receive":
                continue
            size = msg.get("topics.oversized")
            if size is not None:
                # Dropped unread by the protocol (topics.http.server.WSProtocol).
                limit = msg.get("topics.limit")
                await self.outbox.put(
                    _error(
                        None,
                        "payload_too_large",
                        f"message exceeds {limit} bytes (got at least {size}); it was not read",
                    )
                )
                continue
            text = msg.get("text")
            if text is None:
                await self.outbox.put(
                    _error(None, "unsupported_message", "binary frames are not supported")
                )
                continue
            await self.command(text)

    async def command(self, text: str) -> None:
        try:
            # A large message whose parse would multiply its size is refused unread.
            await drive(iter_density_check(text))
        except TopicsError as err:
            await self.outbox.put(_error(None, err.code, err.message))
            return
        try:
            cmd = loads(text)
        except ValueError as exc:
            await self.outbox.put(_error(None, "invalid_json", f"malformed JSON: {exc}"))
            return
        rid = cmd.get("request_id") if isinstance(cmd, dict) else None
        if not _echoable(rid):
            await self.outbox.put(
                _error(None, "invalid_json", "request_id is nested too deeply to be echoed")
            )
            return
        reply: bytes | None
        op: Any = None
        try:
            if not isinstance(cmd, dict):
                raise WsError("invalid_json", "a command must be a JSON object")
            op = cmd.get("op")
            if op == "subscribe":
                reply = await self.subscribe(cmd, rid)
            elif op == "unsubscribe":
                reply = self.unsubscribe(cmd, rid)
            elif op == "publish":
                reply = await self.publish(cmd, rid)
            elif op == "ping":
                reply = _msg("pong", rid)
            else:
                raise WsError("invalid_json", f"unknown op {_describe(op)}")
        except WsError as err:
            reply = _error(rid, err.code, err.message)
        except TopicsError as err:
            reply = _error(rid, err.code, err.message)
        except (RecursionError, ValueError, TypeError) as exc:
            # A command value the handlers could not cope with (e.g. one nested too
            # deeply to print in a message): the command fails, the socket stays.
            log.warning("ws command %s failed on its input: %r", _describe(op), exc)
            reply = _error(rid, "invalid_json", f"the command could not be processed: {exc}")
        if reply is not None:
            await self.outbox.put(reply)

    # ---------------------------------------------------------- subscribe

    async def subscribe(self, cmd: dict[str, Any], rid: Any) -> bytes | None:
        wanted: dict[str, TopicStart] = {}
        try:
            topics = cmd.get("topics")
            if topics is not None:
                if not isinstance(topics, dict):
                    raise WsError("invalid_json", "topics must be an object")
                wanted.update(parse_topic_starts(topics))
            topic = cmd.get("topic")
            if topic is not None:
                if not isinstance(topic, str):
                    raise WsError("invalid_json", "topic must be a string")
                wanted[topic] = TopicStart.parse(cmd)
            opts = parse_read_opts(
                cmd,
                max_limit=self.engine.limits.max_limit,
                default_limit=WS_DEFAULT_LIMIT,
                default_budget=WS_DEFAULT_BUDGET,
            )
            lenient = boolean(cmd, "lenient", False)
        except TopicsError as err:
            raise WsError("invalid_json", err.message) from None
        if not wanted:
            raise WsError("invalid_request", "subscribe needs topic or topics")
        p = self.principal
        if not p.has(SCOPE_READ):
            raise WsError("forbidden", "this key lacks the read scope")
        names = sorted(wanted)
        for name in names:
            if not p.allows_name(name):
                raise WsError("forbidden", f'this key may not access "{name}"')
        resolved: list[tuple[str, Topic, int]] = []
        for name in names:
            t = self.engine.get(name)
            if t is None:
                if lenient:
                    continue
                raise TopicsError(
                    404, "topic_not_found", f'topic "{name}" does not exist', {"topic": name}
                )
            self.engine.prepare_read(t, consume=False)
            resolved.append((name, t, wanted[name].cursor(t)))
        reply = _msg(
            "subscribed",
            rid,
            topics={
                name: {"from_seq": cur, "head_seq": t.head_seq, "earliest_seq": t.earliest_seq}
                for name, t, cur in resolved
            },
        )
        # The reply is queued before the subscriptions exist, so no frame of theirs
        # can overtake it.
        await self.outbox.put(reply)
        for name, t, cur in resolved:
            old = self.subs.get(name)
            if old is not None and old.delivery.topic is not None:
                old.delivery.topic.listeners.discard(self.on_topic)
            self.subs[name] = Subscription(Delivery(name, t), cur, opts)
            t.listeners.add(self.on_topic)
        self.wake.set()
        return None

    def unsubscribe(self, cmd: dict[str, Any], rid: Any) -> bytes:
        sent: list[str] = []
        topic = cmd.get("topic")
        if topic is not None:
            if not isinstance(topic, str):
                raise WsError("invalid_json", "topic must be a string")
            sent.append(topic)
        topics = cmd.get("topics")
        if topics is not None:
            if not isinstance(topics, list) or not all(isinstance(n, str) for n in topics):
                raise WsError("invalid_json", "topics must be an array of names")
            sent.extend(topics)
        if not sent:
            raise WsError("invalid_request", "unsubscribe needs topic or topics")
        for name in sent:
            self._drop(name)
        return _msg("unsubscribed", rid, topics=sent)

    def _drop(self, name: str, sub: Subscription | None = None) -> None:
        cur = self.subs.get(name)
        if cur is None or (sub is not None and cur is not sub):
            return
        del self.subs[name]
        t = cur.delivery.topic
        if t is not None and not any(s.delivery.topic is t for s in self.subs.values()):
            t.listeners.discard(self.on_topic)

    # ------------------------------------------------------------ publish

    async def publish(self, cmd: dict[str, Any], rid: Any) -> bytes:
        t0 = time.perf_counter()
        if not isinstance(cmd.get("topic"), str):
            raise WsError("invalid_json", "publish needs a string topic")
        if not isinstance(cmd.get("records"), list):
            raise WsError("invalid_json", "publish needs a records array")
        for rec in cmd["records"]:
            if not isinstance(rec, dict) or "data" not in rec:
                raise WsError("invalid_json", "every record must be an object with data")
        for fname, ftype in _PUBLISH_FIELDS:
            v = cmd.get(fname)
            if v is not None and not isinstance(v, ftype):
                raise WsError("invalid_json", f"{fname} has the wrong type")
        name: str = cmd["topic"]
        p = self.principal
        if not p.has(SCOPE_WRITE):
            raise WsError("forbidden", "this key lacks the write scope")
        if cmd.get("config") is not None and not p.has(SCOPE_ADMIN):
            raise WsError("forbidden", "a publish with a config needs the admin scope")
        if not p.allows_name(name):
            raise WsError("forbidden", f'this key may not access "{name}"')
        check_config_names(p, cmd.get("config"))
        eng = self.engine
        body = {k: v for k, v in cmd.items() if k not in ("op", "request_id", "return_seqs")}
        req = eng.parse_write(body, None)
        paced_ms = await self.app.node.admit_write(name, req.disable_backpressure)
        await drive(eng.prepare_write(name, req))
        t1 = time.perf_counter()
        res = eng.begin_write(name, req)
        extra: dict[str, Any] = {}
        if isinstance(res, dict):
            out = res
        elif isinstance(res, Replay):
            await wait_published(res.pending)
            out = eng.replay_result(res.pending)
        else:
            await wait_published(res)
            out = eng.write_result(res, True)
            extra = write_perf(res, t1, paced_ms)
        seqs = out.get("seqs") if cmd.get("return_seqs") is not False else None
        return _msg(
            "ack",
            rid,
            topic=out["topic"],
            first_seq=out["first_seq"],
            last_seq=out["last_seq"],
            seqs=seqs,
            head_seq=out["head_seq"],
            count=out["count"],
            created=out["created"],
            deduped=out["deduped"],
            performance=perf(t0, **extra),
        )

    # ----------------------------------------------------------- delivery

    async def deliver(self) -> None:
        ob = self.outbox
        while True:
            self.wake.clear()
            for name in sorted(self.subs):
                sub = self.subs.get(name)
                while sub is not None and self.subs.get(name) is sub:
                    await ob.reserve()
                    if self.subs.get(name) is not sub:
                        ob.unreserve()
                        break
                    step = await read_pool.run(
                        partial(
                            drain_step,
                            self.engine,
                            sub.delivery,
                            sub.cursor,
                            sub.opts,
                            relabel_first=False,
                        )
                    )
                    sub.cursor = step.cursor
                    if not step.events:
                        ob.unreserve()
                    for i, ev in enumerate(step.events):
                        if i:
                            await ob.reserve()
                            if self.subs.get(name) is not sub:
                                ob.unreserve()
                                break
                        await ob.send(render_ws(ev))
                    if sub.delivery.deleted:
                        self._drop(name, sub)
                        break
                    if step.drained:
                        break
                    await history_gate.turn()  # a catch-up gives way between steps
            self.parked = True
            try:
                await self.wake.wait()
            finally:
                self.parked = False

    def close(self) -> None:
        for sub in self.subs.values():
            t = sub.delivery.topic
            if t is not None:
                t.listeners.discard(self.on_topic)
        self.subs.clear()


async def websocket(ctx: Ctx) -> None:
    """`GET /v0/ws`: take a connection slot (429 before accepting), then serve."""
    app = ctx.app
    key = ctx.principal.digest
    app.acquire_sse(key)  # raises 429 before the upgrade is accepted
    conn: Connection | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        msg = await ctx.receive()
        if msg["type"] != "websocket.connect":
            return
        await ctx.send({"type": "websocket.accept"})
        conn = Connection(ctx)
        reader = asyncio.create_task(conn.reader())
        writer = asyncio.create_task(conn.outbox.run())
        deliver = asyncio.create_task(conn.deliver())
        tasks = [reader, writer, deliver]
        stop: asyncio.Task[Any] | None = None
        if app.shutting_down is not None:
            stop = asyncio.create_task(app.shutting_down.wait())
            tasks.append(stop)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is stop or task.cancelled():
                continue
            exc = task.exception()
            if exc is not None and not isinstance(exc, OSError):
                raise exc
        if stop is not None and stop in done and not reader.done() and not writer.done():
            reader.cancel()
            deliver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deliver
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_FLUSH_S):
                    await conn.outbox.put(
                        _error(None, "server_shutting_down", "server is shutting down; reconnect")
                    )
                    await conn.outbox.flushed()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await writer
            with contextlib.suppress(OSError, RuntimeError):
                await ctx.send({"type": "websocket.close", "code": 1001})
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if conn is not None:
            conn.close()
        app.release_sse(key)
