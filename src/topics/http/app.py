"""The `/v0` ASGI application: one pipeline for auth, limits, routing and errors.

Request processing follows docs/API.md, "3.2 Which check answers first":

1. authentication (probe and watch-stream exemptions, bearer, `?token=` on SSE GETs) -> 401
2. per-key in-flight cap -> 429
3. route scope -> 403, then the path-name allowlist -> 403
4. routing -> 404 / 405
5. body size -> 413 (before parsing)
6. content type -> 415, JSON parse -> 400
7. the handler (validation and engine errors)

Handlers are small async functions in sibling modules; they receive a
:class:`Ctx` and return a :class:`~topics.http.responses.Resp`, or stream
themselves (SSE, WebSocket) and return None. The app is a raw ASGI callable
rather than a framework: measurements on this machine show a framework layer
halves the request rate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs

from topics.auth import Principal, bearer, token_from_query
from topics.clock import Clock
from topics.config import SCOPE_ADMIN, SCOPE_DELETE, SCOPE_READ, SCOPE_WRITE, ServerConfig
from topics.engine.core import Engine
from topics.engine.frames import FrameCorrupt
from topics.engine.records import INCREMENTAL_MIN_BYTES, iter_density_check, iter_write_body, loads
from topics.errors import TopicsError, bad_request, throttled
from topics.http.fanout import Fanout
from topics.http.responses import Resp, error_resp
from topics.node import Node
from topics.storage.objstore import ColdStoreError

__all__ = ["TopicsApp", "Ctx", "build_app", "drive"]

#: Scope key where the HTTP/1.1 protocol puts when a request's first bytes were
#: read (perf_counter seconds).
RECEIVED_AT = "topics.received_at"

log = logging.getLogger("topics.http")

T = TypeVar("T")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# Body modes: how a route's body is read and parsed.
BODY_NONE = 0  # no body expected (GET/DELETE)
BODY_JSON = 1  # JSON object required (empty => 415/400)
BODY_JSON_EMPTY_OK = 2  # empty body => {} without content-type check
BODY_CLAIM = 3  # empty body => 400 "claim requires a node"
BODY_WRITE = 4  # like BODY_JSON; a large one is parsed a piece at a time

INFLIGHT_NONE = 0
INFLIGHT_HOLD = 1
INFLIGHT_ADMIT = 2


@dataclass(slots=True)
class Ctx:
    """Per-request context handed to handlers."""

    app: TopicsApp
    scope: Scope
    receive: Receive
    send: Send
    principal: Principal
    params: dict[str, str]
    t0: float
    body: Any = None
    _query: dict[str, list[str]] | None = field(default=None)

    @property
    def engine(self) -> Engine:
        return self.app.engine

    def header(self, name: bytes) -> str | None:
        for k, v in self.scope["headers"]:
            if k == name:
                return str(v.decode("latin-1"))
        return None

    def query(self, name: str) -> str | None:
        if self._query is None:
            qs = self.scope.get("query_string", b"")
            self._query = parse_qs(qs.decode("latin-1"), keep_blank_values=True) if qs else {}
        v = self._query.get(name)
        return v[0] if v else None

    def qbool(self, name: str, default: bool) -> bool:
        """Query boolean: `true`/`1`, `false`/`0`, anything else => default.

        See docs/API.md, "1. Basics".
        """
        v = self.query(name)
        if v in ("true", "1"):
            return True
        if v in ("false", "0"):
            return False
        return default


Handler = Callable[[Ctx], Awaitable[Resp | None]]


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    scopes: tuple[str, ...]
    body: int = BODY_NONE
    # Per-key in-flight cap (checked right after auth): HOLD keeps the slot until the response
    # is produced; ADMIT checks the cap but releases at once (the /work stream is
    # bounded by SSE caps instead); NONE skips it (watch stream, WebSocket).
    inflight: int = 1
    # A read: never waits for a WAL write or fsync, even when it logged a floor
    # (retention applied during the read).
    read: bool = False


@dataclass(slots=True)
class Match:
    """Result of path classification: a route or a 404/405 with its fail-closed scope."""

    route: Route | None
    scopes: tuple[str, ...]
    names: list[str]
    params: dict[str, str]
    status: int = 200  # 404 / 405 when route is None
    allow: tuple[str, ...] = ()  # with a 405: the methods the path takes
    probe: bool = False
    watch_stream: bool = False
    sse_token: bool = False
    websocket: bool = False
    public: bool = False  # no data behind it (the OpenAPI document, the console's files)


R, W, D, A = SCOPE_READ, SCOPE_WRITE, SCOPE_DELETE, SCOPE_ADMIN


class TopicsApp:
    """The raw ASGI callable serving `/v0` for one :class:`~topics.node.Node`.

    The app holds only what is HTTP's own (the route table, per-key in-flight
    counts, SSE/WS connection slots, the shutdown signal of open streams); the
    engine, routers, queues, watch sessions, authenticator, storage and
    readiness are the node's. With `owns_node` the ASGI lifespan starts and
    stops the node (an app built by :func:`build_app`); otherwise whoever
    built the node does (``topics serve``: docs/ARCHITECTURE.md, "Layers").
    """

    def __init__(self, node: Node, *, owns_node: bool = False) -> None:
        from topics.http import console, openapi, ops, queues, routers, topics, watch, ws

        self.node = node
        self.owns_node = owns_node
        self.config = node.config
        self.clock = node.clock
        self.engine = node.engine
        self.routers = node.routers
        self.queues = node.queues
        self.watches = node.watches
        self.auth = node.auth
        self.inflight: dict[bytes, int] = {}
        self._fan: Fanout | None = None  # the serving loop's (set on first use)
        self.sse_total = 0
        # SSE streams marked lagged (a slow reader): now, and since start.
        self.sse_lagged = 0
        self.sse_lagged_total = 0
        self.sse_per_key: dict[bytes, int] = {}
        # Open claim cohorts per queue topic (topics.http.queues).
        self.claim_cohorts: dict[str, Any] = {}
        self.shutting_down = asyncio.Event() if _has_loop() else None
        self._routes = {
            "topics": {"GET": Route(topics.list_topics, (R,))},
            "topic": {
                "PUT": Route(topics.put_topic, (A,), BODY_JSON_EMPTY_OK),
                "GET": Route(topics.get_topic, (R,)),
                "DELETE": Route(topics.delete_topic, (D,)),
                "POST": Route(topics.write, (W,), BODY_WRITE),
            },
            "diff": {"POST": Route(topics.diff, (R,), BODY_JSON_EMPTY_OK, read=True)},
            "delete": {"POST": Route(topics.delete_records, (D,), BODY_JSON)},
            "claim": {"POST": Route(queues.claim, (R, W), BODY_CLAIM)},
            "ack": {"POST": Route(queues.ack, (W,), BODY_JSON)},
            "nack": {"POST": Route(queues.nack, (W,), BODY_JSON)},
            "extend": {"POST": Route(queues.extend, (W,), BODY_JSON)},
            "work": {"GET": Route(queues.work, (R, W), inflight=INFLIGHT_ADMIT)},
            "routers": {"GET": Route(routers.list_routers, (R,))},
            "router": {
                "PUT": Route(routers.put_router, (A,), BODY_JSON),
                "GET": Route(routers.get_router, (R,)),
                "DELETE": Route(routers.delete_router, (D,)),
            },
            "watch": {"POST": Route(watch.create_watch, (R,), BODY_JSON)},
            "watch_stream": {"GET": Route(watch.stream, (), inflight=INFLIGHT_NONE)},
            "ws": {"GET": Route(ws.websocket, (), inflight=INFLIGHT_NONE)},
            "health": {"GET": Route(ops.health, ())},
            "ready": {"GET": Route(ops.ready, ())},
            "metrics": {"GET": Route(ops.metrics, (R,))},
            "openapi": {"GET": Route(openapi.openapi, ())},
            "console": {"GET": Route(console.page, ())},
        }

    # ------------------------------------------------------------- routing

    def classify(self, method: str, path: str) -> Match:
        """Map a path to a route (or 404/405) with its scope and allowlisted names."""
        parts = path.split("/")
        # parts[0] == "" for absolute paths
        if path in ("/healthz", "/v0/health"):
            return self._pick("health", method, (), [], {}, probe=True)
        if path in ("/readyz", "/v0/ready"):
            return self._pick("ready", method, (), [], {}, probe=True)
        if path == "/v0/openapi.json":
            m = self._pick("openapi", method, (), [], {}, probe=True)
            m.public = True
            return m
        if path == "/" or path == "/console" or path.startswith("/console/"):
            file = path[len("/console/") :] if path.startswith("/console/") else ""
            m = self._pick("console", method, (), [], {"file": file}, probe=True)
            m.public = True
            return m
        if len(parts) < 3 or parts[1] != "v0":
            return Match(None, (), [], {}, 404)
        seg = parts[2:]
        n = len(seg)
        if seg[0] == "topics":
            if n == 1:
                return self._pick("topics", method, (R,), [], {})
            name = seg[1]
            if not name:
                return Match(None, (), [], {}, 404)
            params = {"topic": name}
            if n == 2:
                return self._pick("topic", method, (W,), [name], params)
            if n == 3 and seg[2] in ("diff", "delete", "claim", "ack", "nack", "extend", "work"):
                m = self._pick(seg[2], method, (W,), [name], params)
                if seg[2] == "work":
                    m.sse_token = True
                return m
            return Match(None, (W,), [name], params, 404)
        if seg[0] == "routers":
            if n == 1:
                return self._pick("routers", method, (R,), [], {})
            if n == 2 and seg[1]:
                return self._pick("router", method, (A,), [seg[1]], {"router": seg[1]})
            return Match(None, (A,), [], {}, 404)
        if seg[0] == "watch":
            if n == 1:
                return self._pick("watch", method, (R,), [], {})
            if n == 2 and seg[1]:
                m = self._pick("watch_stream", method, (), [], {"wid": seg[1]})
                m.watch_stream = True
                m.sse_token = True
                return m
            return Match(None, (), [], {}, 404)
        if n == 1 and seg[0] == "ws":
            m = self._pick("ws", method, (), [], {})
            m.websocket = True
            return m
        if n == 1 and seg[0] == "metrics":
            return self._pick("metrics", method, (R,), [], {})
        return Match(None, (), [], {}, 404)

    def _pick(
        self,
        key: str,
        method: str,
        fallback: tuple[str, ...],
        names: list[str],
        params: dict[str, str],
        *,
        probe: bool = False,
    ) -> Match:
        routes = self._routes[key]
        route = routes.get(method)
        if route is None and method == "HEAD" and "GET" in routes:
            route = routes["GET"]
        if route is None:
            allow = tuple(sorted({*routes, *(("HEAD",) if "GET" in routes else ())}))
            return Match(None, fallback, names, params, 405, probe=probe, allow=allow)
        return Match(route, route.scopes, names, params, 200, probe=probe)

    # ------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        """ASGI lifespan startup: starts the node when the app owns it."""
        if self.shutting_down is None:
            self.shutting_down = asyncio.Event()
        if self.owns_node:
            await self.node.start()

    def begin_shutdown(self) -> None:
        """Tell open SSE/WS/work streams to send their shutdown frame and end."""
        if self.shutting_down is not None:
            self.shutting_down.set()

    async def shutdown(self) -> None:
        """ASGI lifespan shutdown: streams end; the node stops when the app owns it."""
        self.begin_shutdown()
        if self.owns_node:
            await self.node.stop()

    # ------------------------------------------------------------ the ASGI call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        typ = scope["type"]
        if typ == "http" or typ == "websocket":
            await self._handle(scope, receive, send)
        elif typ == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # pragma: no cover
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request through the layers, in order (docs/HTTP_INPUT.md): classify,
        authenticate, admit (in-flight cap), authorize (scopes, names), readiness,
        route, body, handler with its commit wait; every failure becomes the
        canonical error envelope (a refused WebSocket upgrade, or a 1011 close
        once upgraded)."""
        t0 = time.perf_counter()
        rx = scope.get(RECEIVED_AT)
        if rx is not None:
            # How long the request waited for the loop since its bytes were read.
            self.node.delivery.governor.observe_ingest((t0 - rx) * 1000)
        is_ws = scope["type"] == "websocket"
        method = "GET" if is_ws else scope["method"]
        m = self.classify(method, scope["path"])
        if is_ws and not m.websocket:
            await send({"type": "websocket.close", "code": 1008})
            return
        admitted: bytes | None = None
        try:
            principal = self._authenticate(scope, m)
            admitted = self._admit(principal, m)
            self._authorize(principal, m)
            self._check_ready(m)
            route = self._route(m, method, scope["path"], is_ws)
            ctx = Ctx(self, scope, receive, send, principal, m.params, t0)
            if not is_ws and route.body != BODY_NONE:
                await self._read_body(ctx, route.body)
            resp = await self._run(route, ctx, method)
        except TopicsError as err:
            if is_ws:
                await self._ws_reject(send, err)
                return
            resp = error_resp(err)
        except ColdStoreError as exc:
            # The object-store cold tier failed a read: writes and live delivery
            # never wait on it (docs/FORMATS.md, "Object-store cold tier").
            log.warning("cold tier read failed: %s %s: %s", method, scope["path"], exc)
            if is_ws:
                await send({"type": "websocket.close", "code": 1011})
                return
            if exc.retryable:
                err = TopicsError(503, "cold_tier_unavailable", exc.message, {"retryable": True})
            else:
                err = TopicsError(500, "internal", f"cold tier read failed: {exc.message}")
            resp = error_resp(err)
        except (FrameCorrupt, OSError) as exc:
            # A segment frame that does not verify, or a file that cannot be read:
            # surfaced as an error, never served or skipped (docs/FORMATS.md).
            log.error("storage read failed: %s %s: %s", method, scope["path"], exc)
            if is_ws:
                await send({"type": "websocket.close", "code": 1011})
                return
            resp = error_resp(TopicsError(500, "internal", f"stored data cannot be read: {exc}"))
        except Exception:
            log.exception("handler failed: %s %s", method, scope["path"])
            if is_ws:
                await send({"type": "websocket.close", "code": 1011})
                return
            resp = error_resp(TopicsError(500, "internal", "internal error"))
        finally:
            if admitted is not None:
                self.inflight[admitted] -= 1
        if resp is not None:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [*resp.headers, (b"content-length", b"%d" % resp.length)],
                }
            )
            if resp.pieces is None:
                await send({"type": "http.response.body", "body": resp.body})
                # What this request published reaches the parked streams now, right
                # after its own answer (docs/ARCHITECTURE.md, "Live delivery").
                self.fanout().flush()
                return
            async for piece in resp.pieces:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    def fanout(self) -> Fanout:
        """The live deliveries of the serving loop (topics.http.fanout), made on first use."""
        fan = self._fan
        if fan is None:
            fan = self._fan = Fanout(asyncio.get_running_loop())
        return fan

    def _admit(self, principal: Principal, m: Match) -> bytes | None:
        """The per-key in-flight cap: 429 over it; returns the key holding a slot
        (released when the response is produced), or None."""
        key = principal.digest
        if key is None or m.route is None or not m.route.inflight:
            return None
        cap = self.config.limits.max_inflight_per_key
        cur = self.inflight.get(key, 0)
        if cap and cur >= cap:
            raise throttled("max_inflight_per_key", cap, "too many in-flight requests for this key")
        if m.route.inflight != INFLIGHT_HOLD:
            return None
        self.inflight[key] = cur + 1
        return key

    @staticmethod
    def _authorize(principal: Principal, m: Match) -> None:
        """403 unless the key has the route's scopes and may touch every name in the path."""
        for s in m.scopes:
            if not principal.has(s):
                raise TopicsError(403, "forbidden", f"this key lacks the {s} scope")
        for name in m.names:
            if not principal.allows_name(name):
                raise TopicsError(403, "forbidden", f'this key may not access "{name}"')

    def _check_ready(self, m: Match) -> None:
        """Data routes answer 503 until recovery has finished; probes always answer."""
        node = self.node
        if not node.ready and not m.probe:
            raise TopicsError(
                503,
                "not_ready",
                "recovery in progress",
                {"replay_progress": round(node.replay_progress, 4)},
            )

    @staticmethod
    def _route(m: Match, method: str, path: str, is_ws: bool) -> Route:
        """The matched route, or 404/405 (and 400 for the WebSocket path without an upgrade)."""
        if m.route is None:
            if m.status == 405:
                err = TopicsError(405, "method_not_allowed", f"{method} is not allowed here")
                err.allow = m.allow
                raise err
            raise TopicsError(404, "not_found", f"no route for {path}")
        if m.websocket and not is_ws:
            raise bad_request("GET /v0/ws needs a WebSocket upgrade")
        return m.route

    async def _run(self, route: Route, ctx: Ctx, method: str) -> Resp | None:
        """The handler, inside a journal request scope: a mutation is acknowledged
        only once the control frames it logged (config, deletes, routers, leases)
        are durable; another request's frames are not its business, and a read
        never waits for the log."""
        node = self.node
        token = node.open_request()
        try:
            resp = await route.handler(ctx)
            if resp is not None and resp.status < 300 and method != "GET" and not route.read:
                if node.has_pending_controls():
                    await node.barrier()
            return resp
        finally:
            node.close_request(token)

    async def _ws_reject(self, send: Send, err: TopicsError) -> None:
        """Refuse a WebSocket upgrade with the HTTP error (websocket.http.response)."""
        resp = error_resp(err)
        try:
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": resp.status,
                    "headers": resp.headers,
                }
            )
            await send({"type": "websocket.http.response.body", "body": resp.body})
        except Exception:
            await send({"type": "websocket.close", "code": 1008})

    def _authenticate(self, scope: Scope, m: Match) -> Principal:
        auth = self.auth
        if not auth.enabled:
            return auth.authenticate(None)  # type: ignore[return-value]
        if m.public or (m.probe and not self.config.probe_auth):
            return auth.authenticate(None) if not auth.enabled else _ANON
        if m.watch_stream:
            # Session binding is checked by the stream handler (docs/API.md, "12.2 ...").
            return _ANON
        header = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                header = v.decode("latin-1")
                break
        token = bearer(header)
        if token is None and m.sse_token and not m.websocket:
            token = token_from_query(scope.get("query_string", b""))
        p = auth.authenticate(token)
        if p is None:
            raise TopicsError(401, "unauthorized", "a valid bearer token is required")
        return p

    async def _read_body(self, ctx: Ctx, mode: int) -> None:
        """Read and parse the request body (docs/HTTP_INPUT.md).

        The body is gathered into one buffer without keeping the received
        chunks; a large write body is parsed a piece at a time so the event loop
        keeps serving other requests, and any other large body is checked for
        density before it is parsed in one go. Raises TopicsError: 413 past
        `max_body_bytes` or too dense to parse, 415 for a non-JSON content type,
        400 for a body that is not acceptable JSON.
        """
        limit = self.config.limits.max_body_bytes
        clen = ctx.header(b"content-length")
        if clen is not None:
            try:
                expected = int(clen)
            except ValueError:
                raise bad_request("invalid content-length") from None
            if expected < 0:
                raise bad_request("invalid content-length")
            if limit and expected > limit:
                raise TopicsError(413, "payload_too_large", f"body exceeds {limit} bytes")
        raw = await _receive_body(ctx.receive, limit)
        if not raw or raw.isspace():
            if mode == BODY_JSON_EMPTY_OK:
                ctx.body = {}
                return
            if mode == BODY_CLAIM:
                raise bad_request("claim requires a node")
        ct = ctx.header(b"content-type")
        if ct is None or not ct.lstrip().startswith("application/json"):
            raise TopicsError(
                415, "unsupported_media_type", "Content-Type must be application/json"
            )
        if mode == BODY_WRITE and len(raw) >= INCREMENTAL_MIN_BYTES:
            body = await self._parse_write_body(raw)
            if body is not None:
                ctx.body = body
                return
        await drive(iter_density_check(raw))
        try:
            ctx.body = loads(raw)
        except ValueError as exc:
            raise bad_request(f"malformed JSON body: {exc}") from None

    async def _parse_write_body(self, raw: bytes | bytearray) -> dict[str, Any] | None:
        """Run :func:`iter_write_body`, letting the loop run between pieces."""
        steps = iter_write_body(raw, self.engine.limits)
        body: dict[str, Any] | None = await drive(steps)
        return body

    # ------------------------------------------------------------ SSE slots

    def acquire_sse(self, key: bytes | None) -> None:
        """Take an SSE/WS connection slot (global + per key); 429 when full.

        See docs/API.md, "16. Limits and the knobs that shape the API".
        """
        lim = self.config.limits
        if lim.max_sse_connections and self.sse_total >= lim.max_sse_connections:
            raise throttled(
                "max_sse_connections", lim.max_sse_connections, "too many streaming connections"
            )
        if key is not None and self.auth.enabled:
            cur = self.sse_per_key.get(key, 0)
            cap = lim.max_sse_connections_per_key
            if cap and cur >= cap:
                raise throttled(
                    "max_sse_connections_per_key",
                    cap,
                    "too many streaming connections for this key",
                )
            self.sse_per_key[key] = cur + 1
        self.sse_total += 1

    def release_sse(self, key: bytes | None) -> None:
        self.sse_total -= 1
        if key is not None and self.auth.enabled:
            self.sse_per_key[key] -= 1


