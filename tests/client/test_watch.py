"""Client.watch over SSE against a real server: frames as typed events, resuming
after a dropped connection (same session) and after a server restart (a new
session from the watch's cursors), the clean end on the shutdown frame."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.proxy import Proxy
from tests.support.process import ServerProcess
from topics.client import (
    CaughtUp,
    Client,
    ConnectionFailed,
    Event,
    Record,
    Tombstone,
    TopicDeleted,
    TopicNotFound,
    Watch,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


class Collector:
    """Iterates a watch on a thread; events land in a queue."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.events: queue.Queue[Event | BaseException | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for ev in self.watch:
                self.events.put(ev)
        except BaseException as e:  # handed to the test
            self.events.put(e)
        self.events.put(None)

    def until(self, pred: object, timeout: float = 20.0) -> list[Event]:
        """Events until one satisfies `pred` (included)."""
        out: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; got {out}"
            ev = self.events.get(timeout=left)
            if isinstance(ev, BaseException):
                raise ev
            assert ev is not None, f"the watch ended early ({self.watch.ended_by}); got {out}"
            out.append(ev)
            if pred(ev):  # type: ignore[operator]
                return out

    def end(self, timeout: float = 20.0) -> list[Event]:
        out: list[Event] = []
        while True:
            ev = self.events.get(timeout=timeout)
            if ev is None:
                return out
            if isinstance(ev, BaseException):
                raise ev
            out.append(ev)


def _records(events: list[Event], topic: str | None = None) -> list[int]:
    return [e.seq for e in events if isinstance(e, Record) and (topic is None or e.topic == topic)]


@pytest.fixture
def direct(server: ServerProcess) -> Iterator[Client]:
    with Client(server.base) as c:
        yield c


def test_watch_several_topics_with_tombstone_and_delete(
    server: ServerProcess, direct: Client
) -> None:
    direct.put_topic("w.capped", cap_records=2)
    direct.append("w.capped", ["a", "b", "c", "d"])
    direct.append("w.plain", ["x"])
    with Client(server.base) as c:
        col = Collector(c.watch(["w.capped", "w.plain"], heartbeat_ms=1000))
        got = col.until(lambda e: isinstance(e, CaughtUp) and e.topic == "w.plain")
        tomb = [e for e in got if isinstance(e, Tombstone)]
        assert len(tomb) == 1 and (tomb[0].topic, tomb[0].gap_from, tomb[0].gap_to) == (
            "w.capped",
            1,
            2,
        )
        assert tomb[0].reason == "from_seq_too_old" and tomb[0].missed_estimate is None
        assert _records(got, "w.capped") == [3, 4] and _records(got, "w.plain") == [1]
        direct.append("w.plain", ["live"], node="n1")
        live = col.until(lambda e: isinstance(e, Record))
        assert isinstance(live[-1], Record) and live[-1].data == "live" and live[-1].node == "n1"
        direct.delete_topic("w.plain")
        assert TopicDeleted("w.plain") in col.until(lambda e: isinstance(e, TopicDeleted))
        direct.delete_topic("w.capped")
        col.until(lambda e: isinstance(e, TopicDeleted))
        assert col.end() == []
        assert col.watch.ended_by == "deleted" and col.watch.cursors == {}


def test_watch_tail_and_mapping_start(server: ServerProcess, direct: Client) -> None:
    direct.append("w.tail", ["old1", "old2", "old3"])
    with Client(server.base) as c:
        w = c.watch(["w.tail"], tail=True)
        col = Collector(w)
        col.until(lambda e: isinstance(e, CaughtUp))
        direct.append("w.tail", ["new"])
        got = col.until(lambda e: isinstance(e, Record))
        assert _records(got) == [4]
        w.close()  # from another thread: the blocked read returns at once
        col.thread.join(5)
        assert not col.thread.is_alive() and w.ended_by == "closed"
        w2 = c.watch({"w.tail": 2})
        col2 = Collector(w2)
        assert _records(col2.until(lambda e: isinstance(e, CaughtUp))) == [3, 4]
        w2.close()


def test_watch_missing_topic(server: ServerProcess) -> None:
    with Client(server.base) as c:
        with pytest.raises(TopicNotFound):
            next(iter(c.watch(["w.none"])))
        c.append("w.some", [1])
        w = c.watch(["w.none", "w.some"], lenient=True)
        it = iter(w)
        assert next(it) == TopicDeleted("w.none")
        assert isinstance(next(it), Record)
        w.close()


def test_resume_after_the_connection_drops(server: ServerProcess, direct: Client) -> None:
    direct.append("w.drop", list(range(1, 6)))
    proxy = Proxy(server.port)
    try:
        with Client(proxy.url) as c:
            w = c.watch(["w.drop"], heartbeat_ms=1000)
            col = Collector(w)
            first = col.until(lambda e: isinstance(e, CaughtUp))
            assert _records(first) == [1, 2, 3, 4, 5]
            wid = w.wid
            for _ in range(2):
                assert proxy.drop_all() >= 1
                direct.append("w.drop", ["while down"])
                time.sleep(0.2)
            direct.append("w.drop", ["after"])
            got = col.until(lambda e: isinstance(e, Record) and e.seq == 8)
            assert _records(got) == [6, 7, 8]  # every record once, none twice
            assert w.reconnects >= 1 and w.wid == wid  # the same session, resumed
            assert w.cursors == {"w.drop": 8}
            w.close()
    finally:
        proxy.close()


