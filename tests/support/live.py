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
from websockets.asyncio.client import connect

from topics.config import load_config
from topics.http.app import TopicsApp
from topics.http.server import start_server

__all__ = ["LiveServer", "live_app"]


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
    app = TopicsApp(load_config(dict(env or {})))
    handle = await start_server(app, "127.0.0.1", 0, timeout_graceful_shutdown=2)
    srv = LiveServer(app, handle.port)
    try:
        yield srv
    finally:
        await srv.http.aclose()
        await handle.stop()
