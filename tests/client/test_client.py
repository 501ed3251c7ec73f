"""topics.client against a real `topics serve`: writes, reads, paging, tombstones,
idempotent retries, config, routers, probes, and errors mapped to exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.client.proxy import Proxy
from tests.support.process import ServerProcess
from topics.client import (
    AsyncClient,
    BadRequest,
    Client,
    ConnectionFailed,
    NotAQueue,
    Record,
    RouterNotFound,
    Tombstone,
    TopicConfig,
    TopicExistsIncompatible,
    TopicNotEmpty,
    TopicNotFound,
    TopicsError,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.base) as c:
        yield c


def test_append_and_read_back(client: Client) -> None:
    r = client.append("c.basic", [1, {"data": {"n": 2}, "tag": "t:2", "meta": {"m": 1}}, "three"])
    assert (r.first_seq, r.last_seq, r.seqs, r.created, r.deduped) == (1, 3, [1, 2, 3], True, False)
    one = client.append_one("c.basic", None, tag="t:4", node="n1")
    assert one.first_seq == 4 and not one.created
    got = list(client.read("c.basic", include_tags=True))
    assert [(x.seq, x.data, x.tag) for x in got if isinstance(x, Record)] == [
        (1, 1, None),
        (2, {"n": 2}, "t:2"),
        (3, "three", None),
        (4, None, "t:4"),
    ]
    assert got[1].meta == {"m": 1} and got[3].node == "n1"
    reader = client.read("c.basic", 2)
    assert [x.seq for x in reader if isinstance(x, Record)] == [3, 4]
    assert reader.cursor == 4 and reader.caught_up


def test_read_pages_and_cursor(client: Client) -> None:
    client.append("c.pages", list(range(25)))
    reader = client.read("c.pages", limit=10, max_records=17)
    seqs = [x.seq for x in reader if isinstance(x, Record)]
    assert seqs == list(range(1, 18)) and reader.cursor == 17
    rest = [x.seq for x in client.read("c.pages", reader.cursor, limit=4) if isinstance(x, Record)]
    assert rest == list(range(18, 26))
    page = client.diff("c.pages", 20, limit=2)
    assert [x.seq for x in page.records] == [21, 22] and not page.caught_up and page.lag == 3


def test_node_filter_moves_the_cursor(client: Client) -> None:
    client.append("c.nodes", [{"data": 1, "node": "me"}, {"data": 2, "node": "you"}])
    client.append("c.nodes", [3], node="me")
    reader = client.read("c.nodes", node="me")
    assert [x.data for x in reader if isinstance(x, Record)] == [2]
    assert reader.cursor == 3


def test_tombstone_for_evicted_records(client: Client) -> None:
    client.put_topic("c.capped", cap_records=3)
    client.append("c.capped", list(range(10)))
    events = list(client.read("c.capped"))
    tomb = events[0]
    assert isinstance(tomb, Tombstone)
    assert (tomb.gap_from, tomb.gap_to, tomb.reason, tomb.earliest_seq) == (1, 7, "cap", 8)
    assert tomb.missed == 7 and tomb.missed_estimate == 7
    assert [x.seq for x in events[1:]] == [8, 9, 10]


def test_a_reader_stopped_after_a_recreated_tombstone_still_gets_the_new_records(
    client: Client,
) -> None:
    client.append("c.again", ["old"] * 5)
    client.delete_topic("c.again")
    client.append("c.again", ["new-1", "new-2"])
    reader = client.read("c.again", 5)  # a cursor from the deleted topic, beyond the head
    tomb = next(iter(reader))
    assert isinstance(tomb, Tombstone) and tomb.reason == "recreated"
    assert reader.cursor == 0
    again = [x.data for x in client.read("c.again", reader.cursor) if isinstance(x, Record)]
    assert again == ["new-1", "new-2"]


def test_follow_long_polls_for_new_records(client: Client, server: ServerProcess) -> None:
    client.append("c.follow", ["a"])
    reader = client.read("c.follow", follow=True, wait_ms=5000, max_records=2)
    it = iter(reader)
    assert next(it).data == "a"  # type: ignore[union-attr]

    async def later() -> None:
        await asyncio.sleep(0.3)
        async with AsyncClient(server.base) as ac:
            await ac.append("c.follow", ["b"])

    import threading

    t = threading.Thread(target=lambda: asyncio.run(later()))
    t.start()
    assert next(it).data == "b"  # type: ignore[union-attr]
    t.join()
    with pytest.raises(StopIteration):
        next(it)


def test_idempotent_retry_after_a_lost_answer(server: ServerProcess) -> None:
    proxy = Proxy(server.port)
    try:
        with Client(proxy.url) as c:
            c.append("c.idem", ["first"])
            proxy.swallow_next_response()  # the server appends, the answer is lost
            r = c.append("c.idem", ["once"])
            assert proxy.swallowed == 1
            assert r.attempts == 2 and r.deduped and r.seqs == [2]
            assert r.idempotency_key and r.idempotency_key.startswith("auto-")
            again = c.append("c.idem", ["ignored"], idempotency_key=r.idempotency_key)
            assert again.deduped and again.seqs == [2]
            assert [x.data for x in c.read("c.idem") if isinstance(x, Record)] == ["first", "once"]
    finally:
        proxy.close()


def test_no_retry_of_a_write_without_a_key(server: ServerProcess) -> None:
    proxy = Proxy(server.port)
    try:
        with Client(proxy.url, auto_idempotency=False) as c:
            c.append("c.nokey", [0])
            proxy.swallow_next_response()
            with pytest.raises(ConnectionFailed) as ei:
                c.append("c.nokey", [1])
            assert ei.value.status == 0 and ei.value.code == "connection_failed"
            assert c.get_topic("c.nokey").head_seq == 2  # it was applied, just not answered
    finally:
        proxy.close()


def test_topic_crud_and_config(client: Client) -> None:
    r = client.put_topic("c.crud", TopicConfig(cap_records=50), ttl_ms=60_000)
    assert r.created and r.config.cap_records == 50 and r.config.ttl_ms == 60_000
    assert not client.put_topic("c.crud", cap_records=50).created
    u = client.update_config("c.crud", discard="reject", durable=True)
    assert u.config.discard == "reject" and u.config.durability == "fsync"
    assert u.config.cap_records == 50
    st = client.get_topic("c.crud")
    assert st.type == "log" and st.head_seq == 0 and st.config == u.config and st.queue is None
    with pytest.raises(ValueError, match="unknown config field"):
        client.update_config("c.crud", cap=1)
    for i in range(5):
        client.put_topic(f"c.list.{i}")
    page = client.list_topics_page("c.list.", page_size=2)
    assert [t.topic for t in page.topics] == ["c.list.0", "c.list.1"] and page.next_cursor
    assert [t.topic for t in client.list_topics("c.list.", page_size=2)] == [
        f"c.list.{i}" for i in range(5)
    ]
    client.append("c.crud", ["x"])
    with pytest.raises(TopicNotEmpty) as ei:
        client.delete_topic("c.crud", if_empty=True)
    assert ei.value.status == 409 and ei.value.detail == {"topic": "c.crud", "count": 1}
    d = client.delete_topic("c.crud")
    assert d.deleted and d.routers_removed == []
    assert not client.delete_topic("c.crud").deleted
    assert not client.topic_exists("c.crud")


def test_errors_carry_code_status_message_detail(client: Client) -> None:
    with pytest.raises(TopicNotFound) as nf:
        client.get_topic("c.absent")
    e = nf.value
    assert (e.status, e.code, e.detail) == (404, "topic_not_found", {"topic": "c.absent"})
    assert "does not exist" in e.message and isinstance(e, TopicsError)
    with pytest.raises(TopicNotFound):
        client.append("c.absent", [1], create=False)
    with pytest.raises(BadRequest) as br:
        client.put_topic("bad name!")
    assert br.value.code == "invalid_request"
    client.put_topic("c.q", type="queue")
    client.put_topic("c.log")
    with pytest.raises(NotAQueue):
        client.claim("c.log", "w")
    with pytest.raises(TopicExistsIncompatible) as inc:
        client.put_topic("c.q")
    assert inc.value.detail["existing_type"] == "queue"
    with pytest.raises(RouterNotFound) as rnf:
        client.get_router("c.nope")
    assert rnf.value.detail == {"router": "c.nope"}


def test_routers(client: Client) -> None:
    r = client.put_router("c.src->c.dst", "c.src", "c.dst", filter="keep:*")
    assert r.created and r.filter == ["tag", "Glob", "keep:*"]
    client.append("c.src", [{"data": 1, "tag": "keep:1"}, {"data": 2, "tag": "drop"}])
    assert [x.data for x in client.read("c.dst") if isinstance(x, Record)] == [1]
    got = client.get_router("c.src->c.dst")
    assert got.forwarded_total is not None and got.forwarded_total >= 1 and got.source == "c.src"
    assert [x.router for x in client.list_routers(source="c.src")] == ["c.src->c.dst"]
    assert client.delete_router("c.src->c.dst").deleted
    assert not client.delete_router("c.src->c.dst").deleted


def test_probes_and_metrics(client: Client) -> None:
    h = client.health()
    assert h.status == "ok" and h.version
    r = client.ready()
    assert r.ready and r.status == "ready"
    m = client.metrics()
    assert m["ready"] is True and "topics" in m
    assert "topics_uptime_ms" in client.metrics_text()


def test_unreachable_server() -> None:
    with Client("http://127.0.0.1:9", retries=1) as c, pytest.raises(ConnectionFailed) as ei:
        c.health()
    assert "127.0.0.1:9" in str(ei.value)


def test_async_client(server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(server.base) as c:
            await c.put_topic("c.async", cap_records=2)
            r = await c.append("c.async", ["a", "b", "c"])
            assert r.seqs == [1, 2, 3]
            got = [x async for x in c.read("c.async")]
            assert isinstance(got[0], Tombstone) and got[0].gap_to == 1
            assert [x.data for x in got[1:] if isinstance(x, Record)] == ["b", "c"]
            names = [t.topic async for t in c.list_topics("c.async")]
            assert names == ["c.async"]
            with pytest.raises(TopicNotFound):
                await c.get_topic("c.async.none")
            events = []
            async with c.watch(["c.async"]) as w:
                async for ev in w:
                    events.append(ev)
                    if len(events) == 4:
                        break
            assert isinstance(events[0], Tombstone) and events[0].reason == "from_seq_too_old"
            assert [x.seq for x in events[1:3] if isinstance(x, Record)] == [2, 3]

    asyncio.run(main())
