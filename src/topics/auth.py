"""API-key authentication and scope/allowlist authorization, shared by every shell.

The rules are those of docs/API.md, "2. Authentication, scopes and name prefixes".
The HTTP app takes the key from a bearer header (or `?token=` on SSE GETs:
:func:`bearer`, :func:`token_from_query`); the Kafka listener from a SASL/PLAIN
password (docs/KAFKA.md "Tenancy and authentication"). Either way
:meth:`Authenticator.authenticate` turns it into a :class:`Principal`.

A key with name prefixes may touch only topics (and routers) whose names start
with one of them. That holds for every name a request makes the server touch,
not just the one in the path: names inside bodies and configs (a queue's
`dead_letter`, a router's `source`/`dest`), and topics a request would create
or write as a side effect. The helpers here raise the canonical
`403 forbidden` with `detail {"topic": name}` for those.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from topics.config import ALL_SCOPES, ApiKey
from topics.errors import TopicsError

__all__ = [
    "Principal",
    "Authenticator",
    "DEV_PRINCIPAL",
    "bearer",
    "token_from_query",
    "forbidden_name",
    "check_config_names",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key digest (None in dev mode), scopes and prefixes.

    `namespace` is the prefix Kafka clients of the key do not see
    (docs/KAFKA.md, "Tenant namespaces"); "" for a key without the `ns` option.
    """

    digest: bytes | None
    scopes: frozenset[str]
    prefixes: tuple[str, ...]
    namespace: str = ""

    def has(self, *scopes: str) -> bool:
        return all(s in self.scopes for s in scopes)

    def allows_name(self, name: str) -> bool:
        """True if `name` starts with one of the key's prefixes (or it has none)."""
        return not self.prefixes or any(name.startswith(p) for p in self.prefixes)

    def require_name(self, name: str) -> None:
        """Raise `403 forbidden` (`detail {"topic": name}`) unless `name` is allowed."""
        if not self.allows_name(name):
            raise forbidden_name(name)


def forbidden_name(name: str) -> TopicsError:
    """The `403 forbidden` for a name outside the key's allowlist.

    See docs/API.md, "2.3 What a prefix-restricted key may touch".
    """
    return TopicsError(403, "forbidden", f'this key may not access "{name}"', {"topic": name})


def check_config_names(principal: Principal, config: Any) -> None:
    """Check the topic names inside a topic config object against the key.

    `config` is a request's config object (`PUT /v0/topics/:t` body, a write's
    or WebSocket publish's `config`), before validation: a non-object or a
    non-string `dead_letter` is left to the config parser's `400`. The only
    name a config holds is `dead_letter`. Raises `403 forbidden`
    with `detail {"topic": dead_letter}` when the key may not touch it.
    """
    if not principal.prefixes or not isinstance(config, dict):
        return
    dl = config.get("dead_letter")
    if isinstance(dl, str):
        principal.require_name(dl)


DEV_PRINCIPAL = Principal(None, ALL_SCOPES, ())


class Authenticator:
    """Checks presented tokens against SHA-256 digests in constant time."""

    def __init__(self, keys: tuple[ApiKey, ...]) -> None:
        self.keys = keys
        self.enabled = bool(keys)

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal for `token`, or None when missing/unknown (=> 401).

        The digest of the presented token is compared with every stored digest
        without an early exit, so timing does not reveal which key matched.
        """
        if not self.enabled:
            return DEV_PRINCIPAL
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        if found is None:
            return None
        return Principal(found.digest, found.scopes, found.prefixes, found.namespace)


def bearer(header: str | None) -> str | None:
    """Token from an `Authorization: Bearer <token>` header value."""
    if header is None:
        return None
    h = header.strip()
    if not h.startswith("Bearer "):
        return None
    return h[7:].strip() or None


def token_from_query(query_string: bytes) -> str | None:
    """The first `token` parameter of a form-encoded query string (SSE GETs only)."""
    if b"token" not in query_string:
        return None
    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("token")
    return values[0] if values else None
