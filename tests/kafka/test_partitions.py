"""Multi-partition topics with the three real clients (docs/KAFKA.md, "Partitions").

Partition n of Kafka topic T is the `/v0` topic T (n = 0) or T:n. Per client:
keyed produce through the default partitioner spreads over the partitions (and
one key stays on one partition); a consumer group that is forced to rebalance
(2 members, then a 3rd) processes every record exactly once, counting a record
only once its synchronous commit succeeded; committed offsets survive a server
restart; CreatePartitions while a member consumes brings new partitions the
member picks up. And, at the wire: an OffsetFetch pipelined behind an
OffsetCommit on one connection sees that commit.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.kafka.support import CLIENTS, KafkaProcess, ck_conf, py_conf
from topics.kafka import protocol as P

pytestmark = [pytest.mark.kafka]

#: The assignor each client's group uses: together they cover range (kafka-python's
#: default), roundrobin and cooperative-sticky (incremental rebalancing).
ASSIGNOR = {"confluent": "cooperative-sticky", "kafka-python": "range", "aiokafka": "roundrobin"}

#: (client, assignor) pairs of the rebalance test: each client's own, plus
#: kafka-python's implementation of cooperative-sticky.
REBALANCES = [*ASSIGNOR.items(), ("kafka-python", "cooperative-sticky")]


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def stored(topic: str, index: int) -> str:
    return topic if index == 0 else f"{topic}:{index}"


class Sent(NamedTuple):
    partition: int
    offset: int
    key: bytes
    value: bytes


def keyed(n: int, tag: str, keys: int = 24) -> list[tuple[bytes, bytes]]:
    """`n` (key, value) pairs over `keys` distinct keys; values are unique JSON."""
    return [
        (b"%s-k%d" % (tag.encode(), i % keys), b'{"t":"%s","i":%d}' % (tag.encode(), i))
        for i in range(n)
    ]


def default_partition(client: str, key: bytes, count: int) -> int:
    """The partition the client's default partitioner picks for `key`:
    librdkafka's consistent_random (CRC32), the Java client's murmur2 otherwise."""
    if client == "confluent":
        return zlib.crc32(key) % count
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % count


# ------------------------------------------------------------------ admin and produce


def create_topic(bs: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(ck_conf(bs))  # referenced until the answer is in
    fs = admin.create_topics([NewTopic(topic, partitions)], request_timeout=20)
    fs[topic].result(30)


def grow_topic(bs: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient(ck_conf(bs))  # referenced until the answer is in
    fs = admin.create_partitions([NewPartitions(topic, partitions)], request_timeout=20)
    fs[topic].result(30)


def produce_keyed(
    client: str,
    bs: str,
    topic: str,
    pairs: list[tuple[bytes, bytes]],
    *,
    chunk: int = 0,
    pause: float = 0.0,
) -> list[Sent]:
    """Produce keyed records through the client's default partitioner (no explicit
    partition); with `chunk`, flush every `chunk` records and sleep `pause`."""
    step = chunk or len(pairs) or 1
    out: list[Sent] = []
    if client == "confluent":
        from confluent_kafka import Producer

        p = Producer(ck_conf(bs, acks="all", **{"linger.ms": 5}))
        errors: list[Any] = []

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                out.append(Sent(msg.partition(), msg.offset(), msg.key(), msg.value()))

        for i in range(0, len(pairs), step):
            for k, v in pairs[i : i + step]:
                p.produce(topic, key=k, value=v, on_delivery=done)
                p.poll(0)
            assert p.flush(30) == 0
            time.sleep(pause)
        assert not errors, errors
    elif client == "kafka-python":
        from kafka import KafkaProducer

        kp = KafkaProducer(**py_conf(bs, acks="all", linger_ms=5))
        try:
            for i in range(0, len(pairs), step):
                part = pairs[i : i + step]
                futs = [kp.send(topic, key=k, value=v) for k, v in part]
                kp.flush(30)
                for (k, v), f in zip(part, futs, strict=True):
                    md = f.get(30)
                    out.append(Sent(md.partition, md.offset, k, v))
                time.sleep(pause)
        finally:
            kp.close()
    else:

        async def go() -> None:
            from aiokafka import AIOKafkaProducer

            ap = AIOKafkaProducer(**py_conf(bs, acks="all", linger_ms=5))
            await ap.start()
            try:
                for i in range(0, len(pairs), step):
                    part = pairs[i : i + step]
                    futs = [await ap.send(topic, key=k, value=v) for k, v in part]
                    for (k, v), f in zip(part, futs, strict=True):
                        md = await f
                        out.append(Sent(md.partition, md.offset, k, v))
                    await asyncio.sleep(pause)
            finally:
                await ap.stop()

        asyncio.run(go())
    assert len(out) == len(pairs)
    return out


def http_records(base: str, topic: str, partitions: int) -> dict[int, list[dict[str, Any]]]:
    """Every record of each partition's `/v0` topic, with its tag, checked against head_seq."""
    out: dict[int, list[dict[str, Any]]] = {}
    for i in range(partitions):
        st = httpx.get(f"{base}/v0/topics/{stored(topic, i)}")
        assert st.status_code == 200, (i, st.text)
        r = httpx.post(
            f"{base}/v0/topics/{stored(topic, i)}/diff",
            json={"from_seq": 0, "limit": 1000, "include_tags": True},
        )
        assert r.status_code == 200, r.text
        recs = r.json()["records"]
        assert len(recs) == st.json()["head_seq"], (i, st.json(), len(recs))
        out[i] = recs
    return out


