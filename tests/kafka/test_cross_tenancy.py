"""Cross-protocol reads/writes (Kafka <-> /v0 diff and SSE) and tenant isolation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.kafka.support import CLIENTS, KafkaProcess, consume_assign, list_topics, produce

pytestmark = pytest.mark.kafka


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def sse_records(base: str, topic: str, n: int, token: str | None = None) -> list[dict]:
    """Read `n` records of `topic` from seq 0 over a /v0 watch stream."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    out: list[dict] = []
    async with httpx.AsyncClient(base_url=base, timeout=10, headers=headers) as c:
        r = await c.post(
            "/v0/watch", json={"topics": {topic: {"from_seq": 0}}, "include_tags": True}
        )
        assert r.status_code in (200, 201), r.text
        wid = r.json()["wid"]
        async with c.stream("GET", f"/v0/watch/{wid}") as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    frame = orjson.loads(line[5:])
                    out.extend(frame.get("records", []))
                    if len(out) >= n:
                        break
    return out


@pytest.mark.parametrize("client", CLIENTS)
def test_kafka_to_v0(kserver: KafkaProcess, client: str) -> None:
    topic = name(f"x-{client}")
    sent = [
        (b"user-1", b'{"sku":"B-77","qty":3}', [("trace", b"t-1")]),
        (None, b'{"spaced": [1, 2]}', []),
        (b"\xff\xfe", b"plain text", [("bin", b"\x00\x01"), ("bin", b"\x02")]),
        (None, b"\x89PNG\x00", []),
        (b"gone", None, []),
        (None, b"42", []),
    ]
    assert produce(client, kserver.bootstrap, topic, sent) == list(range(6))
    body = httpx.post(
        f"{kserver.base}/v0/topics/{topic}/diff", json={"from_seq": 0, "include_tags": True}
    ).json()
    recs = body["records"]
    assert [r["$seq"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert recs[0]["$tag"] == "user-1"
    assert recs[0]["data"] == {"sku": "B-77", "qty": 3}
    assert recs[0]["meta"] == {"trace": "t-1"}
    assert recs[1]["data"] == {"spaced": [1, 2]}  # JSON documents stay JSON
    assert recs[2]["data"] == "plain text" and "$tag" not in recs[2]
    assert recs[2]["meta"]["$kafka"]["value"] == "text"
    assert recs[3]["meta"]["$kafka"]["value"] == "base64"
    assert recs[4]["data"] is None and recs[4]["$tag"] == "gone"
    assert recs[5]["data"] == 42
    # ... and the same records read back over Kafka carry the original bytes
    # (JSON documents come back compact).
    back = consume_assign(client, kserver.bootstrap, topic, 0, 6)
    assert [(m.key, m.value) for m in back] == [
        (b"user-1", b'{"sku":"B-77","qty":3}'),
        (None, b'{"spaced":[1,2]}'),
        (b"\xff\xfe", b"plain text"),
        (None, b"\x89PNG\x00"),
        (b"gone", None),
        (None, b"42"),
    ]
    assert back[2].headers == [("bin", b"\x00\x01"), ("bin", b"\x02")]
    # SSE sees the same records.
    sse = asyncio.run(sse_records(kserver.base, topic, 6))
    assert [r["$seq"] for r in sse[:6]] == [1, 2, 3, 4, 5, 6]
    assert sse[0]["data"] == {"sku": "B-77", "qty": 3}


@pytest.mark.parametrize("client", CLIENTS)
def test_v0_to_kafka(kserver: KafkaProcess, client: str) -> None:
    topic = name(f"y-{client}")
    r = httpx.post(
        f"{kserver.base}/v0/topics/{topic}",
        json={
            "records": [
                {"data": {"a": 1}, "tag": "order:1", "meta": {"trace": "abc", "n": 5}},
                {"data": "text"},
                {"data": None},
            ]
        },
    )
    assert r.status_code == 201, r.text
    got = consume_assign(client, kserver.bootstrap, topic, 0, 3)
    assert [m.offset for m in got] == [0, 1, 2]
    assert (got[0].key, got[0].value) == (b"order:1", b'{"a":1}')
    assert got[0].headers == [("trace", b"abc"), ("n", b"5")]
    assert (got[1].key, got[1].value, got[1].headers) == (None, b'"text"', [])
    assert got[2].value == b"null"


KEYS = "ka-secret:rw+a+d:tenantA.,kb-secret:rw+a+d:tenantB."


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    srv = KafkaProcess(Path(tmp_path_factory.mktemp("tenants")), {"TOPICS_API_KEYS": KEYS})
    yield srv
    srv.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_tenants_are_isolated(tenants: KafkaProcess, client: str) -> None:
    a, b = ("alice", "ka-secret"), ("bob", "kb-secret")
    ta, tb = name(f"tenantA.{client}"), name(f"tenantB.{client}")
    assert produce(client, tenants.bootstrap, ta, [(None, b"1", [])], sasl=a) == [0]
    assert produce(client, tenants.bootstrap, tb, [(None, b"2", [])], sasl=b) == [0]
    seen_a = list_topics(client, tenants.bootstrap, sasl=a)
    seen_b = list_topics(client, tenants.bootstrap, sasl=b)
    assert ta in seen_a and tb not in seen_a
    assert tb in seen_b and ta not in seen_b
    assert all(t.startswith("tenantB.") for t in seen_b)
    # B cannot read A's topic: the client reports the authorization failure
    # (librdkafka logs it and delivers nothing on an assign()ed partition).
    try:
        got = consume_assign(client, tenants.bootstrap, ta, 0, 1, sasl=b, timeout=6)
    except Exception as exc:
        assert "uthoriz" in f"{type(exc).__name__} {exc}" or "AUTHORIZ" in str(exc), repr(exc)
    else:
        assert got == []
    if client == "confluent":
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import AdminClient

        from tests.kafka.support import ck_conf

        md = AdminClient(ck_conf(tenants.bootstrap, b)).list_topics(topic=ta, timeout=10)
        assert md.topics[ta].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # ... while A can, and a wrong password gets nowhere.
    assert [m.value for m in consume_assign(client, tenants.bootstrap, ta, 0, 1, sasl=a)] == [b"1"]
    if client == "confluent":
        from confluent_kafka import KafkaException

        with pytest.raises(KafkaException):
            list_topics(client, tenants.bootstrap, sasl=("mallory", "nope"))
    elif client == "aiokafka":
        from aiokafka.errors import KafkaConnectionError

        with pytest.raises(KafkaConnectionError):
            list_topics(client, tenants.bootstrap, sasl=("mallory", "nope"))
    # (kafka-python retries a failed bootstrap for 30 s; test_wire covers the
    # SaslAuthenticate error code and the closed connection directly.)
    # The same names over HTTP: the key's allowlist applies identically.
    r = httpx.get(f"{tenants.base}/v0/topics", headers={"authorization": "Bearer kb-secret"})
    names = {t["topic"] for t in r.json()["topics"]}
    assert tb in names and ta not in names


def test_kafka_records_reach_a_router_dest_live(kserver: KafkaProcess) -> None:
    """A router forwards what Kafka produced as it forwards HTTP writes: publication
    schedules the forwarding, and a live watcher of the dest sees the records."""
    src, dst = name("rsrc"), name("rdst")
    r = httpx.put(f"{kserver.base}/v0/routers/{name('r')}", json={"source": src, "dest": dst})
    assert r.status_code in (200, 201), r.text
    sent = [(None, b'{"n": %d}' % i, []) for i in range(4)]
    assert produce("confluent", kserver.bootstrap, src, sent) == list(range(4))
    got = asyncio.run(sse_records(kserver.base, dst, 4))
    assert [rec["data"] for rec in got[:4]] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]


NS_KEYS = (
    "na-secret:rw+a+d+ns:tenantA.,nb-secret:rw+a+d+ns:tenantB.,"
    "na-reader:r+ns:tenantA.,plain-admin:rw+a+d"
)


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    srv = KafkaProcess(Path(tmp_path_factory.mktemp("ns")), {"TOPICS_API_KEYS": NS_KEYS})
    yield srv
    srv.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_namespaced_tenants_share_plain_names(namespaces: KafkaProcess, client: str) -> None:
    """Two tenants whose keys carry the `ns` option both use the plain name `orders-…`:
    each sees only its own data, offsets and groups; over HTTP the same key reaches
    the stored name under its namespace and nothing else (docs/KAFKA.md, "Tenant
    namespaces")."""
    from tests.kafka.support import group_consume

    a, b, a_reader = ("alice", "na-secret"), ("bob", "nb-secret"), ("ann", "na-reader")
    topic, group = name(f"orders-{client}"), name("billing")
    bs = namespaces.bootstrap
    assert produce(client, bs, topic, [(None, b'{"t":"a","n":0}', [])], sasl=a) == [0]
    assert produce(client, bs, topic, [(None, b'{"t":"b","n":0}', [])], sasl=b) == [0]
    # Plain names in metadata, never the prefix, never the other tenant's topics.
    seen_a, seen_b = list_topics(client, bs, sasl=a), list_topics(client, bs, sasl=b)
    assert topic in seen_a and topic in seen_b
    assert not any(t.startswith("tenant") for t in seen_a | seen_b)
    # Data: the same name reads each tenant's own record.
    assert [m.value for m in consume_assign(client, bs, topic, 0, 1, sasl=a)] == [
        b'{"t":"a","n":0}'
    ]
    assert [m.value for m in consume_assign(client, bs, topic, 0, 1, sasl=b)] == [
        b'{"t":"b","n":0}'
    ]
    # Groups and offsets: A's group commits past its record; B's group of the same
    # id still starts at offset 0. Another key of namespace A shares A's group.
    assert [m.offset for m in group_consume(client, bs, topic, group, 1, sasl=a)] == [0]
    assert [m.offset for m in group_consume(client, bs, topic, group, 1, sasl=b)] == [0]
    assert produce(client, bs, topic, [(None, b'{"t":"a","n":1}', [])], sasl=a) == [1]
    got = group_consume(client, bs, topic, group, 1, sasl=a_reader)
    assert [(m.offset, m.value) for m in got] == [(1, b'{"t":"a","n":1}')]
    # HTTP: the key addresses the stored names under its namespace, only those.
    h_a = {"authorization": "Bearer na-secret"}
    h_b = {"authorization": "Bearer nb-secret"}
    url = f"{namespaces.base}/v0/topics/tenantA.{topic}/diff"
    r = httpx.post(url, json={"from_seq": 0}, headers=h_a)
    assert r.status_code == 200 and [x["data"]["t"] for x in r.json()["records"]] == ["a", "a"]
    r = httpx.post(url, json={"from_seq": 0}, headers=h_b)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = httpx.get(f"{namespaces.base}/v0/topics/tenantB.{topic}", headers=h_b)
    assert r.status_code == 200 and r.json()["head_seq"] == 1
    # A key without a namespace sees the stored names as they are.
    seen_admin = list_topics(client, bs, sasl=("root", "plain-admin"))
    assert {f"tenantA.{topic}", f"tenantB.{topic}"} <= seen_admin


def test_namespace_partitions_live_under_the_prefix(namespaces: KafkaProcess) -> None:
    """A namespaced CreateTopics of three partitions stores tenantA.T, tenantA.T:1, tenantA.T:2."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.kafka.support import ck_conf

    topic = name("parts")
    admin = AdminClient(ck_conf(namespaces.bootstrap, ("alice", "na-secret")))
    for fut in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        fut.result(10)
    md = admin.list_topics(topic=topic, timeout=10)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    h = {"authorization": "Bearer na-secret"}
    for stored in (f"tenantA.{topic}", f"tenantA.{topic}:1", f"tenantA.{topic}:2"):
        assert httpx.get(f"{namespaces.base}/v0/topics/{stored}", headers=h).status_code == 200
