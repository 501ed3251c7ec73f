"""Kafka admin APIs through real admin clients (confluent-kafka's AdminClient,
kafka-python's KafkaAdminClient, aiokafka's AIOKafkaAdminClient) and the raw
codec: configs, groups, cluster, log dirs, partitions and records
(docs/KAFKA.md, "Admin APIs")."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kafka.support import InProcess, KafkaProcess, ck_conf, items, produce, py_conf
from topics.config import ServerConfig, parse_api_keys
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.apis import APIS

pytestmark = pytest.mark.kafka


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def srv() -> Iterator[InProcess]:
    """A memory-mode node with Kafka and HTTP, shared by the module."""
    s = InProcess(http=True)
    yield s
    s.close()


# ----------------------------------------------------------------- helpers


def ck_admin(bs: str, sasl: tuple[str, str] | None = None) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(ck_conf(bs, sasl))


def py_admin(bs: str, sasl: tuple[str, str] | None = None) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(**py_conf(bs, sasl))


def aio_admin(bs: str, fn: Callable[[Any], Any]) -> Any:
    """Run `await fn(client)` with a started AIOKafkaAdminClient."""

    async def go() -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        c = AIOKafkaAdminClient(bootstrap_servers=bs)
        await c.start()
        try:
            return await fn(c)
        finally:
            await c.close()

    return asyncio.run(go())


def create(bs: str, topic: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import NewTopic

    admin = ck_admin(bs)  # kept alive until the futures resolve
    fs = admin.create_topics([NewTopic(topic, partitions, 1, config=configs or {})])
    for f in fs.values():
        f.result(10)


def v0_config(base: str, stored: str, token: str | None = None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{base}/v0/topics/{stored}", headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json()["config"])


def partition_names(topic: str, n: int) -> list[str]:
    return [topic if i == 0 else f"{topic}:{i}" for i in range(n)]


def error_code(exc: BaseException) -> int:
    """The Kafka error code a confluent-kafka KafkaException carries."""
    return int(exc.args[0].code())


class Raw:
    """One Kafka connection speaking through kafka-python's generated codec."""

    def __init__(self, bs: str) -> None:
        host, port = bs.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.corr = 0

    def call(self, key: int, version: int, **fields: Any) -> Any:
        self.corr += 1
        req = P.REQUESTS[key](version=version, **fields)
        req.with_header(correlation_id=self.corr, client_id="raw")
        self.sock.sendall(bytes(req.encode(header=True, framed=True)))
        (n,) = struct.unpack(">i", self._read(4))
        resp = P.RESPONSES[key].decode(self._read(n), version=version, header=True)
        assert resp.header.correlation_id == self.corr
        return resp

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(srv: InProcess) -> Iterator[Raw]:
    r = Raw(srv.bootstrap)
    yield r
    r.close()