# ------------------------------------------------------------------ group members


class Rec(NamedTuple):
    member: str
    partition: int
    offset: int
    key: bytes
    value: bytes


class Ledger:
    """Records processed by the members: appended only after their commit succeeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recs: list[Rec] = []
        self.per_partition: Counter[int] = Counter()

    def add(self, recs: list[Rec]) -> None:
        with self.lock:
            self.recs.extend(recs)
            self.per_partition.update(r.partition for r in recs)

    def count(self, partition: int) -> int:
        with self.lock:
            return self.per_partition[partition]

    def snapshot(self) -> list[Rec]:
        with self.lock:
            return list(self.recs)

    def __len__(self) -> int:
        with self.lock:
            return len(self.recs)


Runs = dict[int, list[tuple[int, bytes, bytes]]]


def last_runs(recs: list[tuple[int, int, bytes, bytes]]) -> Runs:
    """Per partition, the records of a poll batch from its last position reset on:
    offsets go up within a run; a batch that straddles a rebalance may restart a
    partition at its committed offset, and only that last run is still current."""
    runs: dict[int, list[tuple[int, bytes, bytes]]] = {}
    for p, off, k, v in recs:
        run = runs.setdefault(p, [])
        if run and off <= run[-1][0]:
            run.clear()
        run.append((off, k, v))
    return runs


class Member:
    """A subscribed group member polling in its own thread.

    After each poll batch it commits, synchronously, the offset after the last
    record of each partition in the batch; a record counts as processed (is added
    to the ledger) only when its partition's commit succeeded. When a commit fails
    (rebalance in progress, illegal generation, ...) and the member still holds
    the partition, it seeks back to the first uncommitted offset (the group's
    committed offset); otherwise whoever gets the partition resumes from there.

    While `gate(p)` is false the member declines what it reads of partition p:
    nothing is committed and it seeks back to the first record read, so the
    records stay pending (it keeps polling, so it stays in the group).
    """

    def __init__(
        self,
        client: str,
        bs: str,
        group: str,
        topic: str,
        ledger: Ledger,
        label: str,
        *,
        batch: int = 10,
        work: float = 0.0,
        metadata_ms: int | None = None,
        assignor: str | None = None,
        gate: Callable[[int], bool] | None = None,
    ) -> None:
        self.client, self.bs, self.group, self.topic = client, bs, group, topic
        self.ledger, self.label = ledger, label
        self.batch, self.metadata_ms = batch, metadata_ms
        #: Seconds each batch takes to process (between its poll and its commit).
        self.work = work
        self.assignor = assignor or ASSIGNOR[client]
        self.gate = gate or (lambda _p: True)
        self.assigned: frozenset[int] = frozenset()
        self.failed_commits = 0
        #: Records a member threw away unprocessed (aiokafka: fetched before a revocation).
        self.dropped = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=label)
        self.thread.start()

    def __repr__(self) -> str:
        return (
            f"<{self.label} {sorted(self.assigned)} failed_commits={self.failed_commits}"
            f" dropped={self.dropped}>"
        )

    def _run(self) -> None:
        try:
            if self.client == "aiokafka":
                asyncio.run(self._aio())
            elif self.client == "confluent":
                self._ck()
            else:
                self._kp()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _observe(self, held: Callable[[], set[int]]) -> None:
        self.assigned = frozenset(held())

    def _split(self, recs: list[tuple[int, int, bytes, bytes]]) -> tuple[Runs, dict[int, int]]:
        """(runs to process, {partition: offset to seek back to} for declined runs)."""
        runs = last_runs(recs)
        declined = {p: run[0][0] for p, run in runs.items() if not self.gate(p)}
        return {p: run for p, run in runs.items() if p not in declined}, declined

    def _book(self, runs: Runs, ok: set[int]) -> set[int]:
        """Ledger the runs of the partitions whose commit succeeded; return the others."""
        self.ledger.add(
            [
                Rec(self.label, p, off, k, v)
                for p, run in runs.items()
                if p in ok
                for off, k, v in run
            ]
        )
        failed = set(runs) - ok
        self.failed_commits += len(failed)
        return failed

    def _handle(
        self,
        recs: list[tuple[int, int, bytes, bytes]],
        commit: Callable[[dict[int, int]], set[int]],
        seek: Callable[[int, int | None], None],
    ) -> None:
        """Process a poll batch: commit (`commit` returns the partitions committed),
        ledger what committed, seek back where needed (`seek(p, None)`: to the
        committed offset; only partitions the member still holds)."""
        runs, declined = self._split(recs)
        if runs:
            time.sleep(self.work)
        failed = (
            self._book(runs, commit({p: r[-1][0] + 1 for p, r in runs.items()})) if runs else set()
        )
        for p, off in declined.items():
            self._retry(seek, p, off)
        for p in failed:
            self._retry(seek, p, None)
        if declined:
            time.sleep(0.05)

    @staticmethod
    def _retry(seek: Callable[[int, int | None], None], p: int, off: int | None) -> None:
        """Seeking right after an assignment can fail while the partition starts."""
        for _ in range(50):
            try:
                seek(p, off)
                return
            except Exception:
                time.sleep(0.1)
        seek(p, off)

    # -------------------------------------------------------------- confluent-kafka

    def _ck(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        conf: dict[str, Any] = {
            "group.id": self.group,
            "partition.assignment.strategy": self.assignor,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
            "max.poll.interval.ms": 30000,
        }
        if self.metadata_ms is not None:
            conf["topic.metadata.refresh.interval.ms"] = self.metadata_ms
        c = Consumer(ck_conf(self.bs, **conf))

        def commit(offsets: dict[int, int]) -> set[int]:
            tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
            try:
                res = c.commit(offsets=tps, asynchronous=False)
            except KafkaException:
                return set()
            return {tp.partition for tp in res or [] if tp.error is None}

        def held() -> set[int]:
            return {tp.partition for tp in c.assignment() if tp.topic == self.topic}

        def seek(p: int, off: int | None) -> None:
            if p not in held():
                return
            if off is None:
                got = c.committed([TopicPartition(self.topic, p)], timeout=20)[0].offset
                off = max(got, 0)
            c.seek(TopicPartition(self.topic, p, off))

        try:
            c.subscribe([self.topic])
            while not self.stop.is_set():
                msgs = c.consume(num_messages=self.batch, timeout=0.1)
                self._observe(held)
                recs = [
                    (m.partition(), m.offset(), m.key(), m.value())
                    for m in msgs
                    if m.error() is None
                ]
                self._handle(recs, commit, seek)
        finally:
            c.close()

    # -------------------------------------------------------------- kafka-python

    def _kp(self) -> None:
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from kafka.structs import OffsetAndMetadata

        from kafka import KafkaConsumer, TopicPartition

        assignor = {
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor,
        }[self.assignor]
        extra = {} if self.metadata_ms is None else {"metadata_max_age_ms": self.metadata_ms}
        c = KafkaConsumer(
            **py_conf(
                self.bs,
                group_id=self.group,
                partition_assignment_strategy=[assignor],
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                max_poll_interval_ms=30000,
                max_poll_records=self.batch,
                **extra,
            )
        )

        def commit(offsets: dict[int, int]) -> set[int]:
            try:
                c.commit(
                    {
                        TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1)
                        for p, o in offsets.items()
                    },
                    timeout_ms=30000,
                )
            except Exception:
                return set()
            return set(offsets)

        def held() -> set[int]:
            return {tp.partition for tp in c.assignment() if tp.topic == self.topic}

        def seek(p: int, off: int | None) -> None:
            if p not in held():
                return
            tp = TopicPartition(self.topic, p)
            if off is None:
                got = c.committed(tp, timeout_ms=20000)
                off = got if got is not None and got >= 0 else 0
            c.seek(tp, off)

        try:
            c.subscribe([self.topic])
            while not self.stop.is_set():
                # A long poll: kafka-python 3.0.12 loses a rebalance it leads when
                # the poll's time runs out during the JoinGroup/SyncGroup that a
                # metadata change (new partitions) started; the next poll sees the
                # metadata matching its new assignment, never applies it, and the
                # member's session expires. A poll ends early once records arrive.
                got = c.poll(timeout_ms=1000, max_records=self.batch)
                self._observe(held)
                recs = [
                    (r.partition, r.offset, r.key, r.value)
                    for tp, rs in got.items()
                    for r in rs
                    if tp.topic == self.topic
                ]
                self._handle(recs, commit, seek)
        finally:
            c.close(autocommit=False)

    # -------------------------------------------------------------- aiokafka

    async def _aio(self) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        assignor = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[
            self.assignor
        ]
        extra = {} if self.metadata_ms is None else {"metadata_max_age_ms": self.metadata_ms}
        c = AIOKafkaConsumer(
            **py_conf(
                self.bs,
                group_id=self.group,
                partition_assignment_strategy=(assignor,),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                max_poll_interval_ms=30000,
                rebalance_timeout_ms=30000,
                **extra,
            ),
        )
        # aiokafka rebalances in a background task, also between a getmany() and
        # the commit of what it returned, and then restarts the partitions at the
        # committed offset. Its documented remedy: a batch is processed and
        # committed under a lock the revocation callback takes too; a batch that
        # a revocation overtook is dropped, unprocessed, and read again from the
        # committed offset by whoever holds its partition.
        lock = asyncio.Lock()
        revocations = 0

        class Revoke(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                nonlocal revocations
                async with lock:
                    revocations += 1

            async def on_partitions_assigned(self, assigned: Any) -> None:
                pass

        async def seek(p: int, off: int | None) -> None:
            tp = TopicPartition(self.topic, p)
            for _ in range(50):
                if tp not in c.assignment():
                    return
                try:
                    if off is None:
                        got = await c.committed(tp)
                        off = got if got is not None and got >= 0 else 0
                    c.seek(tp, off)
                    return
                except Exception:
                    await asyncio.sleep(0.1)
            raise AssertionError(f"{self.label} could not seek {tp}")

        await c.start()
        try:
            c.subscribe([self.topic], listener=Revoke())
            while not self.stop.is_set():
                before = revocations
                got = await c.getmany(timeout_ms=100, max_records=self.batch)
                self._observe(
                    lambda: {tp.partition for tp in c.assignment() if tp.topic == self.topic}
                )
                recs = [
                    (r.partition, r.offset, r.key, r.value)
                    for tp, rs in got.items()
                    for r in rs
                    if tp.topic == self.topic
                ]
                async with lock:
                    if revocations != before:
                        # Dropped: what of it this member still holds restarts at
                        # the committed offset.
                        self.dropped += len(recs)
                        for p in last_runs(recs):
                            await seek(p, None)
                        continue
                    runs, declined = self._split(recs)
                    ok: set[int] = set()
                    if runs:
                        await asyncio.sleep(self.work)
                        try:
                            await c.commit(
                                {
                                    TopicPartition(self.topic, p): r[-1][0] + 1
                                    for p, r in runs.items()
                                }
                            )
                            ok = set(runs)
                        except Exception:
                            pass  # not processed: seek back below
                    for p in self._book(runs, ok):
                        await seek(p, None)
                    for p, off in declined.items():
                        await seek(p, off)
                if declined:
                    await asyncio.sleep(0.05)
        finally:
            await c.stop()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.label} did not stop"
        assert self.error is None, f"{self.label}: {self.error!r}"


def wait_for(cond: Callable[[], bool], members: list[Member], timeout: float = 60.0) -> bool:
    """Poll `cond` until true or `timeout`; a member that died fails the test at once."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for m in members:
            assert m.error is None, f"{m.label}: {m.error!r}"
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def assert_exactly_once(recs: list[Rec], sent: list[Sent]) -> None:
    """Every sent record processed once: no loss, no duplicate, same key and value."""
    seen = Counter((r.partition, r.offset) for r in recs)
    dups = sorted(k for k, n in seen.items() if n > 1)
    assert not dups, f"processed more than once: {dups[:20]} ({len(dups)})"
    want = {(s.partition, s.offset): (s.key, s.value) for s in sent}
    assert len(want) == len(sent)
    missing = sorted(set(want) - set(seen))
    assert not missing, f"never processed: {missing[:20]} ({len(missing)})"
    extra = sorted(set(seen) - set(want))
    assert not extra, f"processed records that were not sent: {extra[:20]}"
    wrong = [
        (r.partition, r.offset) for r in recs if want[(r.partition, r.offset)] != (r.key, r.value)
    ]
    assert not wrong, f"key/value differ at {wrong[:20]}"


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("client", CLIENTS)
def test_keyed_produce_spreads_over_partitions(kserver: KafkaProcess, client: str) -> None:
    """The client's default partitioner spreads keyed records over the 3 partitions
    (each its own `/v0` topic), and one key always lands on one partition."""
    topic = name(f"spread-{client}")
    create_topic(kserver.bootstrap, topic, 3)
    pairs = keyed(240, "s", keys=30)
    sent = produce_keyed(client, kserver.bootstrap, topic, pairs)
    by_part = Counter(s.partition for s in sent)
    assert set(by_part) == {0, 1, 2} and min(by_part.values()) >= 10, by_part
    for s in sent:  # the client's own default partitioner picked the partition
        assert s.partition == default_partition(client, s.key, 3), s
    # Offsets are dense per partition.
    for p in range(3):
        assert sorted(s.offset for s in sent if s.partition == p) == list(range(by_part[p]))

    held = http_records(kserver.base, topic, 3)
    assert {p: len(rs) for p, rs in held.items()} == dict(by_part)
    key_home: dict[str, set[int]] = {}
    got: dict[tuple[int, int], tuple[bytes, Any]] = {}
    for p, rs in held.items():
        for r in rs:
            key_home.setdefault(r["$tag"], set()).add(p)
            got[(p, r["$seq"] - 1)] = (r["$tag"].encode(), r["data"])
    assert len(key_home) == 30
    assert all(len(homes) == 1 for homes in key_home.values()), key_home
    # Values are JSON documents, stored as such: compare documents, not bytes.
    assert got == {(s.partition, s.offset): (s.key, json.loads(s.value)) for s in sent}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("client", "assignor"), REBALANCES)
