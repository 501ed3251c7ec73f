"""The Kafka listener's limit knobs, and the limits themselves on an in-process listener.

Quick-tier companions of `test_listener_limits.py` (which drives a real
`topics serve`): the same raw-socket checks against a listener on a private
event loop in this process, bound to 127.0.0.1 on an ephemeral port.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from tests.kafka.support import InProcess
from topics.config import ServerConfig, load_config, parse_api_keys
from topics.kafka import protocol as P
from topics.kafka.server import PRE_AUTH_MAX_FRAME


def test_knobs_parse_with_defaults() -> None:
    d = load_config({})
    assert (d.kafka_max_frame_bytes, d.kafka_idle_timeout_ms, d.kafka_frame_timeout_ms) == (
        67_108_864,
        600_000,
        30_000,
    )
    c = load_config(
        {
            "TOPICS_KAFKA_MAX_FRAME_BYTES": " 1048576 ",
            "TOPICS_KAFKA_IDLE_TIMEOUT_MS": "0",
            "TOPICS_KAFKA_FRAME_TIMEOUT_MS": "250",
        }
    )
    assert (c.kafka_max_frame_bytes, c.kafka_idle_timeout_ms, c.kafka_frame_timeout_ms) == (
        1_048_576,
        0,
        250,
    )
    # Unparsable => default; a frame limit of 0 is not "unlimited" but the default.
    bad = load_config(
        {
            "TOPICS_KAFKA_MAX_FRAME_BYTES": "0",
            "TOPICS_KAFKA_IDLE_TIMEOUT_MS": "soon",
            "TOPICS_KAFKA_FRAME_TIMEOUT_MS": "-5",
        }
    )
    assert (bad.kafka_max_frame_bytes, bad.kafka_idle_timeout_ms, bad.kafka_frame_timeout_ms) == (
        67_108_864,
        600_000,
        30_000,
    )


FRAME_MS = 300


@pytest.fixture
def secured() -> Iterator[InProcess]:
    cfg = ServerConfig(
        kafka_port=1,
        api_keys=parse_api_keys("k1:rw:in."),
        kafka_max_frame_bytes=100,  # below the pre-auth cap: raised to it
        kafka_frame_timeout_ms=FRAME_MS,
        kafka_idle_timeout_ms=0,
    )
    srv = InProcess(cfg)
    yield srv
    srv.close()


def connect(srv: InProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.server.port), timeout=5)


def closed_after(s: socket.socket) -> float:
    t0 = time.monotonic()
    try:
        assert s.recv(1) == b""
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def api_versions(s: socket.socket, corr: int = 1) -> int:
    req = P.REQUESTS[P.API_VERSIONS](version=0)
    req.with_header(correlation_id=corr, client_id="t")
    s.sendall(bytes(req.encode(header=True, framed=True)))
    (n,) = struct.unpack(">i", s.recv(4))
    buf = b""
    while len(buf) < n:
        buf += s.recv(n - len(buf))
    return int(P.RESPONSES[P.API_VERSIONS].decode(buf, version=0, header=True).error_code)


def test_pre_auth_cap_and_the_frame_limit_floor(secured: InProcess) -> None:
    assert secured.server.max_frame == PRE_AUTH_MAX_FRAME
    with connect(secured) as s:
        s.sendall(struct.pack(">i", 1 << 20))
        assert closed_after(s) < FRAME_MS / 1000
    with connect(secured) as s:
        assert api_versions(s) == 0  # a normal pre-auth request is served


@pytest.mark.parametrize("partial", [b"\x00", struct.pack(">i", 50) + b"\x00\x12"])
def test_a_stalled_frame_is_closed(secured: InProcess, partial: bytes) -> None:
    with connect(secured) as s:
        assert api_versions(s) == 0
        s.sendall(partial)
        took = closed_after(s)
        assert FRAME_MS / 1000 * 0.8 <= took < FRAME_MS / 1000 + 2
    with connect(secured) as s:
        assert api_versions(s) == 0  # the listener is fine


def test_no_timeouts_means_no_watchdog() -> None:
    srv = InProcess(ServerConfig(kafka_port=1, kafka_frame_timeout_ms=0, kafka_idle_timeout_ms=0))
    try:
        with connect(srv) as s:
            s.sendall(b"\x00\x00")
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(1)  # nothing closes it
            assert srv.server.frame_timeout_s is None and srv.server.idle_timeout_s is None
    finally:
        srv.close()
