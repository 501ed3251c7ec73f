"""End to end: the real `topics serve` process driven over real sockets."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path)
    yield s
    assert s.stop() == 0, (tmp_path / "server.log").read_text()


async def _sse_frames(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], want: int
) -> list[dict]:
    frames: list[dict] = []
    cur: dict = {}
    async with client.stream("GET", url, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line == "":
                if "event" in cur:
                    frames.append(cur)
                    if len(frames) >= want:
                        break
                cur = {}
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            cur[k] = v
    return frames


def test_write_diff_watch_ws_queue_h2c(server: ServerProcess) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.base) as c:
            assert (await c.get("/healthz")).json()["status"] == "ok"
            r = await c.post(
                "/v0/topics/orders", json={"records": [{"data": {"n": i}} for i in range(3)]}
            )
            assert r.status_code == 201 and r.json()["seqs"] == [1, 2, 3]
            d = (await c.post("/v0/topics/orders/diff", json={"from_seq": 1})).json()
            assert [x["data"]["n"] for x in d["records"]] == [1, 2] and d["caught_up"]

            # SSE watch: drain, then resume with Last-Event-ID after reconnecting.
            w = (await c.post("/v0/watch", json={"topics": {"orders": {"from_seq": 0}}})).json()
            frames = await _sse_frames(c, w["stream_url"], {}, 2)
            assert frames[0]["event"] == "record" and frames[1]["event"] == "caught-up"
            rec = json.loads(frames[0]["data"])
            assert [x["$seq"] for x in rec["records"]] == [1, 2, 3]
            cursor = json.loads(base64.urlsafe_b64decode(frames[0]["id"] + "=="))
            assert cursor == {"orders": 3}
            await c.post("/v0/topics/orders", json={"records": [{"data": {"n": 3}}]})
            rewind = base64.urlsafe_b64encode(orjson.dumps({"orders": 2})).rstrip(b"=").decode()
            frames = await _sse_frames(c, w["stream_url"], {"Last-Event-ID": rewind}, 1)
            assert [x["$seq"] for x in json.loads(frames[0]["data"])["records"]] == [3, 4]

            # WebSocket: subscribe with a node filter, publish, receive only others' records.
            ws_url = f"ws://{server.host}:{server.port}/v0/ws"
            async with connect(ws_url) as ws:
                await ws.send(
                    json.dumps(
                        {
                            "op": "subscribe",
                            "request_id": 1,
                            "topic": "chat",
                            "tail": True,
                            "node": "me",
                            "lenient": True,
                        }
                    )
                )
                msg = json.loads(await ws.recv())
                assert msg["op"] in ("subscribed", "error")
                await c.post("/v0/topics/chat", json={"records": [{"data": "x"}]})
                if msg["op"] == "error" or "chat" not in msg.get("topics", {}):
                    # lenient dropped the not-yet-existing topic: subscribe again
                    await ws.send(
                        json.dumps(
                            {"op": "subscribe", "request_id": 2, "topic": "chat", "node": "me"}
                        )
                    )
                    msg = json.loads(await ws.recv())
                    assert msg["op"] == "subscribed"
                await ws.send(
                    json.dumps(
                        {
                            "op": "publish",
                            "request_id": "p",
                            "topic": "chat",
                            "records": [
                                {"node": "me", "data": "mine"},
                                {"node": "you", "data": "theirs"},
                            ],
                        }
                    )
                )
                seen: list[str] = []
                acked = False
                while not (acked and "theirs" in seen):
                    m = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    if m["op"] == "ack":
                        acked = True
                        assert m["request_id"] == "p" and m["count"] == 2
                    elif m["op"] == "record":
                        seen += [x["data"] for x in m["records"]]
                assert "mine" not in seen

            # Queue: claim and ack.
            await c.put("/v0/topics/jobs", json={"type": "queue"})
            await c.post("/v0/topics/jobs", json={"records": [{"data": "j1"}, {"data": "j2"}]})
            cl = (await c.post("/v0/topics/jobs/claim", json={"node": "w1", "max": 5})).json()
            assert [j["$seq"] for j in cl["claimed"]] == [1, 2]
            ack = (await c.post("/v0/topics/jobs/ack", json={"node": "w1", "seqs": [1, 2]})).json()
            assert ack["acked"] == 2
            assert (await c.get("/v0/topics/jobs")).json()["count"] == 0

        # h2c prior knowledge on the same port.
        async with httpx.AsyncClient(base_url=server.base, http1=False, http2=True) as c2:
            r = await c2.post("/v0/topics/orders/diff", json={"from_seq": 3})
            assert r.http_version == "HTTP/2" and r.json()["records"][0]["$seq"] == 4

    asyncio.run(main())


def test_refuses_insecure_bind(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "topics", "serve"],
        env={"TOPICS_HOST": "0.0.0.0", "TOPICS_PORT": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=30,
    )
    assert p.returncode != 0 and b"TOPICS_API_KEYS" in p.stderr
