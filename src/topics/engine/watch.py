"""Watch sessions and push delivery: the sans-I/O half of SSE watch and the WebSocket.

A :class:`WatchSession` is the memory-only state behind `POST /v0/watch` (docs/API.md,
"12. Watch: multiplexed Server-Sent Events"): the topic -> cursor map, the read
options, the creating key and the last-access stamp. :class:`WatchRegistry`
validates POST bodies in the order of docs/API.md, "12.1 `POST /v0/watch`", and
garbage-collects idle sessions.

Delivery is one function, :func:`drain_step`: one pass of the read pipeline
for one topic, turned into push :class:`Event` s (tombstone,
record, caught-up, topic-deleted). The SSE stream and the WebSocket both drive
it; :class:`WatchStream` wraps it for one SSE connection (composite ids,
`from_seq_too_old` relabelling, session cursor updates). Record events splice the
stored JSON fragments; nothing here re-parses a payload.

Fan-out is cheap: streams parked at a topic's head wake on the same publish and
read the same records from the same cursor, so the first one's read (and the
immutable events built from it, with their memoised renderings) is shared by the
rest for as long as the topic's read state is unchanged. Composite ids are
memoised the same way.

Everything here is synchronous; the asyncio shells live in `topics.http.watch`
and `topics.http.ws`.
"""

from __future__ import annotations

import base64
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from topics.cursor_id import decode_composite_id, encode_composite_id
from topics.engine.core import Engine, norm_budget, norm_limit
from topics.engine.params import boolean, node_set, opt_str, opt_u64, u32, u64
from topics.engine.topic import WATCH_DEFAULT_BUDGET, ReadOpts, ReadResult, Topic
from topics.errors import TopicsError, bad_request, not_found_topic, throttled

__all__ = [
    "SESSION_TTL_MS",
    "WATCH_DEFAULT_BUDGET",
    "HEARTBEAT_DEFAULT_MS",
    "ReadOpts",
    "Event",
    "Delivery",
    "StepResult",
    "drain_step",
    "WatchSession",
    "WatchStream",
    "SseFrame",
    "WatchRegistry",
    "encode_composite_id",
    "composite_id_of",
    "decode_composite_id",
    "clamp_heartbeat",
    "render_sse",
    "render_ws",
    "SHUTDOWN_DATA",
    "PassResult",
    "parse_read_opts",
    "TopicStart",
    "parse_topic_starts",
]

SESSION_TTL_MS = 300_000
HEARTBEAT_DEFAULT_MS = 15_000
HEARTBEAT_MIN_MS = 1_000
HEARTBEAT_MAX_MS = 60_000
WS_DEFAULT_LIMIT = 1_000

# Event kinds (SSE event names; the WebSocket uses the `_` spelling as its `op`).
RECORD = "record"
TOMBSTONE = "tombstone"
CAUGHT_UP = "caught-up"
TOPIC_DELETED = "topic-deleted"

_WS_OPS = {
    RECORD: b"record",
    TOMBSTONE: b"tombstone",
    CAUGHT_UP: b"caught_up",
    TOPIC_DELETED: b"topic_deleted",
}

SHUTDOWN_DATA = b'{"code":"server_shutting_down","message":"server is shutting down; reconnect"}'


# --------------------------------------------------------------------- delivery