def test_rebalance_processes_each_record_once_and_offsets_survive_restart(
    tmp_path: Path, client: str, assignor: str
) -> None:
    """Two members consume part of a 3-partition topic, a third joins (a forced
    rebalance) while records keep arriving and takes over a partition at its
    committed offset; a fourth joins and leaves while all are busy. Every record
    is processed exactly once and the three end with one partition each. After a
    restart a new member of the group reads exactly the records produced since
    (the committed offsets held)."""
    srv = KafkaProcess(tmp_path)
    members: list[Member] = []
    try:
        bs = srv.bootstrap
        topic, group = name(f"rb-{client}"), name(f"grp-{client}")
        create_topic(bs, topic, 3)
        ledger = Ledger()
        sent = produce_keyed(client, bs, topic, keyed(300, "a"))
        assert min(Counter(s.partition for s in sent).values()) >= 45

        # The group processes a first part (a few records of every partition), then
        # holds (members keep polling but decline, uncommitted, what they read)
        # until the rebalance has settled: each partition that changes hands does
        # so at a committed offset in the middle of its pending records.
        part = 5
        released = threading.Event()

        def gate(p: int) -> bool:
            return released.is_set() or ledger.count(p) < part

        def member(label: str) -> Member:
            m = Member(
                client,
                bs,
                group,
                topic,
                ledger,
                label,
                batch=5,
                work=0.02,
                assignor=assignor,
                gate=gate,
            )
            members.append(m)
            return m

        m1, m2 = member("m1"), member("m2")
        assert wait_for(
            lambda: (
                all(ledger.count(p) >= part for p in range(3))
                and bool(m1.assigned)
                and bool(m2.assigned)
                and m1.assigned | m2.assigned == {0, 1, 2}
            ),
            members,
        ), (len(ledger), members)
        first = len(ledger)
        assert first < 45, first  # no partition is used up: each has 45 or more

        # The third member joins while more records arrive: the group rebalances.
        more: list[Sent] = []
        prod = threading.Thread(
            target=lambda: more.extend(
                produce_keyed(client, bs, topic, keyed(150, "b"), chunk=5, pause=0.05)
            )
        )
        prod.start()
        m3 = member("m3")

        def settled() -> bool:
            held = [m.assigned for m in members]
            return all(len(h) == 1 for h in held) and frozenset().union(*held) == {0, 1, 2}

        assert wait_for(settled, members, 90), members
        (p3,) = m3.assigned
        released.set()
        a_keys = {s.key for s in sent if s.key.startswith(b"a-")}

        def m3_share() -> set[str]:
            return {r.member for r in ledger.snapshot() if r.partition == p3 and r.key in a_keys}

        # m3 took over p3 in the middle of the first batch: where the group had
        # committed, after another member's share.
        assert wait_for(lambda: "m3" in m3_share(), members, 60), (p3, m3_share(), members)
        assert len(m3_share()) >= 2, (p3, m3_share(), members)

        # Two more rebalances while the members are busy with the arriving records:
        # a fourth member joins, takes part a while, and leaves.
        m4 = member("m4")
        time.sleep(2.0)
        m4.close()
        members.remove(m4)
        prod.join(120)
        assert not prod.is_alive() and len(more) == 150
        sent += more
        last = produce_keyed(client, bs, topic, keyed(90, "c"))
        sent += last
        assert wait_for(lambda: len(ledger) >= len(sent), members, 90), (len(ledger), members)
        assert wait_for(settled, members, 60), members
        time.sleep(0.5)  # nothing more may arrive
        assert_exactly_once(ledger.snapshot(), sent)

        # ------------------------------------------------------------ restart
        for m in members:
            m.close()
        members.clear()
        fresh = produce_keyed(client, bs, topic, keyed(90, "d"))
        assert {s.partition for s in fresh} == {0, 1, 2}
        srv.restart()
        bs = srv.bootstrap
        after = Ledger()
        m5 = Member(client, bs, group, topic, after, "m5", batch=20, assignor=assignor)
        members.append(m5)
        assert wait_for(lambda: len(after) >= len(fresh), members, 60), (len(after), m5)
        assert wait_for(lambda: m5.assigned == {0, 1, 2}, members, 30), m5
        time.sleep(1.0)  # nothing older may follow
        assert_exactly_once(after.snapshot(), fresh)
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.thread.join(60)
        srv.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", CLIENTS)
