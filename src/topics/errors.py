"""The one error type the engine raises and the HTTP shell renders.

A :class:`TopicsError` carries the stable `code` discriminator, the HTTP status,
a free-text message and an optional `detail` object, exactly the canonical body
of docs/API.md, "3.1 The envelope"::

    {"error": {"code": "...", "message": "...", "detail": {...}}}
"""

from __future__ import annotations

from typing import Any

__all__ = ["TopicsError", "bad_request", "not_found_topic", "throttled"]


class TopicsError(Exception):
    """A request-level failure with its wire code and status (docs/API.md, "3.1 The envelope")."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: dict[str, Any] | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        # 429 and 503 always carry Retry-After: 1 (docs/API.md, "3.1 The envelope").
        if retry_after is None and status in (429, 503):
            retry_after = 1
        self.retry_after = retry_after
        #: Methods the path takes, for the `Allow` header of a 405 (RFC 9110, 15.5.6).
        self.allow: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        """The canonical error envelope as a JSON-ready dict."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail is not None:
            err["detail"] = self.detail
        return {"error": err}

    def __repr__(self) -> str:
        return f"TopicsError({self.status}, {self.code!r}, {self.message!r})"


def bad_request(message: str, detail: dict[str, Any] | None = None) -> TopicsError:
    """`400 invalid_request` with the given message."""
    return TopicsError(400, "invalid_request", message, detail)


def not_found_topic(name: str) -> TopicsError:
    """`404 topic_not_found` for `name`."""
    return TopicsError(404, "topic_not_found", f'topic "{name}" does not exist', {"topic": name})


def throttled(limit: str, maximum: int, message: str | None = None) -> TopicsError:
    """`429 throttled` for a resource cap, `detail {"limit", "max"}`.

    The message is `message`, by default one naming the limit. See docs/API.md,
    "16. Limits and the knobs that shape the API".
    """
    if message is None:
        message = f"limit {limit} reached (max {maximum})"
    return TopicsError(429, "throttled", message, {"limit": limit, "max": maximum})