@dataclass(frozen=True, slots=True)
class Event:
    """One push frame for one topic, before transport rendering.

    `cursor` is the topic cursor after this frame: the tombstone moves it to
    `gap_to`, a record batch to `next_from_seq` (docs/API.md, "12.3 Frames").

    Events are immutable and may be shared by every stream that read the same topic
    from the same cursor with the same options (see :func:`drain_step`), so the
    renderings are memoised on the event: the `data` JSON, the WebSocket message,
    and the SSE frame for the last composite id it was rendered with.
    """

    kind: str
    topic: str
    name_json: bytes
    cursor: int
    head_seq: int
    from_seq: int = 0
    records: tuple[bytes, ...] = ()
    reason: str = ""
    gap_from: int = 0
    gap_to: int = 0
    earliest_seq: int = 0
    _data: bytes | None = field(default=None, init=False, compare=False, repr=False)
    _ws: bytes | None = field(default=None, init=False, compare=False, repr=False)
    _sse_id: str | None = field(default=None, init=False, compare=False, repr=False)
    _sse: bytes = field(default=b"", init=False, compare=False, repr=False)

    def data(self) -> bytes:
        """The frame's JSON object (SSE `data:` line; WS message without `op`)."""
        d = self._data
        if d is None:
            d = self._render()
            object.__setattr__(self, "_data", d)
        return d

    def _render(self) -> bytes:
        k = self.kind
        if k == RECORD:
            return b"".join(
                (
                    b'{"topic":',
                    self.name_json,
                    b',"from_seq":%d,"head_seq":%d,"records":[' % (self.from_seq, self.head_seq),
                    b",".join(self.records),
                    b'],"to_seq":%d}' % self.cursor,
                )
            )
        if k == TOMBSTONE:
            return (
                b'{"topic":%b,"reason":%b,"gap_from":%d,"gap_to":%d,"earliest_seq":%d,"head_seq":%d}'
                % (
                    self.name_json,
                    orjson.dumps(self.reason),
                    self.gap_from,
                    self.gap_to,
                    self.earliest_seq,
                    self.head_seq,
                )
            )
        if k == CAUGHT_UP:
            return b'{"topic":%b,"head_seq":%d}' % (self.name_json, self.head_seq)
        return b'{"topic":%b,"head_seq":0,"reason":"deleted"}' % self.name_json

    def to_dict(self) -> dict[str, Any]:
        """The frame data as a dict (tests, debugging)."""
        out: dict[str, Any] = orjson.loads(self.data())
        return out


@dataclass(slots=True)
class Delivery:
    """Per-connection delivery state of one topic (an SSE stream or a WS subscription).

    `topic` is the instance resolved when the connection (or subscription) started;
    once it is no longer alive the topic is reported deleted exactly once.
    """

    name: str
    topic: Topic | None
    first_read: bool = True
    pending_caught_up: bool = True
    deleted: bool = False
    memo: _TopicMemo | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class StepResult:
    """Outcome of :func:`drain_step`: the events, the final cursor, and whether to stop."""

    events: list[Event]
    cursor: int
    drained: bool


def drain_step(
    engine: Engine,
    d: Delivery,
    cursor: int,
    opts: ReadOpts,
    *,
    relabel_first: bool,
) -> StepResult:
    """Run one read-pipeline pass for `d` from `cursor` and turn it into events.

    Order within a step: tombstone, record batch, caught-up (docs/API.md, "12.3 Frames"). With
    `relabel_first` (SSE) a tombstone from the first read of the connection is
    reported as `from_seq_too_old`. `caught-up` is emitted the first time the
    topic is drained and again after any later record/tombstone once drained.
    `drained` is True when the topic is at head (or gone): the caller moves on.
    """
    t = d.topic
    if d.deleted:
        return StepResult([], cursor, True)
    if t is None or not t.alive:
        d.deleted = True
        name_json = t.name_json if t is not None else orjson.dumps(d.name)
        ev = Event(TOPIC_DELETED, d.name, name_json, cursor, 0)
        return StepResult([ev], cursor, True)
    now = engine.prepare_read(t)
    memo = d.memo
    if memo is None:
        memo = d.memo = _memo_of(t)
    sh = _read(memo, t, cursor, opts, now)
    r = sh.r
    events: list[Event] = []
    tomb = r.tombstone
    if tomb is not None:
        reason = "from_seq_too_old" if (relabel_first and d.first_read) else tomb.reason
        cur = tomb.gap_to
        events.append(
            Event(
                TOMBSTONE,
                t.name,
                t.name_json,
                cur,
                tomb.head_seq,
                reason=reason,
                gap_from=tomb.gap_from,
                gap_to=tomb.gap_to,
                earliest_seq=tomb.earliest_seq,
            )
        )
        d.pending_caught_up = True
    d.first_read = False
    if sh.rec is not None:
        events.append(sh.rec)
        d.pending_caught_up = True
    cur = r.next_from_seq
    drained = r.caught_up
    if drained and d.pending_caught_up:
        cu = sh.cu
        if cu is None:
            cu = sh.cu = Event(CAUGHT_UP, t.name, t.name_json, cur, r.head_seq)
        events.append(cu)
        d.pending_caught_up = False
    if not drained and not r.records and tomb is None and r.next_from_seq == cursor:
        drained = True  # defensive: no progress possible now
    return StepResult(events, cur, drained)