def test_create_partitions_while_consuming(kserver: KafkaProcess, client: str) -> None:
    """CreatePartitions 3 -> 6 while a member consumes: keyed records reach the new
    partitions (`/v0` topics T:3..T:5), the member picks them up (its metadata
    refresh is short) and processes every record exactly once."""
    bs = kserver.bootstrap
    topic, group = name(f"grow-{client}"), name(f"grp-{client}")
    create_topic(bs, topic, 3)
    ledger = Ledger()
    sent = produce_keyed(client, bs, topic, keyed(90, "a"))
    m = Member(client, bs, group, topic, ledger, "m", batch=20, metadata_ms=500)
    try:
        assert wait_for(lambda: len(ledger) >= len(sent) and m.assigned == {0, 1, 2}, [m]), (
            len(ledger),
            m,
        )
        grow_topic(bs, topic, 6)
        for i in range(3, 6):
            r = httpx.get(f"{kserver.base}/v0/topics/{topic}:{i}")
            assert r.status_code == 200 and r.json()["head_seq"] == 0, r.text
        assert httpx.get(f"{kserver.base}/v0/topics/{topic}:6").status_code == 404

        grown = produce_keyed(client, bs, topic, keyed(180, "b", keys=36))
        parts = Counter(s.partition for s in grown)
        assert set(parts) == set(range(6)), parts
        for s in grown:
            assert s.partition == default_partition(client, s.key, 6), s
        sent += grown
        assert wait_for(lambda: m.assigned == set(range(6)), [m], 60), m
        assert wait_for(lambda: len(ledger) >= len(sent), [m], 60), (len(ledger), m)
        time.sleep(0.5)
        assert_exactly_once(ledger.snapshot(), sent)
        held = http_records(kserver.base, topic, 6)
        assert {p: len(rs) for p, rs in held.items()} == {
            p: sum(1 for s in sent if s.partition == p) for p in range(6)
        }
    finally:
        m.close()