def commit(bs: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit `offsets` for `group` without joining it (an assign()-style consumer)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(ck_conf(bs, **{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        for tp in c.commit(offsets=tps, asynchronous=False):
            assert tp.error is None, tp.error
    finally:
        c.close()


def committed(raw: Raw, group: str, topic: str, partitions: list[int]) -> list[int]:
    """OffsetFetch of `group` for `topic`'s `partitions` (-1 = none)."""
    T = P.REQUESTS[P.OFFSET_FETCH].OffsetFetchRequestTopic
    resp = raw.call(
        P.OFFSET_FETCH, 7, group_id=group, topics=[T(name=topic, partition_indexes=partitions)]
    )
    assert resp.error_code == 0
    got = {p.partition_index: p.committed_offset for t in resp.topics for p in t.partitions}
    return [got[p] for p in partitions]


class Member:
    """A confluent-kafka consumer that has joined `group` and been assigned partitions."""

    def __init__(self, bs: str, group: str, topics: list[str]) -> None:
        from confluent_kafka import Consumer

        self.assigned: list[Any] = []
        self.c = Consumer(
            ck_conf(
                bs,
                **{
                    "group.id": group,
                    "client.id": "admin-test-member",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                },
            )
        )
        self.c.subscribe(topics, on_assign=lambda _c, parts: self.assigned.extend(parts))
        deadline = time.monotonic() + 15
        while not self.assigned and time.monotonic() < deadline:
            self.c.poll(0.1)
        assert self.assigned, "the consumer was not assigned partitions"

    def close(self) -> None:
        self.c.close()


# ------------------------------------------------------------ DescribeConfigs


def test_describe_configs_confluent(srv: InProcess) -> None:
    """Kafka names map to the /v0 config, /v0 fields appear by their own names,
    server-decided entries are read-only; sources and synonyms say where a value comes from."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    topic = name("dc")
    create(srv.bootstrap, topic, 2, {"retention.ms": "60000", "durability": "fsync"})
    admin = ck_admin(srv.bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic)
    got = admin.describe_configs([res])[res].result(10)
    ret = got["retention.ms"]
    assert ret.value == "60000" and not ret.is_read_only and not ret.is_default
    assert ret.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert {s.name: s.value for s in ret.synonyms.values()}["ttl_ms"] == "60000"
    assert got["retention.bytes"].value == "-1" and got["retention.bytes"].is_default
    assert got["cleanup.policy"].value == "delete"
    assert got["durability"].value == "fsync" and not got["durability"].is_default
    assert got["cap_records"].value == "0" and got["cap_records"].is_default
    assert got["priority"].value is None
    mmb = got["max.message.bytes"]
    assert mmb.value == "1048576" and mmb.is_read_only
    assert mmb.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert got["message.timestamp.type"].value == "LogAppendTime"
    assert got["min.insync.replicas"].value == "1"
    assert got["type"].value == "log" and got["type"].is_read_only
    assert "ttl_ms" not in got and "durable" not in got  # shown as retention.ms / durability
    # The broker resource: a small read-only set.
    b = ConfigResource(ResourceType.BROKER, "0")
    broker = admin.describe_configs([b])[b].result(10)
    assert broker["message.max.bytes"].value == "1048576"
    assert broker["broker.id"].value == "0"
    assert all(e.is_read_only for e in broker.values())
    # An unknown topic.
    missing = ConfigResource(ResourceType.TOPIC, name("nope"))
    with pytest.raises(Exception) as info:
        admin.describe_configs([missing])[missing].result(10)
    assert error_code(info.value) == E.UNKNOWN_TOPIC_OR_PARTITION


def test_describe_configs_kafka_python_and_aiokafka(srv: InProcess) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    topic = name("dcpy")
    create(srv.bootstrap, topic, 1, {"retention.bytes": "4096", "cap_records": "500"})
    admin = py_admin(srv.bootstrap)
    try:
        # The default filter shows only what is set on the topic.
        modified = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert set(modified["topic"][topic]) == {"retention.bytes", "cap_records"}
        # A key filter.
        some = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, ["retention.bytes", "discard"])],
            config_filter="all",
        )["topic"][topic]
        assert set(some) == {"retention.bytes", "discard"}
        assert some["retention.bytes"]["value"] == "4096"
        assert some["discard"]["config_source"] == "DEFAULT_CONFIG"
    finally:
        admin.close()

    async def go(c: Any) -> Any:
        from aiokafka.admin.config_resource import ConfigResource as AR
        from aiokafka.admin.config_resource import ConfigResourceType as AT

        return await c.describe_configs([AR(AT.TOPIC, topic)])

    (resp,) = aio_admin(srv.bootstrap, go)
    (result,) = resp.resources
    entries = {e[0]: e[1] for e in result[4]}
    assert result[0] == 0 and entries["retention.bytes"] == "4096"
    assert entries["cap_records"] == "500"


def test_describe_configs_wire_flags(srv: InProcess, raw: Raw) -> None:
    """configuration_keys, include_synonyms, include_documentation and the v0 is_default."""
    topic = name("dcw")
    create(srv.bootstrap, topic, 1, {"retention.ms": "1000"})
    Res = P.REQUESTS[P.DESCRIBE_CONFIGS].DescribeConfigsResource
    keys = ["retention.ms", "discard", "nothing.like.this"]
    for v in range(5):
        resp = raw.call(
            P.DESCRIBE_CONFIGS,
            v,
            resources=[Res(resource_type=2, resource_name=topic, configuration_keys=keys)],
            include_synonyms=True,
            include_documentation=True,
        )
        (r,) = resp.results
        assert r.error_code == 0
        by = {c.name: c for c in r.configs}
        assert set(by) == {"retention.ms", "discard"}
        if v == 0:
            assert by["discard"].is_default and not by["retention.ms"].is_default
        else:
            assert (by["retention.ms"].config_source, by["discard"].config_source) == (1, 5)
            syn = [(s.name, s.value, s.source) for s in by["retention.ms"].synonyms]
            assert syn == [
                ("retention.ms", "1000", 1),
                ("ttl_ms", "1000", 1),
                ("retention.ms", "-1", 5),
            ]
        if v >= 3:
            assert by["retention.ms"].documentation and by["retention.ms"].config_type == 5
    # Without the flags: no synonyms, no documentation; null keys = every config.
    resp = raw.call(
        P.DESCRIBE_CONFIGS,
        4,
        resources=[Res(resource_type=2, resource_name=topic, configuration_keys=None)],
        include_synonyms=False,
        include_documentation=False,
    )
    configs = resp.results[0].configs
    assert len(configs) > 20
    assert all(c.synonyms == [] and c.documentation is None for c in configs)
    # A partition name, another broker, an unsupported resource type.
    resp = raw.call(
        P.DESCRIBE_CONFIGS,
        4,
        resources=[
            Res(resource_type=2, resource_name=f"{topic}:1", configuration_keys=None),
            Res(resource_type=4, resource_name="7", configuration_keys=None),
            Res(resource_type=32, resource_name="g", configuration_keys=None),
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    assert [r.error_code for r in resp.results] == [
        E.INVALID_TOPIC_EXCEPTION,
        E.INVALID_REQUEST,
        E.INVALID_REQUEST,
    ]


# ------------------------------------------------------------ AlterConfigs


def test_alter_configs_replaces_on_every_partition(srv: InProcess) -> None:
    """AlterConfigs replaces: what it names is set on every partition topic, the
    rest of the settable configs go back to their defaults."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    topic = name("ac")
    create(srv.bootstrap, topic, 3, {"retention.ms": "60000", "cap_records": "100"})
    admin = ck_admin(srv.bootstrap)
    res = ConfigResource(
        ResourceType.TOPIC, topic, set_config={"retention.bytes": "5000", "discard": "reject"}
    )
    with pytest.warns(DeprecationWarning):
        fut = admin.alter_configs([res])[res]
    assert fut.result(10) is None
    for stored in partition_names(topic, 3):
        cfg = v0_config(srv.base, stored)
        assert (cfg["cap_bytes"], cfg["discard"]) == (5000, "reject"), stored
        assert (cfg["ttl_ms"], cfg["cap_records"]) == (0, 0), stored
    # A read-only config may be named with the value it has (a describe-then-alter
    # round trip), not with another one.
    same = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "1048576"})
    with pytest.warns(DeprecationWarning):
        assert admin.alter_configs([same])[same].result(10) is None
    other = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "10"})
    with pytest.warns(DeprecationWarning):
        fut = admin.alter_configs([other])[other]
    with pytest.raises(Exception) as info:
        fut.result(10)
    assert error_code(info.value) == E.INVALID_CONFIG
    assert "read-only" in str(info.value) and "TOPICS_MAX_RECORD_BYTES" in str(info.value)