def render_sse(ev: Event, event_id: str | None) -> bytes:
    """One SSE frame: `id:` (optional), `event:`, one `data:` line, blank line.

    The frame for the last `event_id` is memoised on the (possibly shared) event.
    """
    if event_id is None:
        return b"event: %b\ndata: %b\n\n" % (ev.kind.encode(), ev.data())
    if ev._sse_id == event_id:
        return ev._sse
    out = b"id: %b\nevent: %b\ndata: %b\n\n" % (event_id.encode(), ev.kind.encode(), ev.data())
    object.__setattr__(ev, "_sse_id", event_id)
    object.__setattr__(ev, "_sse", out)
    return out


def render_ws(ev: Event) -> bytes:
    """One WebSocket message: `{"op": ..., <frame fields>}` (memoised).

    See docs/API.md, "13. WebSocket".
    """
    msg = ev._ws
    if msg is None:
        msg = b'{"op":"' + _WS_OPS[ev.kind] + b'",' + ev.data()[1:]
        object.__setattr__(ev, "_ws", msg)
    return msg


# ------------------------------------------------------------ shared tail reads
#
# Streams parked at the head of a topic all wake on the same publish and read the
# same few records from the same cursor. The first of them runs the read pipeline;
# the others reuse its result (and the events built from it, whose renderings are
# memoised), as long as nothing that can change a read's outcome has changed since.


@dataclass(slots=True, eq=False)
class _Shared:
    """One read of a topic from `cursor` with `opts`, and the events built from it."""

    cursor: int
    opts: ReadOpts
    r: ReadResult
    rec: Event | None
    cu: Event | None = None


@dataclass(slots=True, eq=False)
class _TopicMemo:
    """The shared reads of one topic instance for its current read state."""

    state: tuple[Any, ...] | None = None
    reads: list[_Shared] = field(default_factory=list)


_MEMO: weakref.WeakKeyDictionary[Topic, _TopicMemo] = weakref.WeakKeyDictionary()
# Bounds on what a topic's memo keeps alive until its next state change (at worst
# a few hundred KiB per watched topic; a tail read is usually a record or two).
_MEMO_READS = 4  # distinct (cursor, opts) reads kept per topic state
_MEMO_RECORDS = 64  # only small reads that reach the head are shared ...
_MEMO_BYTES = 32_768  # ... and only when their records are this small in total


def _read_state(t: Topic, now: int) -> tuple[Any, ...]:
    """Everything besides (cursor, opts) that a read's outcome depends on.

    Publishes move `head_seq`; deletes and evictions lower `live_count` or move a
    floor / `base_seq`; a config change replaces `config`; the TTL cutoff depends
    on `now` only when the topic has a TTL.
    """
    cfg = t.config
    return (
        t.head_seq,
        t.live_count,
        t.l_cap,
        t.l_ttl,
        t.l_trim,
        t.delete_below,
        t.index.base_seq,
        cfg,
        now if cfg.ttl_ms > 0 else 0,
    )


def _memo_of(t: Topic) -> _TopicMemo:
    memo = _MEMO.get(t)
    if memo is None:
        memo = _MEMO[t] = _TopicMemo()
    return memo


