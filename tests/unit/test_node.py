"""The composition root (`topics.node.Node`): what it builds, its background work, its lifecycle.

docs/ARCHITECTURE.md, "Layers": shells receive a Node; the Node owns the engine,
storage and the background work (router forwarding on publication, the
stalled-router retry pass, checkpoints).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from topics.config import ServerConfig
from topics.engine.core import Engine
from topics.engine.topic import PendingWrite
from topics.http.app import build_app
from topics.node import Node
from topics.storage.lock import LOCK_NAME, DataDirLocked


async def write(eng: Engine, name: str, *datas: Any) -> PendingWrite:
    """Stage a write and wait until it is published (committed)."""
    res = eng.begin_write(name, eng.parse_write({"records": [{"data": d} for d in datas]}, None))
    assert isinstance(res, PendingWrite)
    async with asyncio.timeout(10):
        while not res.published:
            await asyncio.sleep(0.002)
    assert res.ok
    return res


async def until(cond: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.002)


def test_a_memory_node_builds_every_part_and_answers_empty_for_storage() -> None:
    node = Node.memory()
    assert node.engine.routers is node.routers and node.engine.queues is node.queues
    assert node.watches.engine is node.engine and node.clock is node.engine.clock
    assert not node.auth.enabled
    assert node.ready and node.replay_progress == 1.0
    assert node.storage is None and node.wal is None
    assert node.degraded() is None
    assert node.wal_metrics() is None and node.wal_prometheus_lines() == []
    assert node.open_request() is None and not node.has_pending_controls()
    node.close_request(None)
    asyncio.run(node.barrier())  # nothing to wait for


def test_an_app_wires_http_to_its_node() -> None:
    app = build_app(ServerConfig())
    node = app.node
    assert app.owns_node
    assert (app.engine, app.routers, app.queues, app.watches, app.auth) == (
        node.engine,
        node.routers,
        node.queues,
        node.watches,
        node.auth,
    )


def test_publication_forwards_at_once_and_the_retry_pass_resumes_a_stalled_source() -> None:
    async def main() -> None:
        node = Node(ServerConfig(), router_retry_s=0.02)
        await node.start()
        try:
            eng = node.engine
            eng.put_topic("b", {"cap_records": 2, "discard": "reject"})
            node.routers.put("r", {"source": "a", "dest": "b"})
            await write(eng, "a", 1, 2, 3)
            r = node.routers.by_name("r")
            assert r is not None
            await until(lambda: r.cursor == 2)  # forwarded on publication; b is full
            # Room in the dest, and no new publication on the source: only the
            # retry pass can move the stalled router now.
            eng.delete_records("b", {"before_seq": 3})
            await until(lambda: r.cursor == 3)
        finally:
            await node.stop()
        assert node.routers.schedule is None and not node.running

    asyncio.run(main())


def test_a_durable_node_recovers_serves_and_stops(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = ServerConfig(data_dir=str(data), wal_shards=1)

    async def first() -> None:
        node = Node(cfg, durable=True)
        assert not node.ready and node.replay_progress == 0.0
        node.lock()
        with pytest.raises(DataDirLocked):
            Node(cfg, durable=True).lock()
        await node.start()
        try:
            assert node.storage is not None and node.wal is node.storage.journal
            assert node.engine.journal is node.wal
            assert node.replay_progress == 1.0
            assert not node.ready  # the caller flips it once every listener is up
            assert node.degraded() is None
            metrics = node.wal_metrics()
            assert metrics is not None and metrics["disk_full"] is False
            assert any(line.startswith("topics_wal_") for line in node.wal_prometheus_lines())
            node.engine.put_topic("a", {"durability": "fsync"})
            token = node.open_request()
            try:
                node.engine.put_topic("c", {"durability": "fsync"})
                await node.barrier()
                assert not node.has_pending_controls()
            finally:
                node.close_request(token)
            await write(node.engine, "a", "x", "y")
        finally:
            await node.stop()

    async def second() -> None:
        node = Node(cfg, durable=True)
        await node.start()
        try:
            assert node.engine.require("a").head_seq == 2
            assert "c" in node.engine.topics
        finally:
            await node.stop()

    asyncio.run(first())
    assert (data / LOCK_NAME).exists()  # released, not removed: the normal end
    asyncio.run(second())


def test_a_failed_start_leaves_nothing_behind(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    cfg = ServerConfig(data_dir=str(data), wal_shards=1)

    async def main() -> None:
        node = Node(cfg, durable=True)
        await node.start()
        assert os.listdir(data)
        await node.abort(discard=True)

    asyncio.run(main())
    assert not (tmp_path / "fresh").exists()
