"""Fetch and ListOffsets: reading a topic as a Kafka partition (docs/KAFKA.md).

Each partition of a Kafka topic is its own `/v0` topic (docs/KAFKA.md,
"Partitions"; :meth:`~topics.kafka.broker.ConnState.stored`). Kafka offset = seq - 1; the high watermark (and last stable
offset) is `head_seq`; the log start offset is `earliest_seq - 1`. Deleted
records are skipped in fetches (offset gaps, as in compacted Kafka topics). A
fetch below `evict_floor - 1` (records lost to a cap, TTL or source trim:
what `/v0` reports as a tombstone) or above the high watermark gets
OFFSET_OUT_OF_RANGE. Both APIs need the `read` scope on the topic.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from topics.config import SCOPE_READ
from topics.engine.frames import FrameCorrupt
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.records import append_time_batches, to_kafka
from topics.storage.reads import history_gate, read_pool

if TYPE_CHECKING:
    from topics.kafka.backend import Partition
    from topics.kafka.broker import Broker, ConnState

__all__ = ["fetch", "refuse_fetch", "list_offsets", "refuse_list_offsets"]

#: The longest a Fetch long-polls, whatever its `max_wait_ms` (seconds).
FETCH_MAX_WAIT_S = 30.0


log = logging.getLogger("topics.kafka")


def _readable(
    broker: Broker, conn: ConnState, name: str, index: int
) -> tuple[int, Partition | None, str]:
    """(error code, watermarks, stored name) of partition `index` of Kafka topic
    `name` for a reader."""
    if not broker.allowed(conn, SCOPE_READ, conn.stored(name)):
        return E.TOPIC_AUTHORIZATION_FAILED, None, conn.stored(name, index)
    stored, part = broker.locate(conn, name, index)
    if part is None:
        return E.UNKNOWN_TOPIC_OR_PARTITION, None, stored
    return E.NONE, part, stored


def _read_partition(
    broker: Broker, conn: ConnState, name: str, fp: Any, room: int, first: bool
) -> tuple[int, int, int, bytes]:
    """One partition of a fetch: (error code, high watermark, log start - 1, record batch)."""
    hw = lso = -1
    records = b""
    err, part, stored = _readable(broker, conn, name, fp.partition)
    if part is not None:
        hw = part.head_seq
        lso = part.earliest_seq - 1
        off = fp.fetch_offset
        if off > hw or off < 0 or off + 1 < part.evict_floor:
            err = E.OFFSET_OUT_OF_RANGE
        elif off < hw and (room > 0 or first):
            got = broker.backend.read(stored, max(off, lso), max(room, 1))
            if got:
                records = append_time_batches(
                    [(rec.seq - 1, rec.ts, *to_kafka(rec.tag, rec.data, rec.meta)) for rec in got],
                    max(room, 1),
                    broker.backend.fetch_codec,
                )
    return err, hw, lso, records


async def _fetch_pass(
    broker: Broker, conn: ConnState, req: Any, v: int
) -> tuple[list[Any], int, bool]:
    """Read every requested partition once: (topic responses, bytes, any error).

    Each partition is read on its own through the read pool; one that reads
    history first gives way to writes in flight (docs/ARCHITECTURE.md, "The read path").
    """
    R = P.RESPONSES[P.FETCH]
    TR = R.FetchableTopicResponse
    PD = TR.PartitionData
    budget = req.max_bytes if v >= 3 and req.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    errors = False
    out = []
    for ft in req.topics:
        name = ft.topic
        prs = []
        for fp in ft.partitions:
            t = broker.backend.engine.get(conn.stored(name, fp.partition))
            if t is not None and t.head_seq - fp.fetch_offset > HISTORY_RECORDS:
                await history_gate.turn()
            room = min(fp.partition_max_bytes, budget - total)
            try:
                err, hw, lso, records = await read_pool.run(
                    partial(_read_partition, broker, conn, name, fp, room, total == 0)
                )
            except (OSError, FrameCorrupt) as exc:
                # Stored bytes that cannot be read (a damaged frame, a cold tier that
                # is unreachable): this partition says so, the others are served
                # (docs/KAFKA.md, "Errors").
                log.warning("kafka: fetch of %s[%d] failed: %s", name, fp.partition, exc)
                err, hw, lso, records = E.KAFKA_STORAGE_ERROR, -1, -1, b""
            total += len(records)
            if err != E.NONE:
                errors = True
                records = b""  # librdkafka rejects a null record set
            prs.append(
                PD(
                    partition_index=fp.partition,
                    error_code=err,
                    high_watermark=hw,
                    last_stable_offset=hw,
                    log_start_offset=lso,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=records,
                )
            )
        out.append(TR(topic=name, partitions=prs))
    return out, total, errors


#: A fetch this many records or more behind the head reads history.
HISTORY_RECORDS = 128


async def fetch(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """Fetch with a long-poll woken by publishes on the fetched topics (no polling).

    Answers once `min_bytes` of records are ready, any partition has an
    error, or `max_wait_ms` (at most :data:`FETCH_MAX_WAIT_S`) has passed.
    Fetch sessions are not kept: a request naming one gets
    FETCH_SESSION_ID_NOT_FOUND, and every answer has `session_id` 0.
    """
    R = P.RESPONSES[P.FETCH]
    if v >= 7 and req.session_id != 0:
        return R(
            throttle_time_ms=0,
            error_code=E.FETCH_SESSION_ID_NOT_FOUND,
            session_id=0,
            responses=[],
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(req.max_wait_ms, 0) / 1000, FETCH_MAX_WAIT_S)
    names = [conn.stored(ft.topic, fp.partition) for ft in req.topics for fp in ft.partitions]
    while True:
        out, total, errors = await _fetch_pass(broker, conn, req, v)
        remaining = deadline - loop.time()
        if errors or total >= max(req.min_bytes, 1) or remaining <= 0:
            break
        woke = asyncio.Event()
        unwatch = broker.backend.watch(names, woke.set)
        try:
            await asyncio.wait_for(woke.wait(), remaining)
        except TimeoutError:
            pass
        finally:
            unwatch()
    return R(throttle_time_ms=0, error_code=E.NONE, session_id=0, responses=out)


def refuse_fetch(broker: Broker, req: Any, code: int) -> Any:
    """Fetch with `code` on the response and on every requested partition."""
    R = P.RESPONSES[P.FETCH]
    TR = R.FetchableTopicResponse
    PD = TR.PartitionData
    return R(
        error_code=code,
        responses=[
            TR(
                topic=t.topic,
                partitions=[
                    PD(
                        partition_index=p.partition,
                        error_code=code,
                        high_watermark=-1,
                        records=None,
                    )
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


def list_offsets(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """ListOffsets: latest (-1), earliest (-2, -4), max timestamp (-3) or by timestamp.

    By timestamp: the first record whose `$ts` >= it (-1 when none);
    INVALID_REQUEST for any other negative value.
    """
    R = P.RESPONSES[P.LIST_OFFSETS]
    TR = R.ListOffsetsTopicResponse
    PR = TR.ListOffsetsPartitionResponse
    backend = broker.backend
    out = []
    for t in req.topics:
        prs = []
        for p in t.partitions:
            offset = ts = -1
            err, part, stored = _readable(broker, conn, t.name, p.partition_index)
            if part is not None:
                want = p.timestamp
                if want == -1:
                    offset = part.head_seq
                elif want in (-2, -4):
                    offset = part.earliest_seq - 1
                elif want == -3:
                    rec = backend.last_record(stored)
                    if rec is not None:
                        offset, ts = rec.seq - 1, rec.ts
                elif want >= 0:
                    rec = backend.seq_for_time(stored, want)
                    if rec is not None:
                        offset, ts = rec.seq - 1, rec.ts
                else:
                    err = E.INVALID_REQUEST
            prs.append(
                PR(
                    partition_index=p.partition_index,
                    error_code=err,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=0 if err == E.NONE else -1,
                )
            )
        out.append(TR(name=t.name, partitions=prs))
    return R(throttle_time_ms=0, topics=out)


def refuse_list_offsets(broker: Broker, req: Any, code: int) -> Any:
    """ListOffsets with `code` on every requested partition."""
    R = P.RESPONSES[P.LIST_OFFSETS]
    TR = R.ListOffsetsTopicResponse
    return P.refuse_partitions(R, TR, TR.ListOffsetsPartitionResponse, req, code)