def _read(memo: _TopicMemo, t: Topic, cursor: int, opts: ReadOpts, now: int) -> _Shared:
    """`t.read(cursor, ...)`, shared with every reader of the same state/cursor/opts."""
    state = _read_state(t, now)
    if memo.state != state:
        memo.state = state
        memo.reads.clear()
    else:
        for sh in memo.reads:
            if sh.cursor == cursor and (sh.opts is opts or sh.opts == opts):
                return sh
    r = t.read_opts(cursor, opts, now=now)
    rec: Event | None = None
    recs = r.records
    if recs:
        tomb = r.tombstone
        rec = Event(
            RECORD,
            t.name,
            t.name_json,
            r.next_from_seq,
            r.head_seq,
            from_seq=cursor if tomb is None else tomb.gap_to,
            records=tuple(recs),
        )
    sh = _Shared(cursor, opts, r, rec)
    if (
        r.caught_up
        and len(memo.reads) < _MEMO_READS
        and len(recs) <= _MEMO_RECORDS
        and sum(map(len, recs)) <= _MEMO_BYTES
    ):
        memo.reads.append(sh)
    return sh


# --------------------------------------------------------------- composite ids


_CID_MEMO: dict[tuple[tuple[str, int], ...], str] = {}
_CID_MEMO_MAX = 4096  # entries; cleared when full
_CID_MEMO_TOPICS = 16  # only ids of sessions this small are memoised


def composite_id_of(cursors: dict[str, int]) -> str:
    """:func:`encode_composite_id`, memoised for small cursor maps.

    Many streams on the same topic at the same cursor share one id string.
    """
    if len(cursors) > _CID_MEMO_TOPICS:
        return encode_composite_id(cursors)
    key = tuple(cursors.items())
    cid = _CID_MEMO.get(key)
    if cid is None:
        cid = encode_composite_id(cursors)
        if len(_CID_MEMO) >= _CID_MEMO_MAX:
            _CID_MEMO.clear()
        _CID_MEMO[key] = cid
    return cid


def clamp_heartbeat(raw: int) -> int:
    """A watch's `heartbeat_ms` clamped to [HEARTBEAT_MIN_MS, HEARTBEAT_MAX_MS] (1000-60000 ms)."""
    return min(max(raw, HEARTBEAT_MIN_MS), HEARTBEAT_MAX_MS)


# ------------------------------------------------------------------- sessions


@dataclass(slots=True, eq=False)
class WatchSession:
    """A watch subscription. Streams on one wid share `cursors`."""

    wid: str
    cursors: dict[str, int]
    opts: ReadOpts
    heartbeat_ms: int
    creator: bytes | None
    bound: bool
    last_access_ms: int
    open_streams: int = 0

    def composite_id(self) -> str:
        return composite_id_of(self.cursors)

    def rewind(self, last_event_id: str | None) -> None:
        """Apply a `Last-Event-ID`: per known topic, cursor = min(cursor, id value)."""
        if not last_event_id:
            return
        ids = decode_composite_id(last_event_id)
        if not ids:
            return
        for name, seq in ids.items():
            cur = self.cursors.get(name)
            if cur is not None and seq < cur:
                self.cursors[name] = seq


