"""Recovery time-to-ready of the real `topics serve` process.

For each record count N: start a server on a fresh data dir, fill one topic with N
records of 64 B (disk class, 1000-record batches over 4 connections), then

* SIGKILL it and time a restart from spawn until `/readyz` answers 200 (pure WAL
  replay, nothing else to load), and
* stop that server gracefully (SIGTERM) and time another restart.

The recovered head and record count are checked against what was written.
Prints a markdown table and writes JSON (default `bench/results/recovery.json`).

    .venv/bin/python bench/bench_recovery.py                 # 1e5 and 1e6 records
    .venv/bin/python bench/bench_recovery.py --counts 100000 # one size
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent


class Server:
    """`python -m topics serve` on 127.0.0.1:0 over `data`; stopped by its PID."""

    def __init__(self, data: Path, log: Path) -> None:
        self.port_file = data.parent / "port"
        self.port_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
        env.update(
            TOPICS_HOST="127.0.0.1",
            TOPICS_PORT="0",
            TOPICS_KAFKA_PORT="0",
            TOPICS_PORT_FILE=str(self.port_file),
            TOPICS_DATA_DIR=str(data),
            TOPICS_LOG="warning",
        )
        self.log = open(log, "ab")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "topics", "serve"], env=env, stdout=self.log, stderr=self.log
        )
        self.base = ""
        self.ready_s = self._wait_ready()

    def _wait_ready(self) -> float:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited during startup")
            if not self.base and self.port_file.exists():
                text = self.port_file.read_text().strip()
                if text:
                    self.base = f"http://{text}"
            if self.base:
                try:
                    with urllib.request.urlopen(f"{self.base}/readyz", timeout=2) as r:
                        if r.status == 200:
                            return time.perf_counter() - self.t0
                except OSError:
                    pass
            time.sleep(0.005)
        raise RuntimeError("server did not become ready")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(120)
        self.log.close()


async def fill(base: str, n: int) -> None:
    payload = "x" * 56  # 64 B of JSON data with the quotes and key
    per = 1000
    batches = n // per

    async def worker(k: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            for _ in range(k, batches, 4):
                body = orjson.dumps({"records": [{"data": {"p": payload}}] * per})
                r = await c.post(
                    "/v0/topics/rec", content=body, headers={"content-type": "application/json"}
                )
                r.raise_for_status()

    await asyncio.gather(*(worker(k) for k in range(4)))


def state(base: str) -> tuple[int, int]:
    with httpx.Client(base_url=base) as c:
        s = c.get("/v0/topics/rec").json()
    return int(s["head_seq"]), int(s["count"])


def run(n: int, tmp: Path) -> dict[str, object]:
    data = tmp / f"data-{n}"
    log = tmp / f"server-{n}.log"
    shutil.rmtree(data, ignore_errors=True)
    s = Server(data, log)
    t = time.perf_counter()
    asyncio.run(fill(s.base, n))
    fill_s = time.perf_counter() - t
    head, count = state(s.base)
    s.stop(signal.SIGKILL)
    wal_bytes = sum(p.stat().st_size for p in (data / "wal").rglob("*.log"))
    s = Server(data, log)
    kill_ready = s.ready_s
    head2, count2 = state(s.base)
    s.stop(signal.SIGTERM)
    s = Server(data, log)
    clean_ready = s.ready_s
    head3, count3 = state(s.base)
    s.stop(signal.SIGTERM)
    return {
        "records": n,
        "fill_s": round(fill_s, 2),
        "wal_bytes": wal_bytes,
        "written": {"head": head, "count": count},
        "after_sigkill": {"ready_s": round(kill_ready, 3), "head": head2, "count": count2},
        "after_clean_stop": {"ready_s": round(clean_ready, 3), "head": head3, "count": count3},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--json", default=str(ROOT / "bench/results/recovery.json"))
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="topics-recovery-") as d:
        for n in args.counts:
            print(f"filling {n:,} records ...", file=sys.stderr)
            results.append(run(n, Path(d)))
    print(
        "| records | WAL MB | ready after SIGKILL (s) | ready after clean stop (s) | recovered count |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        k = r["after_sigkill"]
        c = r["after_clean_stop"]
        assert isinstance(k, dict) and isinstance(c, dict)
        print(
            f"| {r['records']:,} | {int(r['wal_bytes']) / 1e6:.0f} | {k['ready_s']} | "
            f"{c['ready_s']} | {k['count']:,} / {c['count']:,} |"
        )
    out = {
        "env": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
