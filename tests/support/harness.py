"""In-process harness: the real ASGI app driven through httpx's ASGITransport.

Tests stay synchronous: each :class:`Harness` owns an event loop and runs every
request to completion on it. Time is a :class:`~tests.support.clock.TestClock`, so TTL,
leases and dedupe windows move only when a test advances it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from tests.support.clock import TestClock
from topics.config import load_config
from topics.http.app import TopicsApp, build_app
from topics.node import Node

__all__ = ["Harness"]


class Harness:
    """One app over a memory-mode node + TestClock, and a sync request helper.

    The node is not started (no ASGI lifespan runs here): routers forward when
    a read drains their dest, not from publication.
    """

    def __init__(
        self, env: Mapping[str, str] | None = None, clock: TestClock | None = None
    ) -> None:
        self.clock = clock or TestClock()
        self.loop = asyncio.new_event_loop()
        cfg = load_config(dict(env or {}))
        self.app: TopicsApp = self.loop.run_until_complete(self._make(cfg))
        self.node: Node = self.app.node
        self.engine = self.app.engine
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://testserver"
        )

    async def _make(self, cfg: Any) -> TopicsApp:
        return build_app(cfg, clock=self.clock)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def req(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.run(self.client.request(method, path, **kw))

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.req("GET", path, **kw)

    def post(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        if json is not None:
            kw["json"] = json
        return self.req("POST", path, **kw)

    def put(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        if json is not None:
            kw["json"] = json
        return self.req("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> httpx.Response:
        return self.req("DELETE", path, **kw)

    # conveniences -------------------------------------------------------

    def write(self, topic: str, *datas: Any, **fields: Any) -> dict[str, Any]:
        """Append one record per `datas` item; asserts success and returns the ack."""
        recs = [{"data": d, **fields} for d in datas]
        r = self.post(f"/v0/topics/{topic}", {"records": recs})
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    def diff(self, topic: str, **body: Any) -> dict[str, Any]:
        r = self.post(f"/v0/topics/{topic}/diff", body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def close(self) -> None:
        self.run(self.client.aclose())
        self.loop.close()


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Assert the canonical error envelope (API §1.7) and return `error`."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) <= {"code", "message", "detail"}
    if status in (429, 503):
        assert r.headers.get("retry-after") == "1"
    return dict(err)