def test_incremental_alter_configs_confluent(srv: InProcess) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic = name("iac")
    create(srv.bootstrap, topic, 2, {"cap_records": "100"})
    admin = ck_admin(srv.bootstrap)

    def alter(*entries: tuple[str, str | None, Any], validate_only: bool = False) -> Any:
        res = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(n, v, incremental_operation=op) for n, v, op in entries
            ],
        )
        return admin.incremental_alter_configs([res], validate_only=validate_only)[res]

    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    assert alter(("retention.ms", "120000", SET), ("durability", "fsync", SET)).result(10) is None
    for stored in partition_names(topic, 2):
        cfg = v0_config(srv.base, stored)
        assert (cfg["ttl_ms"], cfg["durability"], cfg["cap_records"]) == (120000, "fsync", 100)
    assert alter(("retention.ms", None, DELETE)).result(10) is None
    # Two names of one /v0 field may both appear when they agree.
    assert alter(("retention.bytes", "-1", SET), ("cap_bytes", "0", SET)).result(10) is None
    for stored in partition_names(topic, 2):
        cfg = v0_config(srv.base, stored)
        assert (cfg["ttl_ms"], cfg["durability"], cfg["cap_records"]) == (0, "fsync", 100)
    # validate_only changes nothing.
    assert alter(("cap_records", "7", SET), validate_only=True).result(10) is None
    assert v0_config(srv.base, topic)["cap_records"] == 100

    def refused(*entries: tuple[str, str | None, Any]) -> tuple[int, str]:
        with pytest.raises(Exception) as info:
            alter(*entries).result(10)
        return error_code(info.value), str(info.value)

    code, msg = refused(("cleanup.policy", "compact", SET))
    assert code == E.INVALID_CONFIG and "compaction" in msg
    code, msg = refused(("cleanup.policy", "delete", AlterConfigOpType.APPEND))
    assert code == E.INVALID_CONFIG
    code, msg = refused(("segment.bytes", "1000", SET))
    assert code == E.INVALID_CONFIG and "read-only" in msg
    code, msg = refused(("no_such_setting", "1", SET))
    assert code == E.INVALID_CONFIG and "unknown" in msg
    code, msg = refused(("durability", "sometimes", SET))
    assert code == E.INVALID_CONFIG
    code, msg = refused(("retention.ms", "1000", SET), ("ttl_ms", "2000", SET))
    assert code == E.INVALID_CONFIG and "ttl_ms" in msg
    code, msg = refused(("retention.ms", "1000", SET), ("ttl_ms", None, DELETE))
    assert code == E.INVALID_CONFIG and "ttl_ms" in msg
    code, msg = refused(("type", "queue", SET))
    assert code == E.INVALID_CONFIG and "fixed" in msg
    # Nothing above changed anything.
    cfg = v0_config(srv.base, f"{topic}:1")
    assert (cfg["ttl_ms"], cfg["durability"], cfg["cap_records"]) == (0, "fsync", 100)
    # Broker configs are read-only; an unknown topic is reported as such.
    b = ConfigResource(
        ResourceType.BROKER,
        "0",
        incremental_configs=[ConfigEntry("num.partitions", "3", incremental_operation=SET)],
    )
    with pytest.raises(Exception) as info:
        admin.incremental_alter_configs([b])[b].result(10)
    assert error_code(info.value) == E.INVALID_REQUEST
    missing = ConfigResource(
        ResourceType.TOPIC,
        name("nope"),
        incremental_configs=[ConfigEntry("retention.ms", "1", incremental_operation=SET)],
    )
    with pytest.raises(Exception) as info:
        admin.incremental_alter_configs([missing])[missing].result(10)
    assert error_code(info.value) == E.UNKNOWN_TOPIC_OR_PARTITION


