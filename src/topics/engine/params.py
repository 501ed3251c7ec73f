"""Typed field readers for request bodies (pure; raise `400 invalid_request`).

Unknown fields are ignored everywhere (docs/API.md, "1. Basics"); a present field of the wrong
type is a `400`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topics.errors import bad_request

__all__ = ["u32", "u64", "opt_u64", "boolean", "opt_str", "node_set", "predicate", "Predicate"]

U64_MAX = (1 << 64) - 1

Predicate = tuple[str, str]  # ("eq", value) or ("prefix", prefix)


def _field(body: dict[str, Any], key: str, ok: Callable[[Any], bool], must: str) -> Any:
    """`body[key]`, None when absent/null; `400` ("`key` must be `must`") when `ok` refuses it."""
    v = body.get(key)
    if v is not None and not ok(v):
        raise bad_request(f"{key} must be {must}")
    return v


def _uint(top: int) -> Callable[[Any], bool]:
    return lambda v: not isinstance(v, bool) and isinstance(v, int) and 0 <= v <= top


_is_u64 = _uint(U64_MAX)


def opt_u64(body: dict[str, Any], key: str) -> int | None:
    """A u64 field, or None when absent/null."""
    v: int | None = _field(body, key, _is_u64, "a non-negative integer")
    return v


U32_MAX = (1 << 32) - 1
_is_u32 = _uint(U32_MAX)


def u32(body: dict[str, Any], key: str, default: int) -> int:
    """A u32 field (`400` when negative, non-integer or above 2^32 - 1)."""
    v: int | None = _field(body, key, _is_u32, f"an integer in [0, {U32_MAX}]")
    return default if v is None else v


def u64(body: dict[str, Any], key: str, default: int) -> int:
    v = opt_u64(body, key)
    return default if v is None else v


def boolean(body: dict[str, Any], key: str, default: bool) -> bool:
    v: bool | None = _field(body, key, lambda v: isinstance(v, bool), "a boolean")
    return default if v is None else v


def opt_str(body: dict[str, Any], key: str) -> str | None:
    v: str | None = _field(body, key, lambda v: isinstance(v, str), "a string")
    return v


def node_set(body: dict[str, Any], key: str = "node") -> list[str] | None:
    """A node filter: a string or an array of strings (None when absent)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise bad_request(f"{key} must be a string or an array of strings")


def predicate(v: Any) -> Predicate:
    """Parse a tag predicate (docs/API.md, "10. Deleting records").

    `["tag","Eq","v"]`, `["tag","Glob","p*"]`, or a bare string (Eq, but a bare
    string ending in `*` is a Glob prefix [src]).
    """
    if isinstance(v, str):
        if v.endswith("*"):
            return ("prefix", v[:-1])
        return ("eq", v)
    if not isinstance(v, list):
        raise bad_request('match must be a string or a ["tag", op, value] array')
    if len(v) != 3:
        raise bad_request("match must have exactly 3 elements")
    if not all(isinstance(x, str) for x in v):
        raise bad_request("match elements must be strings")
    field, op, value = v
    if field != "tag":
        raise bad_request('match can only test "tag"')
    if op == "Eq":
        return ("eq", value)
    if op == "Glob":
        if not value.endswith("*"):
            raise bad_request("a Glob pattern must end with *")
        return ("prefix", value[:-1])
    raise bad_request('match op must be "Eq" or "Glob"')


def predicate_wire(p: Predicate) -> list[str]:
    """Canonical tuple form of a predicate for responses."""
    kind, value = p
    if kind == "eq":
        return ["tag", "Eq", value]
    return ["tag", "Glob", value + "*"]


def predicate_matches(p: Predicate, tag: str | None) -> bool:
    if tag is None:
        return False
    kind, value = p
    return tag == value if kind == "eq" else tag.startswith(value)
