"""Handlers for router CRUD (API §7)."""

from __future__ import annotations

from topics.engine.core import clamp_page_size
from topics.errors import TopicsError
from topics.http.app import Ctx
from topics.http.responses import Resp, json_resp

__all__ = ["put_router", "get_router", "list_routers", "delete_router"]


def _check_router_names(ctx: Ctx, name: str) -> None:
    """On an existing router, its source and dest must be allowlisted too (API §1.3)."""
    p = ctx.principal
    if not p.prefixes:
        return
    r = ctx.app.routers.by_name(name)
    if r is None:
        return
    for n in (r.name, r.source, r.dest):
        if not p.allows_name(n):
            raise TopicsError(403, "forbidden", f'this key may not access "{n}"', {"topic": n})


async def put_router(ctx: Ctx) -> Resp:
    p = ctx.principal
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
