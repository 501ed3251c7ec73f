"""One topic instance: seqs, floors, retention, the read pipeline, deletes.

Everything here is synchronous and clock-injected (the caller passes `now`).
Definitions:

* `head_seq` - highest published seq; `next_seq` - next seq to stage. Seqs in
  between belong to staged batches waiting for their commit point; they are
  published strictly in seq order (a failed batch becomes deleted holes).
* floors `l_cap`, `l_ttl`, `l_trim` (involuntary) and `delete_below`;
  `evict_floor` / `earliest_seq` are derived from them (see :meth:`Topic.earliest_seq`).
* the slot index keeps one slot per published seq from `base_seq` up; leading
  dead slots are popped (lazy front reclaim).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from topics.engine.frames import (
    NATIVE_MIN_RUN,
    Buf,
    Chunk,
    FrameCorrupt,
    FrameSource,
    collect_fields,
    render_frames,
    span_of,
)
from topics.engine.index import LOC_HOLE, NODE_UNKNOWN, SLOT_DTYPE, SlotIndex
from topics.engine.records import NewRecord, Payload, batch_bytes
from topics.engine.tags import TagIndex
from topics.engine.topic_config import TopicConfig
from topics.errors import TopicsError, bad_request
from topics.format.frame import (
    BatchLayout,
    FrameBuf,
    FrameError,
    check_frame,
    encode_batch,
    frame_fields,
    seal_batch,
)
from topics.format.idx import DELETED, F_HAS_META, F_HAS_NODE, F_HAS_TAG, F_RECORD_MASK

__all__ = [
    "Topic",
    "Totals",
    "NodeInterner",
    "PendingWrite",
    "ReadOpts",
    "ReadResult",
    "Tombstone",
    "WATCH_DEFAULT_BUDGET",
]

READ_CHUNK = 2048
#: Frames of one source further apart than this (bytes) are warmed as separate spans.
SPAN_GAP_BYTES = 64 * 1024
#: Payload bytes a watch pass delivers when the request names no `max_batch_bytes`.
WATCH_DEFAULT_BUDGET = 262_144
#: Source ids at or above this are in-memory chunks; below, segments.
CHUNK_BASE = 0x80000000
_CHUNK_LAST = 0xFFFFFF00


class Totals:
    """Instance-wide live counters shared by every topic (global byte quota, metrics)."""

    __slots__ = ("records", "bytes")

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0


class NodeInterner:
    """Maps node strings to small ints (0 = no node) for vectorised node filtering."""

    __slots__ = ("_ids", "_json", "json_by_bytes")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._json: dict[str, bytes] = {}
        # UTF-8 node bytes -> JSON string literal, for rendering from frames.
        self.json_by_bytes: dict[bytes, bytes] = {}

    def json(self, node: str) -> bytes:
        """`node` as a JSON string literal (cached: nodes repeat)."""
        j = self._json.get(node)
        if j is None:
            j = orjson.dumps(node)
            if len(self._json) < 100_000:
                self._json[node] = j
        return j

    def intern(self, node: str | None) -> int:
        if node is None:
            return 0
        i = self._ids.get(node)
        if i is None:
            i = len(self._ids) + 1
            self._ids[node] = i
        return i

    def lookup(self, node: str) -> int:
        """Id of `node`, or 0 when no record ever carried it."""
        return self._ids.get(node, 0)


@dataclass(slots=True)
class Tombstone:
    """An involuntary-loss signal (docs/API.md, "9. Tombstones")."""

    gap_from: int
    gap_to: int
    reason: str
    missed_estimate: int
    earliest_seq: int
    head_seq: int

    def to_wire(self, *, with_estimate: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "gap_from": self.gap_from,
            "gap_to": self.gap_to,
            "reason": self.reason,
        }
        if with_estimate:
            d["missed_estimate"] = self.missed_estimate
        d["earliest_seq"] = self.earliest_seq
        d["head_seq"] = self.head_seq
        return d


@dataclass(frozen=True, slots=True)
class ReadOpts:
    """Normalised read options of :meth:`Topic.read_opts`: the node filter, at most
    `limit` records and about `budget` payload bytes a pass, and what a record
    carries. The defaults are a watch session's."""

    nodes: list[str] | None = None
    limit: int = 256
    budget: int = WATCH_DEFAULT_BUDGET
    include_meta: bool = True
    include_tags: bool = False
    include_data: bool = True


@dataclass(slots=True)
class ReadResult:
    """Outcome of one pass of the read pipeline."""

    records: list[bytes]
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    tombstone: Tombstone | None
    scanned: int
    seqs: list[int] = field(default_factory=list)
    used: int = 0  # payload bytes delivered, counted against the budget
    cold_segments: int = 0  # segments of the cold tier the read fetched bytes from

    @property
    def caught_up(self) -> bool:
        return self.next_from_seq == self.head_seq

    @property
    def lag(self) -> int:
        return self.head_seq - self.next_from_seq


