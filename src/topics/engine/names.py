"""Name validation for topics and routers (docs/API.md, "1. Basics", Names)."""

from __future__ import annotations

import re

__all__ = ["valid_topic_name", "valid_router_name"]

_TOPIC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
_ROUTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:>-]{0,254}")


def valid_topic_name(name: str) -> bool:
    """True for 1-255 ASCII bytes matching `^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$`."""
    return _TOPIC_RE.fullmatch(name) is not None


def valid_router_name(name: str) -> bool:
    """Topic-name charset plus `>` (so `clicks->warehouse` is legal), 1-255 bytes."""
    return _ROUTER_RE.fullmatch(name) is not None
