"""Response helpers: JSON bodies with the `performance` block, the error envelope."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from topics.errors import TopicsError

__all__ = [
    "Resp",
    "json_resp",
    "error_resp",
    "error_body",
    "perf",
    "safe_text",
]

JSON_CT = (b"content-type", b"application/json")


class Resp:
    """A complete HTTP response: its length is known before the first byte goes out.

    The body is `body`, or, when `pieces` is set, the bytes that async iterator
    yields one after another (`length` in all, `body` empty): the app sends each
    piece as it comes, and the iterator may wait between two, so a large body
    does not hold the event loop for its whole length (docs/ARCHITECTURE.md,
    "The read path").
    """

    __slots__ = ("status", "body", "headers", "pieces", "length")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        *,
        pieces: AsyncIterator[bytes] | None = None,
        length: int | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.pieces = pieces
        self.length = len(body) if length is None else length


def perf(t0: float, **extra: Any) -> dict[str, Any]:
    """A `performance` block: `server_total_ms` since `t0` (perf_counter) plus extras."""
    d: dict[str, Any] = {"server_total_ms": round((time.perf_counter() - t0) * 1000, 3)}
    d.update(extra)
    return d


def json_resp(
    status: int, body: dict[str, Any], t0: float | None = None, **perf_extra: Any
) -> Resp:
    """JSON success body; appends `performance` when `t0` is given (docs/API.md, "1. Basics")."""
    if t0 is not None:
        body["performance"] = perf(t0, **perf_extra)
    return Resp(status, orjson.dumps(body), [JSON_CT])


def safe_text(text: str) -> str:
    """`text` with any lone surrogate written as a `\\udXXX` escape, so it encodes as UTF-8."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()


def _safe_detail(detail: dict[str, Any]) -> dict[str, Any]:
    """Keep the detail values that serialise; replace the others by a short description."""
    out: dict[str, Any] = {}
    for k, v in detail.items():
        try:
            orjson.dumps(v)
            out[safe_text(str(k))] = v
        except (orjson.JSONEncodeError, UnicodeEncodeError):
            out[safe_text(str(k))] = f"<unprintable {type(v).__name__}>"
    return out


def error_body(err: TopicsError) -> bytes:
    """The error envelope (docs/API.md, "3.1 The envelope") as JSON bytes; never raises.

    A message or `detail` value that echoes hostile input (a lone surrogate, a
    value nested too deeply to serialise) is rendered safely instead of failing
    the response (docs/HTTP_INPUT.md "Errors").
    """
    try:
        return orjson.dumps(err.body())
    except orjson.JSONEncodeError:
        pass
    e: dict[str, Any] = {"code": err.code, "message": safe_text(err.message)}
    if err.detail is not None:
        e["detail"] = _safe_detail(err.detail)
    return orjson.dumps({"error": e})


def error_resp(err: TopicsError) -> Resp:
    """The error envelope (docs/API.md, "3.1 The envelope"), with Retry-After on 429/503
    and Allow on 405."""
    headers = [JSON_CT]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    if err.allow:
        headers.append((b"allow", ", ".join(err.allow).encode()))
    return Resp(err.status, error_body(err), headers)
