"""What clients see of the delivery scheduler and its ladder (docs/SCHEDULER.md)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import orjson
import pytest
from tests.support.harness import Harness, assert_error

from topics.config import ServerConfig
from topics.http.app import TopicsApp
from topics.http.server import start_server
from topics.node import RETRY_AFTER_MS, Node


def saturate(h: Harness, full: bool = True) -> None:
    """Pressure at 1 and (as far as the node can tell) a full WAL ingest queue."""
    for _ in range(3):
        h.node.delivery.governor.sample(0, 1.0)  # sustained: deferring
    h.node._wal_fill = lambda: 1.0 if full else 0.0  # type: ignore[method-assign]


def test_a_saturated_server_refuses_writes_with_429_and_changes_nothing() -> None:
    h = Harness()
    h.write("t", 1)
    saturate(h)
    r = h.post("/v0/topics/t", {"records": [{"data": 2}]})
    assert_error(r, 429, "throttled")
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["detail"] == {"retry_after_ms": RETRY_AFTER_MS}
    assert h.engine.topics["t"].head_seq == 1
    m = h.get("/v0/metrics", headers={"accept": "application/json"}).json()
    assert m["scheduler"]["rejected"] == 1


def test_disable_backpressure_bypasses_the_throttle() -> None:
    h = Harness()
    saturate(h)
    r = h.post("/v0/topics/t", {"records": [{"data": 1}], "disable_backpressure": True})
    assert r.status_code == 201, r.text
    assert h.engine.topics["t"].head_seq == 1


def test_no_429_without_a_full_queue_or_below_the_pressure_threshold() -> None:
    h = Harness()
    saturate(h, full=False)
    h.write("t", 1)
    saturate(h)
    h.node.delivery.governor.pressure = 0.9
    h.write("t", 2)


def test_disable_backpressure_must_be_a_boolean() -> None:
    h = Harness()
    r = h.post("/v0/topics/t", {"records": [{"data": 1}], "disable_backpressure": "yes"})
    assert_error(r, 400, "invalid_request")
    assert "t" not in h.engine.topics


def test_metrics_show_the_scheduler() -> None:
    h = Harness()
    m = h.get("/v0/metrics", headers={"accept": "application/json"}).json()["scheduler"]
    assert m["mode"] == "priority" and m["pressure"] == 0.0
    assert set(m["ready"]) == {"B4", "B3", "B2", "B1", "B0"}
    assert m["sse_lagged"] == 0 and m["deferring"] is False
    text = h.get("/v0/metrics").text
    for series in (
        "topics_scheduler_pressure 0.0",
        'topics_scheduler_ready{band="B0"} 0',
        'topics_scheduler_latency_ms_bucket{le="+Inf"}',
        "topics_scheduler_throttled_total 0",
        "topics_sse_lagged 0",
    ):
        assert series in text


def test_fifo_mode_is_reported() -> None:
    h = Harness({"TOPICS_SCHEDULER": "fifo"})
    m = h.get("/v0/metrics", headers={"accept": "application/json"}).json()["scheduler"]
    assert m["mode"] == "fifo"


def test_a_widened_commit_window_is_reported_as_throttle_wait(tmp_path: Path) -> None:
    cfg = ServerConfig(data_dir=str(tmp_path / "d"), wal_shards=1)

    async def main() -> None:
        node = Node(cfg, durable=True)
        await node.start()
        node.ready = True
        app = TopicsApp(node)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            r = await c.put("/v0/topics/f", json={"durability": "fsync"})
            assert r.status_code in (200, 201), r.text
            r = await c.post("/v0/topics/f", json={"records": [{"data": 1}]})
            assert "throttle_wait_ms" not in r.json()["performance"]
            node._set_commit_window(0.02)
            r = await c.post("/v0/topics/f", json={"records": [{"data": 2}]})
            perf = r.json()["performance"]
            assert 5.0 <= perf["throttle_wait_ms"] <= 1000.0, perf
            node._set_commit_window(0.0)
        await node.stop()

    asyncio.run(main())


@pytest.mark.slow  # 3000 writes past a 4 MiB socket buffer: the full tier's
@pytest.mark.timeout(60)
def test_a_stalled_reader_is_marked_lagged_and_catches_up_in_order() -> None:
    """Many small frames to a socket that is not read: the stream stops buffering at
    1024 frames, the other watcher and the writer carry on, and once the reader
    reads again it gets every record in order."""

    async def main() -> None:
        app = TopicsApp(Node.memory())
        handle = await start_server(app, "127.0.0.1", 0, timeout_graceful_shutdown=2)
        base = f"http://127.0.0.1:{handle.port}"
        try:
            async with httpx.AsyncClient(base_url=base) as c:
                await c.put("/v0/topics/t")
                slow = (await c.post("/v0/watch", json={"topics": {"t": {}}})).json()
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                loop = asyncio.get_running_loop()
                await loop.sock_connect(sock, ("127.0.0.1", handle.port))
                reader, writer = await asyncio.open_connection(sock=sock)
                writer.transport.pause_reading()  # the stalled reader
                writer.write(f"GET {slow['stream_url']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await writer.drain()
                sess = app.watches.get(slow["wid"])
                assert sess is not None
                async with asyncio.timeout(5):
                    while sess.open_streams != 1:
                        await asyncio.sleep(0.01)
                n = 3000
                pad = "p" * 2000  # 3000 of them pass the 4 MiB a socket buffers
                for i in range(n):
                    r = await c.post(
                        "/v0/topics/t", json={"records": [{"data": {"i": i, "p": pad}}]}
                    )
                    assert r.status_code == 200
                assert app.sse_lagged == 1 and app.sse_lagged_total == 1
                writer.transport.resume_reading()
                got: list[int] = []
                buf = b""
                async with asyncio.timeout(20):
                    while len(got) < n:
                        buf += await reader.read(1 << 16)
                        while b"\n\n" in buf:
                            block, buf = buf.split(b"\n\n", 1)
                            if b"event: record" in block:
                                for line in block.split(b"\n"):
                                    if b'"records"' in line:
                                        data = orjson.loads(line.split(b"data: ", 1)[1])
                                        got += [rec["data"]["i"] for rec in data["records"]]
                assert got == list(range(n))
                async with asyncio.timeout(5):
                    while app.sse_lagged:
                        await asyncio.sleep(0.01)
                writer.close()
        finally:
            await handle.stop()

    asyncio.run(main())


def test_paced_writes_wait_by_band_and_say_so() -> None:
    h = Harness()
    h.put("/v0/topics/low", {"priority": -100})
    h.put("/v0/topics/urgent", {"priority": 900})
    g = h.node.delivery.governor
    g.pace = 0.25  # 5 ms for B0
    r = h.post("/v0/topics/low", {"records": [{"data": 0}]})
    assert "throttle_wait_ms" not in r.json()["performance"]  # nothing urgent to protect
    h.node.delivery.saw_band(4)  # an urgent topic published under pressure
    r = h.post("/v0/topics/low", {"records": [{"data": 1}]})
    assert r.status_code == 200 and r.json()["performance"]["throttle_wait_ms"] == 5.0
    r = h.post("/v0/topics/urgent", {"records": [{"data": 1}]})
    assert "throttle_wait_ms" not in r.json()["performance"]
    r = h.post("/v0/topics/low", {"records": [{"data": 2}], "disable_backpressure": True})
    assert "throttle_wait_ms" not in r.json()["performance"]
    assert h.node.delivery.paced == 1
