"""Bodies whose parse would multiply their size are refused before parsing (413).

docs/HTTP_INPUT.md "Large bodies": a body of 1 MiB or more that is parsed in one
go (any endpoint but a write in the usual layout, and WebSocket commands) is
refused when its `{`, `[` and `,` counts say its Python objects would be far
larger than its text. Served over a real socket by the production runner.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from tests.support.live import live_app

pytestmark = pytest.mark.timeout(60)

ENV = {"TOPICS_MAX_BODY_BYTES": str(8 * 1024 * 1024)}
DENSE = b'{"topics":{"t":{}},"x":[' + b",".join([b"{}"] * (1024 * 1024)) + b"]}"
CT = {"content-type": "application/json"}


def test_dense_bodies_get_413_and_change_nothing() -> None:
    async def main() -> None:
        async with live_app(ENV) as srv:
            c = srv.http
            assert (await c.put("/v0/topics/t", json={})).status_code == 201
            for method, path in (
                ("POST", "/v0/watch"),
                ("PUT", "/v0/routers/r"),
                ("PUT", "/v0/topics/u"),
                ("POST", "/v0/topics/t/diff"),
                ("POST", "/v0/topics/t/delete"),
            ):
                r = await c.request(method, path, content=DENSE, headers=CT)
                assert r.status_code == 413, (path, r.text)
                assert r.json()["error"]["code"] == "payload_too_large", r.text
                assert set(r.json()) == {"error"}
            # A write body in a layout that is parsed in one go (records not found at
            # the top level near the start) is checked too.
            odd = b'{"pad":"' + b" " * 70_000 + b'","records":' + DENSE[23:-1] + b"}"
            r = await c.post("/v0/topics/t", content=odd, headers=CT)
            assert r.status_code == 413, r.text
            listed = (await c.get("/v0/topics")).json()["topics"]
            assert [t["topic"] for t in listed] == ["t"]
            assert (await c.get("/v0/routers")).json()["routers"] == []
            assert len(srv.app.watches.sessions) == 0
            # An ordinary write of the same size goes through.
            recs = [{"data": {"s": "x" * 500}} for _ in range(4000)]
            r = await c.post("/v0/topics/t", json={"records": recs})
            assert r.status_code == 200 and r.json()["count"] == 4000, r.text

    asyncio.run(main())


def test_dense_websocket_message_gets_an_error_and_the_socket_stays_open() -> None:
    async def main() -> None:
        async with live_app(ENV) as srv, srv.ws() as ws:
            await ws.send(DENSE.decode())
            err = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
            assert err["op"] == "error" and err["code"] == "payload_too_large", err
            await ws.send('{"op":"ping","request_id":1}')
            assert orjson.loads(await asyncio.wait_for(ws.recv(), 10)) == {
                "op": "pong",
                "request_id": 1,
            }

    asyncio.run(main())
