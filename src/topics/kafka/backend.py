"""Every access the Kafka listener makes to the topics engine, in one place.

The rest of `topics.kafka` never imports engine modules: it calls
:class:`KafkaBackend`. The engine pieces used here are the public ones:
`Engine.get` / `require` / `put_topic` / `delete_topic` / `begin_write` /
`prepare_read` / `begin_delete` / `topics` (names only) / `limits`, the
node's commit log (`Node.barrier`, `Node.open_request`, `wait_published`),
`WriteRequest`, `NewRecord`, `valid_topic_name`, `parse_topic_config`, and on a
topic `head_seq`,
`earliest_seq`, `evict_floor`, `live_count`, `topic_id`,
`config.durability`, `read(..., fields=True)` (the read pipeline returning
raw `(seq, ts, node, tag, data, meta)` tuples, no JSON rendering), `seq_for_ts`
(a binary search on the index's ts column), `get_record` and `listeners`; on a
staged write `first_seq`, `ts` and `ok`.

All calls happen on the event loop that owns the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from topics.config import KAFKA_CODECS
from topics.engine.core import Engine, WriteRequest
from topics.engine.names import valid_topic_name
from topics.engine.records import NewRecord
from topics.errors import TopicsError
from topics.kafka.naming import SEP, is_partition_name, partition_name
from topics.node import Node, wait_published

__all__ = ["KafkaBackend", "BackendError", "Partition", "Stored", "Staged"]

READ_LIMIT = 10_000


class BackendError(Exception):
    """An engine refusal: HTTP-style `status` and `code` (docs/API.md, "3.3 Every error code") plus message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _wrap(exc: TopicsError) -> BackendError:
    return BackendError(exc.status, exc.code, exc.message)


@dataclass(frozen=True, slots=True)
class Partition:
    """Watermarks of a topic instance (docs/API.md, "8. Reading: diff, cursors and pagination"): seqs,
    not Kafka offsets."""

    instance: int
    head_seq: int
    earliest_seq: int
    evict_floor: int
    durability: str


class Stored(NamedTuple):
    """One live stored record as the Kafka side needs it."""

    seq: int
    ts: int
    tag: str | None
    data: bytes
    meta: bytes | None


class Staged:
    """A write handed to the engine: seqs are assigned, the commit may be pending."""

    __slots__ = ("_pw",)

    def __init__(self, pw: Any) -> None:
        self._pw = pw

    @property
    def first_seq(self) -> int:
        return int(self._pw.first_seq)

    @property
    def ts(self) -> int:
        return int(self._pw.ts)

    async def committed(self) -> bool:
        """Wait for the durability-class commit point; True when it succeeded."""
        await wait_published(self._pw)
        return bool(self._pw.ok)


