"""Wire-level behaviour with hand-built requests (kafka-python's codec on the client side):
version negotiation, bad input isolation, idempotent sequences, ListOffsets by
timestamp, long-poll wake-up, acks=0, admin APIs, SASL gating."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder

from tests.kafka.support import KafkaProcess
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.apis import SUPPORTED

pytestmark = pytest.mark.kafka


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Raw:
    """One Kafka connection speaking through kafka-python's generated codec."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.corr = 0

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, key: int, version: int, **fields: Any) -> int:
        self.corr += 1
        req = P.REQUESTS[key](version=version, **fields)
        req.with_header(correlation_id=self.corr, client_id="raw")
        self.sock.sendall(bytes(req.encode(header=True, framed=True)))
        return self.corr

    def recv_frame(self) -> bytes | None:
        head = self._read(4)
        if head is None:
            return None
        (n,) = struct.unpack(">i", head)
        return self._read(n)

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def call(self, key: int, version: int, **fields: Any) -> Any:
        corr = self.send(key, version, **fields)
        frame = self.recv_frame()
        assert frame is not None, "connection closed"
        resp = P.RESPONSES[key].decode(frame, version=version, header=True)
        assert resp.header.correlation_id == corr
        return resp

    def closed(self) -> bool:
        """True once the server has closed this connection."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True

    def close(self) -> None:
        self.sock.close()


def batch(values: list[bytes], pid: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, 0, pid, epoch, seq, 1 << 30)
    for i, v in enumerate(values):
        b.append(i, int(time.time() * 1000), None, v, [])
    return bytes(b.build())


def produce_req(topic: str, records: bytes, acks: int = 1) -> dict[str, Any]:
    R = P.REQUESTS[P.PRODUCE]
    T = R.TopicProduceData
    return {
        "acks": acks,
        "timeout_ms": 5000,
        "topic_data": [
            T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])
        ],
    }


def produce(raw: Raw, topic: str, records: bytes, acks: int = 1) -> Any:
    resp = raw.call(P.PRODUCE, 9, **produce_req(topic, records, acks))
    return resp.responses[0].partition_responses[0]


def fetch_req(topic: str, offset: int, wait_ms: int = 0) -> dict[str, Any]:
    R = P.REQUESTS[P.FETCH]
    T = R.FetchTopic
    return {
        "max_wait_ms": wait_ms,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [
            T(
                topic=topic,
                partitions=[
                    T.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
                ],
            )
        ],
    }


@pytest.fixture
def raw(kserver: KafkaProcess) -> Iterator[Raw]:
    r = Raw(kserver.kport)
    yield r
    r.close()


def create(kserver: KafkaProcess, topic: str, body: dict[str, Any] | None = None) -> None:
    r = httpx.put(f"{kserver.base}/v0/topics/{topic}", json=body or {})
    assert r.status_code == 201, r.text


def head(kserver: KafkaProcess, topic: str) -> int:
    return int(httpx.get(f"{kserver.base}/v0/topics/{topic}").json()["head_seq"])


def test_api_versions_negotiation(raw: Raw) -> None:
    resp = raw.call(P.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    assert resp.error_code == 0
    table = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert table == SUPPORTED
    # A version beyond ours: error 35 in the v0 body layout, with our table.
    raw.send(P.API_VERSIONS, 4, client_software_name="raw", client_software_version="1")
    frame = raw.recv_frame()
    assert frame is not None
    old = P.RESPONSES[P.API_VERSIONS].decode(frame, version=0, header=True)
    assert old.error_code == E.UNSUPPORTED_VERSION
    assert {k.api_key for k in old.api_keys} == set(SUPPORTED)


def test_unsupported_version_gets_error_35(raw: Raw) -> None:
    R = P.REQUESTS[P.METADATA]
    resp = raw.call(P.METADATA, 13, topics=[R.MetadataRequestTopic(name="x")])
    assert resp.error_code == E.UNSUPPORTED_VERSION
    hb = raw.call(P.HEARTBEAT, 0, group_id="g", generation_id=1, member_id="m")  # still usable
    assert hb.error_code == E.UNKNOWN_MEMBER_ID


@pytest.mark.parametrize(
    "junk",
    [
        b"\x00\x00\x00\x04\x00\x00",  # truncated: frame says 4 bytes, 2 sent
        b"\x00\x00\x00\x03abc",  # shorter than a request header
        struct.pack(">ihhi", 8, 999, 0, 1),  # unknown api key
        struct.pack(">ihhih", 10, 3, 12, 1, 200),  # Metadata whose client id overruns
        struct.pack(">i", 0x7FFFFFF0),  # absurd frame size
        struct.pack(">ihhih", 12, 0, 9, 1, -1) + b"\xff\xff",  # Produce cut mid-body
    ],
)
def test_bad_input_closes_only_that_connection(kserver: KafkaProcess, junk: bytes) -> None:
    topic = name("bad")
    create(kserver, topic)
    other = Raw(kserver.kport)
    bad = Raw(kserver.kport)
    try:
        assert produce(other, topic, batch([b"1", b"2"])).error_code == 0
        bad.send_bytes(junk)
        if junk.startswith(b"\x00\x00\x00\x04"):
            bad.sock.shutdown(socket.SHUT_WR)
        assert bad.closed()
        # The other connection and the stored data are untouched.
        assert produce(other, topic, batch([b"3"])).error_code == 0
        assert head(kserver, topic) == 3
    finally:
        bad.close()
        other.close()
    assert "Traceback" not in kserver.log()


def test_corrupt_batch_is_refused_and_nothing_is_written(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("crc")
    create(kserver, topic)
    b = bytearray(batch([b"a", b"b"]))
    b[-1] ^= 0x01  # flip a bit inside the CRC-covered records
    assert produce(raw, topic, bytes(b)).error_code == E.CORRUPT_MESSAGE
    assert head(kserver, topic) == 0
    assert produce(raw, topic, batch([b"ok"])).error_code == 0


def test_idempotent_sequences(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("seq")
    create(kserver, topic)
    pid = raw.call(P.INIT_PRODUCER_ID, 0, transactional_id=None, transaction_timeout_ms=1000)
    assert pid.error_code == 0
    p, e = pid.producer_id, pid.producer_epoch
    first = produce(raw, topic, batch([b"a", b"b"], p, e, 0))
    assert (first.error_code, first.base_offset) == (0, 0)
    again = produce(raw, topic, batch([b"a", b"b"], p, e, 0))  # a retry
    assert (again.error_code, again.base_offset) == (0, 0)
    assert head(kserver, topic) == 2
    gap = produce(raw, topic, batch([b"c"], p, e, 5))
    assert gap.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    nxt = produce(raw, topic, batch([b"c"], p, e, 2))
    assert (nxt.error_code, nxt.base_offset) == (0, 2)
    stale = produce(raw, topic, batch([b"d"], p, e - 1, 3))
    assert stale.error_code == E.INVALID_PRODUCER_EPOCH
    assert head(kserver, topic) == 3


def test_list_offsets_by_timestamp(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("ts")
    create(kserver, topic)
    produce(raw, topic, batch([b"early1", b"early2"]))
    time.sleep(0.02)  # separates the server-side $ts of the two writes
    late = produce(raw, topic, batch([b"late"]))
    assert late.base_offset == 2
    R = P.REQUESTS[P.LIST_OFFSETS]
    T = R.ListOffsetsTopic

    def lookup(ts: int) -> tuple[int, int, int]:
        resp = raw.call(
            P.LIST_OFFSETS,
            7,
            replica_id=-1,
            isolation_level=0,
            topics=[
                T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=0, timestamp=ts)])
            ],
        )
        pr = resp.topics[0].partitions[0]
        return pr.error_code, pr.offset, pr.timestamp

    assert lookup(-2)[:2] == (0, 0)
    assert lookup(-1)[:2] == (0, 3)
    assert lookup(late.log_append_time_ms) == (0, 2, late.log_append_time_ms)
    assert lookup(0)[1] == 0
    assert lookup(late.log_append_time_ms + 60_000)[1] == -1
    assert lookup(-3)[:2] == (0, 2)


def test_fetch_long_poll_is_woken_by_an_append(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("lp")
    create(kserver, topic)
    # max_wait 30 s; the socket times out after 10 s, so only a wake-up answers in time.
    raw.send(P.FETCH, 12, **fetch_req(topic, 0, wait_ms=30_000))
    time.sleep(0.2)
    r = httpx.post(f"{kserver.base}/v0/topics/{topic}", json={"records": [{"data": {"x": 1}}]})
    assert r.status_code == 200 or r.status_code == 201
    frame = raw.recv_frame()
    assert frame is not None
    resp = P.RESPONSES[P.FETCH].decode(frame, version=12, header=True)
    part = resp.responses[0].partitions[0]
    assert part.error_code == 0 and part.high_watermark == 1
    assert b'{"x":1}' in part.records


def test_fetch_out_of_range_and_empty_partition(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("oor")
    create(kserver, topic)
    produce(raw, topic, batch([b"1"]))
    resp = raw.call(P.FETCH, 12, **fetch_req(topic, 5))
    assert resp.responses[0].partitions[0].error_code == E.OFFSET_OUT_OF_RANGE
    resp = raw.call(P.FETCH, 12, **fetch_req(name("nope"), 0))
    assert resp.responses[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION


def test_acks_zero_gets_no_response(kserver: KafkaProcess, raw: Raw) -> None:
    topic = name("a0")
    create(kserver, topic)
    raw.send(P.PRODUCE, 9, **produce_req(topic, batch([b"x", b"y"]), acks=0))
    # The next request's answer is the first frame back: acks=0 produced none.
    hb = raw.call(P.HEARTBEAT, 0, group_id="g", generation_id=1, member_id="m")
    assert hb.error_code == E.UNKNOWN_MEMBER_ID
    assert head(kserver, topic) == 2


def test_create_and_delete_topics(kserver: KafkaProcess, raw: Raw) -> None:
    R = P.REQUESTS[P.CREATE_TOPICS]
    C = R.CreatableTopic
    t1, t2, t3 = name("ct"), name("ct"), name("ct")

    def topic(n: str, parts: int = 1, configs: list[tuple[str, str]] = ()) -> Any:  # type: ignore[assignment]
        return C(
            name=n,
            num_partitions=parts,
            replication_factor=1,
            assignments=[],
            configs=[C.CreatableTopicConfig(name=k, value=v) for k, v in configs],
        )

    resp = raw.call(
        P.CREATE_TOPICS,
        5,
        timeout_ms=5000,
        validate_only=False,
        topics=[
            topic(t1, configs=[("durability", "fsync"), ("retention.ms", "60000")]),
            topic(t2, parts=3),
            topic(t3, configs=[("bogus", "1")]),
            topic("bad name!"),
            topic(f"{t3}:1"),
            topic(name("ct"), parts=0),
        ],
    )
    codes = [r.error_code for r in resp.topics]
    assert codes == [
        0,
        0,
        E.INVALID_CONFIG,
        E.INVALID_TOPIC_EXCEPTION,
        E.INVALID_TOPIC_EXCEPTION,  # a name ending in :<n> names a partition
        E.INVALID_PARTITIONS,
    ]
    assert resp.topics[1].num_partitions == 3
    # the three partitions of t2 are the /v0 topics t2, t2:1, t2:2
    for stored in (t2, f"{t2}:1", f"{t2}:2"):
        assert httpx.get(f"{kserver.base}/v0/topics/{stored}").status_code == 200
    cfg = httpx.get(f"{kserver.base}/v0/topics/{t1}").json()["config"]
    assert cfg["durability"] == "fsync" and cfg["ttl_ms"] == 60000
    again = raw.call(P.CREATE_TOPICS, 5, timeout_ms=5000, validate_only=False, topics=[topic(t1)])
    assert again.topics[0].error_code == E.TOPIC_ALREADY_EXISTS
    resp = raw.call(P.DELETE_TOPICS, 4, topic_names=[t1, t2], timeout_ms=5000)
    assert {r.name: r.error_code for r in resp.responses} == {t1: 0, t2: 0}
    for stored in (t1, t2, f"{t2}:1", f"{t2}:2"):
        assert httpx.get(f"{kserver.base}/v0/topics/{stored}").status_code == 404
    resp = raw.call(P.DELETE_TOPICS, 4, topic_names=[t2], timeout_ms=5000)
    assert resp.responses[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    srv = KafkaProcess(
        Path(tmp_path_factory.mktemp("sasl")), {"TOPICS_API_KEYS": "reader-1:r,writer-1:rw"}
    )
    yield srv
    srv.stop()


def test_requests_before_sasl_close_the_connection(secured: KafkaProcess) -> None:
    r = Raw(secured.kport)
    try:
        assert r.call(P.API_VERSIONS, 0).error_code == 0  # allowed before auth
        r.send(P.METADATA, 4, topics=None, allow_auto_topic_creation=False)
        assert r.closed()
    finally:
        r.close()


def test_sasl_plain_scopes(secured: KafkaProcess) -> None:
    r = Raw(secured.kport)
    try:
        assert (
            r.call(P.SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256").error_code
            == E.UNSUPPORTED_SASL_MECHANISM
        )
        assert r.call(P.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
        ok = r.call(P.SASL_AUTHENTICATE, 2, auth_bytes=b"\x00anyone\x00reader-1")
        assert ok.error_code == 0
        topic = name("ro")
        # read-only key: no auto-create, no produce, no producer id
        R = P.REQUESTS[P.METADATA]
        md = r.call(
            P.METADATA,
            9,
            topics=[R.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=True,
        )
        assert md.topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        assert produce(r, topic, batch([b"x"])).error_code == E.TOPIC_AUTHORIZATION_FAILED
        pid = r.call(P.INIT_PRODUCER_ID, 0, transactional_id=None, transaction_timeout_ms=1)
        assert pid.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    finally:
        r.close()
    bad = Raw(secured.kport)
    try:
        assert bad.call(P.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
        no = bad.call(P.SASL_AUTHENTICATE, 2, auth_bytes=b"\x00x\x00wrong")
        assert no.error_code == E.SASL_AUTHENTICATION_FAILED
        assert bad.closed()
    finally:
        bad.close()


def test_a_paced_produce_is_throttled_not_refused(inproc: Any) -> None:
    """Under the pressure ladder a Produce to a low band is answered late, with the
    wait in throttle_time_ms; an urgent topic's Produce is not (docs/SCHEDULER.md)."""
    n = inproc.node
    inproc.run(lambda: n.engine.put_topic("low", {"priority": -100}))
    inproc.run(lambda: n.engine.put_topic("urgent", {"priority": 900}))

    def press() -> None:
        n.delivery.governor.pace = 1.0  # 20 ms for B0
        n.delivery.saw_band(4)

    inproc.run(press)
    raw = Raw(inproc.server.port)
    try:
        t0 = time.perf_counter()
        resp = raw.call(P.PRODUCE, 9, **produce_req("low", batch([b"a"])))
        waited = time.perf_counter() - t0
        assert resp.throttle_time_ms == 20 and waited >= 0.019
        assert resp.responses[0].partition_responses[0].error_code == E.NONE
        resp = raw.call(P.PRODUCE, 9, **produce_req("urgent", batch([b"b"])))
        assert resp.throttle_time_ms == 0
        assert inproc.run(lambda: n.engine.topics["low"].head_seq) == 1
    finally:
        raw.sock.close()
