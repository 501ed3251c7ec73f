"""The queue helpers against a real server: claim/ack/nack/extend, and a Worker that
keeps a lease alive past its lease time while the handler runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.process import ServerProcess
from topics.client import AsyncClient, Client, Job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

LEASE_MS = 300


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.base) as c:
        yield c


def test_claim_ack_nack_extend(client: Client) -> None:
    client.put_topic("q.manual", type="queue", lease_ms=LEASE_MS)
    client.append("q.manual", [{"data": "j1", "tag": "t1"}, "j2", "j3"])
    got = client.claim("q.manual", "w1", max=2)
    assert [(j.seq, j.data, j.deliveries) for j in got.jobs] == [(1, "j1", 1), (2, "j2", 1)]
    assert got.jobs[0].tag == "t1" and got.jobs[0].lease_id.startswith("lease_") and got.ready == 1
    ext = client.extend("q.manual", "w1", got.jobs[:1], 10_000)
    assert ext.extended == 1 and ext.deadlines[1] > got.jobs[0].deadline
    assert client.ack("q.manual", "w1", [1], lease_ids=["lease_ffff"]).skipped == [1]  # fenced
    a = client.ack("q.manual", "w1", got.jobs[:1])
    assert (a.acked, a.skipped) == (1, [])
    n = client.nack("q.manual", "w1", got.jobs[1:])
    assert n.nacked == 1
    again = client.claim("q.manual", "w2", max=5)
    assert [(j.seq, j.deliveries) for j in again.jobs] == [(2, 2), (3, 1)]  # returned job first
    st = client.get_topic("q.manual")
    assert st.queue is not None and st.queue.in_flight == 2


def test_a_lease_runs_out_without_a_worker(client: Client) -> None:
    client.put_topic("q.expire", type="queue", lease_ms=LEASE_MS)
    client.append("q.expire", ["job"])
    assert len(client.claim("q.expire", "w1").jobs) == 1
    time.sleep(LEASE_MS * 2 / 1000)
    assert [j.deliveries for j in client.claim("q.expire", "w2").jobs] == [2]


def test_worker_keeps_the_lease_alive(client: Client, server: ServerProcess) -> None:
    client.put_topic("q.slow", type="queue", lease_ms=LEASE_MS)
    client.append("q.slow", ["slow job"])
    seen: list[tuple[int, int]] = []
    rivals: list[int] = []

    def handler(job: Job) -> None:
        seen.append((job.seq, job.deliveries))
        with Client(server.base) as other:
            for _ in range(4):  # 4 x 300 ms: four times the lease
                time.sleep(LEASE_MS / 1000)
                rivals.extend(j.seq for j in other.claim("q.slow", "rival").jobs)

    worker = client.worker("q.slow", "w1")
    stats = worker.run(handler, stop_when_empty=True)
    assert seen == [(1, 1)] and rivals == []  # nobody else got it meanwhile
    assert (stats.handled, stats.acked, stats.failed, stats.lost) == (1, 1, 0, 0)
    assert stats.extends >= 3
    assert client.get_topic("q.slow").count == 0


def test_worker_nacks_a_failed_job_and_goes_on(client: Client) -> None:
    client.put_topic("q.fail", type="queue", lease_ms=5000)
    client.append("q.fail", ["bad", "good"])
    calls: list[tuple[str, int]] = []

    def handler(job: Job) -> None:
        calls.append((job.data, job.deliveries))
        if job.data == "bad" and job.deliveries == 1:
            raise RuntimeError("boom")

    stats = client.worker("q.fail", "w1", batch=2).run(handler, max_jobs=3)
    assert calls == [("bad", 1), ("good", 1), ("bad", 2)]
    assert (stats.handled, stats.acked, stats.failed) == (3, 2, 1)


def test_worker_stop_from_another_thread(client: Client) -> None:
    client.put_topic("q.stop", type="queue", lease_ms=5000)
    worker = client.worker("q.stop", "w1", idle_wait_ms=50)
    t = threading.Timer(0.3, worker.stop)
    t.start()
    started = time.monotonic()
    stats = worker.run(lambda job: None)
    assert stats.handled == 0 and time.monotonic() - started < 5


def test_async_worker_keeps_the_lease_alive(server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(server.base) as c:
            await c.put_topic("q.async", type="queue", lease_ms=LEASE_MS)
            await c.append("q.async", ["a", "b"])
            rivals: list[int] = []

            async def handler(job: Job) -> None:
                for _ in range(3):
                    await asyncio.sleep(LEASE_MS / 1000)
                    rivals.extend(j.seq for j in (await c.claim("q.async", "rival")).jobs)

            stats = await c.worker("q.async", "w1", batch=2).run(handler, stop_when_empty=True)
            assert rivals == [] and (stats.handled, stats.acked, stats.lost) == (2, 2, 0)

            def blocking(job: Job) -> None:  # a plain function runs in a thread
                time.sleep(LEASE_MS * 2 / 1000)

            await c.append("q.async", ["c"])
            stats2 = await c.worker("q.async", "w1").run(blocking, stop_when_empty=True)
            assert (stats2.acked, stats2.lost) == (1, 0)

    asyncio.run(main())


def test_a_lost_lease_is_that_lease_only(client: Client) -> None:
    """A handler outlives its lease (no extends): the ack is skipped and that lease is
    lost; the same job, claimed again with a new lease, is not reported lost."""
    client.put_topic("q.lost", type="queue", lease_ms=LEASE_MS)
    client.append("q.lost", ["job"])
    worker = client.worker("q.lost", "w1", extend_every_ms=60_000)
    first: list[Job] = []
    at_start: list[bool] = []

    def handler(job: Job) -> None:
        at_start.append(worker.lost(job))
        if job.deliveries == 1:
            first.append(job)
            time.sleep(LEASE_MS * 2 / 1000)  # the lease runs out meanwhile

    stats = worker.run(handler, max_jobs=2)
    assert at_start == [False, False], "the second delivery's new lease was reported lost"
    assert worker.lost(first[0]) and (stats.handled, stats.acked, stats.lost) == (2, 1, 1)
