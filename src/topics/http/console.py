"""The web console: static files under `topics/http/static/`, served at `/` and `/console/`.

No build step: the files are plain HTML, CSS and JavaScript shipped in the package,
and the page talks to the `/v0` API from the browser (docs/CONSOLE.md). Served
without authentication (they hold no data; the page asks for a token when the
server wants one).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from topics.http.responses import Resp

__all__ = ["asset", "page"]

_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".png": b"image/png",
}


@cache
def asset(name: str) -> tuple[bytes, bytes] | None:
    """(body, content type) of a console file, or None when there is no such file."""
    ext = name[name.rfind(".") :] if "." in name else ""
    if ext not in _TYPES or "/" in name or name.startswith("."):
        return None
    f = resources.files("topics.http").joinpath("static").joinpath(name)
    if not f.is_file():
        return None
    return f.read_bytes(), _TYPES[ext]


async def page(ctx: object) -> Resp:
    """`GET /` and `GET /console/<file>`: the console's files (404 for anything else)."""
    name = getattr(ctx, "params", {}).get("file") or "index.html"
    got = asset(name)
    if got is None:
        from topics.errors import TopicsError
        from topics.http.responses import error_resp

        return error_resp(TopicsError(404, "not_found", f"no console file {name!r}"))
    body, ctype = got
    return Resp(200, body, [(b"content-type", ctype), (b"cache-control", b"no-cache")])
