"""Request handlers: one method per Kafka API, answering with codec response objects.

Mapping (docs/KAFKA.md): a Kafka topic is the topics topic of the same name
with exactly one partition, 0. Kafka offset = seq - 1; the high watermark (and
last stable offset) is `head_seq`; the log start offset is `earliest_seq - 1`.
Deleted records are skipped in fetches (offset gaps, as in compacted Kafka
topics). A fetch below `evict_floor - 1` (records lost to a cap, TTL or source
trim: what `/v0` reports as a tombstone) or above the high watermark gets
OFFSET_OUT_OF_RANGE.

Authorization mirrors `/v0` (API §1.3) with the connection's API key: produce
needs `write`; fetch, list offsets, group membership and offset commit/fetch
need `read`; CreateTopics needs `admin`, DeleteTopics `delete`. Every topic
name must pass the key's prefix allowlist; Metadata only lists allowed names.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from topics.config import SCOPE_ADMIN, SCOPE_DELETE, SCOPE_READ, SCOPE_WRITE
from topics.http.auth import Principal
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.backend import BackendError, KafkaBackend, Staged
from topics.kafka.groups import Coordinator
from topics.kafka.offsets import OFFSETS_TOPIC, OffsetStore
from topics.kafka.producers import Duplicate, ProducerIds, SequenceTable
from topics.kafka.records import BatchWriter, RecordError, decode_batches, to_kafka, to_new_records

__all__ = ["Broker", "ConnState", "NODE_ID", "CLUSTER_ID"]

log = logging.getLogger("topics.kafka")

NODE_ID = 0
CLUSTER_ID = "topics-single-node"
FETCH_MAX_WAIT_S = 30.0


@dataclass(slots=True, eq=False)
class ConnState:
    """Per-connection state: who is calling (None until SASL succeeds when auth is on)."""

    peer: str
    principal: Principal | None
    client_id: str = ""
    sasl_mechanism: str | None = None
    sasl_raw: bool = False
    close_after: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def tenant(self) -> str:
        p = self.principal
        return p.digest.hex()[:16] if p is not None and p.digest is not None else ""


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


def _storage_code(exc: BackendError) -> int:
    """Kafka error code for an engine refusal of a write."""
    if exc.status == 404:
        return E.UNKNOWN_TOPIC_OR_PARTITION
    if exc.code == "record_too_large":
        return E.MESSAGE_TOO_LARGE
    if exc.code == "batch_too_large":
        return E.RECORD_LIST_TOO_LARGE
    if exc.status == 422:
        return E.POLICY_VIOLATION
    if exc.status == 429:
        return E.REQUEST_TIMED_OUT
    if exc.status == 400:
        return E.INVALID_RECORD
    return E.KAFKA_STORAGE_ERROR


_INT_FIELDS = {
    "ttl_ms",
    "cap_records",
    "cap_bytes",
    "idempotency_window_ms",
    "lease_ms",
    "claim_jitter_ms",
    "max_deliveries",
    "priority",
}
_BOOL_FIELDS = {"durable", "auto_priority", "auto_create", "dedupe_node", "leases_durable"}
_STR_FIELDS = {"type", "discard", "durability", "dead_letter"}


def topic_config_from_kafka(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """CreateTopics configs -> a `/v0` topic config body (API §1.12).

    `/v0` field names are taken as they are (`durability=fsync`,
    `cap_records=1000`, ...); `retention.ms` and `retention.bytes` map to
    `ttl_ms` and `cap_bytes` (-1 = off); `cleanup.policy` must be `delete`;
    other dotted Kafka names are accepted and ignored. Raises ValueError for
    an unknown plain name or a value of the wrong type.
    """
    body: dict[str, Any] = {}
    for name, value in configs:
        if name in _INT_FIELDS:
            body[name] = None if value is None else int(value)
        elif name in _BOOL_FIELDS:
            if value not in ("true", "false"):
                raise ValueError(f"{name} must be true or false")
            body[name] = value == "true"
        elif name in _STR_FIELDS:
            body[name] = value
        elif name == "retention.ms":
            v = int(value or "-1")
            body["ttl_ms"] = max(v, 0)
        elif name == "retention.bytes":
            v = int(value or "-1")
            body["cap_bytes"] = max(v, 0)
        elif name == "cleanup.policy":
            if value != "delete":
                raise ValueError("only cleanup.policy=delete is supported")
        elif "." in name:
            continue
        else:
            raise ValueError(f"unknown topic config {name!r}")
    return body


class Broker:
    """The Kafka APIs of one server, on top of :class:`KafkaBackend`."""

    def __init__(
        self,
        backend: KafkaBackend,
        *,
        advertised: tuple[str, int],
        auth_enabled: bool,
        authenticate: Any,
        now_ms: int,
    ) -> None:
        self.backend = backend
        self.advertised = advertised
        self.auth_enabled = auth_enabled
        self.authenticate = authenticate
        self.groups = Coordinator()
        self.offsets = OffsetStore(backend)
        self.pids = ProducerIds(now_ms)
        self.seqs = SequenceTable()

    # ---------------------------------------------------------------- helpers

    def _allowed(self, conn: ConnState, scope: str, name: str) -> bool:
        p = conn.principal
        return (
            p is not None
            and p.has(scope)
            and p.allows_name(name)
            and name not in self.backend.hidden
        )

    def _broker_list(self, R: Any) -> list[Any]:
        host, port = self.advertised
        return [R(node_id=NODE_ID, host=host, port=port, rack=None)]

    # ------------------------------------------------------------- handshakes

    def api_versions(self, conn: ConnState, req: Any, v: int) -> Any:
        return P.api_versions_response(v)

    def sasl_handshake(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.SASL_HANDSHAKE]
        if req.mechanism != "PLAIN":
            return R(error_code=E.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"])
        conn.sasl_mechanism = "PLAIN"
        conn.sasl_raw = v == 0
        return R(error_code=E.NONE, mechanisms=["PLAIN"])

    def plain_login(self, conn: ConnState, token: bytes) -> str | None:
        """Check a SASL/PLAIN token; sets the principal. Returns an error message or None.

        The token is `authzid NUL username NUL password`; the password is a
        `TOPICS_API_KEYS` secret, the username is free text (logged only).
        """
        parts = bytes(token).split(b"\x00")
        if len(parts) != 3:
            return "malformed PLAIN token"
        try:
            user = parts[1].decode()
            secret = parts[2].decode()
        except UnicodeDecodeError:
            return "malformed PLAIN token"
        if not self.auth_enabled:
            return None
        principal = self.authenticate(secret)
        if principal is None:
            log.info("kafka: SASL/PLAIN rejected for user %r from %s", user, conn.peer)
            return "bad credentials"
        conn.principal = principal
        return None

    def sasl_authenticate(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.SASL_AUTHENTICATE]
        if conn.sasl_mechanism != "PLAIN" or conn.sasl_raw:
            conn.close_after = True
            return R(
                error_code=E.ILLEGAL_SASL_STATE, error_message="SaslHandshake first", auth_bytes=b""
            )
        err = self.plain_login(conn, req.auth_bytes)
        if err is not None:
            conn.close_after = True
            return R(error_code=E.SASL_AUTHENTICATION_FAILED, error_message=err, auth_bytes=b"")
        return R(error_code=E.NONE, error_message=None, auth_bytes=b"", session_lifetime_ms=0)

    # --------------------------------------------------------------- metadata

    async def metadata(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.METADATA]
        T = R.MetadataResponseTopic
        Part = T.MetadataResponsePartition
        names: list[str]
        requested = req.topics
        if requested is None or (v == 0 and not requested):
            names = [
                n
                for n in self.backend.names()
                if self._allowed(conn, SCOPE_READ, n) or self._allowed(conn, SCOPE_WRITE, n)
            ]
            explicit = False
        else:
            names = [t.name for t in requested if t.name is not None]
            explicit = True
        auto = bool(req.allow_auto_topic_creation) if v >= 4 else True
        topics = []
        for name in names:
            err = E.NONE
            allowed = self._allowed(conn, SCOPE_READ, name) or self._allowed(
                conn, SCOPE_WRITE, name
            )
            if explicit and not allowed:
                err = E.TOPIC_AUTHORIZATION_FAILED
            elif self.backend.partition(name) is None:
                err = E.UNKNOWN_TOPIC_OR_PARTITION
                if not self.backend.valid_name(name):
                    err = E.INVALID_TOPIC_EXCEPTION
                elif auto and self._allowed(conn, SCOPE_WRITE, name):
                    try:
                        await self.backend.create(name, {})
                        err = E.NONE
                    except BackendError as exc:
                        log.info("kafka: auto-create of %r refused: %s", name, exc.message)
            parts = []
            if err == E.NONE:
                parts = [
                    Part(
                        error_code=E.NONE,
                        partition_index=0,
                        leader_id=NODE_ID,
                        leader_epoch=0,
                        replica_nodes=[NODE_ID],
                        isr_nodes=[NODE_ID],
                        offline_replicas=[],
                    )
                ]
            topics.append(T(error_code=err, name=name, is_internal=False, partitions=parts))
        return R(
            throttle_time_ms=0,
            brokers=self._broker_list(R.MetadataResponseBroker),
            cluster_id=CLUSTER_ID,
            controller_id=NODE_ID,
            topics=topics,
        )

    # ---------------------------------------------------------------- produce

    def _stage_partition(self, conn: ConnState, name: str, index: int, raw: bytes | None) -> _Part:
        """Validate and stage one partition's batches synchronously (no await)."""
        res = _Part(index)
        if not self._allowed(conn, SCOPE_WRITE, name):
            res.error = E.TOPIC_AUTHORIZATION_FAILED
            return res
        part = self.backend.partition(name)
        if index != 0 or part is None:
            res.error = E.UNKNOWN_TOPIC_OR_PARTITION
            return res
        b = self.backend
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
        for batch, recs in zip(batches, mapped, strict=True):
            pid = batch.producer_id
            if pid >= 0:
                verdict = self.seqs.check(
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
                    log.warning(
                        "kafka: batch to %r split by a refused chunk: %s", name, exc.message
                    )
                res.staged.extend(mine)
                res.error = _storage_code(exc)
                return res
            res.staged.extend(mine)
            first = mine[0].first_seq - 1
            if res.base < 0:
                res.base, res.ts = first, mine[0].ts
            if pid >= 0:
                self.seqs.record(
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

    async def produce(self, conn: ConnState, req: Any, v: int) -> Any:
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
                    r = self._stage_partition(conn, td.name, pd.index, pd.records)
                parts.append(r)
            results.append((td.name, parts))
        if req.acks == 0:
            return None
        out = []
        for name, parts in results:
            prs = []
            for r in parts:
                ok = True
                for s in r.staged:
                    ok = await s.committed() and ok
                for entry in r.dups:
                    for s in entry[4]:
                        ok = await s.committed() and ok
                if not ok:
                    for pid, inst in r.pids:
                        self.seqs.forget(pid, inst)
                    if r.error == E.NONE:
                        r.error = E.KAFKA_STORAGE_ERROR
                part = self.backend.partition(name)
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
        return R(responses=out, throttle_time_ms=0)

    # ------------------------------------------------------------------ fetch

    def _fetch_pass(self, conn: ConnState, req: Any, v: int) -> tuple[list[Any], int, bool]:
        """Read every requested partition once: (topic responses, bytes, any error)."""
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
                err = E.NONE
                hw = lso = -1
                records: bytes = b""
                part = None
                if not self._allowed(conn, SCOPE_READ, name):
                    err = E.TOPIC_AUTHORIZATION_FAILED
                else:
                    part = self.backend.partition(name) if fp.partition == 0 else None
                    if part is None:
                        err = E.UNKNOWN_TOPIC_OR_PARTITION
                if part is not None:
                    hw = part.head_seq
                    lso = part.earliest_seq - 1
                    off = fp.fetch_offset
                    if off > hw or off < 0 or off + 1 < part.evict_floor:
                        err = E.OFFSET_OUT_OF_RANGE
                    elif off < hw:
                        room = min(fp.partition_max_bytes, budget - total)
                        if room > 0 or total == 0:
                            got = self.backend.read(name, max(off, lso), max(room, 1))
                            if got:
                                w = BatchWriter(got[0].seq - 1, max(room, 1))
                                for rec in got:
                                    k, val, hs = to_kafka(rec.tag, rec.data, rec.meta)
                                    if not w.add(rec.seq - 1, rec.ts, k, val, hs):
                                        break
                                records = w.build()
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

    async def fetch(self, conn: ConnState, req: Any, v: int) -> Any:
        """Fetch with a long-poll woken by publishes on the fetched topics (no polling)."""
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
        names = [ft.topic for ft in req.topics]
        while True:
            out, total, errors = self._fetch_pass(conn, req, v)
            remaining = deadline - loop.time()
            if errors or total >= max(req.min_bytes, 1) or remaining <= 0:
                break
            woke = asyncio.Event()
            unwatch = self.backend.watch(names, woke.set)
            try:
                await asyncio.wait_for(woke.wait(), remaining)
            except TimeoutError:
                pass
            finally:
                unwatch()
        return R(throttle_time_ms=0, error_code=E.NONE, session_id=0, responses=out)

    # ----------------------------------------------------------- list offsets

    def list_offsets(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.LIST_OFFSETS]
        TR = R.ListOffsetsTopicResponse
        PR = TR.ListOffsetsPartitionResponse
        out = []
        for t in req.topics:
            prs = []
            for p in t.partitions:
                err = E.NONE
                offset = ts = -1
                part = None
                if not self._allowed(conn, SCOPE_READ, t.name):
                    err = E.TOPIC_AUTHORIZATION_FAILED
                else:
                    part = self.backend.partition(t.name) if p.partition_index == 0 else None
                    if part is None:
                        err = E.UNKNOWN_TOPIC_OR_PARTITION
                if part is not None:
                    want = p.timestamp
                    if want == -1:
                        offset = part.head_seq
                    elif want in (-2, -4):
                        offset = part.earliest_seq - 1
                    elif want == -3:
                        rec = self.backend.last_record(t.name)
                        if rec is not None:
                            offset, ts = rec.seq - 1, rec.ts
                    elif want >= 0:
                        rec = self.backend.seq_for_time(t.name, want)
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

    # -------------------------------------------------------- producer ids

    def init_producer_id(self, conn: ConnState, req: Any, v: int) -> Any:
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
            producer_id=self.pids.allocate(),
            producer_epoch=0,
        )

    # ---------------------------------------------------------------- groups

    def find_coordinator(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.FIND_COORDINATOR]
        host, port = self.advertised
        p = conn.principal

        def answer(key_type: int) -> tuple[int, str | None]:
            if key_type != 0:
                return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported"
            if p is None or not p.has(SCOPE_READ):
                return E.GROUP_AUTHORIZATION_FAILED, "the key lacks the read scope"
            return E.NONE, None

        if v >= 4:
            coords = []
            for key in req.coordinator_keys:
                err, msg = answer(req.key_type)
                coords.append(
                    R.Coordinator(
                        key=key,
                        node_id=NODE_ID if not err else -1,
                        host=host if not err else "",
                        port=port if not err else -1,
                        error_code=err,
                        error_message=msg,
                    )
                )
            return R(throttle_time_ms=0, coordinators=coords)
        err, msg = answer(req.key_type if v >= 1 else 0)
        return R(
            throttle_time_ms=0,
            error_code=err,
            error_message=msg,
            node_id=NODE_ID if not err else -1,
            host=host if not err else "",
            port=port if not err else -1,
        )

    def _group_ok(self, conn: ConnState) -> bool:
        p = conn.principal
        return p is not None and p.has(SCOPE_READ)

    async def join_group(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.JOIN_GROUP]
        if not self._group_ok(conn):
            return R(
                throttle_time_ms=0,
                error_code=E.GROUP_AUTHORIZATION_FAILED,
                generation_id=-1,
                protocol_name=None,
                leader="",
                member_id=req.member_id,
                members=[],
            )
        res = await self.groups.join(
            conn.tenant,
            req.group_id,
            req.member_id,
            conn.client_id,
            req.protocol_type,
            [(p.name, bytes(p.metadata)) for p in req.protocols],
            req.session_timeout_ms,
            req.rebalance_timeout_ms if v >= 1 else req.session_timeout_ms,
        )
        M = R.JoinGroupResponseMember
        return R(
            throttle_time_ms=0,
            error_code=res.error,
            generation_id=res.generation,
            protocol_type=res.protocol_type,
            protocol_name=res.protocol_name if v >= 7 else (res.protocol_name or ""),
            leader=res.leader,
            member_id=res.member_id,
            members=[
                M(member_id=mid, group_instance_id=None, metadata=md) for mid, md in res.members
            ],
        )

    async def sync_group(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.SYNC_GROUP]
        if not self._group_ok(conn):
            return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED, assignment=b"")
        res = await self.groups.sync(
            conn.tenant,
            req.group_id,
            req.generation_id,
            req.member_id,
            [(a.member_id, bytes(a.assignment)) for a in req.assignments],
        )
        return R(
            throttle_time_ms=0,
            error_code=res.error,
            protocol_type=res.protocol_type,
            protocol_name=res.protocol_name,
            assignment=res.assignment,
        )

    def heartbeat(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.HEARTBEAT]
        if not self._group_ok(conn):
            return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED)
        err = self.groups.heartbeat(conn.tenant, req.group_id, req.generation_id, req.member_id)
        return R(throttle_time_ms=0, error_code=err)

    def leave_group(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.LEAVE_GROUP]
        ids = [m.member_id for m in req.members] if v >= 3 else [req.member_id]
        if not self._group_ok(conn):
            return R(throttle_time_ms=0, error_code=E.GROUP_AUTHORIZATION_FAILED, members=[])
        codes = self.groups.leave(conn.tenant, req.group_id, ids)
        if v >= 3:
            MR = R.MemberResponse
            return R(
                throttle_time_ms=0,
                error_code=E.NONE,
                members=[
                    MR(member_id=m, group_instance_id=None, error_code=c)
                    for m, c in zip(ids, codes, strict=True)
                ],
            )
        return R(throttle_time_ms=0, error_code=codes[0])

    # ---------------------------------------------------------------- offsets

    async def offset_commit(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.OFFSET_COMMIT]
        TR = R.OffsetCommitResponseTopic
        PR = TR.OffsetCommitResponsePartition
        gate = (
            E.GROUP_AUTHORIZATION_FAILED
            if not self._group_ok(conn)
            else (
                self.groups.commit_check(
                    conn.tenant, req.group_id, req.generation_id_or_member_epoch, req.member_id
                )
            )
        )
        codes: dict[tuple[str, int], int] = {}
        entries = []
        for t in req.topics:
            for p in t.partitions:
                key = (t.name, p.partition_index)
                if gate != E.NONE:
                    codes[key] = gate
                elif not self._allowed(conn, SCOPE_READ, t.name):
                    codes[key] = E.TOPIC_AUTHORIZATION_FAILED
                elif p.partition_index != 0 or self.backend.partition(t.name) is None:
                    codes[key] = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    codes[key] = E.NONE
                    epoch = p.committed_leader_epoch if v >= 6 else -1
                    entries.append(
                        (
                            t.name,
                            p.partition_index,
                            (p.committed_offset, p.committed_metadata, epoch),
                        )
                    )
        if entries:
            try:
                await self.offsets.commit(conn.tenant, req.group_id, entries)
            except BackendError as exc:
                log.warning(
                    "kafka: offset commit for group %r failed: %s", req.group_id, exc.message
                )
                for name, idx, _c in entries:
                    codes[(name, idx)] = E.COORDINATOR_NOT_AVAILABLE
        return R(
            throttle_time_ms=0,
            topics=[
                TR(
                    name=t.name,
                    partitions=[
                        PR(
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ],
        )

    def offset_fetch(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.OFFSET_FETCH]
        TR = R.OffsetFetchResponseTopic
        PR = TR.OffsetFetchResponsePartition
        if not self._group_ok(conn):
            return R(throttle_time_ms=0, topics=[], error_code=E.GROUP_AUTHORIZATION_FAILED)
        wanted: list[tuple[str, list[int]]]
        if req.topics is None:
            by: dict[str, list[int]] = {}
            for name, idx in self.offsets.committed_partitions(conn.tenant, req.group_id):
                if self._allowed(conn, SCOPE_READ, name):
                    by.setdefault(name, []).append(idx)
            wanted = list(by.items())
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in req.topics]
        out = []
        for name, idxs in wanted:
            prs = []
            for idx in idxs:
                if not self._allowed(conn, SCOPE_READ, name):
                    prs.append(
                        PR(
                            partition_index=idx,
                            committed_offset=-1,
                            committed_leader_epoch=-1,
                            metadata="",
                            error_code=E.TOPIC_AUTHORIZATION_FAILED,
                        )
                    )
                    continue
                c = self.offsets.get(conn.tenant, req.group_id, name, idx)
                off, md, ep = c if c is not None else (-1, "", -1)
                prs.append(
                    PR(
                        partition_index=idx,
                        committed_offset=off,
                        committed_leader_epoch=ep,
                        metadata=md if md is not None else "",
                        error_code=E.NONE,
                    )
                )
            out.append(TR(name=name, partitions=prs))
        return R(throttle_time_ms=0, topics=out, error_code=E.NONE)

    # ------------------------------------------------------------ admin APIs

    async def create_topics(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.CREATE_TOPICS]
        CR = R.CreatableTopicResult
        out = []
        for t in req.topics:
            err, msg = E.NONE, None
            name = t.name
            if not self._allowed(conn, SCOPE_ADMIN, name):
                err, msg = E.TOPIC_AUTHORIZATION_FAILED, "the key lacks admin on this name"
            elif not self.backend.valid_name(name):
                err, msg = E.INVALID_TOPIC_EXCEPTION, "invalid topic name"
            elif t.num_partitions not in (-1, 1) or (
                t.assignments and [a.partition_index for a in t.assignments] != [0]
            ):
                err, msg = E.INVALID_PARTITIONS, "every topic has exactly one partition"
            elif t.replication_factor not in (-1, 1):
                err, msg = E.INVALID_REPLICATION_FACTOR, "a single node: replication factor 1"
            elif self.backend.partition(name) is not None:
                err, msg = E.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            else:
                try:
                    body = topic_config_from_kafka([(c.name, c.value) for c in t.configs])
                    dl = body.get("dead_letter")
                    if isinstance(dl, str) and not self._allowed(conn, SCOPE_ADMIN, dl):
                        # A queue dead-letters into (and creates) that topic: the
                        # key must be allowed the name as well as the topic's own.
                        out.append(
                            _create_result(
                                CR,
                                name,
                                E.TOPIC_AUTHORIZATION_FAILED,
                                "the key may not use this dead_letter topic",
                            )
                        )
                        continue
                    if req.validate_only:
                        self.backend.check_config(name, body)
                    else:
                        await self.backend.create(name, body)
                except ValueError as exc:
                    err, msg = E.INVALID_CONFIG, str(exc)
                except BackendError as exc:
                    err = (
                        E.INVALID_CONFIG
                        if exc.status == 400
                        else (E.POLICY_VIOLATION if exc.status == 429 else E.KAFKA_STORAGE_ERROR)
                    )
                    msg = exc.message
            out.append(_create_result(CR, name, err, msg))
        return R(throttle_time_ms=0, topics=out)

    async def delete_topics(self, conn: ConnState, req: Any, v: int) -> Any:
        R = P.RESPONSES[P.DELETE_TOPICS]
        DR = R.DeletableTopicResult
        out = []
        for name in req.topic_names:
            err, msg = E.NONE, None
            if not self._allowed(conn, SCOPE_DELETE, name):
                err = E.TOPIC_AUTHORIZATION_FAILED
            else:
                try:
                    if not await self.backend.delete(name):
                        err = E.UNKNOWN_TOPIC_OR_PARTITION
                except BackendError as exc:
                    err, msg = E.KAFKA_STORAGE_ERROR, exc.message
            out.append(DR(name=name, error_code=err, error_message=msg))
        return R(throttle_time_ms=0, responses=out)

    # ------------------------------------------------------ version refusals

    def error_response(self, key: int, req: Any, code: int) -> Any:
        """A response carrying `code` everywhere the API has an error field.

        Used for UNSUPPORTED_VERSION: a request at a version outside
        :data:`~topics.kafka.protocol.SUPPORTED` that the codec can still read.
        """
        R = P.RESPONSES[key]
        if key == P.PRODUCE:
            TR = R.TopicProduceResponse
            PR = TR.PartitionProduceResponse
            return R(
                responses=[
                    TR(
                        name=t.name,
                        partition_responses=[
                            PR(index=p.index, error_code=code, base_offset=-1)
                            for p in t.partition_data
                        ],
                    )
                    for t in req.topic_data
                ]
            )
        if key == P.FETCH:
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
        if key == P.LIST_OFFSETS:
            TR = R.ListOffsetsTopicResponse
            PR = TR.ListOffsetsPartitionResponse
            return R(
                topics=[
                    TR(
                        name=t.name,
                        partitions=[
                            PR(partition_index=p.partition_index, error_code=code)
                            for p in t.partitions
                        ],
                    )
                    for t in req.topics
                ]
            )
        if key == P.METADATA:
            T = R.MetadataResponseTopic
            return R(
                brokers=self._broker_list(R.MetadataResponseBroker),
                topics=[T(error_code=code, name=t.name, partitions=[]) for t in (req.topics or [])],
                error_code=code,
            )
        if key == P.OFFSET_COMMIT:
            TR = R.OffsetCommitResponseTopic
            PR = TR.OffsetCommitResponsePartition
            return R(
                topics=[
                    TR(
                        name=t.name,
                        partitions=[
                            PR(partition_index=p.partition_index, error_code=code)
                            for p in t.partitions
                        ],
                    )
                    for t in req.topics
                ]
            )
        if key == P.OFFSET_FETCH:
            return R(
                topics=[],
                error_code=code,
                groups=[
                    R.OffsetFetchResponseGroup(group_id=g.group_id, topics=[], error_code=code)
                    for g in (req.groups or [])
                ],
            )
        if key == P.CREATE_TOPICS:
            CR = R.CreatableTopicResult
            return R(
                topics=[CR(name=t.name, error_code=code, error_message=None) for t in req.topics]
            )
        if key == P.DELETE_TOPICS:
            DR = R.DeletableTopicResult
            names = list(req.topic_names or []) + [t.name for t in (req.topics or [])]
            return R(responses=[DR(name=n, error_code=code) for n in names])
        if key == P.FIND_COORDINATOR:
            return R(
                error_code=code,
                node_id=-1,
                host="",
                port=-1,
                coordinators=[
                    R.Coordinator(
                        key=k, node_id=-1, host="", port=-1, error_code=code, error_message=None
                    )
                    for k in (req.coordinator_keys or [])
                ],
            )
        if key == P.LEAVE_GROUP:
            return R(error_code=code, members=[])
        return R(error_code=code)


def _create_result(CR: Any, name: str, err: int, msg: str | None) -> Any:
    """One CreateTopics result entry."""
    ok = err == E.NONE
    return CR(
        name=name,
        error_code=err,
        error_message=msg,
        num_partitions=1 if ok else -1,
        replication_factor=1 if ok else -1,
        configs=[] if ok else None,
    )


def internal_topics() -> frozenset[str]:
    """Names the listener keeps for itself (hidden from Kafka clients)."""
    return frozenset({OFFSETS_TOPIC})
