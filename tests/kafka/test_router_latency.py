"""A record produced over Kafka reaches a router's dest as fast as one written over HTTP.

Both shells share one node, and publication schedules the node's router
forwarding whichever shell wrote (docs/ARCHITECTURE.md, "The write path"). The
node's retry pass for stalled sources is set to 30 s here, so a copy that shows
up within milliseconds can only have been forwarded on publication.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.kafka.support import InProcess

pytestmark = pytest.mark.kafka

ROUNDS = 9
MEDIAN_BOUND_S = 0.020  # well under the default 50 ms retry pass; generous for a busy host


@pytest.fixture
def both() -> Iterator[InProcess]:
    srv = InProcess(http=True, router_retry_s=30.0)
    yield srv
    srv.close()


class DestWatch:
    """Stamps (perf_counter, head_seq) each time the dest topic publishes (set up on the loop)."""

    def __init__(self, srv: InProcess, dest: str) -> None:
        self.cond = threading.Condition()
        self.head = 0
        self.at = 0.0

        def on_publish(t: Any) -> None:
            with self.cond:
                self.head, self.at = t.head_seq, time.perf_counter()
                self.cond.notify_all()

        srv.run(lambda: srv.engine.require(dest).listeners.add(on_publish))

    def wait_for(self, seq: int, timeout: float = 5.0) -> float:
        """When the dest's head reached `seq` (perf_counter s); fails after `timeout`."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.head >= seq, timeout), (
                f"dest head {self.head} never reached {seq}"
            )
            return self.at


def test_kafka_produce_reaches_the_router_dest_as_fast_as_http(both: InProcess) -> None:
    from kafka import KafkaProducer

    with httpx.Client(base_url=both.base, timeout=10) as http:
        assert http.put("/v0/topics/src", json={}).status_code == 201
        r = http.put("/v0/routers/fwd", json={"source": "src", "dest": "dst"})
        assert r.status_code == 201, r.text
        dest = DestWatch(both, "dst")
        producer = KafkaProducer(bootstrap_servers=both.bootstrap, acks=1, linger_ms=0)
        try:
            producer.send("src", value=b"warm-up").get(10)  # metadata, connection
            dest.wait_for(1)
            seq = 1
            kafka_s: list[float] = []
            http_s: list[float] = []
            for i in range(ROUNDS):
                t0 = time.perf_counter()
                producer.send("src", value=b"k%d" % i).get(10)
                seq += 1
                kafka_s.append(dest.wait_for(seq) - t0)
                t0 = time.perf_counter()
                w = http.post("/v0/topics/src", json={"records": [{"data": i}]})
                assert w.status_code == 200, w.text
                seq += 1
                http_s.append(dest.wait_for(seq) - t0)
        finally:
            producer.close(5)
    kafka_med, http_med = statistics.median(kafka_s), statistics.median(http_s)
    assert kafka_med < MEDIAN_BOUND_S, (kafka_s, http_s)
    assert http_med < MEDIAN_BOUND_S, (kafka_s, http_s)
    got = [r["data"] for r in http_post_diff(both, "dst")]
    assert len(got) == 1 + 2 * ROUNDS


def http_post_diff(srv: InProcess, topic: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=srv.base, timeout=10) as http:
        r = http.post(f"/v0/topics/{topic}/diff", json={"limit": 1000})
        assert r.status_code == 200, r.text
        return list(r.json()["records"])
