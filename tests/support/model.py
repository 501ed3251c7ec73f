"""A small, deliberately naive reference model of ONE topic instance.

Written straight from `/work/shared/spec/SEMANTICS.md` (§1.3 byte accounting,
§2 seqs, §3 floors, §4 lazy front reclaim, §5 retention, §6 the read pipeline,
§7 tombstones, §8 deletes, §9 node filtering) and API §4-6, with no shortcuts:
plain Python lists, linear scans, the §6 pseudo-code transcribed slot by slot.

The model never forgets a record: `slots[s - 1]` is seq `s` forever, together
with its fate (`deleted` = voluntary removal, `lost` = involuntary removal while
still live, with the floor that caused it). "Physically retained" is modelled by
`base_seq` exactly as the spec describes it: seqs below it have no slot.

It is used by the stateful property test as the oracle for the real engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "MRecord",
    "MTombstone",
    "MRead",
    "ModelError",
    "TopicModel",
    "record_bytes",
]

DEFAULT_LIMIT = 256
MAX_LIMIT = 1000
DEFAULT_BUDGET = 1_048_576
MAX_BUDGET = 8_388_608


def record_bytes(data: Any, meta: Any = None) -> int:
    """SEMANTICS §1.3: compact JSON of `data` plus compact JSON of `meta` when present."""
    n = len(orjson.dumps(data))
    if meta is not None:
        n += len(orjson.dumps(meta))
    return n


class ModelError(Exception):
    """A write the spec refuses (API §4 admission): `status` and `code` as on the wire."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"{status} {code}")
        self.status = status
        self.code = code


@dataclass
class MRecord:
    seq: int
    ts: int
    data: Any
    node: str | None
    tag: str | None
    meta: Any  # None = absent
    bytes: int
    deleted: bool = False  # voluntary removal (§8)
    lost: str | None = None  # "cap" / "ttl": removed involuntarily while live (§5)

    @property
    def live(self) -> bool:
        return not self.deleted and self.lost is None


@dataclass
class MTombstone:
    gap_from: int
    gap_to: int
    reason: str
    missed_estimate: int
    earliest_seq: int
    head_seq: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "gap_from": self.gap_from,
            "gap_to": self.gap_to,
            "reason": self.reason,
            "missed_estimate": self.missed_estimate,
            "earliest_seq": self.earliest_seq,
            "head_seq": self.head_seq,
        }


@dataclass
class MRead:
    records: list[dict[str, Any]]
    seqs: list[int]
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    evict_floor: int
    caught_up: bool
    tombstone: MTombstone | None
    lag: int
    scanned: int


