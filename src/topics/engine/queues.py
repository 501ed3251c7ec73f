"""Queues: the lease model on top of a queue topic (docs/API.md, "14. Queues").

A queue topic is an ordinary topic (the *jobs log*) plus a :class:`QueueState`
kept in ``topic.queue``: the in-memory projection of the *leases log* (active
leases, delivery counters, the reclaim and delayed heaps, the claim cursor).
:class:`Queues` is the engine layer that owns those states and implements the
queue endpoints: claim (one pass per claimer cohort), ack, nack, extend, and the
``/work`` connection bookkeeping.

Sans-I/O and synchronous like the rest of the engine: time comes from
``engine.clock``; there are no timers, lease expiry is applied lazily by
:meth:`QueueState.sweep` at the start of every queue operation. The coalescing
window (``claim_jitter_ms``) is the HTTP shell's business: it gathers a cohort of
:class:`Claimer` values and runs one :meth:`Queues.claim_pass` for all of them.

What the queue layer logs (:mod:`topics.engine.events`, through ``journal.log``):

* :class:`~topics.engine.events.LeaseChanged` - one leases-log event (``claimed``,
  ``released``, ``extended``, ``acked``), logged only when ``leases_durable`` is
  on and the class is not ``ephemeral``; failures are ignored (the leases log is
  best effort). For ``released`` the ``deadline_ms`` carries the delayed nack's
  ready time (``0`` = claimable at once).
* :class:`~topics.engine.events.SeqsDeleted` - an explicit-seq-list record delete
  (queue acks and dead-letter moves). For ``fsync`` queues it is logged before
  the delete (applied when it commits) and a refusal aborts the ack with
  ``500``; for the other classes it is logged after the delete and failures are
  ignored.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from topics.engine.events import LeaseChanged, LeaseKind, LeaseProjection, SeqsDeleted
from topics.engine.frames import FrameSource
from topics.engine.params import opt_u64
from topics.engine.records import NewRecord, Payload
from topics.engine.topic import PendingWrite, Topic
from topics.errors import TopicsError, bad_request, not_found_topic
from topics.format.idx import DELETED

if TYPE_CHECKING:
    from topics.engine.core import Engine

__all__ = [
    "Lease",
    "QueueState",
    "Claimer",
    "Queues",
    "not_a_queue",
    "lease_wire",
    "parse_lease_id",
    "LEASE_MIN_MS",
    "LEASE_MAX_MS",
    "MAX_DELAY_MS",
]

LEASE_MIN_MS = 100
LEASE_MAX_MS = 86_400_000
MAX_DELAY_MS = 86_400_000

_LEASE_RE = re.compile(r"lease_([0-9a-fA-F]+)")
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1

# Meta key used when a dead-lettered job's original meta is not a JSON object
# (array, string, number, bool): the copy's meta becomes an object holding the
# original under this key plus the three provenance keys (mirrors the router's
# `_topics_original_meta` wrapping, docs/API.md, "11. Routers").
DEAD_LETTER_ORIGINAL_META = "$dead_letter_original_meta"


def clamp_lease(ms: int) -> int:
    """Clamp a lease length to [100, 86400000] ms."""
    return min(max(ms, LEASE_MIN_MS), LEASE_MAX_MS)


def lease_wire(lease_id: int) -> str:
    """Wire form of a lease id: ``lease_`` + lowercase hex (docs/API.md, "14.1 Jobs and leases")."""
    return f"lease_{lease_id:x}"


def parse_lease_id(s: str) -> int | None:
    """The integer of a ``lease_<hex>`` token, or None when malformed."""
    m = _LEASE_RE.fullmatch(s)
    if m is None:
        return None
    v = int(m.group(1), 16)
    return v if v <= _U64_MAX else None


def not_a_queue(name: str) -> TopicsError:
    """`409 not_a_queue` for a queue endpoint on a `log` topic."""
    return TopicsError(409, "not_a_queue", f'topic "{name}" is not a queue', {"topic": name})


def _count_live(t: Topic, seqs: Iterable[int]) -> int:
    """How many of `seqs` are live jobs of `t` (vectorised over the slot index)."""
    arr = np.fromiter(seqs, dtype=np.int64)
    if not len(arr):
        return 0
    idx = t.index
    base = idx.base_seq
    pos = arr - base
    ok = (pos >= 0) & (pos < len(idx)) & (arr >= t.earliest_seq)
    pos = pos[ok]
    if not len(pos):
        return 0
    return int(np.count_nonzero(idx.view()["flags"][pos] != DELETED))


@dataclass(slots=True)
class Lease:
    """An active lease on one job."""

    node: str
    lease_id: int
    deadline_ms: int
    conn: int | None = None


@dataclass(slots=True)
class Claimer:
    """One member of a claim cohort: who claims, how many, from which `/work` conn."""

    node: str
    max: int
    conn: int | None = None


class QueueState:
    """The lease projection of one queue topic instance."""

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.deliveries: dict[int, int] = {}
        self.reclaim: list[int] = []  # min-heap; `reclaim_set` keeps it a set
        self.reclaim_set: set[int] = set()
        self.delayed: list[tuple[int, int]] = []  # min-heap of (ready_at_ms, seq)
        self.claim_cursor = 1
        self.dead_lettered = 0
        self.next_lease_id = 1
        # (deadline_ms, seq, lease_id) per lease/extension; stale entries are lazy.
        self.expiry: list[tuple[int, int, int]] = []
        # conn id -> leased seqs tagged with it (/work streams).
        self.by_conn: dict[int, set[int]] = {}
        # Jobs diverted to the dead-letter topic whose copy is not committed yet.
        self.dl_pending: set[int] = set()

    # ------------------------------------------------------------ primitives

    def push_reclaim(self, seq: int) -> None:
        if seq not in self.reclaim_set:
            self.reclaim_set.add(seq)
            heapq.heappush(self.reclaim, seq)

    def add_lease(self, seq: int, lease: Lease) -> None:
        self.drop_lease(seq)
        self.leases[seq] = lease
        heapq.heappush(self.expiry, (lease.deadline_ms, seq, lease.lease_id))
        if lease.conn is not None:
            self.by_conn.setdefault(lease.conn, set()).add(seq)

    def drop_lease(self, seq: int) -> Lease | None:
        lease = self.leases.pop(seq, None)
        if lease is not None and lease.conn is not None:
            seqs = self.by_conn.get(lease.conn)
            if seqs is not None:
                seqs.discard(seq)
                if not seqs:
                    del self.by_conn[lease.conn]
        return lease

    def set_deadline(self, seq: int, deadline_ms: int) -> None:
        lease = self.leases[seq]
        lease.deadline_ms = deadline_ms
        heapq.heappush(self.expiry, (deadline_ms, seq, lease.lease_id))

    def alloc_lease_id(self) -> int:
        i = self.next_lease_id
        self.next_lease_id = i + 1
        return i

    # ----------------------------------------------------------------- sweep

    def sweep(self, topic: Topic, now: int) -> None:
        """Lazy expiry: matured nacks and expired leases -> reclaim."""
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, seq = heapq.heappop(delayed)
            if seq not in self.leases:
                self.push_reclaim(seq)
        exp = self.expiry
        while exp and exp[0][0] < now:
            deadline, seq, lease_id = heapq.heappop(exp)
            lease = self.leases.get(seq)
            if lease is None or lease.lease_id != lease_id or lease.deadline_ms != deadline:
                continue  # acked/released, or extended (a newer entry exists)
            self.drop_lease(seq)
            self.push_reclaim(seq)
        if len(exp) > 2 * len(self.leases) + 64:
            self.expiry = [(ls.deadline_ms, s, ls.lease_id) for s, ls in self.leases.items()]
            heapq.heapify(self.expiry)
        if len(self.deliveries) > 2 * topic.live_count + 64:
            # Jobs removed behind the queue's back (delete endpoint, TTL, caps) leave
            # delivery counters behind; prune them once they outnumber the live jobs.
            self.deliveries = {
                s: d
                for s, d in self.deliveries.items()
                if s in self.leases or s in self.dl_pending or topic.slot_live(s)
            }

    # ------------------------------------------------------------ claiming

    def peek_claimable(self, topic: Topic, n: int) -> npt.NDArray[np.int64]:
        """The seqs the next claims would most likely hand out (at most `n`), changing nothing.

        Reclaimed seqs first, then from the claim cursor, as :meth:`next_claimable`
        takes them; a guess, used only to warm their bytes up before a claim.
        """
        leases, pending = self.leases, self.dl_pending
        out = [
            s
            for s in heapq.nsmallest(n, self.reclaim)
            if s not in leases and s not in pending and topic.slot_live(s)
        ]
        cur = max(self.claim_cursor, topic.earliest_seq)
        head = topic.head_seq
        while len(out) < n and cur <= head:
            stop = min(head, cur + 4 * n)
            live = topic.live_seqs(cur, stop).tolist()
            out += [s for s in live if s not in leases and s not in pending]
            cur = stop + 1
        return np.asarray(out[:n], dtype=np.int64)

    def next_claimable(self, topic: Topic) -> tuple[int, int, Payload] | None:
        """Reclaimed seqs first, then never-delivered ones; skips leased/deleted/gone."""
        leases = self.leases
        heap = self.reclaim
        while heap:
            seq = heapq.heappop(heap)
            self.reclaim_set.discard(seq)
            if seq in leases or seq in self.dl_pending:
                continue
            rec = topic.get_record(seq)
            if rec is not None:
                return seq, rec[0], rec[2]
        head = topic.head_seq
        cur = max(self.claim_cursor, topic.earliest_seq)
        while cur <= head:
            seq = cur
            cur += 1
            if seq in leases or seq in self.dl_pending:
                continue
            rec = topic.get_record(seq)
            if rec is not None:
                self.claim_cursor = cur
                return seq, rec[0], rec[2]
        self.claim_cursor = max(self.claim_cursor, cur)
        return None

    # -------------------------------------------------------------- counters

    def counters(self, topic: Topic, now: int) -> dict[str, int]:
        """`ready`, `in_flight`, `dead_lettered` after a sweep.

        See docs/API.md, "14.7 Queue counters and dead-letter copies".
        """
        self.sweep(topic, now)
        in_flight = _count_live(topic, self.leases)
        held = set(self.leases)
        waiting = {s for ready_at, s in self.delayed if ready_at > now and s not in held}
        waiting |= self.dl_pending - held
        ready = topic.live_count - in_flight - _count_live(topic, waiting)
        return {
            "ready": max(ready, 0),
            "in_flight": in_flight,
            "dead_lettered": self.dead_lettered,
        }

    def conn_count(self, topic: Topic, conn: int) -> int:
        """Un-expired leases tagged with `conn` whose job is still live (sweep first)."""
        seqs = self.by_conn.get(conn)
        return _count_live(topic, seqs) if seqs else 0

    # ---------------------------------------------------------------- replay

    def restore(self, p: LeaseProjection) -> None:
        """Install a snapshotted lease projection into this (empty) state."""
        for s, node, lease_id, deadline in p.leases:
            self.add_lease(s, Lease(node, lease_id, deadline, None))
        self.deliveries = dict(p.deliveries)
        self.delayed = list(p.delayed)
        heapq.heapify(self.delayed)
        for s in p.reclaim:
            self.push_reclaim(s)
        self.claim_cursor = p.claim_cursor
        self.next_lease_id = p.next_lease_id
        self.dead_lettered = p.dead_lettered

    def projection(self) -> LeaseProjection:
        """The lease state a snapshot records (see :meth:`restore`)."""
        return LeaseProjection(
            leases=tuple(
                (s, ls.node, ls.lease_id, ls.deadline_ms) for s, ls in self.leases.items()
            ),
            deliveries=tuple(self.deliveries.items()),
            delayed=tuple(self.delayed),
            reclaim=tuple(sorted(self.reclaim_set)),
            claim_cursor=self.claim_cursor,
            next_lease_id=self.next_lease_id,
            dead_lettered=self.dead_lettered,
        )

    def replay(
        self, kind: str, seq: int, node: str, lease_id: int, deadline: int, deliveries: int
    ) -> None:
        """Apply one replayed leases-log event."""
        self.next_lease_id = max(self.next_lease_id, lease_id + 1)
        if kind == "claimed":
            self.add_lease(seq, Lease(node, lease_id, deadline, None))
            self.deliveries[seq] = deliveries
            self.claim_cursor = max(self.claim_cursor, seq + 1)
            return
        lease = self.leases.get(seq)
        if lease is None or lease.lease_id != lease_id:
            return  # stale event
        if kind == "released":
            self.drop_lease(seq)
            if deadline > 0:
                heapq.heappush(self.delayed, (deadline, seq))
            else:
                self.push_reclaim(seq)
        elif kind == "extended":
            self.set_deadline(seq, deadline)
        elif kind == "acked":
            self.drop_lease(seq)
            self.deliveries.pop(seq, None)


@dataclass(slots=True)
class _Diverted:
    seq: int
    prev_deliveries: int
    payload: Payload


@dataclass(slots=True)
class _Batch:
    """A parsed ack/nack/extend body."""

    node: str
    seqs: list[int]
    fences: list[int | None]


class Queues:
    """The queue layer of an :class:`~topics.engine.core.Engine` (``engine.queues``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._next_conn = 1
        # Engine declares no `queues` attribute yet; attach without a type: ignore.
        engine.queues = self
        prev: Callable[[Topic], None] = engine.on_topic_created

        def created(t: Topic) -> None:
            prev(t)
            if t.config.is_queue and t.queue is None:
                t.queue = QueueState()

        engine.on_topic_created = created
        for t in engine.topics.values():
            if t.config.is_queue and t.queue is None:
                t.queue = QueueState()

    # ---------------------------------------------------------------- lookup

    def state(self, topic: Topic) -> QueueState:
        """The queue projection of `topic`, created on first use; 409 on a log."""
        q = topic.queue
        if q is None:
            if not topic.config.is_queue:
                raise not_a_queue(topic.name)
            q = QueueState()
            topic.queue = q
        assert isinstance(q, QueueState)
        return q

    def check_queue(self, name: str) -> Topic:
        """The queue topic `name`: `404 topic_not_found` / `409 not_a_queue`."""
        t = self.engine.topics.get(name)
        if t is None:
            raise not_found_topic(name)
        if not t.config.is_queue:
            raise not_a_queue(name)
        self.state(t)
        return t

    def _find(self, name: str) -> tuple[Topic, QueueState] | None:
        t = self.engine.topics.get(name)
        if t is None or not t.config.is_queue:
            return None
        return t, self.state(t)

    # ------------------------------------------------------------ validation

    def validate_node(self, node: str) -> None:
        """A claimer node must be non-empty and at most 128 bytes (checked after 404/409)."""
        if not node:
            raise bad_request("node must not be empty")
        limit = self.engine.limits.max_node_bytes
        if len(node.encode()) > limit:
            raise bad_request(f"node exceeds {limit} bytes")

    def parse_claim(self, body: Any) -> tuple[str, int, int | None]:
        """Claim body -> (node, max, lease_override); 400 before lookup.

        Empty body or missing `node` => `400 claim requires a node`. `max`: 0 => 1,
        clamped to `limits.max_claim`; `lease_ms` clamped to [100, 86400000].
        Emptiness/length of `node` is checked later by :meth:`validate_node`.
        """
        if body is None:
            raise bad_request("claim requires a node")
        if not isinstance(body, dict):
            raise bad_request("claim body must be a JSON object")
        node = body.get("node")
        if node is None:
            raise bad_request("claim requires a node")
        if not isinstance(node, str):
            raise bad_request("node must be a string")
        n = opt_u64(body, "max")
        if n is not None and n > _U32_MAX:
            raise bad_request("max must be a u32")
        n = 1 if not n else min(n, self.engine.limits.max_claim)
        lease = opt_u64(body, "lease_ms")
        return node, n, None if lease is None else clamp_lease(lease)

    def _parse_batch(self, body: Any, op: str) -> tuple[_Batch, dict[str, Any]]:
        """Shared ack/nack/extend validation.

        The order is that of docs/API.md, "14.3 `POST /v0/topics/:topic/ack`".
        """
        if not isinstance(body, dict):
            raise bad_request(f"{op} body must be a JSON object")
        # Type / required-field errors first.
        node = body.get("node")
        if node is None:
            raise bad_request(f"{op} requires a node")
        if not isinstance(node, str):
            raise bad_request("node must be a string")
        seqs = body.get("seqs")
        if seqs is None:
            raise bad_request(f"{op} requires seqs")
        if not isinstance(seqs, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= _U64_MAX for s in seqs
        ):
            raise bad_request("seqs must be an array of non-negative integers")
        raw_ids = body.get("lease_ids")
        if raw_ids is None:
            raw_ids = []
        if not isinstance(raw_ids, list) or not all(isinstance(x, str) for x in raw_ids):
            raise bad_request("lease_ids must be an array of strings")
        extra: dict[str, Any] = {}
        if op == "nack":
            extra["delay_ms"] = min(opt_u64(body, "delay_ms") or 0, MAX_DELAY_MS)
        elif op == "extend":
            lease_ms = opt_u64(body, "lease_ms")
            if lease_ms is None:
                raise bad_request("extend requires lease_ms")
            extra["lease_ms"] = clamp_lease(lease_ms)
        # Handler validation, in order.
        fences: list[int | None] = []
        for x in raw_ids:
            if x == "":
                fences.append(None)
                continue
            v = parse_lease_id(x)
            if v is None:
                raise bad_request(f"invalid lease_id {x!r}")
            fences.append(v)
        if not node:
            raise bad_request("node must not be empty")
        cap = self.engine.limits.max_claim  # TOPICS_MAX_CLAIM, default 1000
        if len(seqs) > cap:
            raise TopicsError(
                400,
                "batch_too_large",
                f"{op} takes at most {cap} seqs (got {len(seqs)})",
                {"seqs": len(seqs), "max": cap},
            )
        if fences and len(fences) != len(seqs):
            raise bad_request("lease_ids must have one entry per seq")
        if not fences:
            fences = [None] * len(seqs)
        return _Batch(node, list(seqs), fences), extra

    # ------------------------------------------------------------- journal

    def _lease_event(
        self,
        t: Topic,
        kind: LeaseKind,
        seq: int,
        node: str,
        lease_id: int,
        deadline: int,
        deliveries: int,
    ) -> None:
        cfg = t.config
        if not cfg.leases_durable or cfg.durability == "ephemeral":
            return
        ev = LeaseChanged(t.topic_id, kind, seq, node, lease_id, deadline, deliveries, t.head_seq)
        try:
            self.engine.journal.log(ev)
        except Exception:  # the leases log is best effort
            pass

    def _delete_jobs(self, t: Topic, seqs: list[int]) -> None:
        """Permanently delete jobs.

        `fsync` class: WAL-first, the jobs go when the fsynced Delete frame commits;
        the journal's refusal is raised (nothing deleted) and the request's barrier
        turns a failed commit into `500`. Other classes: deleted now, logged best
        effort (a refusal is ignored).
        """
        if not seqs:
            return
        eng = self.engine
        ev = SeqsDeleted(t.topic_id, tuple(seqs), t.head_seq)
        if t.config.durability == "fsync":

            def on_commit(ok: bool) -> None:
                if not (t.alive and eng.topics.get(t.name) is t):
                    return
                if ok:
                    eng.apply(ev)
                    return
                # Not deleted: the jobs become claimable again when the delete fails.
                q = self.state(t)
                for s in seqs:
                    q.push_reclaim(s)
                t.notify()

            eng.journal.log(ev).add_done_callback(on_commit)
            return
        eng.apply(ev)
        try:
            eng.journal.log(ev)
        except Exception:  # best-effort log for non-fsync classes
            pass

    # ----------------------------------------------------------------- claim

    def claim_pass(
        self, name: str, claimers: list[Claimer], lease_override: int | None
    ) -> list[list[dict[str, Any]]]:
        """One claim pass for a cohort; one job list per claimer.

        Raises 404/409 when the topic is gone or not a queue. Node validation is
        the caller's (per claimer, before joining the cohort).
        """
        eng = self.engine
        t = self.check_queue(name)
        q = self.state(t)
        now = eng.prepare_read(t, consume=False)
        cfg = t.config
        lease = clamp_lease(cfg.lease_ms if lease_override is None else lease_override)
        deadline = now + lease
        q.sweep(t, now)
        n = len(claimers)
        out: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        cap = eng.limits.max_claim
        remaining = [min(max(c.max, 1), cap) for c in claimers]
        left = sum(remaining)
        max_del = cfg.max_deliveries
        dead_letter = cfg.dead_letter
        diverted: list[_Diverted] = []
        claimed: list[tuple[int, Lease, int]] = []
        rr = 0
        while left > 0:
            while remaining[rr] == 0:
                rr = (rr + 1) % n
            nxt = q.next_claimable(t)
            if nxt is None:
                break
            seq, ts, payload = nxt
            prev = q.deliveries.get(seq, 0)
            d = prev + 1
            if max_del > 0 and d > max_del and dead_letter is not None:
                diverted.append(_Diverted(seq, prev, payload))
                q.deliveries.pop(seq, None)
                q.dl_pending.add(seq)
                q.dead_lettered += 1
                continue  # same claimer tries again
            q.deliveries[seq] = d
            c = claimers[rr]
            ls = Lease(c.node, q.alloc_lease_id(), deadline, c.conn)
            q.add_lease(seq, ls)
            claimed.append((seq, ls, d))
            out[rr].append(self._job(seq, ls, ts, d, payload))
            remaining[rr] -= 1
            left -= 1
            rr = (rr + 1) % n
        if diverted:
            self._dead_letter(t, q, diverted)
        for seq, ls, d in claimed:
            self._lease_event(t, "claimed", seq, ls.node, ls.lease_id, ls.deadline_ms, d)
        for jobs in out:
            jobs.sort(key=lambda j: int(j["$seq"]))
        return out

    @staticmethod
    def _job(seq: int, ls: Lease, ts: int, d: int, p: Payload) -> dict[str, Any]:
        """A job object in wire order; `data`/`meta` splice the stored JSON bytes."""
        job: dict[str, Any] = {
            "$seq": seq,
            "lease_id": lease_wire(ls.lease_id),
            "deadline": ls.deadline_ms,
            "$ts": ts,
        }
        if p.tag is not None:
            job["$tag"] = p.tag
        job["deliveries"] = d
        job["data"] = orjson.Fragment(p.data)
        if p.meta is not None:
            job["meta"] = orjson.Fragment(p.meta)
        return job

    def claim_spans(self, name: str, n: int) -> list[tuple[FrameSource, int, int]]:
        """Segment spans the next claims of up to `n` jobs of queue `name` would read.

        Warmed up off the loop before a claim pass reads them in place (the pass
        changes state as it reads, so it cannot stop for a cold read; see
        docs/ARCHITECTURE.md, "The read path"). Empty when `name` is no queue.
        """
        t = self.engine.topics.get(name)
        if t is None or not t.config.is_queue:
            return []
        return t.blocking_spans(self.state(t).peek_claimable(t, n))

    def claim(
        self,
        name: str,
        node: str,
        max: int,
        lease_override: int | None,
        conn: int | None = None,
    ) -> dict[str, Any]:
        """Single-claimer claim: the response body without `performance`.

        See docs/API.md, "14.2 `POST /v0/topics/:topic/claim`".
        """
        t = self.check_queue(name)
        self.validate_node(node)
        jobs = self.claim_pass(name, [Claimer(node, max, conn)], lease_override)[0]
        return {
            "topic": t.name,
            "claimed": jobs,
            "count": len(jobs),
            "ready": self.ready(name),
        }

    def ready(self, name: str) -> int:
        """Claimable jobs right now (the `ready` of a claim response)."""
        t = self.check_queue(name)
        return self.state(t).counters(t, self.engine.clock.now_ms())["ready"]

    # ----------------------------------------------------------- dead letter

    def _dead_letter(self, t: Topic, q: QueueState, items: list[_Diverted]) -> None:
        """Move diverted jobs to the dead-letter topic.

        See docs/API.md, "14.7 Queue counters and dead-letter copies".
        """
        eng = self.engine
        cfg = t.config
        dl_name = cfg.dead_letter
        assert dl_name is not None

        def undo(batch: list[_Diverted]) -> None:
            for it in batch:
                q.dl_pending.discard(it.seq)
                if it.prev_deliveries:
                    q.deliveries[it.seq] = it.prev_deliveries
                q.dead_lettered -= 1
                q.push_reclaim(it.seq)

        try:
            dlq, _ = eng.ensure_topic(dl_name)
            if dlq is t:
                raise TopicsError(500, "internal", "dead letter topic is the queue itself")
            eng.prepare_read(dlq, consume=False)
            records = [self._dl_record(t.name, cfg.max_deliveries, it) for it in items]
            # Honour the dead-letter topic's `discard:"reject"` caps and the byte quota.
            eng.admit(dlq, records)
            pw = eng.append_logged(dlq, records)
        except TopicsError:
            undo(items)
            return

        def finish(pw: PendingWrite = pw) -> None:
            if not pw.ok:
                undo(items)
                return
            seqs = [it.seq for it in items]
            for s in seqs:
                q.dl_pending.discard(s)
            if not t.alive:
                return
            try:
                self._delete_jobs(t, seqs)
            except Exception:  # failure => back to reclaim
                for s in seqs:
                    q.push_reclaim(s)

        if pw.done:
            finish()
        else:
            pw.waiters.append(finish)

    @staticmethod
    def _dl_record(src: str, max_deliveries: int, it: _Diverted) -> NewRecord:
        """The dead-letter copy of a job: provenance meta values are strings.

        See docs/API.md, "14.7 Queue counters and dead-letter copies".
        """
        p = it.payload
        prov = {
            "$dead_letter_from": src,
            "$dead_letter_deliveries": str(max_deliveries),
            "$dead_letter_src_seq": str(it.seq),
        }
        if p.meta is None:
            meta_obj: dict[str, Any] = prov
        else:
            orig = orjson.loads(p.meta)
            if isinstance(orig, dict):
                meta_obj = {**orig, **prov}
            else:
                meta_obj = {DEAD_LETTER_ORIGINAL_META: orig, **prov}
        meta = orjson.dumps(meta_obj)
        return NewRecord(p.data, meta, p.node, p.tag, len(p.data) + len(meta))

    # ------------------------------------------------------- ack/nack/extend

    def _open_batch(
        self, name: str, body: Any, op: str
    ) -> tuple[_Batch, dict[str, Any], Topic, QueueState, int]:
        """An ack/nack/extend `body` parsed, its queue `name` checked and swept:
        `(batch, extra, topic, state, now)`."""
        b, extra = self._parse_batch(body, op)
        t = self.check_queue(name)
        q = self.state(t)
        now = self.engine.clock.now_ms()
        q.sweep(t, now)
        return b, extra, t, q, now

    @staticmethod
    def _held(q: QueueState, b: _Batch, skipped: list[int]) -> Iterator[tuple[int, Lease]]:
        """`(seq, lease)` of each seq of `b` whose lease `b.node` holds (under its
        fence, when given), in order; the other seqs go to `skipped`. Lazy: each seq
        is looked up after the previous one was handled (a repeated seq whose lease
        the first one dropped is skipped)."""
        for seq, fence in zip(b.seqs, b.fences, strict=True):
            ls = q.leases.get(seq)
            if ls is None or ls.node != b.node or (fence is not None and fence != ls.lease_id):
                skipped.append(seq)
                continue
            yield seq, ls

    def ack(self, name: str, body: Any) -> dict[str, Any]:
        """`POST /v0/topics/:q/ack` body without `performance`.

        See docs/API.md, "14.3 `POST /v0/topics/:topic/ack`".
        """
        b, _, t, q, now = self._open_batch(name, body, "ack")
        matched: list[tuple[int, Lease]] = []
        skipped: list[int] = []
        for seq, ls in self._held(q, b, skipped):
            q.drop_lease(seq)
            matched.append((seq, ls))
        seqs = [s for s, _ in matched]
        try:
            self._delete_jobs(t, seqs)
        except Exception as exc:
            # Nothing was deleted: every matched job becomes claimable again.
            for s in seqs:
                q.push_reclaim(s)
            if seqs:
                t.notify()
            raise TopicsError(500, "internal", "the ack could not be logged") from exc
        for seq, ls in matched:
            d = q.deliveries.pop(seq, 0)
            self._lease_event(t, "acked", seq, ls.node, ls.lease_id, ls.deadline_ms, d)
        if matched:
            t.notify()
        c = q.counters(t, now)
        return {
            "topic": t.name,
            "acked": len(matched),
            "skipped": skipped,
            "ready": c["ready"],
            "in_flight": c["in_flight"],
        }

    def counters_now(self, name: str) -> dict[str, int]:
        """`ready` / `in_flight` of queue `name` now (after an ack's delete committed)."""
        t = self.check_queue(name)
        c = self.state(t).counters(t, self.engine.clock.now_ms())
        return {"ready": c["ready"], "in_flight": c["in_flight"]}

    def nack(self, name: str, body: Any) -> dict[str, Any]:
        """`POST /v0/topics/:q/nack` body without `performance`.

        See docs/API.md, "14.4 `POST /v0/topics/:topic/nack`".
        """
        b, extra, t, q, now = self._open_batch(name, body, "nack")
        delay: int = extra["delay_ms"]
        nacked = 0
        skipped: list[int] = []
        ready_at = now + delay if delay else 0
        for seq, ls in self._held(q, b, skipped):
            q.drop_lease(seq)
            if delay:
                heapq.heappush(q.delayed, (ready_at, seq))
            else:
                q.push_reclaim(seq)
            nacked += 1
            d = q.deliveries.get(seq, 0)
            self._lease_event(t, "released", seq, ls.node, ls.lease_id, ready_at, d)
        if nacked:
            t.notify()
        c = q.counters(t, now)
        return {
            "topic": t.name,
            "nacked": nacked,
            "skipped": skipped,
            "ready": c["ready"],
            "in_flight": c["in_flight"],
        }

    def extend(self, name: str, body: Any) -> dict[str, Any]:
        """`POST /v0/topics/:q/extend` body without `performance`.

        See docs/API.md, "14.5 `POST /v0/topics/:topic/extend`".
        """
        b, extra, t, q, now = self._open_batch(name, body, "extend")
        lease_ms: int = extra["lease_ms"]
        deadline = now + lease_ms
        skipped: list[int] = []
        deadlines: dict[str, int] = {}
        for seq, ls in self._held(q, b, skipped):
            q.set_deadline(seq, deadline)
            deadlines[str(seq)] = deadline
            d = q.deliveries.get(seq, 0)
            self._lease_event(t, "extended", seq, ls.node, ls.lease_id, deadline, d)
        return {
            "topic": t.name,
            "extended": len(deadlines),
            "skipped": skipped,
            "deadlines": deadlines,
        }

    # ------------------------------------------------------------------ /work

    def new_conn_id(self) -> int:
        """A fresh `/work` connection id (unique per server instance)."""
        i = self._next_conn
        self._next_conn = i + 1
        return i

    def conn_leases(self, name: str, conn: int) -> int:
        """Un-expired leases tagged with `conn` on live jobs (0 if the queue is gone)."""
        found = self._find(name)
        if found is None:
            return 0
        t, q = found
        q.sweep(t, self.engine.clock.now_ms())
        return q.conn_count(t, conn)

    def release_leases(self, name: str, leases: Iterable[tuple[int, str]]) -> int:
        """Release specific `(seq, wire lease id)` leases into `reclaim` (deliveries kept).

        Used for jobs claimed on behalf of a cohort member that went away before
        the pass delivered them. Stale ids are ignored; a no-op when the queue is gone.
        """
        found = self._find(name)
        if found is None:
            return 0
        t, q = found
        n = 0
        for seq, wire in leases:
            ls = q.leases.get(seq)
            if ls is None or lease_wire(ls.lease_id) != wire:
                continue
            q.drop_lease(seq)
            q.push_reclaim(seq)
            d = q.deliveries.get(seq, 0)
            self._lease_event(t, "released", seq, ls.node, ls.lease_id, 0, d)
            n += 1
        if n:
            t.notify()
        return n

    def release_conn(self, name: str, conn: int) -> int:
        """Drop every lease tagged with `conn` into `reclaim` (deliveries kept).

        Returns how many leases were released; a no-op when the queue is gone.
        """
        found = self._find(name)
        if found is None:
            return 0
        t, q = found
        seqs = sorted(q.by_conn.get(conn, ()))
        for seq in seqs:
            ls = q.drop_lease(seq)
            if ls is None:
                continue
            q.push_reclaim(seq)
            d = q.deliveries.get(seq, 0)
            self._lease_event(t, "released", seq, ls.node, ls.lease_id, 0, d)
        if seqs:
            t.notify()
        return len(seqs)
