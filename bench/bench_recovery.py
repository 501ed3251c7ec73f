"""Recovery time-to-ready of the real `topics serve` process.

For each record count N: start a server on a fresh data dir with checkpoints off,
fill one topic with N records of 64 B (disk class, 1000-record batches over 4
connections), then

* SIGKILL it and time a restart from spawn until `/readyz` answers 200 (pure WAL
  replay: no snapshot, no segment), and
* stop that server gracefully (SIGTERM: the final checkpoint moves everything
  into segments) and time another restart (snapshot + `.idx` load).

With `--segments N`, fill N records with checkpoints on (the default triggers),
stop gracefully and time the restart from segments. Every restart reports the
slot-index bytes per record (`storage.index_bytes` of the JSON metrics) and the
server's RSS. The recovered head and record count are checked against what was
written. Prints a markdown table and writes JSON (default
`bench/results/recovery.json`).

    .venv/bin/python bench/bench_recovery.py                    # 1e5 and 1e6 records
    .venv/bin/python bench/bench_recovery.py --counts 100000    # one size
    .venv/bin/python bench/bench_recovery.py --counts --segments 10000000
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
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _client import ServeProcess

ROOT = Path(__file__).resolve().parent.parent


class Server(ServeProcess):
    """The server under test over `data`; `ready_s` is its time to ready."""

    def __init__(self, data: Path, log: Path, extra: dict[str, str] | None = None) -> None:
        super().__init__(data, log, {"TOPICS_LOG": "warning", **(extra or {})}, ready_timeout_s=600)
        self.base = self.url


async def fill(base: str, n: int) -> None:
    payload = "x" * 56  # 64 B of JSON data with the quotes and key
    per = max(1, min(1000, n))  # n is rounded down to whole batches
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


def memory(s: Server) -> dict[str, float]:
    """Slot-index bytes per retained record and the process RSS (MB)."""
    with httpx.Client(base_url=s.base) as c:
        m = c.get("/v0/metrics", headers={"accept": "application/json"}).json()
    st = m.get("storage", {})
    slots = max(int(st.get("index_slots", 0)), 1)
    rss_kb = 0
    for line in Path(f"/proc/{s.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "index_bytes_per_record": round(int(st.get("index_bytes", 0)) / slots, 1),
        "rss_mb": round(rss_kb / 1024, 1),
    }


NO_CHECKPOINTS = {"TOPICS_CHECKPOINT_WAL_BYTES": "0", "TOPICS_CHECKPOINT_INTERVAL_MS": "0"}


def run_segments(n: int, tmp: Path) -> dict[str, object]:
    """Fill `n` records with checkpoints on, stop gracefully, time the restart."""
    data = tmp / f"seg-{n}"
    log = tmp / f"server-seg-{n}.log"
    shutil.rmtree(data, ignore_errors=True)
    s = Server(data, log)
    t = time.perf_counter()
    asyncio.run(fill(s.base, n))
    fill_s = time.perf_counter() - t
    head, count = state(s.base)
    s.stop(signal.SIGTERM)
    seg_bytes = sum(p.stat().st_size for p in (data / "topics").rglob("seg-*"))
    s = Server(data, log)
    ready = s.ready_s
    head2, count2 = state(s.base)
    mem = memory(s)
    s.stop(signal.SIGTERM)
    return {
        "records": n,
        "fill_s": round(fill_s, 2),
        "segment_bytes": seg_bytes,
        "written": {"head": head, "count": count},
        "after_clean_stop": {"ready_s": round(ready, 3), "head": head2, "count": count2, **mem},
    }


def run(n: int, tmp: Path) -> dict[str, object]:
    data = tmp / f"data-{n}"
    log = tmp / f"server-{n}.log"
    shutil.rmtree(data, ignore_errors=True)
    s = Server(data, log, NO_CHECKPOINTS)
    t = time.perf_counter()
    asyncio.run(fill(s.base, n))
    fill_s = time.perf_counter() - t
    head, count = state(s.base)
    s.stop(signal.SIGKILL)
    wal_bytes = sum(p.stat().st_size for p in (data / "wal").rglob("*.log"))
    s = Server(data, log, NO_CHECKPOINTS)
    kill_ready = s.ready_s
    head2, count2 = state(s.base)
    mem_wal = memory(s)
    s.stop(signal.SIGTERM)
    s = Server(data, log, NO_CHECKPOINTS)
    clean_ready = s.ready_s
    head3, count3 = state(s.base)
    mem_seg = memory(s)
    s.stop(signal.SIGTERM)
    return {
        "records": n,
        "fill_s": round(fill_s, 2),
        "wal_bytes": wal_bytes,
        "written": {"head": head, "count": count},
        "after_sigkill": {
            "ready_s": round(kill_ready, 3),
            "head": head2,
            "count": count2,
            **mem_wal,
        },
        "after_clean_stop": {
            "ready_s": round(clean_ready, 3),
            "head": head3,
            "count": count3,
            **mem_seg,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--segments", type=int, nargs="*", default=[])
    ap.add_argument("--json", default=str(ROOT / "bench/results/recovery.json"))
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="topics-recovery-") as d:
        for n in args.counts:
            print(f"filling {n:,} records ...", file=sys.stderr)
            results.append(run(n, Path(d)))
        for n in args.segments:
            print(f"filling {n:,} records (checkpoints on) ...", file=sys.stderr)
            results.append(run_segments(n, Path(d)))
    print("| records | loaded from | ready (s) | recovered count | index B/record | RSS MB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        rows = []
        if "after_sigkill" in r:
            rows.append(
                (f"WAL ({int(r['wal_bytes']) / 1e6:.0f} MB), after SIGKILL", r["after_sigkill"])
            )
            rows.append(("segments, after clean stop", r["after_clean_stop"]))
        else:
            mb = int(r["segment_bytes"]) / 1e6
            rows.append((f"segments ({mb:.0f} MB), after clean stop", r["after_clean_stop"]))
        for label, k in rows:
            assert isinstance(k, dict)
            print(
                f"| {r['records']:,} | {label} | {k['ready_s']} | {k['count']:,} | "
                f"{k['index_bytes_per_record']} | {k['rss_mb']} |"
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
