"""Helpers of the Spark tests: a real server, its diff as ground truth, row normalisation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.process import ServerProcess

__all__ = [
    "Row",
    "client",
    "write",
    "diff_all",
    "diff_rows",
    "spark_rows",
    "corrupt_data",
    "run_session_script",
    "Server",
]

Row = tuple[str, int, int, str | None, str | None, bytes | None, bytes]
"""(topic, seq, ts ms, tag, node, meta as canonical JSON, data as canonical JSON)."""

Server = ServerProcess


def client(srv: ServerProcess, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=srv.base, headers=headers, timeout=30)


def write(
    c: httpx.Client, topic: str, records: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
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


class AckLosingProxy:
    """An HTTP proxy in front of a server that loses the answer of chosen appends once.

    Every request is forwarded. For a POST whose `idempotency_key` ends with one
    of `lose_suffixes`, the first time that key is seen the server's answer is
    replaced by a 500 error body: the records are stored but the client sees a
    failure, as when a connection drops after the commit; at most `max_lost`
    answers are lost in all. `lost` lists the keys.
    Bound to 127.0.0.1 on an ephemeral port; `close()` stops it.
    """

    def __init__(self, upstream: str, lose_suffixes: tuple[str, ...], max_lost: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.lost: list[str] = []
        seen: set[str] = set()
        lock = threading.Lock()
        http = httpx.Client(base_url=upstream, timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("content-type", "authorization")
                }
                r = http.request(self.command, self.path, content=body, headers=headers)
                lose = False
                if self.command == "POST" and body.startswith(b"{"):
                    key = orjson.loads(body).get("idempotency_key")
                    with lock:
                        if (
                            isinstance(key, str)
                            and key.endswith(lose_suffixes)
                            and key not in seen
                            and len(proxy.lost) < max_lost
                        ):
                            seen.add(key)
                            proxy.lost.append(key)
                            lose = True
                status, content = r.status_code, r.content
                if lose:
                    status = 500
                    content = orjson.dumps(
                        {"error": {"code": "internal", "message": "answer lost by the test proxy"}}
                    )
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._srv.server_address[1]}"
        self._http = http
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._http.close()


ROOT = Path(__file__).resolve().parents[2]


def run_session_script(
    script: str, *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Run `tests/spark/<script>` (a fresh SparkSession of its own) and return the
    `KEY value` lines it prints; fails the test with its stderr when it exits non-zero.
    `env` replaces this process's environment (PYTHONPATH is set to the checkout)."""
    full = dict(env if env is not None else os.environ)
    full["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{ROOT}"
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests/spark" / script), *args],
        capture_output=True,
        text=True,
        timeout=280,
        env=full,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    out["_stderr"] = r.stderr
    return out