@dataclass(slots=True, eq=False)
class PendingWrite:
    """A staged batch: seqs assigned, waiting for its commit point to publish."""

    topic: Topic
    first_seq: int
    records: list[NewRecord]
    ts: int
    idempotency_key: str | None = None
    created: bool = False
    done: bool = False
    ok: bool = False
    published: bool = False
    head_after: int = 0
    fsync_ms: float = 0.0  # measured by the journal for fsync-class commits
    throttle_ms: float = 0.0  # waited for a widened commit window (docs/SCHEDULER.md)
    # Why the commit failed, when the journal knows better than "500 internal"
    # (e.g. 507 when the disk is full).
    error: TopicsError | None = None
    waiters: list[Callable[[], None]] = field(default_factory=list)
    # The batch's WAL Append frames (docs/FORMATS.md), encoded once at stage time
    # (a large write's are laid out beforehand and sealed in place, so they sit in
    # a bytearray or an anonymous mmap): logged by the journal, then kept in memory
    # as the records' bytes until the checkpointer copies them into a segment.
    frames: bytes | FrameBuf = b""
    sizes: list[int] = field(default_factory=list)
    nbytes: int = 0  # the records' accounting bytes (docs/API.md, "4. Records")

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.records) - 1


@dataclass(slots=True)
class DedupeEntry:
    seqs: list[int]
    head_seq: int
    created_ms: int


