"""The composite cursor id of a watch stream: what an SSE frame's `id:` carries and
a `Last-Event-ID` hands back (docs/API.md, "12.3 Frames").

It is base64url, without padding, of the compact JSON object `{topic: cursor}`
with its keys sorted. The server (:mod:`topics.engine.watch`) writes and reads
it; the client (:mod:`topics.client`) writes it to rewind a session to what it
handed out. Pure, and light enough for the client to import.
"""

from __future__ import annotations

import base64
import binascii

import orjson

__all__ = ["decode_composite_id", "encode_composite_id"]


def encode_composite_id(cursors: dict[str, int]) -> str:
    """base64url (no padding) of the sorted compact JSON `{topic: cursor}`.

    See docs/API.md, "12.3 Frames".
    """
    raw = orjson.dumps(cursors, option=orjson.OPT_SORT_KEYS)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_composite_id(value: str) -> dict[str, int] | None:
    """Decode a `Last-Event-ID` (padded or not); None when undecodable.

    Entries whose value is not a u64 are ignored.
    """
    v = value.strip()
    if not v:
        return None
    try:
        raw = base64.urlsafe_b64decode(v.rstrip("=") + "=" * (-len(v.rstrip("=")) % 4))
        obj = orjson.loads(raw)
    except (binascii.Error, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    out: dict[str, int] = {}
    for k, n in obj.items():
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < (1 << 64):
            out[k] = n
    return out
