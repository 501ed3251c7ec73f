"""The real app served over a real socket inside the test's own event loop.

Uses the production runner (:func:`topics.http.server.start_server`: uvicorn with
the HTTP/1.1 + h2c sniffing protocol and the WebSocket implementation `topics
serve` uses), bound to 127.0.0.1 on an ephemeral port and stopped by the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect

from topics.config import load_config
from topics.http.app import TopicsApp, build_app
from topics.http.server import start_server

__all__ = ["LiveServer", "Sse", "live_app"]


class LiveServer:
    """A running app: `.app`, `.port`, an httpx client `.http`, and `.ws()`."""

    def __init__(self, app: TopicsApp, port: int) -> None:
        self.app = app
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.http = httpx.AsyncClient(base_url=self.base, timeout=10)

    def ws(self, token: str | None = None, query: str = "") -> Any:
        """A WebSocket client connection to `/v0/ws` (bearer header when `token`)."""
        headers = {"authorization": f"Bearer {token}"} if token else None
        return connect(f"ws://127.0.0.1:{self.port}/v0/ws{query}", additional_headers=headers)


@contextlib.asynccontextmanager
async def live_app(env: Mapping[str, str] | None = None) -> AsyncIterator[LiveServer]:
    """Serve a fresh app configured from `env` until the block exits."""
    app = build_app(load_config(dict(env or {})))
    handle = await start_server(app, "127.0.0.1", 0, timeout_graceful_shutdown=2)
    srv = LiveServer(app, handle.port)
    try:
        yield srv
    finally:
        await srv.http.aclose()
        await handle.stop()


class Sse:
    """Parses an httpx streaming response into SSE blocks."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self.lines = resp.aiter_lines()

    async def block(self) -> dict[str, Any] | None:
        """The next block: {"id","event","data","comment","retry"} subset; None at EOF."""
        out: dict[str, Any] = {}
        async for line in self.lines:
            if line == "":
                if out:
                    return out
                continue
            if line.startswith(":"):
                out["comment"] = line[1:].strip()
                continue
            k, _, v = line.partition(":")
            v = v[1:] if v.startswith(" ") else v
            if k == "data":
                out["data"] = orjson.loads(v)
            else:
                out[k] = v
        return out or None

    async def event(self) -> dict[str, Any]:
        """The next frame, skipping heartbeats and the retry line."""
        while True:
            b = await self.block()
            assert b is not None, "stream ended"
            if "event" in b:
                return b

    async def events(self, n: int) -> list[dict[str, Any]]:
        return [await self.event() for _ in range(n)]
