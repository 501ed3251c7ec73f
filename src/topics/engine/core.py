"""The engine facade: the topic registry and every topic-level operation.

Sans-I/O and synchronous: callers pass parsed JSON bodies, the engine returns
JSON-ready results or raises :class:`~topics.errors.TopicsError`. Time comes
from the injected :class:`~topics.clock.Clock`; durable logging goes through the
injected :class:`~topics.engine.journal.Journal`, one typed event
(:mod:`topics.engine.events`) per mutation, and :meth:`Engine.apply` applies
such an event (recovery, replay; docs/ARCHITECTURE.md, "The event log"). All
calls must come from the one event loop that owns the engine
(docs/ARCHITECTURE.md, "Threads"): there are no locks.

Writes are two-phase so storage can slot in underneath: :meth:`Engine.begin_write`
validates, admits and stages a batch (seqs assigned, nothing visible);
the journal commits it and the topic publishes it in seq order
(:meth:`Topic.complete`); :meth:`Engine.write_result` renders the ack. A large
write's frames can be laid out beforehand, a piece per event-loop step, by
:meth:`Engine.prepare_write`, which touches no engine state.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import orjson

from topics.clock import Clock
from topics.config import Limits
from topics.engine.events import (
    ConfigChanged,
    Event,
    FloorsAdvanced,
    HeadReserved,
    LeaseChanged,
    RecordsAppended,
    RecordsDeleted,
    RecordsLost,
    RecordsReplayed,
    RouterDeleted,
    RouterPut,
    SegmentsAttached,
    SeqsDeleted,
    TopicCreated,
    TopicDeleted,
    TopicEvent,
    TopicIdsUsed,
    TopicRestored,
)
from topics.engine.journal import DONE, Handle, Journal, MemoryJournal
from topics.engine.names import valid_topic_name
from topics.engine.params import boolean, node_set, opt_str, opt_u64, predicate, u32, u64
from topics.engine.records import MAX_KEY_BYTES, NewRecord, batch_bytes, prepare_records
from topics.engine.topic import (
    DedupeEntry,
    NodeInterner,
    PendingWrite,
    ReadOpts,
    ReadResult,
    Topic,
    Totals,
)
from topics.engine.topic_config import TopicConfig, parse_topic_config
from topics.errors import TopicsError, bad_request, not_found_topic, throttled
from topics.format.frame import BatchLayout, FrameError, layout_batch

if TYPE_CHECKING:
    from topics.engine.params import Predicate
    from topics.engine.queues import Queues
    from topics.engine.routers import RouterSet
    from topics.fs import Fs

__all__ = [
    "Engine",
    "WriteRequest",
    "DiffParams",
    "Replay",
    "PendingDelete",
    "encode_cursor",
    "decode_cursor",
]

DEFAULT_LIMIT = 256
#: Writes whose records hold at least this many bytes have their frames laid out
#: ahead of staging (:meth:`Engine.prepare_write`; docs/HTTP_INPUT.md "Large bodies").
PREPARE_MIN_BYTES = 1 << 20
DEFAULT_BUDGET = 1_048_576
MAX_BUDGET = 8_388_608
MAX_WAIT_MS = 30_000


def encode_cursor(after: str) -> str:
    """List pagination cursor: padded standard base64 of `{"after": name}`.

    See docs/API.md, "8.3 List cursors".
    """
    return base64.b64encode(orjson.dumps({"after": after})).decode()


def decode_cursor(cursor: str | None) -> str | None:
    """The `after` name of a list cursor, None for no cursor; `400` when undecodable."""
    if not cursor:
        return None
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), validate=False)
        obj = orjson.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise bad_request("invalid cursor") from exc
    if isinstance(obj, dict) and isinstance(obj.get("after"), str):
        return str(obj["after"])
    return None


def clamp_page_size(raw: str | None) -> int:
    """`page_size`: default 100, clamped to [1, 1000], unparsable => 100.

    See docs/API.md, "6.3 `GET /v0/topics`".
    """
    try:
        v = int(raw) if raw is not None else 100
    except ValueError:
        return 100
    return min(max(v, 1), 1000)


@dataclass(slots=True)
class WriteRequest:
    """A validated write body (docs/API.md, "7.1 `POST /v0/topics/:topic`").

    `layout` holds the batch's frames laid out ahead of staging by
    :meth:`Engine.prepare_write` (large writes only), else None.
    """

    records: list[NewRecord]
    key: str | None
    create: bool | None
    config: Any
    has_config: bool
    layout: BatchLayout | None = None
    #: The writer opted out of pressure throttling (docs/SCHEDULER.md, "The ladder").
    disable_backpressure: bool = False


@dataclass(slots=True, eq=False)
class PendingDelete:
    """A logged record delete waiting for its frame to commit (then applied)."""

    topic: Topic
    done: bool = False
    ok: bool = False
    deleted: int = 0
    waiters: list[Callable[[], None]] = field(default_factory=list)

    def finish(self) -> None:
        self.done = True
        for cb in self.waiters:
            cb()
        self.waiters.clear()


@dataclass(frozen=True, slots=True)
class Replay:
    """A same-key write is in flight: wait for `pending` to publish, then replay it."""

    pending: PendingWrite


@dataclass(frozen=True, slots=True)
class DiffParams(ReadOpts):
    """Normalised diff parameters (docs/API.md, "8.1 `POST /v0/topics/:topic/diff`"):
    the read options, the cursor `from_seq` and the long-poll `wait_ms`."""

    from_seq: int = 0
    wait_ms: int = 0


def norm_limit(v: int, max_limit: int = 1000) -> int:
    return DEFAULT_LIMIT if v == 0 else min(v, max_limit)


def norm_budget(v: int, default: int = DEFAULT_BUDGET) -> int:
    return default if v == 0 else min(v, MAX_BUDGET)


class Engine:
    """All topics of one server instance and the operations on them."""

    def __init__(
        self,
        *,
        clock: Clock,
        limits: Limits | None = None,
        journal: Journal | None = None,
        fs: Fs | None = None,
    ) -> None:
        self.clock = clock
        # The filesystem seam every durable byte goes through; unused
        # by the in-memory journal, handed to the WAL-backed one.
        self.fs = fs
        self.limits = limits or Limits()
        self.journal: Journal = journal or MemoryJournal()
        self.topics: dict[str, Topic] = {}
        # The same live instances by topic id (events name topics by id).
        self._by_id: dict[int, Topic] = {}
        self.totals = Totals()
        self.nodes = NodeInterner()
        self.next_topic_id = 1
        self.started_ms = clock.now_ms()
        # Hooks installed by the router and queue layers (engine.routers / engine.queues).
        self.drain_into: Callable[[Topic], None] = lambda t: None
        self.on_published: Callable[[Topic], None] = lambda t: None
        # The delivery work of a publication (wake the topic's listeners): at once
        # by default; the delivery scheduler installs itself here (docs/SCHEDULER.md).
        self.deliver: Callable[[Topic], None] = Topic.notify
        self.on_topic_deleted: Callable[[Topic], list[str]] = lambda t: []
        self.on_topic_created: Callable[[Topic], None] = lambda t: None
        # The router and queue layers attach themselves here.
        self.routers: RouterSet | None = None
        self.queues: Queues | None = None

    # ------------------------------------------------------------- registry

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: int) -> Topic | None:
        """The live instance with `topic_id`, or None (never created, or deleted)."""
        return self._by_id.get(topic_id)

    def require(self, name: str) -> Topic:
        """The live topic `name`, or `404 topic_not_found`."""
        t = self.topics.get(name)
        if t is None:
            raise not_found_topic(name)
        return t

    def _new_topic(self, name: str, cfg: TopicConfig) -> Topic:
        """Build an unregistered instance after the name and topic-cap checks."""
        if not valid_topic_name(name):
            raise bad_request(f"invalid topic name {name!r}")
        cap = self.limits.max_topics
        if cap and len(self.topics) >= cap:
            raise throttled("max_topics", cap)
        return self._make_topic(name, self.next_topic_id, cfg, self.clock.now_ms())

    def _make_topic(self, name: str, topic_id: int, cfg: TopicConfig, created_ms: int) -> Topic:
        """A new, unregistered instance wired to log its floors."""
        t = Topic(name, topic_id, cfg, created_ms, self.totals, self.nodes)
        t.on_floor_advance = self._floor_advanced
        t.on_publish = self._published
        return t

    def _published(self, t: Topic) -> None:
        self.deliver(t)

    def _floor_advanced(self, t: Topic) -> None:
        if t.alive and self.topics.get(t.name) is t:
            self.journal.log(FloorsAdvanced(t.topic_id, t.l_cap, t.l_ttl, t.l_trim, t.head_seq))

    def _register(self, t: Topic) -> None:
        # Log first: a create the journal refuses must leave no in-memory topic. One
        # whose event then fails to commit is withdrawn before any request waiting
        # on it is answered (the request barrier turns the failure into 500).
        h = self.journal.log(
            TopicCreated(t.topic_id, t.name, t.config, t.epoch, t.created_ms, t.head_seq)
        )
        self._install(t)

        def done(ok: bool) -> None:
            if not ok and t.alive and self.topics.get(t.name) is t:
                self._remove(t)

        h.add_done_callback(done)

    def _install(self, t: Topic) -> None:
        """Make `t` the live instance of its name."""
        self.next_topic_id = max(self.next_topic_id, t.topic_id + 1)
        self.topics[t.name] = t
        self._by_id[t.topic_id] = t
        self.on_topic_created(t)

    def _remove(self, t: Topic) -> list[str]:
        """End the live instance `t` (nothing logged); the routers removed with it."""
        del self.topics[t.name]
        self._by_id.pop(t.topic_id, None)
        removed = self.on_topic_deleted(t)
        t.drop_all()
        t.notify()
        return removed

    def ensure_topic(self, name: str) -> tuple[Topic, bool]:
        """Get or auto-create `name` with the default config (routers, dead letters)."""
        t = self.topics.get(name)
        if t is not None:
            return t, False
        t = self._new_topic(name, TopicConfig())
        self._register(t)
        return t, True

    # ------------------------------------------------------- topic lifecycle

    def put_topic(self, name: str, body: Any) -> tuple[Topic, bool]:
        """Create or fully reconfigure `name` (PUT); returns (topic, created).

        Raises 400 (name/config), 409 topic_exists_incompatible (type change),
        429 throttled (topic cap).
        """
        if not valid_topic_name(name):
            raise bad_request(f"invalid topic name {name!r}")
        cfg = parse_topic_config(body, name)
        existing = self.topics.get(name)
        if existing is not None:
            if existing.config.type != cfg.type:
                raise TopicsError(
                    409,
                    "topic_exists_incompatible",
                    f'topic "{name}" is a {existing.config.type}; its type cannot change',
                    {
                        "topic": name,
                        "existing_type": existing.config.type,
                        "requested_type": cfg.type,
                    },
                )
            prev = existing.config
            h = self.journal.log(ConfigChanged(existing.topic_id, cfg, existing.head_seq))
            existing.config = cfg

            def done(ok: bool) -> None:
                # Not committed: the previous config returns (unless changed again).
                if not ok and existing.config is cfg:
                    existing.config = prev
                    existing.notify()

            h.add_done_callback(done)
            existing.apply_retention(self.clock.now_ms())
            existing.notify()
            return existing, False
        t = self._new_topic(name, cfg)
        self._register(t)
        return t, True

    def effective_priority(self, t: Topic, now: int) -> int:
        """Manual priority, else 500 * 2^(-idle/30 s) recency boost."""
        cfg = t.config
        base = min(max(cfg.priority or 0, -1000), 1000)
        auto = 0.0
        if cfg.priority is None and cfg.auto_priority and t.last_consumed_ms is not None:
            idle = max(now - t.last_consumed_ms, 0)
            if idle < 300_000:
                auto = 500.0 * 2.0 ** (-idle / 30_000)
        return int(round(base + auto))

    def prepare_read(self, t: Topic, *, consume: bool = True) -> int:
        """Read-path preamble: drain routers into `t`, apply retention, touch clocks."""
        self.drain_into(t)
        now = self.clock.now_ms()
        t.apply_retention(now)
        if consume:
            t.last_read_ms = now
            t.last_consumed_ms = now
        return now

    def topic_state(self, name: str, touch: bool = True) -> dict[str, Any]:
        """`GET /v0/topics/:t` body without `performance`.

        See docs/API.md, "6.2 `GET /v0/topics/:topic`".
        """
        t = self.require(name)
        now = self.prepare_read(t, consume=touch)
        out: dict[str, Any] = {
            "topic": t.name,
            "type": t.config.type,
            "head_seq": t.head_seq,
            "earliest_seq": t.earliest_seq,
            "next_seq": t.head_seq + 1,
            "count": t.live_count,
            "bytes": t.live_bytes,
            "config": t.config.to_wire(),
            "effective_priority": self.effective_priority(t, now),
            "last_write_ts": t.last_write_ms,
            "last_read_ts": t.last_read_ms,
        }
        if t.queue is not None:
            out["queue"] = t.queue.counters(t, now)
        return out

    def list_topics(
        self,
        *,
        prefix: str = "",
        page_size: int = 100,
        cursor: str | None = None,
        touch: bool = False,
        allow: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """`GET /v0/topics` body without `performance` (docs/API.md, "6.3 `GET /v0/topics`")."""
        after = decode_cursor(cursor)
        names = sorted(n for n in self.topics if n.startswith(prefix))
        if after is not None:
            names = [n for n in names if n > after]
        if allow is not None:
            names = [n for n in names if allow(n)]
        page = names[:page_size]
        now = self.clock.now_ms()
        items = []
        for n in page:
            t = self.topics[n]
            self.drain_into(t)
            t.apply_retention(now)
            if touch:
                t.last_consumed_ms = now
            items.append(
                {
                    "topic": n,
                    "head_seq": t.head_seq,
                    "earliest_seq": t.earliest_seq,
                    "count": t.live_count,
                    "bytes": t.live_bytes,
                    "durable": t.config.durable,
                    "effective_priority": self.effective_priority(t, now),
                }
            )
        out: dict[str, Any] = {"topics": items}
        if len(names) > page_size:
            out["next_cursor"] = encode_cursor(page[-1])
        return out

    def delete_topic(self, name: str, if_empty: bool = False) -> dict[str, Any]:
        """`DELETE /v0/topics/:t`: ends the instance and its routers."""
        t = self.topics.get(name)
        if t is None:
            return {"deleted": False, "routers_removed": []}
        if if_empty:
            self.prepare_read(t, consume=False)
            if t.live_count:
                raise TopicsError(
                    409,
                    "topic_not_empty",
                    f'topic "{name}" still holds {t.live_count} records',
                    {"topic": name, "count": t.live_count},
                )
        self.journal.log(TopicDeleted(t.topic_id, name, t.head_seq))
        removed = sorted(self._remove(t))
        return {"topic": name, "deleted": True, "routers_removed": removed}

    # ------------------------------------------------------------ write path

    def parse_write(self, body: Any, header_key: str | None) -> WriteRequest:
        """Validate a write body; raises 400s before any topic lookup."""
        if not isinstance(body, dict):
            raise bad_request("write body must be a JSON object")
        records = prepare_records(body.get("records"), body.get("node"), self.limits)
        key = opt_str(body, "idempotency_key")
        if key is None:
            key = header_key
        if key is not None and len(key.encode()) > MAX_KEY_BYTES:
            raise bad_request(f"idempotency key exceeds {MAX_KEY_BYTES} bytes")
        create = body.get("create")
        if create is not None and not isinstance(create, bool):
            raise bad_request("create must be a boolean")
        has_config = body.get("config") is not None
        if has_config and not isinstance(body["config"], dict):
            raise bad_request("config must be a JSON object")
        bypass = boolean(body, "disable_backpressure", False)
        return WriteRequest(
            records,
            key or None,
            create,
            body.get("config"),
            has_config,
            disable_backpressure=bypass,
        )

    def prepare_write(
        self, name: str, req: WriteRequest, *, min_bytes: int = PREPARE_MIN_BYTES
    ) -> Generator[None, None, None]:
        """Lay out a large write's frames before :meth:`begin_write`, a piece per step.

        A generator: it yields after each piece (about 1 MiB of frames, see
        :func:`~topics.format.frame.layout_batch`) so the caller can let the
        event loop run, and stores the layout in `req.layout`; :meth:`begin_write`
        then only seals it (seqs, ts, checksums) instead of encoding the whole
        batch in one step. It reads nothing but the records and changes no
        engine state, so it may run any time before :meth:`begin_write`, which
        decides everything (a layout it cannot use is ignored). Does nothing
        for a write whose records hold under `min_bytes` bytes (default
        :data:`PREPARE_MIN_BYTES`, 1 MiB: smaller batches are cheaper to encode
        in one go), one that already has a layout, or one :meth:`begin_write`
        would refuse because its topic is missing and may not be created.
        Raises nothing: when a record cannot be encoded (or no buffer can be
        mapped) `req.layout` stays None, and :meth:`begin_write` encodes the
        batch itself, refusing such a record in its turn (`400`).
        """
        if req.layout is not None or batch_bytes(req.records) < min_bytes:
            return
        if name not in self.topics and (
            req.create is False
            or (
                req.create is None
                and req.has_config
                and isinstance(req.config, dict)
                and not req.config.get("auto_create", True)
            )
        ):
            return
        try:
            req.layout = yield from layout_batch(req.records)
        except (FrameError, OSError):
            req.layout = None

    def begin_write(self, name: str, req: WriteRequest) -> PendingWrite | Replay | dict[str, Any]:
        """Resolve, dedupe, admit and stage a write.

        The checks run in the order of docs/API.md, "7.1 `POST /v0/topics/:topic`".

        Returns a replay result dict for an in-window idempotent repeat, a
        :class:`Replay` when a same-key write is still committing, else the staged
        :class:`PendingWrite` (already published when the journal commits
        synchronously). The frames are sealed from `req.layout` when
        :meth:`prepare_write` laid them out, else encoded here. Raises
        400/404/422/429 without changing anything.
        """
        now = self.clock.now_ms()
        t = self.topics.get(name)
        created = False
        if t is None:
            if req.create is False:
                raise not_found_topic(name)
            cfg = parse_topic_config(req.config, name) if req.has_config else TopicConfig()
            if req.create is None and not (
                req.config.get("auto_create", True) if req.has_config else True
            ):
                raise not_found_topic(name)
            t = self._new_topic(name, cfg)
            created = True
        key = req.key
        if key is not None and not created:
            hit = self._dedupe_lookup(t, key, now)
            if hit is not None:
                return hit
            inflight = t.dedupe_pending.get(key)
            if inflight is not None:
                return Replay(inflight)
        if not created:
            self.drain_into(t)
            t.apply_retention(now)
        self.admit(t, req.records)
        pw = t.stage(req.records, now, key, req.layout)
        if created:
            try:
                self._register(t)
            except BaseException:
                t.unstage(pw)
                raise
        pw.created = created
        if key is not None:
            t.dedupe_pending[key] = pw
        pw.waiters.append(lambda: self._after_publish(pw))
        try:
            h = self.journal.log(RecordsAppended(pw))
        except BaseException:
            t.unstage(pw)
            if key is not None:
                t.dedupe_pending.pop(key, None)
            raise
        if h is DONE:  # the common case: acknowledged on enqueue
            t.complete(pw, True)
        else:
            self._commit_when(pw, h)
        return pw

    @staticmethod
    def _commit_when(pw: PendingWrite, h: Handle) -> None:
        """Complete `pw` when its handle completes (now, when it already has)."""
        if h is DONE:  # the common case: acknowledged on enqueue
            pw.topic.complete(pw, True)
        elif h.done:
            Engine._committed(pw, h)
        else:
            h.add_done_callback(lambda ok: Engine._committed(pw, h))

    @staticmethod
    def _committed(pw: PendingWrite, h: Handle) -> None:
        if h.error is not None:
            pw.error = h.error
        pw.fsync_ms = h.fsync_ms
        pw.throttle_ms = h.throttle_ms
        pw.topic.complete(pw, h.ok)

    def admit(self, t: Topic, records: list[NewRecord]) -> None:
        """Admission checks: `discard:"reject"` caps and the byte quota.

        Raises `400 record_too_large` (can never fit), `422 topic_full`, or `429
        throttled` (`max_total_bytes`); changes nothing.
        """
        cfg = t.config
        n = len(records)
        nbytes = batch_bytes(records)
        if cfg.discard == "reject":
            if (cfg.cap_bytes and nbytes > cfg.cap_bytes) or (
                cfg.cap_records and n > cfg.cap_records
            ):
                raise TopicsError(
                    400,
                    "record_too_large",
                    "the batch can never fit within the topic's caps",
                )
            count = t.live_count + t.pending_count
            size = t.live_bytes + t.pending_bytes
            # cap_records is a seq window. After mid-log deletes
            # the live count can be under the cap while the window would still pass
            # the first live seq; refusing that batch too keeps "never ack-then-drop"
            # (a record is never acknowledged and then evicted at once).
            window_floor = t.next_seq - 1 + n - cfg.cap_records
            if (
                cfg.cap_records and (count + n > cfg.cap_records or t.earliest_seq <= window_floor)
            ) or (cfg.cap_bytes and size + nbytes > cfg.cap_bytes):
                raise TopicsError(
                    422,
                    "topic_full",
                    f'topic "{t.name}" is full (discard: reject)',
                    {
                        "topic": t.name,
                        "cap_records": cfg.cap_records,
                        "cap_bytes": cfg.cap_bytes,
                        "head_seq": t.head_seq,
                        "earliest_seq": t.earliest_seq,
                    },
                )
        quota = self.limits.max_total_bytes
        if quota and self.totals.bytes + nbytes > quota:
            raise throttled("max_total_bytes", quota)

    def _dedupe_lookup(self, t: Topic, key: str, now: int) -> dict[str, Any] | None:
        window = t.config.idempotency_window_ms
        if t.dedupe:
            stale = [k for k, e in t.dedupe.items() if now - e.created_ms > window]
            for k in stale:
                del t.dedupe[k]
        e = t.dedupe.get(key)
        if e is None:
            return None
        return {
            "topic": t.name,
            "first_seq": e.seqs[0],
            "last_seq": e.seqs[-1],
            "seqs": list(e.seqs),
            "head_seq": e.head_seq,
            "count": len(e.seqs),
            "created": False,
            "deduped": True,
        }

    def _after_publish(self, pw: PendingWrite) -> None:
        t = pw.topic
        if pw.idempotency_key is not None:
            t.dedupe_pending.pop(pw.idempotency_key, None)
            if pw.ok and t.alive:
                t.dedupe[pw.idempotency_key] = DedupeEntry(
                    list(range(pw.first_seq, pw.last_seq + 1)), pw.head_after, pw.ts
                )
        if pw.ok and t.alive:
            # discard:"old" eviction after publish.
            t.apply_retention(self.clock.now_ms())
            self.on_published(t)

    def write_result(self, pw: PendingWrite, return_seqs: bool = True) -> dict[str, Any]:
        """The ack body for a published batch; `500 internal` if its commit failed
        (or the journal's own error, e.g. `507 insufficient_storage`)."""
        if not pw.ok:
            if pw.error is not None:
                raise pw.error
            raise TopicsError(500, "internal", "the write could not be committed to the log")
        out: dict[str, Any] = {
            "topic": pw.topic.name,
            "first_seq": pw.first_seq,
            "last_seq": pw.last_seq,
        }
        if return_seqs:
            out["seqs"] = list(range(pw.first_seq, pw.last_seq + 1))
        out["head_seq"] = pw.head_after
        out["count"] = len(pw.records)
        out["created"] = pw.created
        out["deduped"] = False
        return out

    def replay_result(self, pw: PendingWrite) -> dict[str, Any]:
        """A same-key writer that waited on `pw` gets the dedupe replay of it."""
        if not pw.ok:
            if pw.error is not None:
                raise pw.error
            raise TopicsError(500, "internal", "the write could not be committed to the log")
        return {
            "topic": pw.topic.name,
            "first_seq": pw.first_seq,
            "last_seq": pw.last_seq,
            "seqs": list(range(pw.first_seq, pw.last_seq + 1)),
            "head_seq": pw.head_after,
            "count": len(pw.records),
            "created": False,
            "deduped": True,
        }

    def append_derived(self, t: Topic, records: list[NewRecord]) -> PendingWrite:
        """Append copies that are derived, not logged (router forwarding)."""
        pw = t.stage(records, self.clock.now_ms(), None)
        t.complete(pw, True)
        t.apply_retention(self.clock.now_ms())
        self.on_published(t)
        return pw

    def append_logged(self, t: Topic, records: list[NewRecord]) -> PendingWrite:
        """An internal durable append (dead-letter copies) through the normal path."""
        pw = t.stage(records, self.clock.now_ms(), None)
        pw.waiters.append(lambda: self._after_publish(pw))
        try:
            h = self.journal.log(RecordsAppended(pw))
        except BaseException:
            t.unstage(pw)
            raise
        self._commit_when(pw, h)
        return pw

    # ------------------------------------------------------------- read path

    def parse_diff(self, body: Any) -> DiffParams:
        """Validate a diff body; clamps rather than rejects oversize values."""
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise bad_request("diff body must be a JSON object")
        return DiffParams(
            from_seq=u64(body, "from_seq", 0),
            limit=norm_limit(u32(body, "limit", 0), self.limits.max_limit),
            nodes=node_set(body),
            include_tags=boolean(body, "include_tags", False),
            include_meta=boolean(body, "include_meta", True),
            wait_ms=min(u32(body, "wait_ms", 0), MAX_WAIT_MS),
            budget=norm_budget(u64(body, "max_batch_bytes", 0)),
        )

    def diff(self, name: str, p: DiffParams) -> tuple[Topic, ReadResult]:
        """One diff pass on `name`; `404` when absent."""
        t = self.require(name)
        now = self.prepare_read(t)
        return t, t.read_opts(p.from_seq, p, now=now)

    # ----------------------------------------------------------- record delete

    def begin_delete(self, name: str, body: Any) -> PendingDelete:
        """Start `POST /v0/topics/:t/delete`: permanent, silent, point-in-time.

        The route is described in docs/API.md, "10. Deleting records". Validates,
        fixes the point-in-time bound (head + 1 now) and logs the Delete frame; the
        delete is applied when the frame commits (WAL-first: logged before applied),
        at once with a journal that commits synchronously. Raises 400
        (body), 404 (topic), or the journal's refusal (429/500); nothing changes then.
        """
        if not isinstance(body, dict):
            raise bad_request("delete body must be a JSON object")
        before = opt_u64(body, "before_seq")
        pred = predicate(body["match"]) if body.get("match") is not None else None
        if before is None and pred is None:
            raise bad_request("delete needs before_seq and/or match")
        t = self.require(name)
        self.drain_into(t)
        t.apply_retention(self.clock.now_ms())
        bound = t.head_seq + 1
        op = PendingDelete(t)
        ev = RecordsDeleted(t.topic_id, before, pred, bound, t.head_seq)

        def on_commit(ok: bool) -> None:
            op.ok = ok
            if ok and t.alive and self.topics.get(t.name) is t:
                op.deleted = self.apply(ev)
            op.finish()

        self.journal.log(ev).add_done_callback(on_commit)
        return op

    def delete_result(self, op: PendingDelete) -> dict[str, Any]:
        """The response body of a committed delete; `500 internal` when its frame failed."""
        if not op.ok:
            raise TopicsError(500, "internal", "the delete could not be written to the log")
        t = op.topic
        return {
            "topic": t.name,
            "deleted": op.deleted,
            "earliest_seq": t.earliest_seq,
            "head_seq": t.head_seq,
            "count": t.live_count,
            "bytes": t.live_bytes,
        }

    def delete_records(self, name: str, body: Any) -> dict[str, Any]:
        """:meth:`begin_delete` then :meth:`delete_result`, for journals that commit at once.

        Raises RuntimeError when the delete is still committing (use begin_delete
        and wait for it).
        """
        op = self.begin_delete(name, body)
        if not op.done:
            raise RuntimeError("the delete is still committing; use begin_delete")
        return self.delete_result(op)

    def apply_delete(self, t: Topic, before: int | None, pred: Predicate | None, bound: int) -> int:
        """Apply a (logged) record delete with its point-in-time `bound`.

        `match` victims are live tagged seqs below `min(before_seq, bound)`; a
        `before_seq`-only delete removes every live seq below it and raises
        `delete_below`. Returns how many records were deleted.
        """
        b = bound if before is None else min(before, bound)
        if pred is not None:
            kind, value = pred
            victims = t.tags.eq(value, b) if kind == "eq" else t.tags.prefix(value, b)
            deleted = t.delete_seqs(victims)
        else:
            deleted = t.delete_range(b)
            t.delete_below = max(t.delete_below, b)
        if deleted:
            t.notify()
        return deleted

    # ------------------------------------------------------------ log events

    def apply(self, event: Event) -> int:
        """Apply one log event (:mod:`topics.engine.events`) to this engine.

        What recovery does with every event it decodes from a snapshot and the
        WAL, and what a recorded event stream replayed into a fresh engine does
        (docs/ARCHITECTURE.md, "The event log"). Nothing is logged, no cap or
        quota is checked and no retention runs; an event about a topic instance
        that is not live here (never created, or deleted since) changes nothing.
        Returns how many records the event published or deleted (0 for the other
        kinds). Raises KeyError for a type that is not an event; FrameCorrupt or
        OSError when a `match` delete must read tags back from a source.
        """
        kind = type(event)
        on_live = self._APPLY_LIVE.get(kind)
        if on_live is None:
            return self._APPLY[kind](self, event)
        t = self._by_id.get(cast(TopicEvent, event).topic_id)
        return 0 if t is None else on_live(self, t, event)

    def apply_retention_all(self) -> None:
        """Advance every topic's TTL and cap floors to the clock's now (after a replay)."""
        now = self.clock.now_ms()
        for t in self.topics.values():
            t.apply_retention(now)

    def _apply_created(self, ev: TopicCreated) -> int:
        if ev.topic_id in self._by_id:
            return 0
        old = self.topics.get(ev.name)
        if old is not None:  # an older instance whose delete was not replayed first
            self._remove(old)
        t = self._make_topic(ev.name, ev.topic_id, ev.config, ev.created_ms)
        t.epoch = ev.epoch
        self._install(t)
        return 0

    def _apply_restored(self, ev: TopicRestored) -> int:
        old = self.topics.get(ev.name)
        if ev.topic_id in self._by_id or old is not None:
            return 0
        t = self._make_topic(ev.name, ev.topic_id, ev.config, ev.created_ms)
        t.epoch = ev.epoch
        t.restore_head(ev.head_seq)
        t.last_ts = ev.last_ts
        t.l_cap, t.l_ttl, t.l_trim = ev.l_cap, ev.l_ttl, ev.l_trim
        t.delete_below = ev.delete_below
        t.lost = list(ev.lost)
        t.last_write_ms = ev.last_write_ms
        t.last_read_ms = ev.last_read_ms
        self._install(t)
        if ev.queue is not None and self.queues is not None and ev.config.is_queue:
            self.queues.state(t).restore(ev.queue)
        return 0

    # Events about one live topic instance: `t` is the instance `ev.topic_id` names.

    def _apply_deleted(self, t: Topic, ev: TopicDeleted) -> int:
        self._remove(t)
        return 0

    def _apply_config(self, t: Topic, ev: ConfigChanged) -> int:
        t.config = ev.config
        return 0

    def _apply_appended(self, t: Topic, ev: RecordsAppended) -> int:
        pw = ev.write
        return t.restore_write(pw.first_seq, pw.ts, pw.records, pw.frames, pw.sizes)

    def _apply_replayed(self, t: Topic, ev: RecordsReplayed) -> int:
        return t.replay_frames(ev.buf, ev.frames)

    def _apply_records_deleted(self, t: Topic, ev: RecordsDeleted) -> int:
        return self.apply_delete(t, ev.before_seq, ev.predicate, ev.bound)

    def _apply_seqs_deleted(self, t: Topic, ev: SeqsDeleted) -> int:
        return t.delete_seqs(list(ev.seqs))

    def _apply_floors(self, t: Topic, ev: FloorsAdvanced) -> int:
        t.raise_floors(ev.l_cap, ev.l_ttl, ev.l_trim)
        return 0

    def _apply_lease(self, t: Topic, ev: LeaseChanged) -> int:
        if self.queues is not None and t.config.is_queue:
            self.queues.state(t).replay(
                ev.kind, ev.seq, ev.node, ev.lease_id, ev.deadline_ms, ev.deliveries
            )
        return 0

    def _apply_head(self, t: Topic, ev: HeadReserved) -> int:
        if t.config.durability in ("disk", "ephemeral"):
            t.reserve_head(ev.head_seq, t.last_ts)
        return 0

    def _apply_lost(self, t: Topic, ev: RecordsLost) -> int:
        t.mark_lost(ev.first_seq, ev.last_seq, ev.ts)
        return 0

    def _apply_segments(self, t: Topic, ev: SegmentsAttached) -> int:
        t.attach_segments(ev.base_seq, ev.rows, dict(ev.sources))
        return len(ev.rows)

    _APPLY_LIVE: dict[type, Callable[[Engine, Topic, Any], int]] = {
        TopicDeleted: _apply_deleted,
        ConfigChanged: _apply_config,
        RecordsAppended: _apply_appended,
        RecordsReplayed: _apply_replayed,
        RecordsDeleted: _apply_records_deleted,
        SeqsDeleted: _apply_seqs_deleted,
        FloorsAdvanced: _apply_floors,
        LeaseChanged: _apply_lease,
        HeadReserved: _apply_head,
        RecordsLost: _apply_lost,
        SegmentsAttached: _apply_segments,
    }

    # The other events: a topic instance coming into being, routers, topic ids.

    def _apply_router_put(self, ev: RouterPut) -> int:
        src = self.topics.get(ev.router.source)
        dst = self.topics.get(ev.router.dest)
        if (
            self.routers is not None
            and src is not None
            and dst is not None
            and src.topic_id == ev.source_id
            and dst.topic_id == ev.dest_id
        ):
            self.routers.restore(ev)
        return 0

    def _apply_router_deleted(self, ev: RouterDeleted) -> int:
        if self.routers is not None:
            self.routers.forget(ev.name)
        return 0

    def _apply_ids(self, ev: TopicIdsUsed) -> int:
        self.next_topic_id = max(self.next_topic_id, ev.next_topic_id)
        return 0

    _APPLY: dict[type, Callable[[Engine, Any], int]] = {
        TopicCreated: _apply_created,
        TopicRestored: _apply_restored,
        RouterPut: _apply_router_put,
        RouterDeleted: _apply_router_deleted,
        TopicIdsUsed: _apply_ids,
    }

    # Kept for callers written against the earlier private name.
    _admit = admit