_ANON = Principal(None, frozenset(), ())


async def drive(steps: Generator[None, None, T]) -> T:
    """Run a stepping generator to its return value, letting the loop run between steps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        await asyncio.sleep(0)


async def _receive_body(receive: Receive, limit: int) -> bytes | bytearray:
    """The whole request body, refused with 413 as soon as it passes `limit` bytes.

    A body that arrives in one message is returned as it came; a longer one is
    appended to a single growing buffer, so no list of chunks and no joined copy
    coexist. (Growing beats preallocating from Content-Length: `bytearray(n)`
    zero-fills every page up front, a stall of tens of ms for 60 MiB, while
    glibc grows a large block by remapping it, without copying.)
    """
    msg = await receive()
    if msg["type"] == "http.disconnect":
        raise TopicsError(400, "invalid_request", "client disconnected")
    chunk: bytes = msg.get("body", b"")
    if limit and len(chunk) > limit:
        raise TopicsError(413, "payload_too_large", f"body exceeds {limit} bytes")
    if not msg.get("more_body", False):
        return chunk
    buf = bytearray(chunk)
    while msg.get("more_body", False):
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise TopicsError(400, "invalid_request", "client disconnected")
        chunk = msg.get("body", b"")
        if limit and len(buf) + len(chunk) > limit:
            raise TopicsError(413, "payload_too_large", f"body exceeds {limit} bytes")
        buf += chunk
    return buf


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def build_app(config: ServerConfig | None = None, *, clock: Clock | None = None) -> TopicsApp:
    """An app over a fresh memory-mode :class:`~topics.node.Node` of `config` (tests, embedding).

    The app owns that node: the ASGI lifespan starts and stops it.
    """
    return TopicsApp(Node.memory(config, clock=clock), owns_node=True)