@dataclass
class TopicModel:
    """One topic instance (SEMANTICS §1.1) with config fields relevant to logs."""

    ttl_ms: int = 0
    cap_records: int = 0
    cap_bytes: int = 0
    discard: str = "old"
    dedupe_node: bool = True

    slots: list[MRecord] = field(default_factory=list)  # slots[s - 1] is seq s
    head_seq: int = 0
    base_seq: int = 1
    l_cap: int = 0
    l_ttl: int = 0
    delete_below: int = 0
    last_ts: int = 0

    # ------------------------------------------------------------ floors (§3.1)

    @property
    def l_del(self) -> int:
        return max(self.delete_below - 1, 0)

    @property
    def evict_floor(self) -> int:
        return min(max(max(self.l_cap, self.l_ttl) + 1, 1), self.head_seq + 1)

    @property
    def earliest_seq(self) -> int:
        return min(
            max(max(self.l_cap, self.l_ttl, self.l_del) + 1, 1, self.base_seq),
            self.head_seq + 1,
        )

    def rec(self, seq: int) -> MRecord:
        """The record ever written at `seq` (whatever its fate)."""
        assert 1 <= seq <= self.head_seq
        return self.slots[seq - 1]

    def index(self, seq: int) -> MRecord | None:
        """The slot for `seq`, or None when it is not physically retained (§4)."""
        if seq < self.base_seq or seq > self.head_seq:
            return None
        return self.slots[seq - 1]

    @property
    def live_count(self) -> int:
        return sum(1 for r in self.slots if r.live)

    @property
    def live_bytes(self) -> int:
        return sum(r.bytes for r in self.slots if r.live)

    def reason_for(self, g: int) -> str:
        """§7.2 (no routers here, so L_trim = 0)."""
        cap = self.l_cap >= g and self.l_cap > 0
        ttl = self.l_ttl >= g and self.l_ttl > 0
        if cap and ttl:
            return "mixed"
        if cap:
            return "cap"
        if ttl:
            return "ttl"
        return "cap"

    # --------------------------------------------------------- retention (§5)

    def _lose_upto(self, floor: int, reason: str) -> None:
        for s in range(1, min(floor, self.head_seq) + 1):
            r = self.slots[s - 1]
            if r.live:
                r.lost = reason

    def reclaim(self) -> None:
        """§4 lazy front reclaim: pop leading slots below the floors or already deleted."""
        floor = max(self.l_cap, self.l_ttl, self.l_del)
        while self.base_seq <= self.head_seq and (
            self.base_seq <= floor or self.slots[self.base_seq - 1].deleted
        ):
            self.base_seq += 1

    def apply_retention(self, now: int) -> None:
        """§5.2, literally."""
        if self.ttl_ms > 0:
            # maximal expired prefix of retained slots, scanning from base_seq;
            # deleted slots count by their ts too.
            last = 0
            for s in range(self.base_seq, self.head_seq + 1):
                if now - self.slots[s - 1].ts > self.ttl_ms:
                    last = s
                else:
                    break
            if last > self.l_ttl:
                self.l_ttl = last
                self._lose_upto(self.l_ttl, "ttl")
        if self.cap_records > 0 and self.head_seq > self.cap_records:
            self.l_cap = max(self.l_cap, self.head_seq - self.cap_records)
            self._lose_upto(self.l_cap, "cap")
        if self.cap_bytes > 0 and self.live_bytes > self.cap_bytes:
            excess = self.live_bytes - self.cap_bytes
            skip_upto = max(self.l_cap, self.l_ttl)
            last = 0
            for s in range(self.base_seq, self.head_seq + 1):
                if s <= skip_upto:
                    continue
                r = self.slots[s - 1]
                excess -= r.bytes if r.live else 0
                last = s
                if excess <= 0:
                    break
            self.l_cap = max(self.l_cap, last)
            self._lose_upto(self.l_cap, "cap")
        self.reclaim()

    # -------------------------------------------------------------- write (§2)

    def write(
        self,
        records: list[dict[str, Any]],
        now: int,
        batch_node: str | None = None,
    ) -> list[int]:
        """Append a batch atomically; returns its seqs. Raises ModelError on refusal.

        `records` items are write-body records: `data` plus optional `node`, `tag`,
        `meta` (a per-record `node` overrides `batch_node`).
        """
        self.apply_retention(now)
        sizes = [record_bytes(r["data"], r.get("meta")) for r in records]
        n = len(records)
        if self.discard == "reject":
            nbytes = sum(sizes)
            if (self.cap_bytes and nbytes > self.cap_bytes) or (
                self.cap_records and n > self.cap_records
            ):
                raise ModelError(400, "record_too_large")
            # cap_records is a seq window (§5.2 [src]); to never drop an acked record
            # (§19.11) a reject topic also refuses a batch whose window would pass
            # the first live seq.
            if (
                self.cap_records
                and (
                    self.live_count + n > self.cap_records
                    or self.earliest_seq <= self.head_seq + n - self.cap_records
                )
            ) or (self.cap_bytes and self.live_bytes + nbytes > self.cap_bytes):
                raise ModelError(422, "topic_full")
        ts = max(now, self.last_ts)
        self.last_ts = ts
        seqs = []
        for r, size in zip(records, sizes, strict=True):
            node = r.get("node")
            if node is None:
                node = batch_node
            seq = self.head_seq + 1
            self.slots.append(MRecord(seq, ts, r["data"], node, r.get("tag"), r.get("meta"), size))
            self.head_seq = seq
            seqs.append(seq)
        self.apply_retention(now)  # discard:"old" eviction after publish
        return seqs

    # --------------------------------------------------------------- read (§6)

    def project(self, r: MRecord, include_tags: bool, include_meta: bool) -> dict[str, Any]:
        """API §1.6 record object, in wire field order."""
        out: dict[str, Any] = {"$seq": r.seq, "$ts": r.ts}
        if r.node is not None:
            out["$node"] = r.node
        if include_tags and r.tag is not None:
            out["$tag"] = r.tag
        out["data"] = r.data
        if include_meta and r.meta is not None:
            out["meta"] = r.meta
        return out

    def read(
        self,
        from_seq: int,
        limit: int,
        nodes: list[str] | None,
        budget: int,
        now: int,
        *,
        include_tags: bool = False,
        include_meta: bool = True,
    ) -> MRead:
        """The §6 pseudo-code, slot by slot (routers: none)."""
        self.apply_retention(now)
        limit = DEFAULT_LIMIT if limit == 0 else min(limit, MAX_LIMIT)
        budget = DEFAULT_BUDGET if budget == 0 else min(budget, MAX_BUDGET)
        H = self.head_seq
        E = self.earliest_seq
        F = self.evict_floor
        node_set = nodes if self.dedupe_node else None
        tomb: MTombstone | None = None
        cur = from_seq
        if from_seq > H:
            tomb = MTombstone(1, H, "recreated", max(H, 1), E, H)
            cur = E - 1
        elif from_seq + 1 < F:
            tomb = MTombstone(
                from_seq + 1,
                F - 1,
                self.reason_for(from_seq + 1),
                F - 1 - from_seq,
                F,
                H,
            )
            cur = max(E - 1, from_seq)
        out: list[dict[str, Any]] = []
        seqs: list[int] = []
        nxt = cur
        used = 0
        scanned = 0
        s = cur + 1
        while s <= H and len(out) < limit:
            slot = self.index(s)
            if slot is None:
                nxt = s
            elif self.ttl_ms > 0 and now - slot.ts > self.ttl_ms:
                scanned += 1
                nxt = s
            elif slot.deleted:
                scanned += 1
                nxt = s
            elif node_set and slot.node in node_set:
                scanned += 1
                nxt = s
            elif out and used + slot.bytes > budget:
                break
            else:
                assert slot.live, f"model: delivering non-live seq {s}"
                out.append(self.project(slot, include_tags, include_meta))
                seqs.append(s)
                used += slot.bytes
                scanned += 1
                nxt = s
            s += 1
        return MRead(
            records=out,
            seqs=seqs,
            next_from_seq=nxt,
            head_seq=H,
            earliest_seq=E,
            evict_floor=F,
            caught_up=nxt == H,
            tombstone=tomb,
            lag=H - nxt,
            scanned=scanned,
        )

    # ------------------------------------------------------------- deletes (§8)

    def _delete(self, victims: list[int]) -> int:
        for s in victims:
            self.slots[s - 1].deleted = True
        self.reclaim()
        return len(victims)

    def _response(self, deleted: int) -> dict[str, Any]:
        return {
            "deleted": deleted,
            "earliest_seq": self.earliest_seq,
            "head_seq": self.head_seq,
            "count": self.live_count,
            "bytes": self.live_bytes,
        }

    def delete_before(self, before_seq: int, now: int) -> dict[str, Any]:
        """`{"before_seq": n}` only: every live seq in [earliest_seq, B)."""
        self.apply_retention(now)
        bound = self.head_seq + 1
        b = min(before_seq, bound)
        victims = [s for s in range(self.earliest_seq, b) if self.rec(s).live]
        n = self._delete(victims)
        self.delete_below = max(self.delete_below, b)
        self.reclaim()
        return self._response(n)

    def _delete_tags(self, pred: Any, before_seq: int | None, now: int) -> dict[str, Any]:
        self.apply_retention(now)
        bound = self.head_seq + 1
        b = bound if before_seq is None else min(before_seq, bound)
        victims = [
            s
            for s in range(1, b)
            if self.rec(s).live and self.rec(s).tag is not None and pred(self.rec(s).tag)
        ]
        return self._response(self._delete(victims))

    def delete_tag_eq(self, value: str, now: int, before_seq: int | None = None) -> dict[str, Any]:
        """`match: ["tag","Eq",v]` (AND `before_seq` when given)."""
        return self._delete_tags(lambda t: t == value, before_seq, now)

    def delete_tag_prefix(
        self, prefix: str, now: int, before_seq: int | None = None
    ) -> dict[str, Any]:
        """`match: ["tag","Glob",prefix + "*"]` (AND `before_seq` when given)."""
        return self._delete_tags(lambda t: t.startswith(prefix), before_seq, now)

    def state(self, now: int) -> dict[str, Any]:
        """The watermark part of `GET /v0/topics/:t` after retention."""
        self.apply_retention(now)
        return {
            "head_seq": self.head_seq,
            "earliest_seq": self.earliest_seq,
            "next_seq": self.head_seq + 1,
            "count": self.live_count,
            "bytes": self.live_bytes,
        }