@dataclass(frozen=True, slots=True)
class SseFrame:
    """A produced SSE frame: its composite id, event name and data JSON."""

    id: str
    event: str
    data: bytes

    def to_bytes(self) -> bytes:
        return b"id: %b\nevent: %b\ndata: %b\n\n" % (
            self.id.encode(),
            self.event.encode(),
            self.data,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = orjson.loads(self.data)
        return out


@dataclass(slots=True)
class PassResult:
    frames: list[SseFrame]
    drained: bool


class WatchStream:
    """Delivery state of one SSE connection on a session.

    Frames go out in the order docs/API.md, "12.3 Frames" gives.
    """

    def __init__(self, engine: Engine, session: WatchSession) -> None:
        self.engine = engine
        self.session = session
        self.deliveries: dict[str, Delivery] = {
            name: Delivery(name, engine.get(name)) for name in sorted(session.cursors)
        }
        self._cid_key: tuple[tuple[str, int], ...] | None = None
        self._names: list[str] | None = None  # cached names(); reset when one is deleted
        self._cid = ""

    def topics(self) -> list[Topic]:
        """The live instances this connection listens to."""
        return [d.topic for d in self.deliveries.values() if d.topic is not None]

    def names(self) -> list[str]:
        """Topics still to process, in name order (deleted ones are skipped)."""
        names = self._names
        if names is None:
            names = self._names = [n for n, d in self.deliveries.items() if not d.deleted]
        return names

    @property
    def all_deleted(self) -> bool:
        return not self.names()

    def pass_topic(self, name: str) -> PassResult:
        """One drain step for `name`; advances the session cursor frame by frame."""
        d = self.deliveries[name]
        cursors = self.session.cursors
        step = drain_step(self.engine, d, cursors[name], self.session.opts, relabel_first=True)
        frames: list[SseFrame] = []
        for ev in step.events:
            cursors[name] = ev.cursor
            frames.append(SseFrame(self.composite_id(), ev.kind, ev.data()))
        cursors[name] = step.cursor
        if d.deleted:
            self._names = None
        return PassResult(frames, step.drained)

    def pass_sse(self, name: str, out: list[bytes]) -> bool:
        """:meth:`pass_topic`, appending the frames' wire bytes to `out`; True when drained."""
        d = self.deliveries[name]
        cursors = self.session.cursors
        step = drain_step(self.engine, d, cursors[name], self.session.opts, relabel_first=True)
        for ev in step.events:
            cursors[name] = ev.cursor
            out.append(render_sse(ev, self.composite_id()))
        cursors[name] = step.cursor
        if d.deleted:
            self._names = None
        return step.drained

    def composite_id(self) -> str:
        """The composite id of the session's current cursors (cached per stream)."""
        cursors = self.session.cursors
        key = tuple(cursors.items())
        if key != self._cid_key:
            self._cid = composite_id_of(cursors)
            self._cid_key = key
        return self._cid

    def shutdown_frame(self) -> SseFrame:
        return SseFrame(self.session.composite_id(), "error", SHUTDOWN_DATA)


# ------------------------------------------------------------------- registry


def _new_wid() -> str:
    return "wid_" + base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()


@dataclass(slots=True)
class TopicStart:
    """Where a stream of one topic starts: `from_seq`, or the head when `tail`."""

    from_seq: int | None
    tail: bool

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> TopicStart:
        """`{from_seq?, tail?}`; `400` for a field of the wrong type."""
        return cls(opt_u64(spec, "from_seq"), boolean(spec, "tail", False))

    def cursor(self, t: Topic) -> int:
        """The cursor the stream starts from on `t`."""
        return t.head_seq if self.tail else (self.from_seq or 0)


def parse_topic_starts(topics: dict[str, Any]) -> dict[str, TopicStart]:
    """A `topics` object, name -> `{from_seq?, tail?}` or null: a watch session's
    (docs/API.md, "12.1 `POST /v0/watch`") or a WebSocket subscribe's ("13. WebSocket").

    `400` when an entry is not an object or has a field of the wrong type.
    """
    out: dict[str, TopicStart] = {}
    for name, spec in topics.items():
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise bad_request(f"topics.{name} must be an object")
        out[name] = TopicStart.parse(spec)
    return out


@dataclass(slots=True)
class WatchRegistry:
    """All watch sessions of the instance (memory only)."""

    engine: Engine
    sessions: dict[str, WatchSession] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, wid: str) -> WatchSession | None:
        return self.sessions.get(wid)

    def gc(self, now: int) -> int:
        """Drop sessions idle > TTL with no open stream; returns how many went."""
        dead = [
            w
            for w, s in self.sessions.items()
            if s.open_streams <= 0 and now - s.last_access_ms > SESSION_TTL_MS
        ]
        for w in dead:
            del self.sessions[w]
        return len(dead)

    def create(
        self,
        body: Any,
        principal_digest: bytes | None,
        bound: bool,
        lenient: bool,
        allow: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Validate and store a session (`POST /v0/watch`); returns the body sans `performance`.

        Order (docs/API.md, "12.1 `POST /v0/watch`"): parse -> count (400) ->
        allowlist (403) -> idle GC -> topic resolution (404 unless `lenient`) ->
        session cap (429).
        """
        entries, opts, heartbeat = self._parse(body)
        lim = self.engine.limits
        if not entries or len(entries) > lim.max_watch_topics:
            raise bad_request(f"topics must have 1..{lim.max_watch_topics} entries")
        names = sorted(entries)
        if allow is not None:
            for name in names:
                if not allow(name):
                    raise TopicsError(
                        403, "forbidden", f'this key may not access "{name}"', {"topic": name}
                    )
        now = self.engine.clock.now_ms()
        self.gc(now)
        cursors: dict[str, int] = {}
        topics_out: dict[str, Any] = {}
        for name in names:
            t = self.engine.get(name)
            if t is None:
                if lenient:
                    continue
                raise not_found_topic(name)
            self.engine.prepare_read(t, consume=False)
            cur = entries[name].cursor(t)
            cursors[name] = cur
            topics_out[name] = {
                "from_seq": cur,
                "head_seq": t.head_seq,
                "earliest_seq": t.earliest_seq,
            }
        cap = lim.max_watch_sessions
        if cap and len(self.sessions) >= cap:
            raise throttled("max_watch_sessions", cap)
        wid = _new_wid()
        while wid in self.sessions:  # pragma: no cover - 128 random bits
            wid = _new_wid()
        self.sessions[wid] = WatchSession(
            wid=wid,
            cursors=cursors,
            opts=opts,
            heartbeat_ms=heartbeat,
            creator=principal_digest if bound else None,
            bound=bound,
            last_access_ms=now,
        )
        return {
            "wid": wid,
            "stream_url": f"/v0/watch/{wid}",
            "session_ttl_ms": SESSION_TTL_MS,
            "topics": topics_out,
        }

    def _parse(self, body: Any) -> tuple[dict[str, TopicStart], ReadOpts, int]:
        if not isinstance(body, dict):
            raise bad_request("watch body must be a JSON object")
        raw = body.get("topics")
        if not isinstance(raw, dict):
            raise bad_request("topics must be an object of name -> {from_seq?, tail?}")
        entries = parse_topic_starts(raw)
        opts = parse_read_opts(
            body,
            max_limit=self.engine.limits.max_limit,
            default_limit=None,
            default_budget=WATCH_DEFAULT_BUDGET,
        )
        heartbeat = u64(body, "heartbeat_ms", HEARTBEAT_DEFAULT_MS)
        consistency = opt_str(body, "consistency")
        if consistency is not None and consistency not in ("eventual", "strong"):
            raise bad_request('consistency must be "eventual" or "strong"')
        return entries, opts, heartbeat


def parse_read_opts(
    body: dict[str, Any],
    *,
    max_limit: int,
    default_limit: int | None,
    default_budget: int,
) -> ReadOpts:
    """`node`, `limit`, `max_batch_bytes` and the include flags of a watch/subscribe body.

    `limit`: absent => `default_limit` (None => 256), `0` => 256, clamped to
    `max_limit`. `max_batch_bytes`: absent => `default_budget`, `0` => 1 MiB,
    clamped to 8 MiB.
    """
    raw_limit = u32(body, "limit", -1) if body.get("limit") is not None else None
    if raw_limit is None and default_limit is not None:
        limit = min(default_limit, max_limit)
    else:
        limit = norm_limit(raw_limit or 0, max_limit)
    raw_budget = opt_u64(body, "max_batch_bytes")
    budget = default_budget if raw_budget is None else norm_budget(raw_budget)
    opts = ReadOpts(
        nodes=node_set(body),
        limit=limit,
        budget=budget,
        include_meta=boolean(body, "include_meta", True),
        include_tags=boolean(body, "include_tags", False),
        include_data=boolean(body, "include_data", True),
    )
    # Equal options share one instance, so shared tail reads match them by identity.
    key = (
        None if opts.nodes is None else tuple(opts.nodes),
        limit,
        budget,
        opts.include_meta,
        opts.include_tags,
        opts.include_data,
    )
    same = _OPTS.get(key)
    if same is not None:
        return same
    if len(_OPTS) >= 1024:
        _OPTS.clear()
    _OPTS[key] = opts
    return opts


_OPTS: dict[tuple[Any, ...], ReadOpts] = {}
