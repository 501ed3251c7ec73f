"""Bearer-key authentication and scope/allowlist authorization (API §1.2-1.3)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import parse_qs

from topics.config import ALL_SCOPES, ApiKey

__all__ = ["Principal", "Authenticator", "DEV_PRINCIPAL", "token_from_query"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key digest (None in dev mode), scopes and prefixes."""

    digest: bytes | None
    scopes: frozenset[str]
    prefixes: tuple[str, ...]

    def has(self, *scopes: str) -> bool:
        return all(s in self.scopes for s in scopes)

    def allows_name(self, name: str) -> bool:
        return not self.prefixes or any(name.startswith(p) for p in self.prefixes)


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
        return Principal(found.digest, found.scopes, found.prefixes)


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
