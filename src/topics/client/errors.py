"""Exceptions raised by :mod:`topics.client`.

Every failure the server reports arrives as the error envelope of docs/API.md,
"3.1 The envelope" (`{"error": {"code", "message", "detail"}}`) and is raised as
a :class:`TopicsError` whose class is picked by the canonical `code` (docs/API.md,
"3.3 Every error code"), falling back on the HTTP status for a code this client
does not know. A server that cannot be reached raises :class:`ConnectionFailed`,
also a :class:`TopicsError`, so ``except TopicsError`` covers every failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = [
    "TopicsError",
    "ConnectionFailed",
    "BadRequest",
    "BatchTooLarge",
    "RecordTooLarge",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "TopicNotFound",
    "RouterNotFound",
    "Conflict",
    "TopicExistsIncompatible",
    "TopicNotEmpty",
    "NotAQueue",
    "RouterCycle",
    "PayloadTooLarge",
    "TopicFull",
    "Throttled",
    "ServerError",
    "Unavailable",
    "NotReady",
    "InsufficientStorage",
    "error_from_response",
]


class TopicsError(Exception):
    """A request that failed.

    Attributes: `status` (the HTTP status; 0 when no answer came), `code` (the
    stable error code to branch on, e.g. ``"topic_not_found"``), `message` (for
    humans; may change between versions), `detail` (structured context, ``{}``
    when the server sent none), `retry_after` (seconds from ``Retry-After``, or
    None).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail: dict[str, Any] = dict(detail or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f"HTTP {self.status}" if self.status else "no response"
        return f"{self.code}: {self.message} ({where})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"message={self.message!r}, detail={self.detail!r})"
        )


class ConnectionFailed(TopicsError):
    """The server could not be reached, or the connection broke before an answer.

    `status` is 0 and `code` is ``"connection_failed"``; the transport error is
    the exception's ``__cause__``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_failed", message)


class BadRequest(TopicsError):
    """400: a malformed or invalid request (`invalid_request` and the size codes)."""


class BatchTooLarge(BadRequest):
    """400 `batch_too_large`: more than 10000 records, or more than 1000 queue seqs."""


class RecordTooLarge(BadRequest):
    """400 `record_too_large`: a record over 1 MiB, or a batch a full reject topic could never take."""


class Unauthorized(TopicsError):
    """401 `unauthorized`: no token, or one that matches no key (docs/API.md, "2.1 Keys")."""


class Forbidden(TopicsError):
    """403 `forbidden`: the key lacks the scope, or a name is outside its prefixes."""


class NotFound(TopicsError):
    """404: `not_found` (no such route, or an unknown watch id), and its subclasses."""


class TopicNotFound(NotFound):
    """404 `topic_not_found`; `detail["topic"]` names it."""


class RouterNotFound(NotFound):
    """404 `router_not_found`; `detail["router"]` names it."""


class Conflict(TopicsError):
    """409: the request contradicts the current state; subclasses by code."""


class TopicExistsIncompatible(Conflict):
    """409 `topic_exists_incompatible`: another `type`, a router fan-in or re-point."""


class TopicNotEmpty(Conflict):
    """409 `topic_not_empty`: a delete with `if_empty` on a topic with live records."""


class NotAQueue(Conflict):
    """409 `not_a_queue`: a queue route on a `log` topic."""


class RouterCycle(Conflict):
    """409 `router_cycle`: the router would close a cycle; `detail["cycle"]` lists it."""


class PayloadTooLarge(TopicsError):
    """413 `payload_too_large`: the body is over the server's limits."""


class TopicFull(TopicsError):
    """422 `topic_full`: a `discard: "reject"` topic has no room for the batch now."""


class Throttled(TopicsError):
    """429 `throttled`: a resource cap, or a momentary overload.

    `retry_after` is the wait the server asked for, in seconds (from
    ``Retry-After``, or `detail["retry_after_ms"]` when that is longer).
    `detail["limit"]` names the cap when one was hit (docs/API.md, "16. Limits
    and the knobs that shape the API").
    """


class ServerError(TopicsError):
    """500 `internal` (and any other 5xx this client has no class for)."""


class Unavailable(TopicsError):
    """503: `not_ready`, `cold_tier_unavailable`, `too_many_connections`; retry later."""


class NotReady(Unavailable):
    """503 `not_ready`: the server is still replaying its log; `detail["replay_progress"]`."""


class InsufficientStorage(TopicsError):
    """507 `insufficient_storage`: the server's disk is full; writes resume when space returns."""


_BY_CODE: dict[str, type[TopicsError]] = {
    "invalid_request": BadRequest,
    "batch_too_large": BatchTooLarge,
    "record_too_large": RecordTooLarge,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "topic_not_found": TopicNotFound,
    "router_not_found": RouterNotFound,
    "topic_exists_incompatible": TopicExistsIncompatible,
    "topic_not_empty": TopicNotEmpty,
    "not_a_queue": NotAQueue,
    "router_cycle": RouterCycle,
    "payload_too_large": PayloadTooLarge,
    "topic_full": TopicFull,
    "throttled": Throttled,
    "internal": ServerError,
    "not_ready": NotReady,
    "cold_tier_unavailable": Unavailable,
    "too_many_connections": Unavailable,
    "insufficient_storage": InsufficientStorage,
}

_BY_STATUS: dict[int, type[TopicsError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: TopicFull,
    429: Throttled,
    503: Unavailable,
    507: InsufficientStorage,
}


def parse_retry_after(header: str | None, detail: Mapping[str, Any] | None = None) -> float | None:
    """Seconds to wait: the ``Retry-After`` header (delta-seconds) or
    `detail["retry_after_ms"]`, whichever is longer; None when neither is usable."""
    out: float | None = None
    if header:
        try:
            out = max(float(header.strip()), 0.0)
        except ValueError:
            out = None
    ms = (detail or {}).get("retry_after_ms")
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
        out = max(out or 0.0, ms / 1000.0)
    return out


def _foreign_answer(status: int, body: bytes, lacks: str = "a topics error body") -> str:
    """One line for an answer that lacks what a topics server sends (`lacks`): it
    came from another server, or from something in between (a proxy, a load balancer)."""
    text = re.sub(r"<[^>]*>", " ", body[:2000].decode("utf-8", "replace"))
    text = " ".join(text.split())
    if len(text) > 120:
        text = text[:117] + "..."
    what = repr(text) if text else "an empty body"
    return f"HTTP {status} without {lacks} ({what}); is the url a topics server's?"


def unreadable_answer(status: int, body: bytes) -> TopicsError:
    """The exception for a 2xx answer whose body is not JSON (code `invalid_answer`)."""
    return TopicsError(status, "invalid_answer", _foreign_answer(status, body, "a JSON body"))


def error_from_response(
    status: int, body: bytes, retry_after_header: str | None = None
) -> TopicsError:
    """The exception for a non-2xx answer: the envelope's code picks the class.

    A body that is not the envelope (a proxy's error page, another server)
    gives the status's class with code ``"http_<status>"`` and a one-line
    message that says so, quoting the start of the body's text.
    """
    code, message, detail = f"http_{status}", "", {}
    try:
        err = orjson.loads(body)["error"]
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", ""))
            d = err.get("detail")
            detail = d if isinstance(d, dict) else {}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    if code == f"http_{status}" and not message:
        message = _foreign_answer(status, body)
    cls = (
        _BY_CODE.get(code)
        or _BY_STATUS.get(status)
        or (ServerError if status >= 500 else TopicsError)
    )
    return cls(
        status, code, message, detail, retry_after=parse_retry_after(retry_after_header, detail)
    )
