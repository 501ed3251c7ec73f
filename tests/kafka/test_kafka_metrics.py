"""The Kafka listener on `/v0/metrics` (docs/KAFKA.md, "Metrics"), against a real
`topics serve` with real clients: connections, requests per API and version,
error codes, bytes, request latency (a Fetch's long-poll included) and
consumer-group lag, in both the JSON and the Prometheus form."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kafka.support import KafkaProcess, ck_conf, consume_assign, items, produce
from tests.kafka.test_wire import Raw, batch, fetch_req
from tests.kafka.test_wire import produce as raw_produce
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.metrics import LATENCY_BUCKETS_MS, consumer_lag, count_errors, error_fields

pytestmark = pytest.mark.kafka

KAFKA_SERIES = (
    "topics_kafka_connections",
    "topics_kafka_connections_accepted_total",
    "topics_kafka_connections_closed_total",
    "topics_kafka_sasl_failures_total",
    "topics_kafka_requests_refused_total",
    "topics_kafka_bytes_in_total",
    "topics_kafka_bytes_out_total",
    "topics_kafka_requests_total",
    "topics_kafka_errors_total",
    "topics_kafka_request_latency_ms",
    "topics_kafka_consumer_lag",
    "topics_kafka_consumer_lag_truncated",
)
NS_KEYS = "na-secret:rw+a+d+ns:tenantA.,admin-secret:rw+a+d"

_SAMPLE = re.compile(r"^([a-z_]+)(\{.*\})? (\S+)$")


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    s = KafkaProcess(Path(tmp_path_factory.mktemp("kmetrics")))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    s = KafkaProcess(Path(tmp_path_factory.mktemp("kmetrics-ns")), {"TOPICS_API_KEYS": NS_KEYS})
    yield s
    s.stop()


def kjson(srv: KafkaProcess, token: str | None = None) -> dict[str, Any]:
    """The `kafka` section of the JSON form."""
    h = {"accept": "application/json"}
    if token:
        h["authorization"] = f"Bearer {token}"
    r = httpx.get(f"{srv.base}/v0/metrics", headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    assert "kafka" in body, body
    kafka: dict[str, Any] = body["kafka"]
    return kafka


def prom_text(srv: KafkaProcess, token: str | None = None) -> str:
    h = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{srv.base}/v0/metrics", headers=h)
    assert r.status_code == 200, r.text
    return r.text


def prom(srv: KafkaProcess, token: str | None = None) -> dict[str, float]:
    """Every sample of the Prometheus form: `name{labels}` -> value."""
    out: dict[str, float] = {}
    for line in prom_text(srv, token).splitlines():
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m is not None, line
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def requests_of(k: dict[str, Any], api: str) -> int:
    return sum(r["count"] for r in k["requests"] if r["api"] == api)


def errors_of(k: dict[str, Any], api: str, code: int) -> int:
    return sum(e["count"] for e in k["errors"] if e["api"] == api and e["code"] == code)


def latency_of(k: dict[str, Any], api: str) -> tuple[int, float]:
    """(observations, sum ms) of `api`'s latency histogram."""
    h = k["latency_ms"]["apis"].get(api)
    return (sum(h["counts"]), h["sum"]) if h else (0, 0.0)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def commit(bs: str, group: str, topic: str, offsets: dict[int, int], **sasl: Any) -> None:
    """Commit `offsets` (partition -> offset) for `group` with confluent-kafka."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(ck_conf(bs, sasl.get("sasl"), **{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = [TopicPartition(topic, p, o) for p, o in offsets.items()]
        got = c.commit(offsets=tps, asynchronous=False)
        assert got is not None and all(tp.error is None for tp in got), got
    finally:
        c.close()


# ------------------------------------------------------------------------ tests


def test_requests_bytes_connections_and_latency_move(srv: KafkaProcess) -> None:
    """A real producer and consumer move the request counters per API and version,
    the byte counters, the connection counters and the latency histograms; the
    Prometheus form says the same with HELP and TYPE on every Kafka series."""
    bs = srv.bootstrap
    before = kjson(srv)
    topic = name("m")
    assert produce("confluent", bs, topic, items(10)) == list(range(10))
    got = consume_assign("confluent", bs, topic, 0, 10)
    assert [m.offset for m in got] == list(range(10))
    wait_for(lambda: kjson(srv)["connections_closed"] > before["connections_closed"])
    after = kjson(srv)

    for api in ("ApiVersions", "Metadata", "Produce", "Fetch"):
        assert requests_of(after, api) > requests_of(before, api), api
    produce_versions = {r["version"] for r in after["requests"] if r["api"] == "Produce"}
    assert produce_versions and all(3 <= v <= 12 for v in produce_versions)
    assert after["bytes_in"] > before["bytes_in"] and after["bytes_out"] > before["bytes_out"]
    assert after["connections_accepted"] > before["connections_accepted"]
    assert after["connections"] >= 0
    assert after["connections"] == after["connections_accepted"] - after["connections_closed"]
    n, total = latency_of(after, "Produce")
    assert n > latency_of(before, "Produce")[0] and total > 0
    assert latency_of(after, "Fetch")[0] > latency_of(before, "Fetch")[0]
    assert after["latency_ms"]["buckets"] == list(LATENCY_BUCKETS_MS)

    text = prom_text(srv)
    for series in KAFKA_SERIES:
        assert f"# HELP {series} " in text and f"# TYPE {series} " in text, series
    assert "long-poll" in text.split("# HELP topics_kafka_request_latency_ms ")[1].split("\n")[0]
    p = prom(srv)
    for v in produce_versions:
        assert p[f'topics_kafka_requests_total{{api="Produce",version="{v}"}}'] >= 1
    assert p["topics_kafka_bytes_in_total"] > 0 and p["topics_kafka_bytes_out_total"] > 0
    assert p["topics_kafka_connections_accepted_total"] >= after["connections_accepted"]
    count = p['topics_kafka_request_latency_ms_count{api="Produce"}']
    assert count >= n
    assert p['topics_kafka_request_latency_ms_bucket{api="Produce",le="+Inf"}'] == count
    assert p['topics_kafka_request_latency_ms_sum{api="Produce"}'] > 0


def test_error_codes_are_counted_per_api_and_code(srv: KafkaProcess) -> None:
    """A Produce to an unknown topic answers UNKNOWN_TOPIC_OR_PARTITION in its
    partition response: the error counter of (Produce, 3) moves by exactly one."""
    before = kjson(srv)
    key = 'topics_kafka_errors_total{api="Produce",code="3",error="UNKNOWN_TOPIC_OR_PARTITION"}'
    p0 = prom(srv).get(key, 0.0)
    r = Raw(srv.kport)
    try:
        assert (
            raw_produce(r, name("missing"), batch([b"x"])).error_code
            == E.UNKNOWN_TOPIC_OR_PARTITION
        )
    finally:
        r.close()
    after = kjson(srv)
    code = E.UNKNOWN_TOPIC_OR_PARTITION
    assert errors_of(after, "Produce", code) == errors_of(before, "Produce", code) + 1
    assert prom(srv)[key] == p0 + 1
    # the raw connection was counted and, once closed, counted as closed
    wait_for(lambda: kjson(srv)["connections_closed"] > before["connections_closed"])


def test_fetch_latency_includes_its_long_poll(srv: KafkaProcess) -> None:
    """A Fetch at the high watermark waits `max_wait_ms` for data; its latency
    observation covers that wait."""
    topic = name("poll")
    assert produce("confluent", srv.bootstrap, topic, items(1)) == [0]
    before = latency_of(kjson(srv), "Fetch")
    r = Raw(srv.kport)
    try:
        t0 = time.monotonic()
        resp = r.call(P.FETCH, 12, **fetch_req(topic, 1, wait_ms=400))
        waited = time.monotonic() - t0
        assert resp.responses[0].partitions[0].records in (None, b"")
    finally:
        r.close()
    assert waited >= 0.35
    n, total = latency_of(kjson(srv), "Fetch")
    assert n == before[0] + 1
    assert total - before[1] >= 350


def test_consumer_lag_is_head_minus_committed(srv: KafkaProcess) -> None:
    """Produce 10 to partition 0 and 3 to partition 1 of a two-partition topic,
    commit 4 and 1: the lag series say 6 and 2; a commit at the head makes it 0."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bs = srv.bootstrap
    topic, group = name("lag"), name("g")
    admin = AdminClient(ck_conf(bs))  # held until its futures resolve
    for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        fut.result(10)
    prod = Producer(ck_conf(bs))
    for i in range(10):
        prod.produce(topic, value=b'{"i":%d}' % i, partition=0)
    for i in range(3):
        prod.produce(topic, value=b'{"i":%d}' % i, partition=1)
    assert prod.flush(30) == 0
    commit(bs, group, topic, {0: 4, 1: 1})

    lag = {
        (c["topic"], c["partition"]): c for c in kjson(srv)["consumer_lag"] if c["group"] == group
    }
    assert lag[(topic, 0)] == {
        "tenant": "",
        "group": group,
        "topic": topic,
        "partition": 0,
        "committed": 4,
        "head_seq": 10,
        "lag": 6,
    }
    assert lag[(topic, 1)]["lag"] == 2 and lag[(topic, 1)]["head_seq"] == 3
    p = prom(srv)
    lb = f'tenant="",group="{group}",topic="{topic}"'
    assert p[f'topics_kafka_consumer_lag{{{lb},partition="0"}}'] == 6
    assert p[f'topics_kafka_consumer_lag{{{lb},partition="1"}}'] == 2
    assert p["topics_kafka_consumer_lag_truncated"] == 0

    commit(bs, group, topic, {0: 10})
    assert prom(srv)[f'topics_kafka_consumer_lag{{{lb},partition="0"}}'] == 0


