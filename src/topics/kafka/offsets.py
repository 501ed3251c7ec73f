"""Committed consumer-group offsets, kept durable in an internal topics topic.

Every OffsetCommit is one atomic write of one JSON document per partition to
the `fsync`-class topic :data:`OFFSETS_TOPIC`, acknowledged only after its
`fdatasync` (through the engine's normal write path, so the WAL and recovery
cover it). At startup, after recovery, the documents are replayed in seq order
and the last one per (tenant, group, topic, partition) wins. Deleting offsets
(DeleteGroups, OffsetDelete) writes one tombstone document per key, the same
key with `"deleted": true` and no offset, which removes the key when replayed.

Compaction: when the topic holds many more documents than there are live
keys, the current table is written again as one batch and everything before
that batch is deleted (a logged, permanent record delete). Compaction only
starts while no commit or delete is in flight, so every document below the
new batch, tombstones included, is already reflected in it (a deleted key is
simply absent from the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import orjson

from topics.kafka.backend import KafkaBackend

__all__ = ["OffsetStore", "OFFSETS_TOPIC", "Committed", "internal_topics"]

log = logging.getLogger("topics.kafka")

OFFSETS_TOPIC = "topics.kafka.offsets"
COMPACT_MIN = 1000

Key = tuple[str, str, str, int]  # tenant, group, topic, partition
Committed = tuple[int, str | None, int]  # offset, metadata, leader epoch


def internal_topics() -> frozenset[str]:
    """Names the listener keeps for itself (hidden from Kafka clients)."""
    return frozenset({OFFSETS_TOPIC})


class OffsetStore:
    """The committed-offset table of every group, backed by :data:`OFFSETS_TOPIC`."""

    def __init__(self, backend: KafkaBackend) -> None:
        self.backend = backend
        self.table: dict[Key, Committed] = {}
        self._inflight = 0
        self._compacting = False
        # (tenant, group) -> one future per write of that group still in progress
        self._writing: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

    @contextlib.contextmanager
    def _write_of(self, tenant: str, group: str) -> Iterator[None]:
        """Mark a write of the group in progress until the block ends (see :meth:`settled`)."""
        key = (tenant, group)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writing.setdefault(key, set()).add(mine)
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1
            mine.set_result(None)
            left = self._writing[key]
            left.discard(mine)
            if not left:
                del self._writing[key]

    async def settled(self, tenant: str, group: str) -> None:
        """Wait until every write of the group that started before this call has
        finished (applied or failed): OffsetFetch reads after the commits that
        arrived before it, as if they had been handled one after the other
        (docs/KAFKA.md, "Consumer groups")."""
        earlier = self._writing.get((tenant, group))
        if earlier:
            await asyncio.wait(set(earlier))

    def load(self) -> int:
        """Replay the offsets topic (call once, after recovery); returns documents read."""
        n = 0
        for raw in self.backend.scan_internal(OFFSETS_TOPIC):
            n += 1
            try:
                d = orjson.loads(raw)
                key = (d["tenant"], d["group"], d["topic"], int(d["partition"]))
                if d.get("deleted") is True:
                    self.table.pop(key, None)
                else:
                    self.table[key] = (
                        int(d["offset"]),
                        d.get("metadata"),
                        int(d.get("epoch", -1)),
                    )
            except (ValueError, KeyError, TypeError):
                log.warning("kafka: skipping a malformed committed-offset document")
        return n

    @staticmethod
    def _doc(key: Key, c: Committed) -> bytes:
        return orjson.dumps(
            {
                "tenant": key[0],
                "group": key[1],
                "topic": key[2],
                "partition": key[3],
                "offset": c[0],
                "metadata": c[1],
                "epoch": c[2],
            }
        )

    async def commit(
        self, tenant: str, group: str, entries: list[tuple[str, int, Committed]]
    ) -> None:
        """Durably record `entries` (topic, partition, committed) for one group.

        Raises :class:`~topics.kafka.backend.BackendError` when the write fails;
        nothing is recorded then.
        """
        if not entries:
            return
        docs = [self._doc((tenant, group, t, p), c) for t, p, c in entries]
        with self._write_of(tenant, group):
            await self.backend.append_internal(OFFSETS_TOPIC, docs)
            for t, p, c in entries:
                self.table[(tenant, group, t, p)] = c
        await self._maybe_compact()

    @staticmethod
    def _tombstone(key: Key) -> bytes:
        return orjson.dumps(
            {
                "tenant": key[0],
                "group": key[1],
                "topic": key[2],
                "partition": key[3],
                "deleted": True,
            }
        )

    async def delete(
        self, tenant: str, group: str, partitions: list[tuple[str, int]] | None = None
    ) -> list[tuple[str, int]]:
        """Durably forget the group's committed offsets of `partitions` (every
        one of the group's when None); returns the (topic, partition) pairs that
        had an offset, in order. One atomic write of a tombstone per such key;
        nothing is written when there is none.

        Raises :class:`~topics.kafka.backend.BackendError` when the write fails;
        nothing is forgotten then.
        """
        if partitions is None:
            partitions = self.committed_partitions(tenant, group)
        keys = list(
            dict.fromkeys(
                (tenant, group, t, p) for t, p in partitions if (tenant, group, t, p) in self.table
            )
        )
        if not keys:
            return []
        with self._write_of(tenant, group):
            await self.backend.append_internal(OFFSETS_TOPIC, [self._tombstone(k) for k in keys])
            for k in keys:
                self.table.pop(k, None)
        await self._maybe_compact()
        return [(k[2], k[3]) for k in keys]

    def groups(self, tenant: str) -> set[str]:
        """Every group of `tenant` with at least one committed offset."""
        return {k[1] for k in self.table if k[0] == tenant}

    def has_group(self, tenant: str, group: str) -> bool:
        """Does the group have at least one committed offset?"""
        return any(k[0] == tenant and k[1] == group for k in self.table)

    def get(self, tenant: str, group: str, topic: str, partition: int) -> Committed | None:
        return self.table.get((tenant, group, topic, partition))

    def committed_partitions(self, tenant: str, group: str) -> list[tuple[str, int]]:
        """Every (topic, partition) the group has an offset for, sorted."""
        return sorted((k[2], k[3]) for k in self.table if k[0] == tenant and k[1] == group)

    async def _maybe_compact(self) -> None:
        if self._compacting or self._inflight:
            return
        held = self.backend.count(OFFSETS_TOPIC)
        if held < max(COMPACT_MIN, 4 * len(self.table)):
            return
        self._compacting = True
        try:
            snapshot = [self._doc(k, c) for k, c in self.table.items()]
            first = await self.backend.append_internal(OFFSETS_TOPIC, snapshot)
            await self.backend.delete_before(OFFSETS_TOPIC, first)
            log.info("kafka: compacted committed offsets to %d documents", len(snapshot))
        except Exception as exc:  # compaction is an optimisation; commits stay correct
            log.warning("kafka: offset compaction failed: %s", exc)
        finally:
            self._compacting = False

    def stats(self) -> dict[str, Any]:
        return {"keys": len(self.table), "documents": self.backend.count(OFFSETS_TOPIC)}