class KafkaBackend:
    """The Kafka listener's view of the :class:`~topics.engine.core.Engine` of one node."""

    def __init__(self, node: Node, hidden: frozenset[str] = frozenset()) -> None:
        self.node = node
        self.engine: Engine = node.engine
        self.hidden = hidden
        lim = self.engine.limits
        self.max_batch_records = lim.max_batch_records
        self.max_tag_bytes = lim.max_tag_bytes
        self.max_meta_bytes = lim.max_meta_bytes
        self.max_record_bytes = lim.max_record_bytes
        #: Kafka codec id of fetched batches (docs/KAFKA.md "Records").
        self.fetch_codec = KAFKA_CODECS.index(node.config.kafka_fetch_compression)

    # ----------------------------------------------------------------- topics

    @staticmethod
    def valid_name(name: str) -> bool:
        return valid_topic_name(name)

    def names(self) -> list[str]:
        """Every stored name that is a Kafka topic (partition 0), internal ones
        excepted, sorted (docs/KAFKA.md, "Partitions")."""
        return sorted(
            n for n in self.engine.topics if n not in self.hidden and not is_partition_name(n)
        )

    def partition_count(self, base: str) -> int:
        """Partitions of the Kafka topic stored as `base`: the length of the run
        `base`, `base:1`, `base:2`, ... of existing topics (0 when `base` is absent)."""
        topics = self.engine.topics
        if base not in topics:
            return 0
        n = 1
        while partition_name(base, n) in topics:
            n += 1
        return n

    def partition_topics(self, base: str) -> list[str]:
        """Every existing stored name `base:<n>` (n >= 1), in partition order, gaps included."""
        head = base + SEP
        found = [
            n
            for n in self.engine.topics
            if n.startswith(head) and is_partition_name(n) and n.rfind(SEP) == len(base)
        ]
        return sorted(found, key=lambda n: int(n[len(head) :]))

    @staticmethod
    def default_config() -> dict[str, Any]:
        """The `/v0` config object of a topic created with `{}` (docs/API.md, "5. The topic config object")."""
        from topics.engine.topic_config import parse_topic_config

        return dict(parse_topic_config({}).to_wire())

    def config_body(self, name: str) -> dict[str, Any] | None:
        """The `/v0` config object of `name` (docs/API.md, "5. The topic config object"), or None."""
        t = self.engine.get(name)
        return None if t is None else dict(t.config.to_wire())

    def partition(self, name: str) -> Partition | None:
        """Watermarks of `name` (retention applied first), or None when absent."""
        t = self.engine.get(name)
        if t is None:
            return None
        self.engine.prepare_read(t, consume=False)
        return Partition(t.topic_id, t.head_seq, t.earliest_seq, t.evict_floor, t.config.durability)

    async def _barrier(self) -> None:
        try:
            await self.node.barrier()
        except TopicsError as exc:
            raise _wrap(exc) from None

    async def create(self, name: str, config: dict[str, Any]) -> bool:
        """Create `name` with a `/v0` config body (docs/API.md, "5. The topic config object"); False if it exists.

        Raises :class:`BackendError` (400 bad name/config, 429 topic cap, 500 log
        failure). Returns once the create is durable.
        """
        if self.engine.get(name) is not None:
            return False
        try:
            _, created = self.engine.put_topic(name, config)
        except TopicsError as exc:
            raise _wrap(exc) from None
        await self._barrier()
        return created

    @staticmethod
    def check_config(name: str, config: dict[str, Any]) -> None:
        """Validate a config body without creating anything (400 -> BackendError)."""
        from topics.engine.topic_config import parse_topic_config

        try:
            parse_topic_config(config, name)
        except TopicsError as exc:
            raise _wrap(exc) from None

    async def delete(self, name: str) -> bool:
        """Delete the topic instance `name` (docs/API.md, "6.4 `DELETE /v0/topics/:topic`"); False when absent."""
        try:
            res = self.engine.delete_topic(name)
        except TopicsError as exc:
            raise _wrap(exc) from None
        await self._barrier()
        return bool(res.get("deleted"))

    async def reconfigure(self, name: str, config: dict[str, Any]) -> None:
        """Replace the whole config of the existing topic `name` with a `/v0` config
        body, as `PUT /v0/topics/:topic` does (docs/API.md, "6.1 `PUT /v0/topics/:topic`":
        a field left out goes back to its default). Returns once the change is durable.

        Raises :class:`BackendError`: 404 topic_not_found when `name` is absent,
        400 a bad config, 409 a `type` change, 500 the change could not be logged.
        """
        if self.engine.get(name) is None:
            raise BackendError(404, "topic_not_found", f"topic {name!r} does not exist")
        try:
            self.engine.put_topic(name, config)
        except TopicsError as exc:
            raise _wrap(exc) from None
        await self._barrier()

    # ------------------------------------------------------------------ write

    def append(self, name: str, records: list[NewRecord], *, create: bool = False) -> Staged:
        """Stage one atomic write of `records` (contiguous seqs) to an existing topic.

        Raises :class:`BackendError`: 404 topic_not_found, 400 record/batch too
        large, 422 topic_full, 429 throttled, 500 internal.
        """
        req = WriteRequest(records, None, None if create else False, None, False)
        try:
            res = self.engine.begin_write(name, req)
        except TopicsError as exc:
            raise _wrap(exc) from None
        if not hasattr(res, "first_seq"):  # only keyed writes can be replays
            raise BackendError(500, "internal", "unexpected write outcome")
        return Staged(res)

    # ------------------------------------------------------------------- read

    def read(
        self, name: str, from_seq: int, max_bytes: int, limit: int = READ_LIMIT
    ) -> list[Stored]:
        """Live records with seq > `from_seq`, oldest first, about `max_bytes` of payload.

        At least one record is returned when one exists. Deleted and expired seqs
        are skipped (retention is applied first). The caller has already checked
        `from_seq` against the watermarks.
        """
        t = self.engine.get(name)
        if t is None:
            return []
        now = self.engine.prepare_read(t)
        r = t.read(from_seq, limit, max(max_bytes, 1), now=now, fields=True)
        return [Stored(s, ts, tag, data, meta) for s, ts, _node, tag, data, meta in r.records]

    def first_at_or_after(self, name: str, seq: int) -> Stored | None:
        """The first live record with seq >= `seq`, or None."""
        got = self.read(name, seq - 1, 1, 1)
        return got[0] if got else None

    def seq_for_time(self, name: str, ts: int) -> Stored | None:
        """The first live record whose `$ts` >= `ts` (ts is non-decreasing in seq).

        A binary search on the index's `ts` column, then one read from there.
        """
        t = self.engine.get(name)
        if t is None:
            return None
        self.engine.prepare_read(t, consume=False)
        s = t.seq_for_ts(ts)
        return self.first_at_or_after(name, s) if s <= t.head_seq else None

    def last_record(self, name: str) -> Stored | None:
        """The newest live record (it has the largest `$ts`), or None."""
        t = self.engine.get(name)
        if t is None:
            return None
        s = t.head_seq
        stop = max(t.earliest_seq, s - 10_000)
        while s >= stop:
            rec = t.get_record(s)
            if rec is not None:
                ts, _h, p = rec
                return Stored(s, ts, p.tag, p.data, p.meta)
            s -= 1
        return None

    def watch(self, names: list[str], wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake()` on the next publish/delete/config change of any of `names`.

        Returns the function that removes the listeners again. Topics created
        after the call are not watched (the caller's timeout covers them).
        """
        cb = lambda _t: wake()  # noqa: E731
        topics = [t for t in (self.engine.get(n) for n in set(names)) if t is not None]
        for t in topics:
            t.listeners.add(cb)

        def unwatch() -> None:
            for t in topics:
                t.listeners.discard(cb)

        return unwatch

    # --------------------------------------------------------- internal topics

    async def append_internal(self, name: str, docs: list[bytes]) -> int:
        """Durably append JSON documents to an internal `fsync` topic (created on need).

        Returns the first seq. Raises :class:`BackendError` when the write is
        refused or its commit fails.
        """
        recs = [NewRecord(d, None, None, None, len(d)) for d in docs]
        first = 0
        for i in range(0, len(recs), self.max_batch_records):
            req = WriteRequest(
                recs[i : i + self.max_batch_records], None, True, {"durability": "fsync"}, True
            )
            try:
                pw = self.engine.begin_write(name, req)
            except TopicsError as exc:
                raise _wrap(exc) from None
            st = Staged(pw)
            if not first:
                first = st.first_seq
            if not await st.committed():
                raise BackendError(500, "internal", "the write could not be committed to the log")
        await self._barrier()
        return first

    def scan_internal(self, name: str) -> Iterator[bytes]:
        """Every live document of an internal topic, oldest first."""
        cur = 0
        while True:
            got = self.read(name, cur, 1 << 22)
            if not got:
                return
            for s in got:
                yield s.data
            cur = got[-1].seq

    def count(self, name: str) -> int:
        """Live records of `name` (0 when absent)."""
        t = self.engine.get(name)
        return int(t.live_count) if t is not None else 0

    def live_bytes(self, name: str) -> int:
        """Payload bytes of the live records of `name` (0 when absent)."""
        t = self.engine.get(name)
        return int(t.live_bytes) if t is not None else 0

    def head_seq(self, name: str) -> int | None:
        """`head_seq` of `name` as it stands (no retention pass), or None when absent."""
        t = self.engine.get(name)
        return int(t.head_seq) if t is not None else None

    async def delete_before(self, name: str, seq: int) -> None:
        """Permanently delete every record of `name` below `seq` (logged, durable)."""
        if self.engine.get(name) is None:
            return
        try:
            self.engine.begin_delete(name, {"before_seq": seq})
        except TopicsError as exc:
            raise _wrap(exc) from None
        await self._barrier()
