"""Helpers of the Spark tests: a real server, its diff as ground truth, row normalisation."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.process import ServerProcess

__all__ = ["Row", "client", "write", "diff_all", "diff_rows", "spark_rows", "corrupt_data", "Server"]

Row = tuple[str, int, int, str | None, str | None, bytes | None, bytes]
"""(topic, seq, ts ms, tag, node, meta as canonical JSON, data as canonical JSON)."""

Server = ServerProcess


def client(srv: ServerProcess, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=srv.base, headers=headers, timeout=30)


def write(c: httpx.Client, topic: str, records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    r = c.post(f"/v0/topics/{topic}", json={"records": records, **extra})
    assert r.status_code in (200, 201), r.text
    return r.json()


def diff_all(c: httpx.Client, topic: str, from_seq: int = 0) -> list[dict[str, Any]]:
    """Every record after `from_seq` through the engine's own diff, paged (API §5)."""
    out: list[dict[str, Any]] = []
    cur = from_seq
    while True:
        r = c.post(
            f"/v0/topics/{topic}/diff",
            json={"from_seq": cur, "include_tags": True, "limit": 1000},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["records"])
        cur = body["next_from_seq"]
        if body["caught_up"]:
            return out


def _canon(text: str | bytes | None) -> bytes | None:
    return None if text is None else orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS)


def diff_rows(topic: str, records: Iterable[dict[str, Any]]) -> set[Row]:
    return {
        (
            topic,
            r["$seq"],
            r["$ts"],
            r.get("$tag"),
            r.get("$node"),
            orjson.dumps(r["meta"], option=orjson.OPT_SORT_KEYS) if "meta" in r else None,
            orjson.dumps(r["data"], option=orjson.OPT_SORT_KEYS),
        )
        for r in records
    }


def spark_rows(df: Any) -> list[Row]:
    """Rows of a DataFrame of the topics schema, normalised like :func:`diff_rows`."""
    out: list[Row] = []
    for r in df.collect():
        ts_ms = int(round(r["ts"].timestamp() * 1000))
        out.append(
            (r["topic"], r["seq"], ts_ms, r["tag"], r["node"], _canon(r["meta"]), _canon(r["data"]))
        )
    return out


def corrupt_data(path: Path) -> None:
    """Flip bytes in the middle of a `.data` file so its frames no longer verify."""
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 4, len(raw) - 8, 97):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