def test_alter_configs_kafka_python_and_aiokafka(srv: InProcess) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    topic = name("acpy")
    create(srv.bootstrap, topic, 2)
    admin = py_admin(srv.bootstrap)
    try:
        res = ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "90000"})
        assert admin.alter_configs([res]) == {"topic": {topic: "OK"}}
        assert [v0_config(srv.base, s)["ttl_ms"] for s in partition_names(topic, 2)] == [
            90000,
            90000,
        ]
        reset = ConfigResource(ConfigResourceType.TOPIC, topic, ["retention.ms"])
        assert admin.reset_configs([reset]) == {"topic": {topic: "OK"}}
        assert v0_config(srv.base, f"{topic}:1")["ttl_ms"] == 0
    finally:
        admin.close()

    async def go(c: Any) -> Any:
        from aiokafka.admin.config_resource import ConfigResource as AR
        from aiokafka.admin.config_resource import ConfigResourceType as AT

        return await c.alter_configs([AR(AT.TOPIC, topic, {"retention.bytes": "8192"})])

    (resp,) = aio_admin(srv.bootstrap, go)
    assert [r[0] for r in resp.resources] == [0]
    assert [v0_config(srv.base, s)["cap_bytes"] for s in partition_names(topic, 2)] == [
        8192,
        8192,
    ]


# ------------------------------------------------------------------ groups