def test_watch_ends_cleanly_on_shutdown(fresh_server: ServerProcess) -> None:
    with Client(fresh_server.base) as c:
        c.append("w.bye", [1])
        w = c.watch(["w.bye"])
        col = Collector(w)
        col.until(lambda e: isinstance(e, CaughtUp))
        assert fresh_server.stop() == 0
        assert col.end() == []
        assert w.ended_by == "shutdown" and w.cursors == {"w.bye": 1}


def test_resume_after_a_server_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path)
    proxy = Proxy(server.port)
    try:
        with Client(server.base) as direct:
            direct.put_topic("w.restart", durability="fsync")
            direct.append("w.restart", ["a", "b"])
        with Client(proxy.url) as c:
            w = c.watch(["w.restart"], heartbeat_ms=1000, reconnect_timeout=60)
            col = Collector(w)
            assert _records(col.until(lambda e: isinstance(e, CaughtUp))) == [1, 2]
            old_wid = w.wid
            server.stop(signal.SIGKILL)  # no shutdown frame: the connection just breaks
            server = ServerProcess(tmp_path)
            proxy.retarget(server.port)
            with Client(server.base) as direct:
                direct.append("w.restart", ["c"])
            got = col.until(lambda e: isinstance(e, Record))
            assert _records(got) == [3]
            assert w.wid != old_wid and w.reconnects >= 1
            w.close()
    finally:
        proxy.close()
        server.stop()


def test_no_reconnect_raises(server: ServerProcess, direct: Client) -> None:
    direct.append("w.once", [1])
    proxy = Proxy(server.port)
    try:
        with Client(proxy.url) as c:
            col = Collector(c.watch(["w.once"], reconnect=False))
            col.until(lambda e: isinstance(e, CaughtUp))
            proxy.drop_all()
            with pytest.raises(ConnectionFailed):
                col.end()
    finally:
        proxy.close()


def test_reconnect_on_shutdown_waits_for_the_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path)
    proxy = Proxy(server.port)
    try:
        with Client(server.base) as direct:
            direct.put_topic("w.back", durability="fsync")
            direct.append("w.back", ["a"])
        with Client(proxy.url) as c:
            w = c.watch(["w.back"], reconnect_on_shutdown=True)
            col = Collector(w)
            col.until(lambda e: isinstance(e, CaughtUp))
            assert server.stop() == 0  # graceful: the shutdown frame, then the stream ends
            server = ServerProcess(tmp_path)
            proxy.retarget(server.port)
            with Client(server.base) as direct:
                direct.append("w.back", ["b"])
            assert _records(col.until(lambda e: isinstance(e, Record))) == [2]
            w.close()
    finally:
        proxy.close()
        server.stop()


def test_async_watch_resumes_after_a_drop(server: ServerProcess, direct: Client) -> None:
    import asyncio

    from topics.client import AsyncClient

    direct.append("w.adrop", ["a"])
    proxy = Proxy(server.port)

    async def main() -> list[int]:
        seqs: list[int] = []
        async with AsyncClient(proxy.url) as c, c.watch(["w.adrop"], heartbeat_ms=1000) as w:
            async for ev in w:
                if isinstance(ev, CaughtUp) and ev.head_seq == 1:
                    proxy.drop_all()
                    await asyncio.to_thread(direct.append, "w.adrop", ["b"])
                if isinstance(ev, Record):
                    seqs.append(ev.seq)
                    if ev.seq == 2:
                        break
            assert w.reconnects >= 1
        return seqs

    try:
        assert asyncio.run(main()) == [1, 2]
    finally:
        proxy.close()


def test_a_watch_stopped_mid_frame_resumes_after_its_last_event(
    server: ServerProcess, direct: Client
) -> None:
    """Four records arrive in one frame; a consumer that stops after the second
    keeps cursor 2, and a watch from those cursors hands out 3 and 4 (sync and
    async alike)."""
    import asyncio

    from topics.client import AsyncClient

    direct.append("w.midframe", ["a", "b", "c", "d"])
    with Client(server.base) as c:
        w = c.watch(["w.midframe"])
        for ev in w:
            if isinstance(ev, Record) and ev.seq == 2:
                break
        w.close()
        assert w.cursors == {"w.midframe": 2}
        w2 = c.watch(w.cursors)
        col = Collector(w2)
        assert _records(col.until(lambda e: isinstance(e, CaughtUp))) == [3, 4]
        w2.close()

    async def stop_at_2() -> dict[str, int]:
        async with AsyncClient(server.base) as ac, ac.watch(["w.midframe"]) as aw:
            async for ev in aw:
                if isinstance(ev, Record) and ev.seq == 2:
                    break
            return dict(aw.cursors)

    assert asyncio.run(stop_at_2()) == {"w.midframe": 2}
