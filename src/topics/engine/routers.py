"""Routers: asynchronous, derived forwarding from one topic into another.

Sans-I/O and synchronous like the rest of the engine (docs/API.md, "11. Routers").
A :class:`RouterSet` owns every router definition of one engine and installs
itself on it:

* ``engine.drain_into`` - read-path catch-up: before a topic is read, every
  router feeding it (and, transitively, the routers feeding those sources) is
  advanced until it makes no progress, so a read right after a source write
  sees the forwarded copy;
* ``engine.on_published`` (chained) - marks a topic dirty when it is a router
  source, so the shell's periodic :meth:`RouterSet.drain_dirty` forwards it;
* ``engine.on_topic_deleted`` - removes every router touching the topic.

One forwarding pass (:meth:`RouterSet.advance`) does, in order: source-trim holes,
per-slot skip rules, copy building, exactly-once keys, size validation and
`discard:"reject"` back-pressure, then a single derived append into the dest.
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from topics.engine.core import Engine, decode_cursor, encode_cursor
from topics.engine.events import RouterDef, RouterDeleted, RouterPut
from topics.engine.frames import FrameSource
from topics.engine.names import valid_router_name, valid_topic_name
from topics.engine.params import Predicate, boolean, predicate, predicate_matches, predicate_wire
from topics.engine.records import NewRecord, loads
from topics.engine.topic import Topic
from topics.errors import TopicsError, bad_request, not_found_topic, throttled

__all__ = [
    "Router",
    "RouterSet",
    "GUARANTEES",
    "MAX_HOPS",
    "PASS_MAX_SEQS",
    "router_key",
    "router_meta",
    "router_event",
]

#: Valid `guarantee` values (docs/API.md, "11. Routers"); the first is the default.
GUARANTEES = ("at_least_once", "exactly_once")
#: Records whose hop count reached this are never forwarded again.
MAX_HOPS = 8
#: At most this many source seqs are examined by one forwarding pass.
PASS_MAX_SEQS = 1024

ROUTER_META_KEY = "_topics_router"
ORIGINAL_META_KEY = "_topics_original_meta"

Allow = Callable[[str], bool]


@dataclass(slots=True, eq=False)
class Router:
    """One router: its definition (`spec`) plus its forwarding state.

    `cursor` is the last source seq consumed; `forwarded_total` counts source
    seqs delivered to the dest (copies, trim holes and exactly-once duplicates);
    `dest_base` is the dest `head_seq` when the router was created; `order` is
    the creation order within the engine.
    """

    spec: RouterDef
    cursor: int = 0
    forwarded_total: int = 0
    dest_base: int = 0
    order: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def source(self) -> str:
        return self.spec.source

    @property
    def dest(self) -> str:
        return self.spec.dest

    def to_wire(self) -> dict[str, Any]:
        """The router object (docs/API.md, "11. Routers"), without `created` / `forwarded_total`."""
        d = self.spec
        out = asdict(d)
        out["filter"] = predicate_wire(d.filter) if d.filter is not None else None
        return {"router": out.pop("name"), **out}


def router_key(name: str, source: Topic, seq: int) -> str:
    """The exactly-once idempotency key of source `seq` (docs/API.md, "11. Routers")."""
    return f"router:{name}:{source.topic_id}:{source.epoch}:{seq}"


def router_meta(meta: bytes | None, info: dict[str, Any], max_keys: int = 64) -> bytes:
    """A copy's meta with `_topics_router` added (docs/API.md, "11. Routers").

    Absent meta becomes `{"_topics_router": info}`; an object gains the key (or
    has it replaced); a non-object, or an object already holding `max_keys` keys
    without `_topics_router`, is wrapped as `_topics_original_meta`.
    """
    if meta is None:
        return orjson.dumps({ROUTER_META_KEY: info})
    original = loads(meta)
    if isinstance(original, dict) and (ROUTER_META_KEY in original or len(original) < max_keys):
        original[ROUTER_META_KEY] = info
        return orjson.dumps(original)
    return orjson.dumps({ROUTER_META_KEY: info, ORIGINAL_META_KEY: original})


# Stands in for a topic name the caller's key may not see (in a router_cycle detail).
HIDDEN_NAME = "<hidden>"


def _forbidden(name: str) -> TopicsError:
    return TopicsError(
        403, "forbidden", f'name "{name}" is not allowed for this key', {"topic": name}
    )


def _not_found_router(name: str) -> TopicsError:
    return TopicsError(404, "router_not_found", f'router "{name}" does not exist', {"router": name})


def _parse_spec(name: str, body: Any) -> tuple[RouterDef, bool]:
    """Body type checks of `PUT /v0/routers/:r`; every failure is `400 invalid_request`.

    Returns the definition and the body's `create_dest`.

    See docs/API.md, "11.1 `PUT /v0/routers/:router`".
    """
    if not isinstance(body, dict):
        raise bad_request("router body must be a JSON object")
    names: builtins.list[str] = []
    for key in ("source", "dest"):
        v = body.get(key)
        if v is None:
            raise bad_request(f"{key} is required")
        if not isinstance(v, str):
            raise bad_request(f"{key} must be a string")
        names.append(v)
    raw_filter = body.get("filter")
    filt: Predicate | None = None
    if raw_filter is not None:
        try:
            filt = predicate(raw_filter)
        except TopicsError as exc:
            raise bad_request(f"invalid filter: {exc.message}") from exc
    guarantee = body.get("guarantee")
    if guarantee is None:
        guarantee = GUARANTEES[0]
    if not isinstance(guarantee, str) or guarantee not in GUARANTEES:
        raise bad_request('guarantee must be "at_least_once" or "exactly_once"')
    spec = RouterDef(
        name=name,
        source=names[0],
        dest=names[1],
        preserve_node=boolean(body, "preserve_node", True),
        preserve_tag=boolean(body, "preserve_tag", True),
        filter=filt,
        allow_cycle=boolean(body, "allow_cycle", False),
        guarantee=guarantee,
    )
    return spec, boolean(body, "create_dest", True)


def _find_path(adj: dict[str, builtins.list[str]], start: str, goal: str) -> list[str] | None:
    """A DFS path `start ... goal` over `adj` (iterative), or None."""
    path = [start]
    visited = {start}
    stack = [iter(adj.get(start, ()))]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
        if nxt == goal:
            return [*path, nxt]
        if nxt in visited:
            continue
        visited.add(nxt)
        path.append(nxt)
        stack.append(iter(adj.get(nxt, ())))
    return None


class RouterSet:
    """Every router of one engine: the control plane and the forwarder."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._routers: dict[str, Router] = {}
        self._by_source: dict[str, builtins.list[Router]] = {}
        self._by_dest: dict[str, builtins.list[Router]] = {}
        self._dirty: set[str] = set()
        # How forwarding is started after a publication: the owner of the event
        # loop sets `schedule` (e.g. `loop.call_soon`), so a record published by
        # any shell (HTTP, WebSocket, Kafka) reaches its router's dest at once,
        # off the writer's ack path. Unset (tests, tools): callers drain.
        self.schedule: Callable[[Callable[[], object]], object] | None = None
        self._drain_scheduled = False
        self._next_order = 1
        # Per dest topic name: (dest seq, key) in append order, to prune
        # `Topic.router_keys` once the keyed copies leave the dest.
        self._key_fifo: dict[str, deque[tuple[int, str]]] = {}
        prev = engine.on_published

        def on_published(t: Topic) -> None:
            prev(t)
            if t.name in self._by_source:
                self._dirty.add(t.name)
                if self.schedule is not None and not self._drain_scheduled:
                    self._drain_scheduled = True
                    self.schedule(self._scheduled_drain)

        engine.on_published = on_published
        engine.drain_into = self.drain_into
        engine.on_topic_deleted = self.remove_touching
        engine.routers = self

    # ----------------------------------------------------------- registry

    def __len__(self) -> int:
        return len(self._routers)

    def __contains__(self, name: object) -> bool:
        return name in self._routers

    def by_name(self, name: str) -> Router | None:
        return self._routers.get(name)

    def names(self) -> builtins.list[str]:
        """All router names, sorted."""
        return sorted(self._routers)

    def routers(self) -> builtins.list[Router]:
        """All routers in creation order."""
        return list(self._routers.values())

    def feeding(self, dest: str) -> builtins.list[Router]:
        """Routers whose dest is `dest`."""
        return list(self._by_dest.get(dest, ()))

    def _index(self, r: Router) -> None:
        self._routers[r.name] = r
        self._by_source.setdefault(r.source, []).append(r)
        self._by_dest.setdefault(r.dest, []).append(r)

    def _unindex(self, r: Router) -> None:
        self._routers.pop(r.name, None)
        for m, k in ((self._by_source, r.source), (self._by_dest, r.dest)):
            lst = m.get(k)
            if lst is None:
                continue
            lst[:] = [x for x in lst if x is not r]
            if not lst:
                del m[k]
        if r.source not in self._by_source:
            self._dirty.discard(r.source)

    def restore(self, ev: RouterPut) -> Router:
        """Reinstall a router from its logged state (recovery; no checks, no logging)."""
        r = Router(
            ev.router,
            cursor=ev.cursor,
            forwarded_total=ev.forwarded_total,
            dest_base=ev.dest_base,
            order=self._next_order,
        )
        self._next_order += 1
        old = self._routers.get(r.name)
        if old is not None:
            self._unindex(old)
        self._index(r)
        self._dirty.add(r.source)
        return r

    def forget(self, name: str) -> bool:
        """Remove router `name` without logging (a replayed delete); False if absent."""
        r = self._routers.get(name)
        if r is None:
            return False
        self._unindex(r)
        return True

    def _log_put(self, r: Router) -> None:
        """Log a router definition change (raises the journal's refusal)."""
        eng = self.engine
        self.engine.journal.log(router_event(r, lambda n: _live_id(eng, n)))

    # ------------------------------------------------------- control plane

    def put(self, name: str, body: Any, allow: Allow | None = None) -> tuple[dict[str, Any], bool]:
        """`PUT /v0/routers/:name`; returns (router object, created).

        The checks run in the order of docs/API.md, "11.1 `PUT /v0/routers/:router`":
        body types (400), body source/dest allowlist (403), router name (400), source == dest (400),
        topic names (400), `create_dest:false` with an absent dest (404), fan-in
        (409), re-point (409), router cap (429), cycle (409), auto-create of
        missing topics (rolled back on failure), then create or update.
        """
        spec, create_dest = _parse_spec(name, body)
        if allow is not None:
            for t in (spec.source, spec.dest):
                if not allow(t):
                    raise _forbidden(t)
        if not valid_router_name(name):
            raise bad_request(f"invalid router name {name!r}")
        if spec.source == spec.dest:
            raise bad_request("router source and dest must differ")
        for t in (spec.source, spec.dest):
            if not valid_topic_name(t):
                raise bad_request(f"invalid topic name {t!r}")
        eng = self.engine
        if not create_dest and spec.dest not in eng.topics:
            raise not_found_topic(spec.dest)
        for other in self._by_dest.get(spec.dest, ()):
            if other.name != name and other.source != spec.source:
                msg = f'topic "{spec.dest}" is already the dest of router "{other.name}" '
                msg += f'from "{other.source}"'
                if allow is not None and not (allow(other.name) and allow(other.source)):
                    # Do not name another tenant's router or topic.
                    msg = f'topic "{spec.dest}" is already the dest of another router'
                raise TopicsError(
                    409,
                    "topic_exists_incompatible",
                    msg,
                    {"topic": spec.dest, "reason": "router_dest_fan_in"},
                )
        existing = self._routers.get(name)
        if existing is not None and (existing.source != spec.source or existing.dest != spec.dest):
            raise TopicsError(
                409,
                "topic_exists_incompatible",
                f'router "{name}" routes {existing.source} -> {existing.dest}; '
                "it cannot be re-pointed",
                {
                    "router": name,
                    "reason": "router_repoint_forbidden",
                    "existing_source": existing.source,
                    "existing_dest": existing.dest,
                },
            )
        cap = eng.limits.max_routers
        if existing is None and cap and len(self._routers) >= cap:
            raise throttled("max_routers", cap)
        if not spec.allow_cycle:
            cycle = self._cycle(name, spec.source, spec.dest)
            if cycle is not None:
                if allow is not None:
                    # Topics the key may not see stay anonymous (no valid name has `<`).
                    cycle = [n if allow(n) else HIDDEN_NAME for n in cycle]
                raise TopicsError(
                    409,
                    "router_cycle",
                    "router would close a cycle: " + " -> ".join(cycle),
                    {"cycle": cycle},
                )
        if existing is not None:
            # Update in place: cursor, totals and dest_base are kept.
            self._log_put(
                Router(spec, existing.cursor, existing.forwarded_total, existing.dest_base)
            )
            existing.spec = spec
            return self._put_result(existing, False), False
        src, dst = self._ensure_topics(spec.source, spec.dest)
        # No backfill: forwarding starts after the source head at creation.
        r = Router(
            spec,
            cursor=src.head_seq,
            dest_base=dst.head_seq,
            order=self._next_order,
        )
        self._log_put(r)
        self._next_order += 1
        self._index(r)
        return self._put_result(r, True), True

    @staticmethod
    def _put_result(r: Router, created: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"router": r.name, "created": created}
        out.update(r.to_wire())
        return out

    def _ensure_topics(self, source: str, dest: str) -> tuple[Topic, Topic]:
        """Get or auto-create both topics; all-or-nothing (topic cap => 429, nothing created)."""
        eng = self.engine
        missing = [n for n in (source, dest) if n not in eng.topics]
        cap = eng.limits.max_topics
        if missing and cap and len(eng.topics) + len(missing) > cap:
            raise throttled("max_topics", cap)
        created: builtins.list[str] = []
        try:
            src, c1 = eng.ensure_topic(source)
            if c1:
                created.append(source)
            dst, c2 = eng.ensure_topic(dest)
            if c2:
                created.append(dest)
        except Exception:
            for n in reversed(created):
                eng.delete_topic(n)
            raise
        return src, dst

    def _cycle(self, name: str, source: str, dest: str) -> builtins.list[str] | None:
        """`[source, dest, ..., source]` if `dest` reaches `source` over the other routers."""
        adj: dict[str, builtins.list[str]] = {}
        for r in self._routers.values():
            if r.name == name:
                continue
            nbrs = adj.setdefault(r.source, [])
            if r.dest not in nbrs:
                nbrs.append(r.dest)
        path = _find_path(adj, dest, source)
        return None if path is None else [source, *path]

    def get(self, name: str) -> dict[str, Any]:
        """`GET /v0/routers/:name`: drive the router to its source head first."""
        r = self._routers.get(name)
        if r is None:
            raise _not_found_router(name)
        while self.advance(r) > 0:
            pass
        out = r.to_wire()
        out["forwarded_total"] = r.forwarded_total
        return out

    def list(
        self,
        prefix: str = "",
        source: str | None = None,
        dest: str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
        allow: Allow | None = None,
    ) -> dict[str, Any]:
        """`GET /v0/routers` without `performance`.

        Sorted by router name; `allow` (the key's name allowlist) must accept the
        router name, its source and its dest; it filters before paging.
        """
        after = decode_cursor(cursor)
        page_size = min(max(page_size, 1), 1000)
        rs = sorted(
            (
                r
                for r in self._routers.values()
                if r.name.startswith(prefix)
                and (source is None or r.source == source)
                and (dest is None or r.dest == dest)
                and (after is None or r.name > after)
            ),
            key=lambda r: r.name,
        )
        if allow is not None:
            rs = [r for r in rs if allow(r.name) and allow(r.source) and allow(r.dest)]
        page = rs[:page_size]
        out: dict[str, Any] = {
            "routers": [
                {
                    "router": r.name,
                    "source": r.source,
                    "dest": r.dest,
                    "guarantee": r.spec.guarantee,
                    "forwarded_total": r.forwarded_total,
                }
                for r in page
            ]
        }
        if len(rs) > page_size:
            out["next_cursor"] = encode_cursor(page[-1].name)
        return out

    def delete(self, name: str) -> dict[str, Any]:
        """`DELETE /v0/routers/:name`: forwarding stops at once; copies stay."""
        r = self._routers.get(name)
        if r is None:
            return {"router": name, "deleted": False}
        self.engine.journal.log(RouterDeleted(r.name))
        self._unindex(r)
        return {"router": name, "deleted": True}

    def remove_touching(self, t: Topic) -> builtins.list[str]:
        """Drop every router whose source or dest is `t` (topic delete); their names."""
        victims = [r for r in self._routers.values() if t.name in (r.source, r.dest)]
        for r in victims:
            self._unindex(r)
        self._dirty.discard(t.name)
        self._key_fifo.pop(t.name, None)
        return sorted(r.name for r in victims)

    # ------------------------------------------------------------ forwarding

    def advance(self, r: Router) -> int:
        """One forwarding pass; returns the source seqs consumed."""
        if self._routers.get(r.name) is not r:
            return 0
        eng = self.engine
        src = eng.topics.get(r.source)
        dst = eng.topics.get(r.dest)
        if src is None or dst is None:
            return 0
        now = eng.clock.now_ms()
        try:
            src.apply_retention(now)
        except TopicsError:
            return 0  # durable hardening failed: defer
        head = src.head_seq
        if r.cursor >= head:
            return 0
        consumed = 0
        floor = src.evict_floor
        if floor > r.cursor + 1:
            # The source lost records before we forwarded them: source_trim holes.
            if dst.pending:
                return 0  # holes cannot overtake staged dest writes; retry later
            n = floor - 1 - r.cursor
            self._trim(dst, n, now)
            r.cursor = floor - 1
            r.forwarded_total += n
            consumed += n
        try:
            dst.apply_retention(now)
        except TopicsError:
            if consumed:
                dst.notify()
            return consumed
        lim = eng.limits
        cfg = dst.config
        reject = cfg.discard == "reject"
        ttl = src.config.ttl_ms
        d = r.spec
        filt = d.filter
        exactly_once = d.exactly_once
        copies: builtins.list[NewRecord] = []
        keys: builtins.list[str | None] = []
        queued_bytes = 0
        forwarded = 0
        last = r.cursor
        end = min(head, r.cursor + PASS_MAX_SEQS)
        for seq in range(r.cursor + 1, end + 1):
            rec = src.get_record(seq)
            if rec is None:
                last = seq  # missing or deleted
                continue
            ts, hops, pl = rec
            if (ttl > 0 and now - ts > ttl) or hops >= MAX_HOPS:
                last = seq  # expired, or loop breaker
                continue
            if filt is not None and not predicate_matches(filt, pl.tag):
                last = seq
                continue
            meta = pl.meta
            key: str | None = None
            if exactly_once:
                key = router_key(r.name, src, seq)
                dseq = dst.router_keys.get(key)
                if dseq is not None:
                    if dseq > dst.head_seq or dst.slot_live(dseq):
                        last = seq  # already forwarded and still retained
                        forwarded += 1
                        continue
                    del dst.router_keys[key]
                info = {
                    "idempotency_key": key,
                    "router": r.name,
                    "source_topic": src.name,
                    "source_topic_id": src.topic_id,
                    "source_epoch": src.epoch,
                    "source_seq": seq,
                }
                meta = router_meta(meta, info, lim.max_meta_keys)
            mlen = len(meta) if meta is not None else 0
            nbytes = len(pl.data) + mlen
            if nbytes > lim.max_record_bytes or mlen > lim.max_meta_bytes:
                if exactly_once:
                    break
                last = seq  # at_least_once: dropped
                continue
            if reject and (
                (
                    cfg.cap_records
                    and dst.live_count + dst.pending_count + len(copies) + 1 > cfg.cap_records
                )
                or (
                    cfg.cap_bytes
                    and dst.live_bytes + dst.pending_bytes + queued_bytes + nbytes > cfg.cap_bytes
                )
            ):
                break  # back-pressure: the cursor stays before this seq
            copies.append(
                NewRecord(
                    pl.data,
                    meta,
                    pl.node if d.preserve_node else None,
                    pl.tag if d.preserve_tag else None,
                    nbytes,
                    hops + 1,
                )
            )
            keys.append(key)
            queued_bytes += nbytes
            forwarded += 1
            last = seq
        if copies:
            pw = eng.append_derived(dst, copies)
            fifo: deque[tuple[int, str]] | None = None
            for i, k in enumerate(keys):
                if k is not None:
                    dseq = pw.first_seq + i
                    dst.router_keys[k] = dseq
                    if fifo is None:
                        fifo = self._key_fifo.setdefault(dst.name, deque())
                    fifo.append((dseq, k))
        elif consumed:
            # Only trim holes reached the dest: wake its readers, and forward the
            # holes onwards when the dest is itself a router source.
            dst.notify()
            if dst.name in self._by_source:
                self._dirty.add(dst.name)
        self._prune_keys(dst)
        consumed += last - r.cursor
        r.cursor = last
        r.forwarded_total += forwarded
        return consumed

    def _trim(self, dst: Topic, n: int, now: int) -> None:
        """Append `n` deleted holes to `dst` and raise its `L_trim` over them.

        `L_trim` is a floor: every dest seq up to the last hole becomes
        involuntary loss (readers crossing it get a `source_trim` tombstone),
        so the live slots below it are evicted like a cap eviction would.
        """
        dst.source_trim(n, now)

    def _prune_keys(self, dst: Topic) -> None:
        """Forget exactly-once keys whose copies fell below the dest's earliest seq."""
        fifo = self._key_fifo.get(dst.name)
        if not fifo:
            return
        floor = dst.earliest_seq
        keys = dst.router_keys
        while fifo and fifo[0][0] < floor:
            dseq, k = fifo.popleft()
            if keys.get(k) == dseq:
                del keys[k]
        if not fifo:
            del self._key_fifo[dst.name]

    def _run(self, r: Router) -> int:
        """Advance `r` until it makes no progress; total seqs consumed."""
        total = 0
        while True:
            n = self.advance(r)
            if n <= 0:
                return total
            total += n

    def _pending(self, r: Router) -> bool:
        src = self.engine.topics.get(r.source)
        return src is not None and r.cursor < src.head_seq

    def drain_into(self, t: Topic) -> None:
        """Read-path catch-up for a read of `t`.

        Every router whose dest is `t` runs until it makes no progress; the routers
        feeding their sources run first (upstream before downstream), so a write
        is visible through a chain of routers.
        """
        if t.name not in self._by_dest:
            return
        for name in self._upstream_order(t.name):
            for r in list(self._by_dest.get(name, ())):
                self._run(r)

    def _upstream_order(self, dest: str) -> builtins.list[str]:
        """Topics feeding `dest` (transitively) in DFS post-order: upstream first, `dest` last."""
        order: builtins.list[str] = []
        seen = {dest}
        stack = [(dest, self._sources_of(dest))]
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                order.append(node)
                continue
            nxt = todo.pop()
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, self._sources_of(nxt)))
        return order

    def _sources_of(self, dest: str) -> builtins.list[str]:
        """Distinct sources of the routers into `dest`, reversed (popped first-created first)."""
        srcs = list(dict.fromkeys(r.source for r in self._by_dest.get(dest, ())))
        srcs.reverse()
        return srcs

    def dirty_sources(self) -> builtins.list[Topic]:
        """The live source topics with records their routers have not forwarded yet."""
        tops = self.engine.topics
        return [t for n in self._dirty if (t := tops.get(n)) is not None]

    def _scheduled_drain(self) -> None:
        self._drain_scheduled = False
        self.drain_dirty()

    def pending_spans(self) -> builtins.list[tuple[FrameSource, int, int]]:
        """Segment spans the next forwarding pass of the dirty sources would read.

        Warmed up off the loop before :meth:`drain_dirty` reads them in place
        (docs/ARCHITECTURE.md, "The read path"). No I/O.
        """
        out: builtins.list[tuple[FrameSource, int, int]] = []
        for name in self._dirty:
            src = self.engine.topics.get(name)
            if src is None:
                continue
            for r in self._by_source.get(name, ()):
                live = src.live_seqs(r.cursor + 1, r.cursor + PASS_MAX_SEQS)
                out += src.blocking_spans(live)
        return out

    def drain_dirty(self) -> bool:
        """Forward from every dirty source until nothing progresses; True on any progress.

        Sources whose routers are still behind (a `discard:"reject"` dest pushing
        back) stay dirty, so the next call retries them.
        """
        progress = False
        stalled: set[str] = set()
        while self._dirty:
            batch = sorted(self._dirty)
            self._dirty.clear()
            moved = False
            for name in batch:
                for r in list(self._by_source.get(name, ())):
                    if self._run(r):
                        moved = True
                    if self._pending(r):
                        stalled.add(name)
            progress = progress or moved
            if not moved:
                break
        self._dirty |= {n for n in stalled if n in self._by_source}
        return progress

    def drain_all(self) -> int:
        """Run every router until the whole set makes no progress (graceful shutdown)."""
        total = 0
        while True:
            moved = 0
            for r in list(self._routers.values()):
                moved += self._run(r)
            total += moved
            if not moved:
                break
        self._dirty = {r.source for r in self._routers.values() if self._pending(r)}
        return total


def _live_id(eng: Engine, name: str) -> int:
    t = eng.topics.get(name)
    return t.topic_id if t is not None else 0


def router_event(r: Router, topic_id: Callable[[str], int]) -> RouterPut:
    """Everything needed to restore a router after a restart, as an event.

    `topic_id(name)` gives the live instance id of a topic (0: none), so
    recovery can drop a router whose source or dest instance was deleted later.
    """
    return RouterPut(
        r.spec,
        source_id=topic_id(r.source),
        dest_id=topic_id(r.dest),
        cursor=r.cursor,
        dest_base=r.dest_base,
        forwarded_total=r.forwarded_total,
    )
