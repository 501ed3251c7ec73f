"""`GET /v0/openapi.json`: the OpenAPI 3.1 description of the `/v0` API.

The document is the package file `openapi.json` beside this module, read once and
served as it is, without authentication (like the probes: it describes the API,
it holds no data). That file is written by `scripts/openapi` from
:mod:`topics.http.openapi_doc` and committed; tests/http/test_openapi.py holds it
to the app (docs/API.md, "The OpenAPI document").
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from topics.http.responses import Resp

__all__ = ["document_bytes", "openapi"]

JSON_CT = (b"content-type", b"application/json")


@cache
def document_bytes() -> bytes:
    """The OpenAPI document (bytes of `topics/http/openapi.json`)."""
    return resources.files("topics.http").joinpath("openapi.json").read_bytes()


async def openapi(ctx: object) -> Resp:
    """`GET /v0/openapi.json` (docs/API.md, "The OpenAPI document")."""
    return Resp(200, document_bytes(), [JSON_CT])
