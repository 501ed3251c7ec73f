"""Response helpers: JSON bodies with the `performance` block, the error envelope."""

from __future__ import annotations

import time
from typing import Any

import orjson

from topics.errors import TopicsError

__all__ = ["Resp", "json_resp", "error_resp", "perf"]

JSON_CT = (b"content-type", b"application/json")


class Resp:
    """A complete (non-streaming) HTTP response."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


def perf(t0: float, **extra: Any) -> dict[str, Any]:
    """A `performance` block: `server_total_ms` since `t0` (perf_counter) plus extras."""
    d: dict[str, Any] = {"server_total_ms": round((time.perf_counter() - t0) * 1000, 3)}
    d.update(extra)
    return d


def json_resp(
    status: int, body: dict[str, Any], t0: float | None = None, **perf_extra: Any
) -> Resp:
    """JSON success body; appends `performance` when `t0` is given (API §1.10)."""
    if t0 is not None:
        body["performance"] = perf(t0, **perf_extra)
    return Resp(status, orjson.dumps(body), [JSON_CT])


def error_resp(err: TopicsError) -> Resp:
    """The canonical error envelope (API §1.7), with Retry-After on 429/503."""
    headers = [JSON_CT]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    return Resp(err.status, orjson.dumps(err.body()), headers)
