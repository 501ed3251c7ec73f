"""Handlers for router CRUD (docs/API.md, "11. Routers").

With a prefix-restricted key every topic a router names is checked, not just
the router's own name in the path: the body `source` and `dest` of a PUT
(before anything is created), and on an existing router its stored source and
dest (GET, DELETE, and a PUT that would update it), so a key can neither
attach to nor learn about routers that touch topics outside its prefixes.
"""

from __future__ import annotations

from topics.auth import forbidden_name
from topics.engine.core import clamp_page_size
from topics.http.app import Ctx
from topics.http.responses import Resp, json_resp

__all__ = ["put_router", "get_router", "list_routers", "delete_router"]


def _check_router_names(ctx: Ctx, name: str) -> None:
    """On an existing router, its source and dest must be allowlisted too.

    See docs/API.md, "2.3 What a prefix-restricted key may touch".

    Raises `403 forbidden` with `detail {"topic": name}` for the first name
    outside the key's prefixes; an absent router passes (the handler 404s).
    """
    p = ctx.principal
    if not p.prefixes:
        return
    r = ctx.app.routers.by_name(name)
    if r is None:
        return
    for n in (r.name, r.source, r.dest):
        if not p.allows_name(n):
            raise forbidden_name(n)


async def put_router(ctx: Ctx) -> Resp:
    """`PUT /v0/routers/:r`; the engine checks the body source/dest (403)."""
    p = ctx.principal
    # An existing router whose topics are outside the key's prefixes is neither
    # updated nor described (the 409 re-point detail would name its topics).
    _check_router_names(ctx, ctx.params["router"])
    body, created = ctx.app.routers.put(
        ctx.params["router"], ctx.body, p.allows_name if p.prefixes else None
    )
    return json_resp(201 if created else 200, body, ctx.t0)


async def get_router(ctx: Ctx) -> Resp:
    name = ctx.params["router"]
    _check_router_names(ctx, name)
    return json_resp(200, ctx.app.routers.get(name), ctx.t0)


async def list_routers(ctx: Ctx) -> Resp:
    p = ctx.principal
    body = ctx.app.routers.list(
        prefix=ctx.query("prefix") or "",
        source=ctx.query("source"),
        dest=ctx.query("dest"),
        page_size=clamp_page_size(ctx.query("page_size")),
        cursor=ctx.query("cursor"),
        allow=p.allows_name if p.prefixes else None,
    )
    return json_resp(200, body, ctx.t0)


async def delete_router(ctx: Ctx) -> Resp:
    name = ctx.params["router"]
    _check_router_names(ctx, name)
    return json_resp(200, ctx.app.routers.delete(name), ctx.t0)