def test_namespaced_lag_sasl_failures_and_scoped_keys(secured: KafkaProcess) -> None:
    """A namespaced tenant's lag is read from its stored partition (`tenantA.T`) and
    labelled with its tenant `ns:tenantA.`; a failed SASL login is counted; a
    prefix-restricted key's scrape has no Kafka section."""
    bs, alice = secured.bootstrap, ("alice", "na-secret")
    topic, group = name("nslag"), name("g")
    assert produce("confluent", bs, topic, items(10), sasl=alice) == list(range(10))
    commit(bs, group, topic, {0: 4}, sasl=alice)
    k = kjson(secured, "admin-secret")
    (entry,) = [c for c in k["consumer_lag"] if c["group"] == group]
    assert (entry["tenant"], entry["topic"], entry["lag"]) == ("ns:tenantA.", topic, 6)

    before = k["sasl_failures"]
    r = Raw(secured.kport)
    try:
        assert r.call(P.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
        no = r.call(P.SASL_AUTHENTICATE, 2, auth_bytes=b"\x00x\x00wrong")
        assert no.error_code == E.SASL_AUTHENTICATION_FAILED
    finally:
        r.close()
    after = kjson(secured, "admin-secret")
    assert after["sasl_failures"] == before + 1
    assert errors_of(after, "SaslAuthenticate", E.SASL_AUTHENTICATION_FAILED) >= 1
    p = prom(secured, "admin-secret")
    assert p["topics_kafka_sasl_failures_total"] == before + 1

    scoped = httpx.get(
        f"{secured.base}/v0/metrics",
        headers={"accept": "application/json", "authorization": "Bearer na-secret"},
    )
    assert scoped.status_code == 200 and "kafka" not in scoped.json()
    assert "topics_kafka_" not in prom_text(secured, "na-secret")


# ------------------------------------------------------------- without a server


def test_error_fields_come_from_the_codec_schemas() -> None:
    """Every served API's response has at least one error-code field; Produce's is
    per partition, Fetch's at the top level and per partition."""
    fields = error_fields()
    assert set(fields) == set(P.RESPONSES)
    assert all(fields.values())
    assert fields[P.PRODUCE] == (
        ("responses", (("partition_responses", (("error_code", None),)),)),
    )
    assert ("error_code", None) in fields[P.FETCH]


def test_count_errors_counts_each_nonzero_code() -> None:
    R = P.RESPONSES[P.PRODUCE]
    T = R.TopicProduceResponse
    PR = T.PartitionProduceResponse
    resp = R(
        responses=[
            T(
                name="a",
                partition_responses=[
                    PR(index=0, error_code=0, base_offset=0),
                    PR(index=1, error_code=3, base_offset=-1),
                ],
            ),
            T(name="b", partition_responses=[PR(index=0, error_code=3, base_offset=-1)]),
        ],
        throttle_time_ms=0,
    )
    into: dict[tuple[int, int], int] = {}
    count_errors(P.PRODUCE, resp, into)
    assert into == {(P.PRODUCE, 3): 2}


def test_consumer_lag_caps_and_maps_namespaces() -> None:
    heads = {"t": 10, "t:1": 5, "ns.t": 7}
    table = {
        ("", "g", "t", 0): (4, None, -1),
        ("", "g", "t", 1): (5, None, -1),
        ("", "g", "gone", 0): (1, None, -1),
        ("", "h", "t", 0): (-1, None, -1),
        ("ns:ns.", "g", "t", 0): (2, None, -1),
        ("abcdef0123456789", "g", "t", 0): (12, None, -1),
    }
    got, cut = consumer_lag(table, heads.get)
    assert not cut
    assert [(c["tenant"], c["topic"], c["partition"], c["lag"]) for c in got] == [
        ("", "t", 0, 6),
        ("", "t", 1, 0),
        ("abcdef0123456789", "t", 0, 0),
        ("ns:ns.", "t", 0, 5),
    ]
    got, cut = consumer_lag(table, heads.get, cap=2)
    assert cut and len(got) == 2