def test_groups_with_a_live_member(srv: InProcess, raw: Raw) -> None:
    """ListGroups and DescribeGroups show a live member and its assignment;
    DeleteGroups refuses a group with members; OffsetDelete refuses a topic the
    members subscribe to and deletes another's offsets; once the member left the
    group is Empty and can be deleted."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AclOperation

    topic, other, group = name("gt"), name("go"), name("grp")
    create(srv.bootstrap, topic, 2)
    create(srv.bootstrap, other, 1)
    commit(srv.bootstrap, group, {(other, 0): 3})
    admin = ck_admin(srv.bootstrap)
    member = Member(srv.bootstrap, group, [topic])
    try:
        listed = admin.list_consumer_groups().result(10)
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1 and mine[0].state == ConsumerGroupState.STABLE
        assert not mine[0].is_simple_consumer_group
        desc = admin.describe_consumer_groups([group], include_authorized_operations=True)
        d = desc[group].result(10)
        assert d.state == ConsumerGroupState.STABLE and not d.is_simple_consumer_group
        (m,) = d.members
        assert m.client_id == "admin-test-member" and m.host == "/127.0.0.1"
        assert sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions) == [
            (topic, 0),
            (topic, 1),
        ]
        assert AclOperation.DELETE in d.authorized_operations
        # kafka-python decodes the subscription and assignment too.
        py = py_admin(srv.bootstrap)
        try:
            pd = py.describe_groups([group])[group]
            assert pd["group_state"] == "Stable" and pd["protocol_type"] == "consumer"
            assert len(pd["members"]) == 1
            assert {g["group_id"] for g in py.list_groups(states_filter=["Stable"])} >= {group}
            assert group not in {g["group_id"] for g in py.list_groups(states_filter=["Empty"])}
            from kafka import TopicPartition

            out = py.delete_group_offsets(
                group, [TopicPartition(topic, 0), TopicPartition(other, 0)]
            )
            assert out[TopicPartition(topic, 0)].errno == E.GROUP_SUBSCRIBED_TO_TOPIC
            assert out[TopicPartition(other, 0)].errno == 0
        finally:
            py.close()
        assert committed(raw, group, other, [0]) == [-1]
        # aiokafka's DescribeGroups.
        (aresp,) = aio_admin(srv.bootstrap, lambda c: c.describe_consumer_groups([group]))
        assert aresp.groups[0][0] == 0 and aresp.groups[0][2] == "Stable"
        # A group with a member is not deleted.
        with pytest.raises(Exception) as info:
            admin.delete_consumer_groups([group])[group].result(10)
        assert error_code(info.value) == E.NON_EMPTY_GROUP
        member.c.commit(asynchronous=False, offsets=[_tp(topic, 0, 1)])
    finally:
        member.close()
    # The member left; its committed offset keeps the group listed, Empty.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        d = admin.describe_consumer_groups([group])[group].result(10)
        if d.state == ConsumerGroupState.EMPTY:
            break
        time.sleep(0.05)
    assert d.state == ConsumerGroupState.EMPTY and d.members == []
    assert admin.delete_consumer_groups([group])[group].result(10) is None
    assert committed(raw, group, topic, [0, 1]) == [-1, -1]
    listed = admin.list_consumer_groups().result(10)
    assert group not in {g.group_id for g in listed.valid}
    d = admin.describe_consumer_groups([group])[group].result(10)
    assert d.state in (ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN)


def _tp(topic: str, partition: int, offset: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition, offset)


def test_group_admin_wire(srv: InProcess, raw: Raw) -> None:
    """Unknown groups: Dead in DescribeGroups, GROUP_ID_NOT_FOUND for DeleteGroups
    and OffsetDelete; an offsets-only group is listed Empty with protocol type ""."""
    group, topic = name("wg"), name("wt")
    create(srv.bootstrap, topic, 1)
    commit(srv.bootstrap, group, {(topic, 0): 5})
    for v in range(6):
        resp = raw.call(P.LIST_GROUPS, v, states_filter=[], types_filter=[])
        assert resp.error_code == 0
        mine = [g for g in resp.groups if g.group_id == group]
        assert len(mine) == 1 and mine[0].protocol_type == ""
        if v >= 4:
            assert mine[0].group_state == "Empty"
    resp = raw.call(P.LIST_GROUPS, 4, states_filter=["stable"])
    assert group not in {g.group_id for g in resp.groups}
    resp = raw.call(P.LIST_GROUPS, 5, states_filter=[], types_filter=["consumer"])
    assert resp.groups == []
    unknown = name("unknown")
    for v in range(7):
        resp = raw.call(
            P.DESCRIBE_GROUPS, v, groups=[group, unknown], include_authorized_operations=False
        )
        states = [(g.error_code, g.group_state) for g in resp.groups]
        assert states == [(0, "Empty"), (0, "Dead")]
        if v >= 3:
            assert resp.groups[0].authorized_operations is None  # -2147483648 on the wire
    T = P.REQUESTS[P.OFFSET_DELETE].OffsetDeleteRequestTopic
    Part = T.OffsetDeleteRequestPartition
    resp = raw.call(
        P.OFFSET_DELETE,
        0,
        group_id=unknown,
        topics=[T(name=topic, partitions=[Part(partition_index=0)])],
    )
    assert resp.error_code == E.GROUP_ID_NOT_FOUND
    resp = raw.call(
        P.OFFSET_DELETE,
        0,
        group_id=group,
        topics=[
            T(name=topic, partitions=[Part(partition_index=0)]),
            T(name=name("gone"), partitions=[Part(partition_index=0)]),
        ],
    )
    assert resp.error_code == 0
    codes = [[p.error_code for p in t.partitions] for t in resp.topics]
    assert codes == [[0], [E.UNKNOWN_TOPIC_OR_PARTITION]]
    assert committed(raw, group, topic, [0]) == [-1]
    # The group had only that offset: it is gone now.
    for v in range(3):
        resp = raw.call(P.DELETE_GROUPS, v, groups_names=[group, ""])
        assert [r.error_code for r in resp.results] == [E.GROUP_ID_NOT_FOUND, E.INVALID_GROUP_ID]


def test_deleted_group_stays_deleted_after_restart(tmp_path: Path) -> None:
    """DeleteGroups writes tombstones: after a restart the deleted group's offsets
    stay gone while another group's survive."""
    from kafka import TopicPartition

    srv = KafkaProcess(tmp_path)
    try:
        topic, gone, kept = name("rt"), name("gone"), name("kept")
        create(srv.bootstrap, topic, 2)
        commit(srv.bootstrap, gone, {(topic, 0): 4, (topic, 1): 2})
        commit(srv.bootstrap, kept, {(topic, 0): 9})
        admin = py_admin(srv.bootstrap)
        try:
            never = name("never")
            assert admin.delete_groups([gone, never]) == {
                gone: "OK",
                never: "GroupIdNotFoundError",
            }
            offsets = admin.list_group_offsets({kept: None})[kept]
            assert offsets[TopicPartition(topic, 0)].offset == 9
        finally:
            admin.close()
        srv.restart()
        raw = Raw(srv.bootstrap)
        try:
            assert committed(raw, gone, topic, [0, 1]) == [-1, -1]
            assert committed(raw, kept, topic, [0]) == [9]
            listed = {g.group_id for g in raw.call(P.LIST_GROUPS, 4, states_filter=[]).groups}
            assert kept in listed and gone not in listed
        finally:
            raw.close()
    finally:
        srv.stop()