class Topic:
    """State of one topic instance.

    Record bytes live in frame sources (`sources`, keyed by slot `loc`): an
    in-memory :class:`~topics.engine.frames.Chunk` per write until the
    checkpointer has copied its frames into a segment, then the segment. The
    checkpoint fields: `ckpt_seq` is the highest seq whose slot points into a
    segment, `ckpt_claim` the highest seq a running checkpoint is writing, and
    `flip_seqs` the deleted seqs at or below `ckpt_claim` whose `.idx` flag the
    next checkpoint must flip.
    """

    def __init__(
        self,
        name: str,
        topic_id: int,
        config: TopicConfig,
        now_ms: int,
        totals: Totals,
        nodes: NodeInterner,
    ) -> None:
        self.name = name
        self.name_json = orjson.dumps(name)
        self.topic_id = topic_id
        self.epoch = 1
        self.config = config
        self.created_ms = now_ms
        self.index = SlotIndex(1)
        self.sources: dict[int, FrameSource] = {}
        self._chunks: deque[tuple[int, int]] = deque()  # (last_seq, loc), in seq order
        self._next_chunk = CHUNK_BASE
        self._tags: TagIndex | None = TagIndex()  # None: rebuild from frames when needed
        self.ckpt_seq = 0
        self.ckpt_claim = 0
        self.flip_seqs: list[int] = []
        self.head_seq = 0
        self.next_seq = 1
        self.last_ts = 0
        self.l_cap = 0
        self.l_ttl = 0
        self.l_trim = 0
        self.delete_below = 0
        # Seq ranges `(first, last)` that storage damage destroyed (set by recovery
        # after `topics repair`): reads across them get a `corrupt` tombstone.
        self.lost: list[tuple[int, int]] = []
        self.live_count = 0
        self.live_bytes = 0
        self.pending_count = 0
        self.pending_bytes = 0
        self.last_write_ms: int | None = None
        self.last_read_ms: int | None = None
        self.last_consumed_ms: int | None = None
        self.dedupe: dict[str, DedupeEntry] = {}
        self.dedupe_pending: dict[str, PendingWrite] = {}
        self.pending: deque[PendingWrite] = deque()
        self.listeners: set[Callable[[Topic], None]] = set()
        self.router_keys: dict[str, int] = {}
        self.queue: Any = None  # QueueState for queue topics (engine.queues)
        self.alive = True
        # Called when an involuntary floor advances, so it can be logged (EvictWatermark).
        self.on_floor_advance: Callable[[Topic], None] | None = None
        # Called when records become visible: the delivery work of the publication
        # (the engine hands it to its scheduler; alone, a topic wakes its listeners).
        self.on_publish: Callable[[Topic], None] = Topic.notify
        self._totals = totals
        self._nodes = nodes

    # ---------------------------------------------------------------- floors

    @property
    def base_seq(self) -> int:
        return self.index.base_seq

    @property
    def evict_floor(self) -> int:
        """First seq above involuntary loss: clamp(max(L_cap, L_ttl, L_trim) + 1, 1, head + 1)."""
        f = max(self.l_cap, self.l_ttl, self.l_trim) + 1
        return min(max(f, 1), self.head_seq + 1)

    @property
    def earliest_seq(self) -> int:
        """First live seq, or head + 1 when nothing is live."""
        l_del = max(self.delete_below - 1, 0)
        f = max(max(self.l_cap, self.l_ttl, self.l_trim, l_del) + 1, 1, self.index.base_seq)
        return min(f, self.head_seq + 1)

    def reason_for(self, g: int) -> str:
        """Tombstone reason for a gap starting at `g` (docs/API.md, "9. Tombstones")."""
        cap = self.l_cap > 0 and self.l_cap >= g
        ttl = self.l_ttl > 0 and self.l_ttl >= g
        if cap and ttl:
            return "mixed"
        if cap:
            return "cap"
        if ttl:
            return "ttl"
        if self.l_trim >= g > 0:
            return "source_trim"
        return "cap"

    def notify(self) -> None:
        """Wake everything waiting on this topic (long-polls, SSE, WS, /work)."""
        for cb in list(self.listeners):
            cb(self)

    # ------------------------------------------------------------- accounting

    def _sub_live(self, count: int, nbytes: int) -> None:
        self.live_count -= count
        self.live_bytes -= nbytes
        self._totals.records -= count
        self._totals.bytes -= nbytes

    def _add_live(self, count: int, nbytes: int) -> None:
        self.live_count += count
        self.live_bytes += nbytes
        self._totals.records += count
        self._totals.bytes += nbytes

    # ---------------------------------------------------------------- sources

    def add_chunk(self, chunk: Chunk) -> int:
        """Register an in-memory chunk of frames; returns its `loc`."""
        loc = self._next_chunk
        while loc in self.sources:
            loc = loc + 1 if loc < _CHUNK_LAST else CHUNK_BASE
        self._next_chunk = loc + 1 if loc < _CHUNK_LAST else CHUNK_BASE
        self.sources[loc] = chunk
        self._chunks.append((chunk.last_seq, loc))
        return loc

    def free_chunks(self) -> None:
        """Forget chunks no slot points into (popped, or copied into a segment)."""
        chunks = self._chunks
        below = max(self.index.base_seq, self.ckpt_seq + 1)
        while chunks and chunks[0][0] < below:
            _last, loc = chunks.popleft()
            self.sources.pop(loc, None)

    def chunk_bytes(self) -> int:
        """Bytes held by in-memory chunks (records not yet in a segment)."""
        seen: set[int] = set()
        total = 0
        for _last, loc in self._chunks:
            src = self.sources.get(loc)
            if isinstance(src, Chunk) and id(src.buf) not in seen:
                seen.add(id(src.buf))
                total += len(src.buf)
        return total

    def blocking_spans(self, seqs: npt.NDArray[np.int64]) -> list[tuple[FrameSource, int, int]]:
        """`(source, lo, hi)`: the byte spans of blocking sources (segment files) that
        hold frames of the live `seqs`, for warming them up off the loop before a
        read in place (docs/ARCHITECTURE.md, "The read path"). No I/O; records
        still in memory cost one lookup per source they are in.
        """
        idx = self.index
        n = len(idx)
        p = seqs - idx.base_seq
        p = p[(p >= 0) & (p < n)]
        if not len(p):
            return []
        arr = idx.window(0, n)
        p = p[arr["flags"][p] != DELETED]
        locs = arr["loc"][p]
        out: list[tuple[FrameSource, int, int]] = []
        for loc in np.unique(locs).tolist():
            src = self.sources.get(loc) if loc != LOC_HOLE else None
            if src is None or not src.blocking:
                continue
            sel = p[locs == loc]
            lo = arr["offset"][sel].astype(np.int64)
            order = np.argsort(lo, kind="stable")
            lo = lo[order]
            hi = np.maximum.accumulate(lo + arr["len"][sel][order])
            # Frames further apart than SPAN_GAP_BYTES: separate spans, not the bytes between.
            cuts = (np.flatnonzero(lo[1:] - hi[:-1] > SPAN_GAP_BYTES) + 1).tolist()
            for a, z in zip([0, *cuts], [*cuts, len(lo)], strict=True):
                out.append((src, int(lo[a]), int(hi[z - 1])))
        return out

    def live_seqs(self, lo: int, hi: int) -> npt.NDArray[np.int64]:
        """The seqs in `[lo, hi]` that are published, retained and not deleted
        (:meth:`slot_live` over a range, in one pass)."""
        idx = self.index
        lo = max(lo, self.earliest_seq, idx.base_seq)
        hi = min(hi, idx.base_seq + len(idx) - 1)
        if hi < lo:
            return np.zeros(0, np.int64)
        flags = idx.window(lo - idx.base_seq, hi - lo + 1)["flags"]
        return np.flatnonzero(flags != DELETED).astype(np.int64) + lo

    def _frames(self, positions: list[int]) -> Iterator[tuple[int, Buf, int, int, int]]:
        """`(pos, buf, o, len, hdr)` of each verified frame at slot `positions`.

        Positions are relative to `base_seq`; holes are skipped. Raises FrameCorrupt
        or OSError when a source cannot deliver a frame.
        """
        if not positions:
            return
        idx = self.index
        base_seq = idx.base_seq
        arr = idx.view()
        pos = np.asarray(positions, dtype=np.int64)
        locs = arr["loc"][pos].tolist()
        offs = arr["offset"][pos].tolist()
        lens = arr["len"][pos].tolist()
        i = 0
        n = len(positions)
        while i < n:
            loc = locs[i]
            j = i + 1
            while j < n and locs[j] == loc:
                j += 1
            src = self.sources.get(loc) if loc != LOC_HOLE else None
            if src is not None:
                lo = min(offs[i:j])
                hi = max(o + ln for o, ln in zip(offs[i:j], lens[i:j], strict=True))
                buf, base = span_of(src, lo, hi)
                for k in range(i, j):
                    o = offs[k] - base
                    if src.verify:
                        why = check_frame(buf, o, lens[k], base_seq + positions[k], src.hdr)
                        if why is not None:
                            raise FrameCorrupt(src.name, base_seq + positions[k], why)
                    yield positions[k], buf, o, lens[k], src.hdr
            i = j

    # ------------------------------------------------------------------- tags

    @property
    def tags(self) -> TagIndex:
        """The tag index, rebuilt from the frames of live tagged slots when stale.

        Records loaded from disk carry only a has_tag flag in memory; their tags are
        read the first time a `match` delete needs them (the tag index is consulted
        by deletes only). Raises FrameCorrupt/OSError from the sources.
        """
        tags = self._tags
        if tags is None:
            tags = TagIndex()
            pos = self._tagged_positions().tolist()
            base = self.index.base_seq
            for p, buf, o, ln, hdr in self._frames(pos):
                tag = frame_fields(buf, o, ln, hdr)[1]
                if tag is not None:
                    tags.add(tag, base + p)
            self._tags = tags
        return tags

    def tag_spans(self) -> list[tuple[FrameSource, int, int]]:
        """Segment spans a rebuild of the tag index would read ([] when it is current).

        Warmed up off the loop before a `match` delete rebuilds the index in place
        (docs/ARCHITECTURE.md, "The read path"). No I/O.
        """
        if self._tags is not None:
            return []
        return self.blocking_spans(self._tagged_positions() + self.index.base_seq)

    def _tagged_positions(self) -> npt.NDArray[np.int64]:
        """Slot positions (from `base_seq`) of the live records that carry a tag."""
        fl = self.index.view()["flags"]
        return np.flatnonzero((fl != DELETED) & ((fl & F_HAS_TAG) != 0)).astype(np.int64)

    def tags_stale(self) -> None:
        """Forget the tag index; the next delete that needs it rebuilds it from frames."""
        self._tags = None

    # -------------------------------------------------------------- retention

    def apply_retention(self, now: int) -> bool:
        """Advance TTL/cap floors against `now` and reclaim; True if a floor moved.

        TTL expires the maximal prefix with `now - ts > ttl_ms`; `cap_records` is a
        seq window (`head - cap`); `cap_bytes` walks the oldest live bytes until the
        excess is gone (docs/API.md, "5. The topic config object").
        """
        cfg = self.config
        moved = False
        idx = self.index
        if cfg.ttl_ms > 0 and len(idx):
            cutoff = now - cfg.ttl_ms  # expired iff ts < cutoff
            if cutoff > 0:
                k = int(np.searchsorted(idx.view()["ts"], cutoff, side="left"))
                if k:
                    last = idx.base_seq + k - 1
                    if last > self.l_ttl:
                        self.l_ttl = last
                        moved = True
        if cfg.cap_records > 0 and self.head_seq > cfg.cap_records:
            floor = self.head_seq - cfg.cap_records
            if floor > self.l_cap:
                self.l_cap = floor
                moved = True
        if moved:
            self._evict_to(max(self.l_cap, self.l_ttl, self.l_trim))
        if cfg.cap_bytes > 0 and self.live_bytes > cfg.cap_bytes:
            excess = self.live_bytes - cfg.cap_bytes
            cs = np.cumsum(idx.view()["bytes"], dtype=np.int64)
            i = int(np.searchsorted(cs, excess, side="left"))
            last = idx.base_seq + min(i, len(cs) - 1)
            if last > self.l_cap:
                self.l_cap = last
                moved = True
            self._evict_to(max(self.l_cap, self.l_ttl, self.l_trim))
        self._reclaim_front()
        if moved and self.on_floor_advance is not None:
            self.on_floor_advance(self)
        return moved

    def _evict_to(self, floor: int) -> None:
        """Remove every slot with seq <= `floor` (involuntary loss already recorded)."""
        self._drop_prefix(floor - self.index.base_seq + 1)

    def _pop(self, k: int) -> None:
        """Pop `k` front slots and what hangs off them (tag postings, chunks)."""
        idx = self.index
        idx.pop_front(k)
        if self._tags is not None and len(self._tags):
            self._tags.drop_upto(idx.base_seq - 1)
        if self._chunks:
            self.free_chunks()

    def _drop_prefix(self, k: int) -> int:
        """Pop the first `k` slots, un-counting the live ones; returns how many were live."""
        idx = self.index
        k = min(k, len(idx))
        if k <= 0:
            return 0
        w = idx.window(0, k)
        live = w["flags"] != DELETED
        n_live = int(np.count_nonzero(live))
        if n_live:
            self._sub_live(n_live, int(w["bytes"].sum(dtype=np.int64)))
        self._pop(k)
        return n_live

    def _reclaim_front(self) -> None:
        """Pop leading deleted slots (lazy front reclaim)."""
        idx = self.index
        n = len(idx)
        if not n:
            return
        flags = idx.view()["flags"]
        if flags[0] != DELETED:
            return
        alive = np.flatnonzero(flags != DELETED)
        self._pop(int(alive[0]) if len(alive) else n)

    # ------------------------------------------------------------ write path

    def stage(
        self,
        records: list[NewRecord],
        now: int,
        key: str | None,
        layout: BatchLayout | None = None,
    ) -> PendingWrite:
        """Assign contiguous seqs and a non-decreasing ts to a batch (not yet visible).

        Encodes the batch's WAL frames once: with `layout` (laid out from these
        very `records` by :func:`~topics.format.frame.layout_batch` and not
        sealed yet) by sealing it in place, which is far less work than
        encoding; otherwise in one go. Raises `400 invalid_request` (nothing
        changed) when a node or tag cannot be encoded as UTF-8.
        """
        ts = max(now, self.last_ts)
        durable = self.config.durability == "fsync"
        frames: bytes | FrameBuf
        try:
            if layout is not None and layout.records is records and not layout.sealed:
                frames = seal_batch(layout, self.topic_id, self.next_seq, ts, durable)
                sizes = layout.sizes
            else:
                frames, sizes = encode_batch(self.topic_id, self.next_seq, ts, records, durable)
        except FrameError as exc:
            raise bad_request(f"a record cannot be stored: {exc}") from None
        self.last_ts = ts
        nbytes = batch_bytes(records)
        pw = PendingWrite(
            self, self.next_seq, records, ts, key, frames=frames, sizes=sizes, nbytes=nbytes
        )
        self.next_seq += len(records)
        self.pending_count += len(records)
        self.pending_bytes += nbytes
        self.pending.append(pw)
        return pw

    def complete(self, pw: PendingWrite, ok: bool) -> None:
        """Mark a staged batch committed (or failed) and publish in seq order."""
        pw.done = True
        pw.ok = ok
        published = False
        while self.pending and self.pending[0].done:
            p = self.pending.popleft()
            self.pending_count -= len(p.records)
            self.pending_bytes -= p.nbytes
            if p.ok:
                self._publish(p)
            else:
                self._append_holes(len(p.records), p.ts)
            p.published = True
            p.head_after = self.head_seq
            published = True
            for cb in p.waiters:
                cb()
            p.waiters.clear()
        if published:
            self.on_publish(self)

    def _publish(self, p: PendingWrite) -> None:
        n = len(p.records)
        loc = self.add_chunk(Chunk(p.frames, p.first_seq, p.last_seq))
        rows = self._batch_rows(p.records, p.sizes, p.ts, p.first_seq)
        rows["loc"] = loc
        self.index.append_rows(rows)
        self.head_seq = p.last_seq
        self._add_live(n, p.nbytes)
        self.last_write_ms = p.ts

    def _batch_rows(
        self,
        recs: list[NewRecord],
        sizes: list[int],
        ts: int,
        first_seq: int,
        *,
        index_tags: bool = True,
    ) -> Any:
        """Slot rows (without `loc`) of a batch whose frames sit back to back; with
        `index_tags`, its tags join the tag index."""
        n = len(recs)
        rows = np.zeros(n, SLOT_DTYPE)
        lens = np.array(sizes, dtype=np.uint32)
        rows["len"] = lens
        if n > 1:
            np.cumsum(lens[:-1], out=rows["offset"][1:])
        rows["ts"] = ts
        if not n:
            return rows
        # The batch's columns (data, meta, node, tag, nbytes, hops), transposed in C.
        _data, metas, nodes, tags, nbytes, hops = zip(*recs, strict=True)
        rows["bytes"] = nbytes
        # plain: no tag, node, meta or hops anywhere in the batch
        plain = (
            metas.count(None) == n and nodes.count(None) == n and tags.count(None) == n
        ) and not any(hops)
        if not plain:
            intern = self._nodes.intern
            rows["flags"] = [
                (F_HAS_TAG if t is not None else 0)
                | (F_HAS_NODE if nd is not None else 0)
                | (F_HAS_META if m is not None else 0)
                for m, nd, t in zip(metas, nodes, tags, strict=True)
            ]
            if index_tags and self._tags is not None:
                self._tags.add_many(list(tags), first_seq)
            rows["hops"] = hops
            rows["node"] = [intern(x) for x in nodes]
        return rows

    def restore_write(
        self,
        first_seq: int,
        ts: int,
        records: list[NewRecord],
        frames: bytes | FrameBuf,
        sizes: list[int],
    ) -> int:
        """Publish a batch logged elsewhere at its own seqs (event replay).

        `frames` holds the batch's WAL Append frames back to back (`sizes` in
        bytes), `ts` its commit time (ms). Seqs at or below the head are
        skipped; a jump above the head becomes deleted holes. Nothing is
        published while this topic has staged writes of its own. Returns how
        many records were published.
        """
        n = len(records)
        last = first_seq + n - 1
        head = self.head_seq
        if not n or last <= head or self.pending:
            return 0
        rows = self._batch_rows(records, sizes, ts, first_seq, index_tags=False)
        skip = max(head + 1 - first_seq, 0)
        if skip:
            rows = rows[skip:]
        elif first_seq > head + 1:
            gap = np.zeros(first_seq - head - 1, SLOT_DTYPE)
            gap["ts"] = ts
            gap["flags"] = DELETED
            gap["loc"] = LOC_HOLE
            rows = np.concatenate([gap, rows])
        self.restore_rows(rows, Chunk(frames, head + 1, last))
        return n - skip

    def replay_frames(self, buf: Buf, frames: Any) -> int:
        """Publish logged Append frames of this topic at their seqs (WAL replay).

        `frames` is a WAL_COLS_DTYPE array (log order) of frames inside `buf`;
        frames at or below the head are skipped, a jump in seqs becomes deleted
        holes, and the records are served from `buf`. Nodes are read back from
        the frames on demand, tags likewise. Nothing is published while this
        topic has staged writes of its own. Returns how many were published.
        """
        c = frames
        seqs = c["seq"].astype(np.int64)
        keep = seqs > self.head_seq
        if not keep.all():
            c = c[keep]
            seqs = seqs[keep]
        if not len(c) or self.pending:
            return 0
        if len(c) > 1 and np.any(np.diff(seqs) <= 0):
            # Out of order within the log (never written that way): frame by frame.
            n = 0
            for i in range(len(c)):
                if int(seqs[i]) > self.head_seq:
                    self._replay_rows(buf, c[i : i + 1], seqs[i : i + 1])
                    n += 1
            return n
        self._replay_rows(buf, c, seqs)
        return len(c)

    def _replay_rows(self, buf: Buf, c: Any, seqs: Any) -> None:
        head = self.head_seq
        n = int(seqs[-1]) - head
        out = np.zeros(n, SLOT_DTYPE)
        pos = seqs - head - 1
        if n != len(c):
            out["flags"] = DELETED
            out["loc"] = LOC_HOLE
            out["ts"] = int(c["ts"][0])
        fl = c["flags"]
        meta4 = np.where((fl & F_HAS_META) != 0, 4, 0)
        out["offset"][pos] = c["off"]
        out["len"][pos] = c["size"]
        out["ts"][pos] = c["ts"]
        out["flags"][pos] = fl & F_RECORD_MASK
        out["loc"][pos] = 0
        out["bytes"][pos] = c["dl"].astype(np.int64) - meta4
        out["node"][pos] = np.where((fl & F_HAS_NODE) != 0, NODE_UNKNOWN, 0)
        self.restore_rows(out, Chunk(buf, head + 1, int(seqs[-1])))

    def raise_floors(self, l_cap: int, l_ttl: int, l_trim: int) -> None:
        """Raise the involuntary floors to at least the given seqs and drop what
        they cover (logged floors, replayed; a floor never moves back)."""
        self.l_cap = max(self.l_cap, l_cap)
        self.l_ttl = max(self.l_ttl, l_ttl)
        self.l_trim = max(self.l_trim, l_trim)
        self._evict_to(min(max(self.l_cap, self.l_ttl, self.l_trim), self.head_seq))

    def restore_head(self, head_seq: int) -> None:
        """Start an empty instance at `head_seq` (snapshot restore): seqs up to it
        are taken, none has a slot (the segments bring the records)."""
        self.index.clear_to(head_seq + 1)
        self.head_seq = head_seq
        self.next_seq = head_seq + 1

    def restore_rows(self, rows: Any, chunk: Chunk | None) -> None:
        """Publish recovered records at their logged seqs (WAL replay).

        `rows` is a SLOT_DTYPE array for seqs `head_seq + 1 ..` whose frames sit in
        `chunk` (`loc` is filled in here); deleted holes may be mixed in with
        `loc` LOC_HOLE. The tag index goes stale (tags are read back on demand).
        """
        n = len(rows)
        if not n:
            return
        if chunk is not None:
            loc = self.add_chunk(chunk)
            live = rows["loc"] != LOC_HOLE
            rows["loc"][live] = loc
        if self._tags is not None and np.any(rows["flags"] & F_HAS_TAG):
            self._tags = None
        self.index.append_rows(rows)
        self.head_seq += n
        self.next_seq = self.head_seq + 1
        ts_max = int(rows["ts"].max())
        self.last_ts = max(self.last_ts, ts_max)
        self.last_write_ms = max(self.last_write_ms or 0, ts_max)
        alive = rows["flags"] != DELETED
        self._add_live(int(np.count_nonzero(alive)), int(rows["bytes"][alive].sum(dtype=np.int64)))
        self._reclaim_front()

    def attach_segments(self, base_seq: int, rows: Any, sources: dict[int, FrameSource]) -> None:
        """Adopt records loaded from segment files (recovery, before any WAL replay).

        `rows` are SLOT_DTYPE slots for seqs `base_seq ..` pointing into `sources`.
        The head becomes at least the last of them; seqs the head already covers
        beyond them become deleted holes; floors set beforehand (from a snapshot)
        drop what lies below them. The tag index goes stale.
        """
        self.sources.update(sources)  # an empty active segment is a source too
        n = len(rows)
        if not n:
            return
        assert not len(self.index), "attach_segments needs an empty index"
        self.index = SlotIndex.from_rows(base_seq, rows)
        end = base_seq + n - 1
        self.ckpt_seq = self.ckpt_claim = end
        alive = rows["flags"] != DELETED
        self._add_live(int(np.count_nonzero(alive)), int(rows["bytes"][alive].sum(dtype=np.int64)))
        ts_max = int(rows["ts"].max())
        self.last_ts = max(self.last_ts, ts_max)
        if self.last_write_ms is None or self.last_write_ms < ts_max:
            self.last_write_ms = ts_max
        if np.any(rows["flags"] & F_HAS_TAG):
            self._tags = None
        head = self.head_seq
        if head > end:
            rows_h = np.zeros(head - end, SLOT_DTYPE)
            rows_h["ts"] = ts_max
            rows_h["flags"] = DELETED
            rows_h["loc"] = LOC_HOLE
            self.index.append_rows(rows_h)
        self.head_seq = max(head, end)
        self.next_seq = self.head_seq + 1
        self._drop_prefix(self.earliest_seq - base_seq)
        self._reclaim_front()

    def _append_holes(self, n: int, ts: int) -> None:
        rows = np.zeros(n, SLOT_DTYPE)
        rows["ts"] = ts
        rows["flags"] = DELETED
        rows["loc"] = LOC_HOLE
        self.index.append_rows(rows)
        self.head_seq += n
        self._reclaim_front()

    def append_holes(self, n: int, ts: int) -> None:
        """Publish `n` deleted holes at once (router source trim, recovery padding)."""
        if n <= 0:
            return
        self.next_seq = max(self.next_seq, self.head_seq + n + 1)
        self._append_holes(n, max(ts, self.last_ts))
        self.last_ts = max(ts, self.last_ts)

    def unstage(self, pw: PendingWrite) -> None:
        """Withdraw a staged batch the journal refused before logging anything.

        The tail batch gives its seqs back; one with later batches behind it becomes
        holes (seqs are never reused once a later batch holds higher ones).
        """
        if self.pending and self.pending[-1] is pw:
            self.pending.pop()
            self.next_seq = pw.first_seq
            self.pending_count -= len(pw.records)
            self.pending_bytes -= pw.nbytes
        else:
            self.complete(pw, False)

    def reserve_head(self, head: int, ts: int) -> None:
        """Raise the head to a durable reservation, padding with holes (disk class)."""
        if head > self.head_seq and not self.pending:
            self.append_holes(head - self.head_seq, ts)

    def mark_lost(self, first: int, last: int, ts: int) -> None:
        """Record that seqs `first..last` were destroyed by storage damage.

        The head is raised past them (holes), so they are never handed out
        again, and a read whose cursor reaches them gets a tombstone with
        reason `corrupt` for the range (docs/FORMATS.md, "Repair").
        """
        if last < first or last < 1:
            return
        first = max(first, 1)
        if last > self.head_seq and not self.pending:
            self.append_holes(last - self.head_seq, ts)
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.lost, (first, last)]):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.lost = merged

    def source_trim(self, n: int, ts: int) -> None:
        """Record `n` seqs a router could not derive (its source lost them).

        Appends `n` deleted holes, raises `L_trim` to the last of them and evicts
        everything at or below it, so readers crossing the gap get a
        `source_trim` tombstone (docs/API.md, "9. Tombstones").
        """
        if n <= 0:
            return
        self.append_holes(n, ts)
        self.l_trim = max(self.l_trim, self.head_seq)
        self._evict_to(self.l_trim)
        if self.on_floor_advance is not None:
            self.on_floor_advance(self)

    # ------------------------------------------------------------- read path

    def _resolve_nodes(self, w: Any, pos: int) -> None:
        """Intern the nodes of slots in window `w` (at index position `pos`) not read yet."""
        unknown = np.flatnonzero((w["node"] == NODE_UNKNOWN) & (w["flags"] != DELETED))
        if not len(unknown):
            return
        intern = self._nodes.intern
        nodes = w["node"]
        for p, buf, o, ln, hdr in self._frames([pos + int(u) for u in unknown]):
            nodes[p - pos] = intern(frame_fields(buf, o, ln, hdr)[0])

    def read_opts(
        self, from_seq: int, opts: ReadOpts, *, now: int, limit: int | None = None, used: int = 0
    ) -> ReadResult:
        """:meth:`read` from `from_seq` with the options `opts` (`limit`, when given,
        in place of `opts.limit`)."""
        return self.read(
            from_seq,
            opts.limit if limit is None else limit,
            opts.budget,
            now=now,
            nodes=opts.nodes,
            include_tags=opts.include_tags,
            include_meta=opts.include_meta,
            include_data=opts.include_data,
            used=used,
        )

    def read(
        self,
        from_seq: int,
        limit: int,
        budget: int,
        *,
        now: int,
        nodes: list[str] | None = None,
        include_tags: bool = False,
        include_meta: bool = True,
        include_data: bool = True,
        fields: bool = False,
        used: int = 0,
    ) -> ReadResult:
        """One pass of the read pipeline (retention applied by the caller).

        With `fields`, `records` holds `(seq, ts, node, tag, data, meta)` tuples
        (raw JSON bytes for data/meta) instead of rendered wire objects.

        `limit` bounds delivered records (>= 1), `budget` the payload bytes (at least
        one record is always delivered when any is deliverable, unless `used`, the
        payload bytes an earlier pass of the same response delivered, is not 0). Skipped slots
        (expired, deleted, own-node) advance the cursor; a budget stop does not step
        over the record that did not fit. Raises FrameCorrupt when a segment frame
        does not verify, OSError when it cannot be read.
        """
        H = self.head_seq
        E = self.earliest_seq
        F = self.evict_floor
        tomb: Tombstone | None = None
        cur = from_seq
        if from_seq > H:
            tomb = Tombstone(1, H, "recreated", max(H, 1), E, H)
            cur = E - 1
        elif from_seq + 1 < F:
            tomb = Tombstone(
                from_seq + 1, F - 1, self.reason_for(from_seq + 1), F - 1 - from_seq, F, H
            )
            cur = max(E - 1, from_seq)
        stop = H  # the loop reads up to here: just before the next lost range
        for lo, hi in self.lost:
            if hi <= cur or hi < F:
                continue
            if lo <= cur + 1:
                if tomb is None:
                    tomb = Tombstone(cur + 1, hi, "corrupt", hi - cur, E, H)
                    cur = hi
                    continue
                stop = min(stop, cur)
            else:
                stop = min(stop, lo - 1)
            break
        idx = self.index
        base = idx.base_seq
        nxt = cur
        if cur + 1 < base:
            # Seqs below base_seq have no slot: the cursor passes them unexamined.
            nxt = min(base - 1, H)
        # Own-node records are skipped by interned node id. Slots loaded from disk
        # learn their node only when a filtered read first resolves them, so the ids
        # are looked up again after each window is resolved (a node this process has
        # not seen yet may be in the window).
        own = nodes if nodes and self.config.dedupe_node else None
        cutoff = now - self.config.ttl_ms if self.config.ttl_ms > 0 else None
        out: list[bytes] = []
        seqs: list[int] = []
        first = used == 0
        scanned = 0
        sources = self.sources
        node_json = self._nodes.json_by_bytes
        # The first window is sized to what the read still wants; windows double
        # while skipped records leave it short, up to READ_CHUNK slots.
        span = limit + 16
        while len(out) < limit and nxt < stop:
            pos = nxt + 1 - base
            count = min(stop - nxt, READ_CHUNK, span)
            span *= 2
            w = idx.window(pos, count)
            flags = w["flags"]
            skip = flags == DELETED
            if cutoff is not None and cutoff > 0:
                skip |= w["ts"] < cutoff
            if own is not None:
                self._resolve_nodes(w, pos)
                ids = [i for i in map(self._nodes.lookup, own) if i]
                if ids:
                    skip |= np.isin(w["node"], np.array(ids, dtype=np.uint32))
            deliver = np.flatnonzero(~skip)
            want = limit - len(out)
            stop_pos = count - 1  # last examined position in this chunk
            stopped = False
            if len(deliver):
                b = w["bytes"][deliver].astype(np.int64)
                cs = np.cumsum(b) + used
                fit = int(np.searchsorted(cs, budget, side="right"))
                if first and not out and fit == 0:
                    fit = 1  # a single oversized record cannot wedge the cursor
                take = min(want, fit)
                if take == want:
                    # Limit reached: the loop ends right after the last delivered record.
                    stopped = True
                    stop_pos = int(deliver[take - 1])
                elif take < len(deliver):
                    # Budget stop: examined up to the slot before the blocked record.
                    stopped = True
                    stop_pos = int(deliver[take]) - 1
                if take:
                    chosen = deliver[:take]
                    used = int(cs[take - 1])
                    c_locs = w["loc"][chosen]
                    # Lists or int64 arrays, whichever the renderer at hand takes best.
                    c_seqs: Any
                    c_offs: Any
                    c_lens: Any
                    c_ts: Any
                    if fields or take < NATIVE_MIN_RUN:
                        # Lists: what the Python loops index fastest.
                        c_seqs = (chosen + (nxt + 1)).tolist()
                        c_offs = w["offset"][chosen].tolist()
                        c_lens = w["len"][chosen].tolist()
                        c_ts = w["ts"][chosen].tolist()
                    else:
                        # int64 arrays: what the compiled renderer takes without copying.
                        c_seqs = chosen + (nxt + 1)
                        c_offs = w["offset"][chosen].astype(np.int64)
                        c_lens = w["len"][chosen].astype(np.int64)
                        c_ts = w["ts"][chosen].astype(np.int64)
                    cuts = [0, *(np.flatnonzero(c_locs[1:] != c_locs[:-1]) + 1).tolist(), take]
                    for a, z in zip(cuts, cuts[1:], strict=False):
                        src = sources[int(c_locs[a])]
                        run = (c_seqs[a:z], c_offs[a:z], c_lens[a:z], c_ts[a:z])
                        if fields:
                            collect_fields(src, *run, out)
                        else:
                            render_frames(
                                src,
                                *run,
                                out,
                                node_json,
                                include_tags=include_tags,
                                include_meta=include_meta,
                                include_data=include_data,
                            )
                    seqs.extend(c_seqs if isinstance(c_seqs, list) else c_seqs.tolist())
            scanned += stop_pos + 1
            nxt = nxt + stop_pos + 1
            if stopped:
                break
        return ReadResult(out, nxt, H, E, tomb, scanned, seqs, used)

    # ---------------------------------------------------------------- lookup

    def seq_for_ts(self, ts: int) -> int:
        """The first retained seq whose commit time is >= `ts` (ms), or head + 1.

        A binary search on the slots' `ts` column (non-decreasing in seq); the seq
        found may be deleted: read from it for the first live record.
        """
        idx = self.index
        start = max(self.earliest_seq - idx.base_seq, 0)
        tss = idx.view()["ts"][start:]
        return idx.base_seq + start + int(np.searchsorted(tss, ts, side="left"))

    def slot_live(self, seq: int) -> bool:
        """True if `seq` is published, retained and not deleted."""
        idx = self.index
        p = seq - idx.base_seq
        if p < 0 or p >= len(idx) or seq < self.earliest_seq:
            return False
        return bool(idx.window(p, 1)["flags"][0] != DELETED)

    def get_record(self, seq: int) -> tuple[int, int, Payload] | None:
        """(ts, hops, payload) of a live seq, or None.

        Raises FrameCorrupt / OSError when its frame cannot be read back.
        """
        if not self.slot_live(seq):
            return None
        idx = self.index
        p = seq - idx.base_seq
        row = idx.window(p, 1)[0]
        for _p, buf, o, ln, hdr in self._frames([p]):
            node, tag, data, meta = frame_fields(buf, o, ln, hdr)
            ts = int(row["ts"])
            return ts, int(row["hops"]), Payload.build(seq, ts, node, tag, data, meta)
        return None

    # ---------------------------------------------------------------- delete

    def delete_seqs(self, seqs: list[int]) -> int:
        """Permanently delete the given live seqs; returns how many were live."""
        idx = self.index
        base = idx.base_seq
        n = len(idx)
        count = 0
        nbytes = 0
        arr = idx.view()
        fl = arr["flags"]
        by = arr["bytes"]
        claim = self.ckpt_claim
        for s in seqs:
            p = s - base
            if p < 0 or p >= n or fl[p] == DELETED:
                continue
            count += 1
            nbytes += int(by[p])
            fl[p] = DELETED
            by[p] = 0
            if s <= claim:
                self.flip_seqs.append(s)
        if count:
            self._sub_live(count, nbytes)
            self._reclaim_front()
        return count

    def delete_range(self, upto: int) -> int:
        """Delete every live seq < `upto` (a `before_seq`-only delete); returns the count."""
        count = self._drop_prefix(upto - self.index.base_seq)
        self._reclaim_front()
        return count

    def drop_all(self) -> None:
        """Release everything held by this instance (topic delete)."""
        self._sub_live(self.live_count, self.live_bytes)
        self.index.clear_to(self.head_seq + 1)
        self.sources.clear()
        self._chunks.clear()
        self._tags = TagIndex()
        self.flip_seqs.clear()
        self.dedupe.clear()
        self.router_keys.clear()
        self.alive = False
