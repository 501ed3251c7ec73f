"""The Kafka listener with real clients, per client: produce/consume, groups, restart, rebalance,
idempotent retries, out-of-range after eviction (real Kafka clients from PyPI)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kafka.support import (
    CLIENTS,
    InProcess,
    KafkaProcess,
    ck_conf,
    consume_assign,
    group_consume,
    items,
    produce,
    py_conf,
)

pytestmark = pytest.mark.kafka


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("acks", ["1", "all"])
def test_produce_then_assign_and_seek(kserver: KafkaProcess, client: str, acks: str) -> None:
    topic = name(f"p-{client}-{acks}")
    want = items(120, prefix=client)
    offsets = produce(client, kserver.bootstrap, topic, want, acks=acks)
    assert offsets == list(range(120))
    got = consume_assign(client, kserver.bootstrap, topic, 0, 120)
    assert [m.offset for m in got] == list(range(120))
    assert [(m.key, m.value, m.headers) for m in got] == [(k, v, h) for k, v, h in want]
    tail = consume_assign(client, kserver.bootstrap, topic, 60, 60)
    assert [m.offset for m in tail] == list(range(60, 120))
    assert tail[0].value == want[60][1]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("client", CLIENTS)
def test_every_codec_round_trips(kserver: KafkaProcess, client: str, codec: str) -> None:
    """Compressed batches of every codec a client can write are decoded into records
    that read back the same over Kafka and over HTTP."""
    if client == "kafka-python" and codec == "snappy":
        import kafka.codec

        if not kafka.codec.has_snappy():
            pytest.skip("kafka-python writes snappy only with python-snappy, not installed")
    topic = name(f"z-{client}-{codec}")
    want = items(200, prefix=f"{client}-{codec}")
    assert produce(client, kserver.bootstrap, topic, want, compression=codec) == list(range(200))
    got = consume_assign(client, kserver.bootstrap, topic, 0, 200)
    assert [(m.key, m.value, m.headers) for m in got] == [(k, v, h) for k, v, h in want]
    r = httpx.post(f"{kserver.base}/v0/topics/{topic}/diff", json={"from_seq": 0, "limit": 1000})
    assert r.status_code == 200 and len(r.json()["records"]) == 200


@pytest.mark.parametrize("client", CLIENTS)
def test_acks_all_on_an_fsync_topic(kserver: KafkaProcess, client: str) -> None:
    topic = name(f"fs-{client}")
    r = httpx.put(f"{kserver.base}/v0/topics/{topic}", json={"durability": "fsync"})
    assert r.status_code == 201
    offsets = produce(client, kserver.bootstrap, topic, items(50), acks="all")
    assert offsets == list(range(50))
    state = httpx.get(f"{kserver.base}/v0/topics/{topic}").json()
    assert state["head_seq"] == 50 and state["config"]["durability"] == "fsync"


@pytest.mark.parametrize("client", CLIENTS)
def test_group_commit_survives_restart(tmp_path: Path, client: str) -> None:
    srv = KafkaProcess(tmp_path)
    try:
        topic, group = name(f"g-{client}"), name("grp")
        produce(client, srv.bootstrap, topic, items(100))
        first = group_consume(client, srv.bootstrap, topic, group, 60)
        assert [m.offset for m in first] == list(range(60))
        srv.restart()
        rest = group_consume(client, srv.bootstrap, topic, group, 40)
        assert [m.offset for m in rest] == list(range(60, 100))
        assert rest[0].value == items(100)[60][1]
    finally:
        srv.stop()


class Member:
    """A subscribed consumer polling in its own thread; exposes its assignment."""

    def __init__(self, client: str, bs: str, group: str, topics: list[str]) -> None:
        self.client, self.bs, self.group, self.topics = client, bs, group, topics
        self.assigned: set[str] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

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

    def _ck(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer(
            ck_conf(
                self.bs,
                **{
                    "group.id": self.group,
                    "partition.assignment.strategy": "roundrobin",
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 300,
                    "auto.offset.reset": "earliest",
                },
            )
        )
        c.subscribe(self.topics)
        while not self.stop.is_set():
            c.poll(0.1)
            self.assigned = {tp.topic for tp in c.assignment()}
        c.close()

    def _kp(self) -> None:
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        from kafka import KafkaConsumer

        c = KafkaConsumer(
            **py_conf(
                self.bs,
                group_id=self.group,
                partition_assignment_strategy=[RoundRobinPartitionAssignor],
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                auto_offset_reset="earliest",
            )
        )
        c.subscribe(self.topics)
        while not self.stop.is_set():
            c.poll(timeout_ms=100)
            self.assigned = {tp.topic for tp in c.assignment()}
        c.close()

    async def _aio(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        c = AIOKafkaConsumer(
            *self.topics,
            **py_conf(
                self.bs,
                group_id=self.group,
                partition_assignment_strategy=(RoundRobinPartitionAssignor,),
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                auto_offset_reset="earliest",
            ),
        )
        await c.start()
        while not self.stop.is_set():
            await c.getmany(timeout_ms=100)
            self.assigned = {tp.topic for tp in c.assignment()}
        await c.stop()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert self.error is None, self.error


def wait_for(cond: Any, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


@pytest.mark.parametrize("client", CLIENTS)
def test_two_member_rebalance(kserver: KafkaProcess, client: str) -> None:
    t1, t2, group = name("rb1"), name("rb2"), name(f"rb-{client}")
    for t in (t1, t2):
        produce(client, kserver.bootstrap, t, items(3))
    both = {t1, t2}
    a = Member(client, kserver.bootstrap, group, [t1, t2])
    b: Member | None = None
    try:
        assert wait_for(lambda: a.assigned == both), a.assigned
        b = Member(client, kserver.bootstrap, group, [t1, t2])
        assert wait_for(
            lambda: (
                len(a.assigned) == 1 and len(b.assigned) == 1 and a.assigned | b.assigned == both
            )
        ), (a.assigned, b.assigned)
        b.close()
        b = None
        assert wait_for(lambda: a.assigned == both), a.assigned
    finally:
        if b is not None:
            b.close()
        a.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_idempotent_retry_writes_once(client: str) -> None:
    inproc = InProcess(dropper=True)
    try:
        assert inproc.dropper is not None
        topic = name(f"idem-{client}")
        inproc.call(inproc.server.backend.create(topic, {}))
        # The first produce response is never delivered (the connection drops after
        # the write happened): the client retries the same batch with the same sequence.
        inproc.dropper.drop_produce_responses = 1
        want = items(40)
        offsets = produce(client, inproc.bootstrap, topic, want, acks="all", idempotent=True)
        assert inproc.dropper.drop_produce_responses == 0  # the fault fired
        assert sorted(offsets) == list(range(40))
        part = inproc.run(lambda: inproc.server.backend.partition(topic))
        assert part.head_seq == 40  # nothing written twice
        got = consume_assign(client, inproc.bootstrap, topic, 0, 40)
        assert [m.value for m in got] == [v for _k, v, _h in want]
    finally:
        inproc.close()


def _out_of_range_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return (
        "OffsetOutOfRange" in text
        or "OFFSET_OUT_OF_RANGE" in text
        or "out of range" in text.lower()
        or "_AUTO_OFFSET_RESET" in text
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_fetch_below_the_eviction_floor(kserver: KafkaProcess, client: str) -> None:
    topic = name(f"cap-{client}")
    r = httpx.put(f"{kserver.base}/v0/topics/{topic}", json={"cap_records": 10})
    assert r.status_code == 201
    produce(client, kserver.bootstrap, topic, items(30))
    # auto.offset.reset=earliest: the client is told its offset is gone and
    # restarts at the log start offset (the first retained record, offset 20).
    got = consume_assign(client, kserver.bootstrap, topic, 0, 10, reset="earliest")
    assert [m.offset for m in got] == list(range(20, 30))
    # Without a reset policy the OFFSET_OUT_OF_RANGE error reaches the application.
    with pytest.raises(Exception) as info:
        more = consume_assign(client, kserver.bootstrap, topic, 5, 1, reset="none", timeout=10)
        raise AssertionError(f"no error, got {more}")
    assert _out_of_range_error(info.value), repr(info.value)


def test_fetched_records_carry_their_append_time(kserver: KafkaProcess) -> None:
    """Every fetched record says LogAppendTime with its own `$ts`, also where one
    fetch spans records appended at different times (docs/KAFKA.md "Records")."""
    topic = name("ts")
    for i in range(6):
        r = httpx.post(f"{kserver.base}/v0/topics/{topic}", json={"records": [{"data": i}] * 2})
        assert r.status_code in (200, 201), r.text
        time.sleep(0.003)  # a new millisecond: a new append time
    r = httpx.post(f"{kserver.base}/v0/topics/{topic}/diff", json={"from_seq": 0})
    want = [rec["$ts"] for rec in r.json()["records"]]
    assert len(want) == 12 and len(set(want)) > 1

    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

    c = Consumer(ck_conf(kserver.bootstrap, **{"group.id": name("g"), "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        while len(got) < 12 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.timestamp())
    finally:
        c.close()
    assert got == [(TIMESTAMP_LOG_APPEND_TIME, ts) for ts in want]

    async def go() -> list[tuple[int, int]]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as TP

        ac = AIOKafkaConsumer(**py_conf(kserver.bootstrap, enable_auto_commit=False))
        await ac.start()
        try:
            ac.assign([TP(topic, 0)])
            ac.seek(TP(topic, 0), 0)
            out: list[tuple[int, int]] = []
            while len(out) < 12:
                batch = await ac.getmany(timeout_ms=1000)
                out += [(m.timestamp_type, m.timestamp) for ms in batch.values() for m in ms]
            return out
        finally:
            await ac.stop()

    assert asyncio.run(go()) == [(1, ts) for ts in want]  # 1: LogAppendTime


@pytest.fixture(scope="module", params=["gzip", "snappy", "lz4", "zstd"])
def compressing(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server whose Fetch answers carry batches compressed with one codec."""
    codec = request.param
    srv = KafkaProcess(
        Path(tmp_path_factory.mktemp(f"fetch-{codec}")),
        {"TOPICS_KAFKA_FETCH_COMPRESSION": codec},
    )
    yield codec, srv
    srv.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_compressed_fetch_answers_decode_in_every_client(compressing: Any, client: str) -> None:
    """TOPICS_KAFKA_FETCH_COMPRESSION: what a client reads back was compressed by the
    server with that codec, and every client that has the codec decodes it to the
    same records (docs/KAFKA.md "Records")."""
    codec, srv = compressing
    if client == "kafka-python" and codec == "snappy":
        import kafka.codec

        if not kafka.codec.has_snappy():
            pytest.skip("kafka-python reads snappy only with python-snappy, not installed")
    topic = name(f"fz-{client}-{codec}")
    want = items(300, prefix=codec)
    assert produce(client, srv.bootstrap, topic, want) == list(range(300))
    got = consume_assign(client, srv.bootstrap, topic, 0, 300)
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(want)
    ]