def test_offset_tombstones_replay_and_compact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tombstones remove their keys when the offsets topic is replayed, before and
    after compaction (which keeps only live keys)."""
    from topics.kafka import offsets as O

    monkeypatch.setattr(O, "COMPACT_MIN", 8)
    node = InProcess()
    try:
        store = node.server.broker.offsets

        def replayed() -> dict[Any, Any]:
            fresh = O.OffsetStore(store.backend)
            node.run(fresh.load)
            return fresh.table

        node.call(store.commit("t", "g1", [("a", 0, (1, None, -1)), ("a", 1, (2, None, -1))]))
        node.call(store.commit("t", "g2", [("a", 0, (3, "m", -1))]))
        assert node.call(store.delete("t", "g1", [("a", 1), ("a", 9)])) == [("a", 1)]
        assert (
            replayed()
            == store.table
            == {
                ("t", "g1", "a", 0): (1, None, -1),
                ("t", "g2", "a", 0): (3, "m", -1),
            }
        )
        assert node.call(store.delete("t", "g1")) == [("a", 0)]
        assert node.call(store.delete("t", "g1")) == []  # nothing left: nothing written
        assert replayed() == store.table == {("t", "g2", "a", 0): (3, "m", -1)}
        # Enough documents for compaction: the table is rewritten, the history dropped.
        for i in range(10):
            node.call(store.commit("t", "g3", [("b", 0, (i, None, -1))]))
        node.call(store.delete("t", "g3"))
        assert node.run(lambda: store.backend.count(O.OFFSETS_TOPIC)) < 8
        assert replayed() == store.table == {("t", "g2", "a", 0): (3, "m", -1)}
    finally:
        node.close()


# ------------------------------------------------------- cluster and log dirs


def test_describe_cluster(srv: InProcess) -> None:

    host, port = srv.bootstrap.rsplit(":", 1)
    admin = ck_admin(srv.bootstrap)
    d = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert d.cluster_id == "topics-single-node"
    assert d.controller.id == 0
    assert [(n.id, n.host, n.port) for n in d.nodes] == [(0, host, int(port))]
    # librdkafka asks Metadata (v8-10) for the cluster's authorized operations
    from confluent_kafka.admin import AclOperation

    assert d.authorized_operations is not None
    assert {AclOperation.DESCRIBE, AclOperation.ALTER_CONFIGS} <= set(d.authorized_operations)
    py = py_admin(srv.bootstrap)
    try:
        info = py.describe_cluster()  # DescribeCluster (librdkafka asks Metadata)
        assert info["cluster_id"] == "topics-single-node" and info["controller_id"] == 0
        assert [(b["broker_id"], b["host"], b["port"]) for b in info["brokers"]] == [
            (0, host, int(port))
        ]
        assert {"DESCRIBE", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"} <= set(
            info["authorized_operations"]
        )
    finally:
        py.close()
    meta = aio_admin(srv.bootstrap, lambda c: c.describe_cluster())
    assert meta["cluster_id"] == "topics-single-node" and meta["controller_id"] == 0


def test_describe_log_dirs(srv: InProcess, raw: Raw) -> None:
    topic = name("ld")
    create(srv.bootstrap, topic, 3)
    r = httpx.post(f"{srv.base}/v0/topics/{topic}:2", json={"records": [{"data": "x" * 100}] * 3})
    assert r.status_code in (200, 201), r.text
    py = py_admin(srv.bootstrap)
    try:
        (broker,) = py.describe_log_dirs(topic_partitions={topic: [0, 2, 7]})
    finally:
        py.close()
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0
    assert [
        (t["name"], [p["partition_index"] for p in t["partitions"]]) for t in log_dir["topics"]
    ] == [(topic, [0, 2])]
    sizes = [p["partition_size"] for p in log_dir["topics"][0]["partitions"]]
    assert sizes[0] == 0 and sizes[1] >= 300  # the live payload bytes of each partition
    resp = raw.call(P.DESCRIBE_LOG_DIRS, 4, topics=None)
    names = {t.name for r in resp.results for t in r.topics}
    assert topic in names and "topics.kafka.offsets" not in names


# ----------------------------------------------- partitions and records (admin)


def test_create_partitions_three_to_six(srv: InProcess) -> None:
    """CreatePartitions through the AdminClient: the new partitions are /v0 topics
    with partition 0's config, and clients see six partitions."""
    from confluent_kafka.admin import NewPartitions

    topic = name("cp")
    create(srv.bootstrap, topic, 3, {"retention.ms": "30000"})
    admin = ck_admin(srv.bootstrap)
    assert admin.create_partitions([NewPartitions(topic, 6)])[topic].result(10) is None
    md = admin.list_topics(topic=topic, timeout=10)
    assert sorted(md.topics[topic].partitions) == list(range(6))
    assert v0_config(srv.base, f"{topic}:5")["ttl_ms"] == 30000
    with pytest.raises(Exception) as info:
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
    assert error_code(info.value) == E.INVALID_PARTITIONS