def test_offset_fetch_sees_the_commit_pipelined_before_it(kserver: KafkaProcess) -> None:
    """An OffsetCommit and an OffsetFetch sent together on one connection: the
    fetch answers with the committed offsets of every partition, as a broker that
    handles a connection's requests in order does (aiokafka pipelines the two when
    a rebalance lands during a commit)."""
    topic, group = name("pipe"), name("grp")
    create_topic(kserver.bootstrap, topic, 3)
    C = P.REQUESTS[P.OFFSET_COMMIT]
    CT, CP = C.OffsetCommitRequestTopic, C.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    F = P.REQUESTS[P.OFFSET_FETCH]

    def frame(req: Any, corr: int) -> bytes:
        req.with_header(correlation_id=corr, client_id="pipe")
        return bytes(req.encode(header=True, framed=True))

    def read_frame(sock: socket.socket) -> bytes:
        def exactly(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = sock.recv(n - len(buf))
                assert chunk, "connection closed"
                buf += chunk
            return buf

        (n,) = struct.unpack(">i", exactly(4))
        return exactly(n)

    with socket.create_connection(("127.0.0.1", kserver.kport), timeout=20) as sock:
        for i in range(1, 11):
            want = [i * 100 + p for p in range(3)]
            commit = C(
                version=2,
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                retention_time_ms=-1,
                topics=[
                    CT(
                        name=topic,
                        partitions=[
                            CP(partition_index=p, committed_offset=o, committed_metadata="")
                            for p, o in enumerate(want)
                        ],
                    )
                ],
            )
            fetch = F(
                version=1,
                group_id=group,
                topics=[F.OffsetFetchRequestTopic(name=topic, partition_indexes=[0, 1, 2])],
            )
            sock.sendall(frame(commit, 2 * i) + frame(fetch, 2 * i + 1))  # one write
            done = P.RESPONSES[P.OFFSET_COMMIT].decode(read_frame(sock), version=2, header=True)
            assert [p.error_code for p in done.topics[0].partitions] == [0, 0, 0]
            got = P.RESPONSES[P.OFFSET_FETCH].decode(read_frame(sock), version=1, header=True)
            assert got.header.correlation_id == 2 * i + 1
            assert [p.committed_offset for p in got.topics[0].partitions] == want, i
