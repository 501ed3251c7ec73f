"""A long diff page goes out in pieces and arrives whole, over HTTP/1.1 and h2c.

docs/ARCHITECTURE.md, "The read path": a page of more than 256 records is sent in
pieces of about 128 KiB, each a step of the history lane; the bytes are those of
one body with a correct Content-Length.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from tests.support.live import live_app


@pytest.mark.parametrize("http2", [False, True])
def test_a_long_page_arrives_whole(http2: bool) -> None:
    async def run() -> None:
        async with live_app() as srv:
            recs = [{"data": {"i": i, "pad": "p" * 900}} for i in range(1000)]
            r = await srv.http.post("/v0/topics/t", json={"records": recs})
            assert r.status_code == 201
            async with httpx.AsyncClient(
                base_url=srv.base, http1=not http2, http2=http2, timeout=10
            ) as c:
                # Two readers at once: their pieces take turns in the lane.
                r1, r2 = await asyncio.gather(
                    c.post("/v0/topics/t/diff", json={"from_seq": 0, "limit": 1000}),
                    c.post("/v0/topics/t/diff", json={"from_seq": 500, "limit": 1000}),
                )
            for resp, first in ((r1, 1), (r2, 501)):
                assert resp.status_code == 200
                assert resp.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
                assert int(resp.headers["content-length"]) == len(resp.content) > 400_000
                body = orjson.loads(resp.content)
                seqs = [rec["$seq"] for rec in body["records"]]
                assert seqs == list(range(first, 1001))
                assert body["records"][0]["data"] == {"i": first - 1, "pad": "p" * 900}
                assert body["head_seq"] == 1000 and body["caught_up"] is True

    asyncio.run(run())