def test_delete_records(srv: InProcess) -> None:
    """DeleteRecords through the AdminClient: the new low watermark is reported
    and `earliest_seq` over HTTP moves to match; other partitions are untouched."""
    from confluent_kafka import TopicPartition

    topic = name("dr")
    create(srv.bootstrap, topic, 2)
    assert produce("confluent", srv.bootstrap, topic, items(10)) is not None
    heads = {
        s: httpx.get(f"{srv.base}/v0/topics/{s}").json()["head_seq"]
        for s in partition_names(topic, 2)
    }
    full = max(heads, key=lambda s: heads[s])
    index = 0 if full == topic else 1
    admin = ck_admin(srv.bootstrap)
    fut = admin.delete_records([TopicPartition(topic, index, 2)])
    (deleted,) = [f.result(10) for f in fut.values()]
    assert deleted.low_watermark == 2
    assert httpx.get(f"{srv.base}/v0/topics/{full}").json()["earliest_seq"] == 3
    rest = next(s for s in heads if s != full)
    assert httpx.get(f"{srv.base}/v0/topics/{rest}").json()["earliest_seq"] <= 1


# ----------------------------------------------------------------- tenancy


def test_admin_apis_follow_the_key(tmp_path: Path) -> None:
    """Describe needs read or admin on the topic, alter needs admin; groups and their
    offsets are the tenant's own; a namespaced key sees its plain names."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    keys = "ka:rw+a+d:tenantA.,kr:r:tenantA.,kb:rw+a+d:tenantB.,ns:rw+a+d+ns:tenantN."
    srv = InProcess(ServerConfig(kafka_port=1, api_keys=parse_api_keys(keys)), http=True)
    try:
        a, r, b, n = ("a", "ka"), ("r", "kr"), ("b", "kb"), ("n", "ns")
        topic = name("tenantA.cfg")
        from confluent_kafka.admin import AdminClient, NewTopic

        ka = AdminClient(ck_conf(srv.bootstrap, a))
        for f in ka.create_topics([NewTopic(topic, 2, 1)]).values():
            f.result(10)
        kr, kb = AdminClient(ck_conf(srv.bootstrap, r)), AdminClient(ck_conf(srv.bootstrap, b))
        res = ConfigResource(ResourceType.TOPIC, topic)
        assert "retention.ms" in kr.describe_configs([res])[res].result(10)
        with pytest.raises(Exception) as info:
            kb.describe_configs([res])[res].result(10)
        assert error_code(info.value) == E.TOPIC_AUTHORIZATION_FAILED
        inc = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", "5000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        with pytest.raises(Exception) as info:
            kr.incremental_alter_configs([inc])[inc].result(10)
        assert error_code(info.value) == E.TOPIC_AUTHORIZATION_FAILED
        assert ka.incremental_alter_configs([inc])[inc].result(10) is None
        # A namespaced key names its topic without the namespace; the change
        # lands on the stored names.
        nk = AdminClient(ck_conf(srv.bootstrap, n))
        plain = name("orders")
        for f in nk.create_topics([NewTopic(plain, 2, 1)]).values():
            f.result(10)
        nres = ConfigResource(
            ResourceType.TOPIC,
            plain,
            incremental_configs=[
                ConfigEntry("retention.bytes", "777", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        assert nk.incremental_alter_configs([nres])[nres].result(10) is None
        for stored in partition_names(f"tenantN.{plain}", 2):
            assert v0_config(srv.base, stored, "ns")["cap_bytes"] == 777
        # Groups are per tenant.
        group = name("shared")
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(ck_conf(srv.bootstrap, a, **{"group.id": group, "enable.auto.commit": False}))
        try:
            c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        finally:
            c.close()
        seen_a = {g.group_id for g in ka.list_consumer_groups().result(10).valid}
        seen_b = {g.group_id for g in kb.list_consumer_groups().result(10).valid}
        assert group in seen_a and group not in seen_b
        with pytest.raises(Exception) as info:
            kb.delete_consumer_groups([group])[group].result(10)
        assert error_code(info.value) == E.GROUP_ID_NOT_FOUND
        assert group in {g.group_id for g in ka.list_consumer_groups().result(10).valid}
    finally:
        srv.close()


# ------------------------------------------------------------ every version


def test_docs_table_lists_what_api_versions_advertises() -> None:
    """docs/KAFKA.md "Supported APIs and versions" names every API of the table."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "KAFKA.md").read_text()
    table = text.split("## Supported APIs and versions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \((\d+)\) \| (\d+)(?:-(\d+))? \|$", table, re.M)
    documented = {int(k): (int(lo), int(hi or lo)) for _n, k, lo, hi in rows}
    assert documented == {k: (a.min_version, a.max_version) for k, a in APIS.items()}


