"""Where a write's latency goes while another client scans history.

Writes one record at a time (200/s) to a `durability: fsync` topic and splits each
ack into what the server reports in the response's `performance` block
(`server_total_ms`, `wal_append_ms`: until the commit came back, `fsync_ms`: the
sync itself) and the rest (reaching the server and coming back). Two phases on
the same server: idle, then with `--scanners` clients reading the topic
`history` with `diff` at limit 1000 as fast as they can (`--cold` evicts the
history's segment files from the page cache every 0.5 s meanwhile).

Run it on a data directory `bench/bench_invariant.py --data-dir DIR` filled::

    .venv/bin/python bench/bench_invariant.py --quick --data-dir /tmp/inv    # fill once
    .venv/bin/python bench/probe_write_path.py --data-dir /tmp/inv --cold

Prints a markdown table (p50 / p90 / p99 per part and phase) and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _client import AsyncConn, ServeProcess, SyncConn, build_request
from bench_invariant import fadvise_dontneed

PARTS = ("client_ms", "server_total_ms", "wal_append_ms", "fsync_ms")


def probe(srv: ServeProcess, seconds: float, rate: float) -> dict[str, list[float]]:
    conn = SyncConn(srv.host, srv.port)
    body = b'{"records":[{"data":{"x":1}}]}'
    req = build_request("POST", "/v0/topics/probe", body, host=f"{srv.host}:{srv.port}")
    out: dict[str, list[float]] = {p: [] for p in PARTS}
    end = time.monotonic() + seconds
    nxt = time.perf_counter()
    while time.monotonic() < end:
        nxt += 1 / rate
        if (d := nxt - time.perf_counter()) > 0:
            time.sleep(d)
        t0 = time.perf_counter_ns()
        st, b = conn.roundtrip(req)
        out["client_ms"].append((time.perf_counter_ns() - t0) / 1e6)
        if st not in (200, 201):
            raise RuntimeError(f"write: {st} {b[:200]!r}")
        perf = orjson.loads(b).get("performance", {})
        for p in PARTS[1:]:
            out[p].append(float(perf.get(p, 0.0)))
    conn.close()
    return out


async def _scan(host: str, port: int, n: int, head: int, seconds: float) -> int:
    """`n` clients reading `history` with diff at limit 1000 for `seconds`; the pages read."""
    pages = 0
    end = time.monotonic() + seconds

    async def one(k: int) -> None:
        nonlocal pages
        c = await AsyncConn.open(host, port)
        cur = k * head // n
        while time.monotonic() < end:
            body = b'{"from_seq":%d,"limit":1000}' % cur
            st, b = await c.roundtrip(
                build_request("POST", "/v0/topics/history/diff", body, host=f"{host}:{port}")
            )
            if st != 200:
                raise RuntimeError(f"diff: {st} {b[:200]!r}")
            j = b.rfind(b'"next_from_seq":') + 16
            nxt = int(b[j : b.index(b",", j)])
            cur = 0 if nxt >= head or nxt == cur else nxt
            pages += 1
        c.close()

    await asyncio.gather(*(one(k) for k in range(n)))
    return pages


def _get(srv: ServeProcess, path: str) -> bytes:
    conn = SyncConn(srv.host, srv.port)
    try:
        st, b = conn.roundtrip(build_request("GET", path, None, host=f"{srv.host}:{srv.port}"))
    finally:
        conn.close()
    if st != 200:
        raise RuntimeError(f"GET {path}: {st} {b[:200]!r}")
    return b


def _evict(files: list[Path], stop: threading.Event) -> None:
    while not stop.wait(0.5):
        fadvise_dontneed(files)


def stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {q: round(float(np.percentile(a, int(q[1:]))), 3) for q in ("p50", "p90", "p99")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="filled by bench_invariant.py")
    ap.add_argument("--seconds", type=float, default=8.0, help="per phase")
    ap.add_argument("--rate", type=float, default=200.0, help="writes per second")
    ap.add_argument("--scanners", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="evict the history every 0.5 s")
    ap.add_argument("--open-files", type=int, default=16)
    ap.add_argument("--json", type=Path, default=Path("bench/results/probe_write_path.json"))
    ap.add_argument("--_scan", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._scan:
        host, port, head = args._scan.rsplit(":", 2)
        stop = threading.Event()
        if args.cold:
            files = [
                p for p in args.data_dir.glob("topics/*/seg-*") if p.suffix in (".data", ".idx")
            ]
            threading.Thread(target=_evict, args=(files, stop), daemon=True).start()
        pages = asyncio.run(_scan(host, int(port), args.scanners, int(head), args.seconds))
        stop.set()
        print(pages)
        return 0
    work = Path(tempfile.mkdtemp(prefix="probe-"))
    env = {"TOPICS_MAX_OPEN_SEGMENT_FILES": str(args.open_files)}
    srv = ServeProcess(args.data_dir, work / "server.log", env)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        conn = SyncConn(srv.host, srv.port)
        put = build_request(
            "PUT", "/v0/topics/probe", b'{"durability":"fsync"}', host=f"{srv.host}:{srv.port}"
        )
        st, b = conn.roundtrip(put)
        conn.close()
        if st not in (200, 201):
            raise RuntimeError(f"PUT probe: {st} {b[:200]!r}")
        probe(srv, 1.0, args.rate)  # warm-up
        report["idle"] = {p: stats(v) for p, v in probe(srv, args.seconds, args.rate).items()}
        head = int(orjson.loads(_get(srv, "/v0/topics/history"))["head_seq"])
        # The scanners (and the evictor) run in a process of their own: in this one they
        # would take the GIL from the probe and show up as write latency.
        scanner = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--_scan",
                f"{srv.host}:{srv.port}:{head}",
                "--scanners",
                str(args.scanners),
                "--seconds",
                str(args.seconds + 2),
                "--data-dir",
                str(args.data_dir),
                *(["--cold"] if args.cold else []),
            ],
            stdout=subprocess.PIPE,
        )
        time.sleep(1.0)
        scan = probe(srv, args.seconds, args.rate)
        out, _ = scanner.communicate(timeout=120)
        report["scan_pages"] = int(out.strip() or 0)
        report["scan"] = {p: stats(v) for p, v in scan.items()}
    finally:
        srv.stop()
    print(
        f"| part | idle p50 / p90 / p99 ms | scan{' (cold)' if args.cold else ''} p50 / p90 / p99 ms |"
    )
    print("|---|---|---|")
    for p in PARTS:
        i, s = report["idle"][p], report["scan"][p]
        print(
            f"| {p} | {i['p50']} / {i['p90']} / {i['p99']} | {s['p50']} / {s['p90']} / {s['p99']} |"
        )
    print(f"scan pages (1000 records each): {report['scan_pages']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({"idle": report["idle"], "scan": report["scan"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
