"""The Kafka listener's exposure limits, with raw sockets against a real `topics serve`.

With keys configured: a frame above 16 KiB before SASL completes closes the
connection at once (the size prefix alone is enough), `TOPICS_KAFKA_MAX_FRAME_BYTES`
applies after it, a frame that stops half way is cut after
`TOPICS_KAFKA_FRAME_TIMEOUT_MS`, an unauthenticated connection gets that long
between frames, and an authenticated one is closed after
`TOPICS_KAFKA_IDLE_TIMEOUT_MS` of silence unless a request is still in progress.
Through all of it the server stays healthy and real clients keep working.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kafka.support import KafkaProcess, consume_assign, produce
from tests.kafka.test_wire import Raw, batch, fetch_req
from tests.kafka.test_wire import produce as raw_produce
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.server import PRE_AUTH_MAX_FRAME

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SECRET = "lim-secret"
FRAME_TIMEOUT_MS = 600
IDLE_TIMEOUT_MS = 2000
MAX_FRAME = 256 * 1024


def name(prefix: str = "lim.") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    s = KafkaProcess(
        Path(tmp_path_factory.mktemp("limits")),
        {
            "TOPICS_API_KEYS": f"{SECRET}:rw+a+d:lim.",
            "TOPICS_KAFKA_FRAME_TIMEOUT_MS": str(FRAME_TIMEOUT_MS),
            "TOPICS_KAFKA_IDLE_TIMEOUT_MS": str(IDLE_TIMEOUT_MS),
            "TOPICS_KAFKA_MAX_FRAME_BYTES": str(MAX_FRAME),
        },
    )
    yield s
    s.stop()


def login(srv: KafkaProcess) -> Raw:
    r = Raw(srv.kport)
    assert r.call(P.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
    assert r.call(P.SASL_AUTHENTICATE, 2, auth_bytes=f"\0u\0{SECRET}".encode()).error_code == 0
    return r


def closed_within(r: Raw, seconds: float) -> float:
    """Seconds until the server closed `r` (asserts it happened within `seconds`)."""
    t0 = time.monotonic()
    r.sock.settimeout(seconds)
    try:
        data = r.sock.recv(1 << 16)
    except ConnectionResetError:
        data = b""
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds} s")
    assert data == b"", data
    return time.monotonic() - t0


def healthy(srv: KafkaProcess) -> None:
    """HTTP answers and a fresh Kafka connection can log in and produce."""
    assert httpx.get(f"{srv.base}/v0/health", timeout=5).status_code == 200
    r = login(srv)
    try:
        t = name()
        md = r.call(
            P.METADATA,
            9,
            topics=[P.REQUESTS[P.METADATA].MetadataRequestTopic(name=t)],
            allow_auto_topic_creation=True,
        )
        assert md.topics[0].error_code == 0
        assert raw_produce(r, t, batch([b"ok"])).error_code == 0
    finally:
        r.close()


def test_pre_auth_huge_length_prefix_is_closed_at_once(srv: KafkaProcess) -> None:
    r = Raw(srv.kport)
    try:
        r.send_bytes(struct.pack(">i", 1 << 20))  # 1 MiB announced, nothing else sent
        # Closed on the prefix alone: long before the frame timeout could fire.
        assert closed_within(r, 5) < FRAME_TIMEOUT_MS / 1000
    finally:
        r.close()
    # Just over the cap is refused too, while a request at the cap is only
    # judged on its content (here: an unknown API key closes it as well, but
    # only after the whole frame arrived).
    r = Raw(srv.kport)
    try:
        r.send_bytes(struct.pack(">i", PRE_AUTH_MAX_FRAME + 1))
        assert closed_within(r, 5) < FRAME_TIMEOUT_MS / 1000
    finally:
        r.close()
    assert "before SASL authentication" in srv.log()
    healthy(srv)


def test_pre_auth_requests_still_fit(srv: KafkaProcess) -> None:
    r = Raw(srv.kport)
    try:
        long_name = "c" * 4000  # a long client software name still fits the pre-auth cap
        resp = r.call(
            P.API_VERSIONS, 3, client_software_name=long_name, client_software_version="1"
        )
        assert resp.error_code == 0
    finally:
        r.close()


def test_max_frame_bytes_applies_after_auth(srv: KafkaProcess) -> None:
    r = login(srv)
    t = name()
    try:
        assert (
            r.call(
                P.METADATA,
                9,
                topics=[P.REQUESTS[P.METADATA].MetadataRequestTopic(name=t)],
                allow_auto_topic_creation=True,
            )
            .topics[0]
            .error_code
            == 0
        )
        # Bigger than the pre-auth cap, within TOPICS_KAFKA_MAX_FRAME_BYTES: fine.
        big = batch([b"x" * (64 * 1024)])
        assert raw_produce(r, t, big).error_code == 0
        r.send_bytes(struct.pack(">i", MAX_FRAME + 1))
        assert closed_within(r, 5) < FRAME_TIMEOUT_MS / 1000
    finally:
        r.close()
    assert f"(limit {MAX_FRAME})" in srv.log()
    head = httpx.get(
        f"{srv.base}/v0/topics/{t}", headers={"authorization": f"Bearer {SECRET}"}
    ).json()
    assert head["head_seq"] == 1  # the oversized request wrote nothing
    healthy(srv)


@pytest.mark.parametrize("authed", [False, True])
@pytest.mark.parametrize(
    "partial",
    [b"\x00\x00", struct.pack(">i", 200) + b"\x00\x12\x00\x00"],
    ids=["half-header", "half-body"],
)
def test_half_sent_frame_is_closed_after_the_frame_timeout(
    srv: KafkaProcess, authed: bool, partial: bytes
) -> None:
    r = login(srv) if authed else Raw(srv.kport)
    try:
        r.send_bytes(partial)
        took = closed_within(r, 10)
        assert FRAME_TIMEOUT_MS / 1000 * 0.8 <= took < FRAME_TIMEOUT_MS / 1000 + 3
    finally:
        r.close()
    assert "stalled" in srv.log()
    healthy(srv)


def test_silent_connection_before_auth_is_closed(srv: KafkaProcess) -> None:
    r = Raw(srv.kport)
    try:
        took = closed_within(r, 10)  # never sends a byte
        assert FRAME_TIMEOUT_MS / 1000 * 0.8 <= took < FRAME_TIMEOUT_MS / 1000 + 3
    finally:
        r.close()
    # Logged in but silent: the same gap is fine, the idle timeout closes it later.
    r = login(srv)
    try:
        time.sleep(FRAME_TIMEOUT_MS / 1000 * 1.5)
        assert r.call(P.API_VERSIONS, 0).error_code == 0  # still open
        took = closed_within(r, 15)
        assert IDLE_TIMEOUT_MS / 1000 * 0.8 <= took < IDLE_TIMEOUT_MS / 1000 + 3
    finally:
        r.close()
    assert "no request for" in srv.log()


def test_a_long_poll_in_progress_is_not_idle(srv: KafkaProcess) -> None:
    r = login(srv)
    t = name()
    try:
        r.call(
            P.METADATA,
            9,
            topics=[P.REQUESTS[P.METADATA].MetadataRequestTopic(name=t)],
            allow_auto_topic_creation=True,
        )
        wait_ms = IDLE_TIMEOUT_MS + 1500
        r.sock.settimeout(wait_ms / 1000 + 10)
        t0 = time.monotonic()
        resp = r.call(P.FETCH, 12, **fetch_req(t, 0, wait_ms=wait_ms))
        took = time.monotonic() - t0
        assert resp.responses[0].partitions[0].error_code == E.NONE
        assert took >= wait_ms / 1000 * 0.9  # the full long-poll, not cut by the idle timer
    finally:
        r.close()


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
def test_authenticated_clients_produce_and_fetch(srv: KafkaProcess, client: str) -> None:
    t = name(f"lim.{client}-")
    sasl = ("someone", SECRET)
    items = [(b"k1", b'{"n":1}', []), (None, b"x" * (100 * 1024), [])]
    assert produce(client, srv.bootstrap, t, items, sasl=sasl) == [0, 1]
    got = consume_assign(client, srv.bootstrap, t, 0, 2, sasl=sasl)
    assert [(m.key, m.value) for m in got] == [(b"k1", b'{"n":1}'), (None, b"x" * (100 * 1024))]
    assert "Traceback" not in srv.log()


def test_create_topics_checks_the_dead_letter_name(srv: KafkaProcess) -> None:
    r = login(srv)
    R = P.REQUESTS[P.CREATE_TOPICS]
    T = R.CreatableTopic
    C = T.CreatableTopicConfig
    q_bad, q_ok = name(), name()

    def create(topic: str, dead_letter: str) -> int:
        req = T(
            name=topic,
            num_partitions=1,
            replication_factor=1,
            assignments=[],
            configs=[
                C(name="type", value="queue"),
                C(name="max_deliveries", value="1"),
                C(name="dead_letter", value=dead_letter),
            ],
        )
        resp = r.call(P.CREATE_TOPICS, 5, topics=[req], timeout_ms=5000, validate_only=False)
        return int(resp.topics[0].error_code)

    try:
        assert create(q_bad, "other.dlq") == E.TOPIC_AUTHORIZATION_FAILED
        assert create(q_ok, "lim.dlq") == E.NONE
    finally:
        r.close()
    h = {"authorization": f"Bearer {SECRET}"}
    assert httpx.get(f"{srv.base}/v0/topics/{q_bad}", headers=h).status_code == 404
    cfg = httpx.get(f"{srv.base}/v0/topics/{q_ok}", headers=h).json()["config"]
    assert cfg["dead_letter"] == "lim.dlq"


def test_no_auth_server_has_no_pre_auth_cap(kserver: KafkaProcess) -> None:
    """Dev mode (no keys): every connection is authenticated from the start."""
    r = Raw(kserver.kport)
    try:
        t = name("dev-")
        httpx.put(f"{kserver.base}/v0/topics/{t}", json={})
        assert raw_produce(r, t, batch([b"y" * (64 * 1024)])).error_code == 0
    finally:
        r.close()
    with socket.create_connection(("127.0.0.1", kserver.kport), timeout=5) as s:
        s.sendall(struct.pack(">i", 1 << 20) + b"\x00" * 10)
        s.settimeout(1.0)
        with pytest.raises(TimeoutError):
            s.recv(1)  # 1 MiB is within the (default 64 MiB) limit: the server waits
