"""Produce and InitProducerId: writing Kafka record batches as topics records.

Each partition (its own `/v0` topic: docs/KAFKA.md, "Partitions") has its
batches decoded, mapped to records (docs/KAFKA.md
"Records") and staged as atomic engine writes before the handler's first
await, so requests pipelined on one connection get their offsets in arrival
order. The answer waits for each write's durability-class commit point,
whatever the acks level (docs/KAFKA.md "Produce acknowledgements"). Kafka
offset = seq - 1; the log start offset is `earliest_seq - 1`.

Idempotent producers: InitProducerId hands out producer ids; per (producer
id, topic instance) :class:`~topics.kafka.producers.SequenceTable` answers a
retried batch with its original offset and refuses sequence gaps and old
epochs. Produce needs the `write` scope on the topic; InitProducerId needs
`write`. Transactions are not supported (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_WRITE
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.backend import BackendError, Staged
from topics.kafka.producers import Duplicate
from topics.kafka.records import RecordError, decode_batches, to_new_records
from topics.storage.reads import history_gate

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = ["produce", "refuse_produce", "init_producer_id"]

log = logging.getLogger("topics.kafka")


@dataclass(slots=True, eq=False)
class _Part:
    """One partition of a Produce request on its way through staging."""

    index: int
    error: int = E.NONE
    base: int = -1
    ts: int = -1
    staged: list[Staged] = field(default_factory=list)
    dups: list[Any] = field(default_factory=list)
    pids: list[tuple[int, int]] = field(default_factory=list)


def _stage_partition(
    broker: Broker, conn: ConnState, name: str, index: int, raw: bytes | None
) -> _Part:
    """Validate and stage partition `index` of Kafka topic `name` synchronously (no await)."""
    res = _Part(index)
    if not broker.allowed(conn, SCOPE_WRITE, conn.stored(name)):
        res.error = E.TOPIC_AUTHORIZATION_FAILED
        return res
    b = broker.backend
    name, part = broker.locate(conn, name, index)
    if part is None:
        res.error = E.UNKNOWN_TOPIC_OR_PARTITION
        return res
    try:
        batches = decode_batches(raw)
        mapped = [
            to_new_records(
                batch.records,
                max_tag_bytes=b.max_tag_bytes,
                max_meta_bytes=b.max_meta_bytes,
                max_record_bytes=b.max_record_bytes,
            )
            for batch in batches
        ]
    except RecordError as exc:
        log.info("kafka: produce to %r refused: %s", name, exc.message)
        res.error = exc.code
        return res
    seqs = broker.seqs
    for batch, recs in zip(batches, mapped, strict=True):
        pid = batch.producer_id
        if pid >= 0:
            verdict = seqs.check(
                pid, batch.producer_epoch, part.instance, batch.base_sequence, len(recs)
            )
            if isinstance(verdict, int):
                res.error = verdict
                return res
            if isinstance(verdict, Duplicate):
                res.dups.append(verdict.entry)
                if res.base < 0:
                    res.base, res.ts = verdict.entry[2], verdict.entry[3]
                continue
        mine: list[Staged] = []
        try:
            for i in range(0, len(recs), b.max_batch_records):
                mine.append(b.append(name, recs[i : i + b.max_batch_records]))
        except BackendError as exc:
            if mine:
                log.warning("kafka: batch to %r split by a refused chunk: %s", name, exc.message)
            res.staged.extend(mine)
            res.error = E.from_engine(E.WRITE, exc.code, exc.status)
            return res
        res.staged.extend(mine)
        first = mine[0].first_seq - 1
        if res.base < 0:
            res.base, res.ts = first, mine[0].ts
        if pid >= 0:
            seqs.record(
                pid,
                batch.producer_epoch,
                part.instance,
                batch.base_sequence,
                len(recs),
                first,
                mine[0].ts,
                mine,
            )
            res.pids.append((pid, part.instance))
    return res


async def produce(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """Produce: stage every partition, then answer once each write is committed.

    Returns None for acks=0 (no response). Per partition: base offset and
    log-append time of the first record, or the error code (-1 offsets).
    """
    R = P.RESPONSES[P.PRODUCE]
    TR = R.TopicProduceResponse
    PR = TR.PartitionProduceResponse
    # Stage every partition before the first await: requests pipelined on one
    # connection are staged (get their offsets) in arrival order.
    results: list[tuple[str, list[_Part]]] = []
    for td in req.topic_data:
        parts = []
        for pd in td.partition_data:
            if req.transactional_id is not None:
                r = _Part(pd.index)
                r.error = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            else:
                r = _stage_partition(broker, conn, td.name, pd.index, pd.records)
            parts.append(r)
        results.append((td.name, parts))
    if req.acks == 0:
        return None
    out = []
    for name, parts in results:
        prs = []
        for r in parts:
            ok = True
            with history_gate.write():
                for s in r.staged:
                    ok = await s.committed() and ok
                for entry in r.dups:
                    for s in entry[4]:
                        ok = await s.committed() and ok
            if not ok:
                for pid, inst in r.pids:
                    broker.seqs.forget(pid, inst)
                if r.error == E.NONE:
                    r.error = E.from_engine(E.WRITE, E.NOT_COMMITTED)
            part = broker.backend.partition(conn.stored(name, r.index)) if r.index >= 0 else None
            good = r.error == E.NONE
            prs.append(
                PR(
                    index=r.index,
                    error_code=r.error,
                    base_offset=r.base if good else -1,
                    log_append_time_ms=r.ts if good else -1,
                    log_start_offset=(part.earliest_seq - 1) if part is not None else -1,
                )
            )
        out.append(TR(name=name, partition_responses=prs))
    throttle = _throttle_ms(broker, [conn.stored(t.name) for t in req.topic_data])
    if throttle:
        # Kafka's own way to pace a producer: the answer comes that much later and
        # says so in throttle_time_ms (docs/KAFKA.md "Produce acknowledgements").
        await asyncio.sleep(throttle / 1000)
    return R(responses=out, throttle_time_ms=throttle)


def _throttle_ms(broker: Broker, names: list[str]) -> int:
    """The pressure ladder's wait for a Produce to `names` (docs/SCHEDULER.md): the
    longest pacing wait of its topics, or a refusal's `retry_after_ms` where HTTP
    would answer 429 (a Kafka producer is throttled, never refused, under load)."""
    node = broker.backend.node
    worst = max((node.write_pace(name, False, refuse=False) for name in names), default=0.0)
    return int(math.ceil(worst))


def refuse_produce(broker: Broker, req: Any, code: int) -> Any:
    """Produce with `code` on every requested partition."""
    R = P.RESPONSES[P.PRODUCE]
    TR = R.TopicProduceResponse
    PR = TR.PartitionProduceResponse
    return R(
        responses=[
            TR(
                name=t.name,
                partition_responses=[
                    PR(index=p.index, error_code=code, base_offset=-1) for p in t.partition_data
                ],
            )
            for t in req.topic_data
        ]
    )


def init_producer_id(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """InitProducerId: a new producer id at epoch 0, or an epoch bump of the caller's own."""
    R = P.RESPONSES[P.INIT_PRODUCER_ID]
    p = conn.principal
    if req.transactional_id is not None:
        return R(
            throttle_time_ms=0,
            error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            producer_id=-1,
            producer_epoch=-1,
        )
    if p is None or not p.has(SCOPE_WRITE):
        return R(
            throttle_time_ms=0,
            error_code=E.CLUSTER_AUTHORIZATION_FAILED,
            producer_id=-1,
            producer_epoch=-1,
        )
    if v >= 3 and req.producer_id >= 0 and 0 <= req.producer_epoch < 32766:
        # KIP-360: the client asks for an epoch bump of its own id.
        return R(
            throttle_time_ms=0,
            error_code=E.NONE,
            producer_id=req.producer_id,
            producer_epoch=req.producer_epoch + 1,
        )
    return R(
        throttle_time_ms=0,
        error_code=E.NONE,
        producer_id=broker.pids.allocate(),
        producer_epoch=0,
    )