def _samples() -> dict[int, dict[str, Any]]:
    Q = P.REQUESTS
    DC = Q[P.DESCRIBE_CONFIGS].DescribeConfigsResource
    AC = Q[P.ALTER_CONFIGS].AlterConfigsResource
    IA = Q[P.INCREMENTAL_ALTER_CONFIGS].AlterConfigsResource
    OD = Q[P.OFFSET_DELETE].OffsetDeleteRequestTopic
    LD = Q[P.DESCRIBE_LOG_DIRS].DescribableLogDirTopic
    return {
        P.DESCRIBE_CONFIGS: {
            "resources": [DC(resource_type=4, resource_name="0", configuration_keys=None)],
            "include_synonyms": True,
            "include_documentation": True,
        },
        P.ALTER_CONFIGS: {
            "resources": [
                AC(
                    resource_type=2,
                    resource_name="absent-topic",
                    configs=[AC.AlterableConfig(name="retention.ms", value="1")],
                )
            ],
            "validate_only": True,
        },
        P.INCREMENTAL_ALTER_CONFIGS: {
            "resources": [
                IA(
                    resource_type=2,
                    resource_name="absent-topic",
                    configs=[
                        IA.AlterableConfig(name="retention.ms", config_operation=0, value="1")
                    ],
                )
            ],
            "validate_only": True,
        },
        P.LIST_GROUPS: {"states_filter": [], "types_filter": []},
        P.DESCRIBE_GROUPS: {"groups": ["absent-group"], "include_authorized_operations": True},
        P.DELETE_GROUPS: {"groups_names": ["absent-group"]},
        P.OFFSET_DELETE: {
            "group_id": "absent-group",
            "topics": [
                OD(name="t", partitions=[OD.OffsetDeleteRequestPartition(partition_index=0)])
            ],
        },
        P.DESCRIBE_CLUSTER: {
            "include_cluster_authorized_operations": True,
            "endpoint_type": 1,
            "include_fenced_brokers": False,
        },
        P.DESCRIBE_LOG_DIRS: {"topics": [LD(topic="absent-topic", partitions=[0])]},
    }


def test_every_new_api_answers_every_version_it_advertises(raw: Raw) -> None:
    """Each admin API is answered at every version of its range, and its refusal
    builder encodes at every version the codec knows."""
    for key, fields in _samples().items():
        api = APIS[key]
        for v in range(api.min_version, api.max_version + 1):
            raw.call(key, v, **fields)
        for v in range(P.REQUESTS[key].min_version, P.REQUESTS[key].max_version + 1):
            req = P.REQUESTS[key](version=v, **fields)
            req.with_header(correlation_id=1, client_id="x")
            decoded = P.REQUESTS[key].decode(bytes(req.encode(header=True)), version=v, header=True)
            refusal = api.refuse(None, decoded, E.UNSUPPORTED_VERSION)  # type: ignore[arg-type]
            assert P.encode_response(refusal, v, 1)
