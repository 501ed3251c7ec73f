"""Overload: does an urgent topic keep its delivery latency while unimportant ones flood the server?

The shape (docs/SCHEDULER.md; the numbers in docs/BENCHMARKS.md come from this script):

* topic ``hot`` (``priority: 900``, band B4) with ``--hot-watchers`` SSE streams (10),
  written at ``--rate`` records/s (200) by one client, one record per request;
* ``--cold-topics`` topics (1000, ``priority: -100``, band B0), one SSE stream each,
  written as fast as ``--cold-conns`` connections (16) can, one record per request,
  round-robin over the topics.

Every record carries its writer's ``time.monotonic_ns()``; the subscriber process
stamps each received chunk, so delivery latency = arrival - send (one machine, one
monotonic clock). The same run is repeated for each ``--modes`` value
(``TOPICS_SCHEDULER``: ``priority`` and ``fifo``, each on a fresh server and data
directory) and, with ``--stalled N`` (100), once more in ``priority`` mode with N
extra SSE streams on ``hot`` whose sockets are never read.

Reported per run: the hot topic's delivery p50/p99/max (ms), the cold topics'
delivery p50/p99 and the lag left when the writers stop, cold writes acknowledged
per second, 429 answers, server CPU, and a loss check: after the writers stop and
the streams settle, every stream must hold every seq of its topic exactly once, in
order (or a tombstone, which the cold topics' config never causes). Ratios: hot
p99 fifo/priority, and hot p99 with stalled consumers / without.

Usage::

    .venv/bin/python bench/bench_overload.py --quick        # about 1 minute
    .venv/bin/python bench/bench_overload.py                # 20 s phases

Prints a markdown table and one JSON line; writes ``--json``
(default ``bench/results/overload.json``). All processes share the machine's vCPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _client import (  # noqa: E402
    AsyncConn,
    ChunkRecorder,
    CpuMeter,
    ServeProcess,
    SSEParser,
    SyncConn,
    build_request,
    summarize,
)

HOT = "hot"
HOT_PRIORITY = 900
COLD_PRIORITY = -100


def cold_name(i: int) -> str:
    return f"cold-{i:05d}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- subscriber process ------------------------------------------------------------------------
async def _stream_url(host: str, port: int, ctl: AsyncConn, topic: str) -> str:
    """A new watch session on `topic` from its head (on `ctl`): its stream URL."""
    body = orjson.dumps({"topics": {topic: {"tail": True}}})
    st, b = await ctl.roundtrip(build_request("POST", "/v0/watch", body, host=f"{host}:{port}"))
    if st != 200:
        raise RuntimeError(f"POST /v0/watch: {st} {b[:200]!r}")
    return str(orjson.loads(b)["stream_url"])


def _stream_get(host: str, port: int, url: str) -> bytes:
    return build_request(
        "GET", url, headers=[("Accept", "text/event-stream")], host=f"{host}:{port}"
    )


async def _open_stream(host: str, port: int, ctl: AsyncConn, topic: str) -> ChunkRecorder:
    url = await _stream_url(host, port, ctl, topic)
    _t, rec = await asyncio.get_running_loop().create_connection(ChunkRecorder, host, port)
    rec.transport.write(_stream_get(host, port, url))
    return rec


async def _stalled_stream(host: str, port: int, ctl: AsyncConn) -> socket.socket:
    """A stream on `hot` whose socket is never read (a tiny receive buffer)."""
    url = await _stream_url(host, port, ctl, HOT)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, port))
    s.sendall(_stream_get(host, port, url))
    return s


def _frames(rec: ChunkRecorder) -> list[tuple[int, list[dict[str, Any]], bool]]:
    """(arrival ns, records, tombstone?) per frame of a stream's recorded chunks."""
    p = SSEParser()
    out: list[tuple[int, list[dict[str, Any]], bool]] = []
    for t, chunk in rec.chunks:
        for event, data in p.feed(chunk):
            if event == b"record":
                out.append((t, orjson.loads(data)["records"], False))
            elif event == b"tombstone":
                out.append((t, [], True))
    return out


def _subscriber(
    host: str, port: int, cold: int, hot: int, stalled: int, go: Any, stop: Any, out: Any
) -> None:
    async def main() -> dict[str, Any]:
        ctl = await AsyncConn.open(host, port)
        hot_streams = [await _open_stream(host, port, ctl, HOT) for _ in range(hot)]
        cold_streams = [await _open_stream(host, port, ctl, cold_name(i)) for i in range(cold)]
        stuck = [await _stalled_stream(host, port, ctl) for _ in range(stalled)]
        for r in hot_streams + cold_streams:
            await r.ready
        go.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        res: dict[str, Any] = {"hot": [], "cold": []}
        for kind, streams in (("hot", hot_streams), ("cold", cold_streams)):
            for r in streams:
                lat: list[int] = []
                seqs: list[int] = []
                tombs = 0
                arrivals: list[int] = []
                for t, recs, tomb in _frames(r):
                    tombs += tomb
                    for rec in recs:
                        seqs.append(rec["$seq"])
                        lat.append(t - rec["data"]["t"])
                        arrivals.append(t)
                res[kind].append(
                    {"lat": lat, "seqs": seqs, "tombstones": tombs, "arrivals": arrivals}
                )
        for s in stuck:
            s.close()
        ctl.close()
        return res

    Path(out).write_bytes(orjson.dumps(asyncio.run(main())))


# -- cold writers (a process) -------------------------------------------------------------------
def _cold_writers(host: str, port: int, topics: int, conns: int, stop: Any, out: Any) -> None:
    async def main() -> dict[str, Any]:
        hostport = f"{host}:{port}"
        stats = {"acked": 0, "throttled": 0, "errors": 0}

        async def worker(k: int) -> None:
            c = await AsyncConn.open(host, port)
            i = k
            while not stop.is_set():
                name = cold_name(i % topics)
                body = b'{"records":[{"data":{"t":%d}}]}' % time.monotonic_ns()
                st, b = await c.roundtrip(
                    build_request("POST", f"/v0/topics/{name}", body, host=hostport)
                )
                if st == 200:
                    stats["acked"] += 1
                elif st == 429:
                    stats["throttled"] += 1
                    # as a well-behaved client does: wait what the server asks
                    wait_ms = orjson.loads(b)["error"].get("detail", {}).get("retry_after_ms", 1000)
                    await asyncio.sleep(wait_ms / 1000)
                else:
                    stats["errors"] += 1
                    if stats["errors"] > 50:
                        raise RuntimeError(f"cold write: {st} {b[:200]!r}")
                i += conns
            c.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(conns)))
        stats["seconds"] = time.perf_counter() - t0
        return stats

    Path(out).write_bytes(orjson.dumps(asyncio.run(main())))


# -- one run -----------------------------------------------------------------------------------
def _json(srv: ServeProcess, method: str, path: str, body: Any = None) -> Any:
    c = SyncConn(srv.host, srv.port)
    try:
        data = orjson.dumps(body) if body is not None else None
        st, b = c.roundtrip(build_request(method, path, data, host=f"{srv.host}:{srv.port}"))
    finally:
        c.close()
    if st not in (200, 201):
        raise RuntimeError(f"{method} {path}: {st} {b[:300]!r}")
    return orjson.loads(b) if b else None


def _metrics(srv: ServeProcess) -> Any:
    c = SyncConn(srv.host, srv.port)
    try:
        st, b = c.roundtrip(
            build_request(
                "GET", "/v0/metrics", headers=[("Accept", "application/json")], host=srv.url[7:]
            )
        )
    finally:
        c.close()
    if st != 200:
        raise RuntimeError(f"GET /v0/metrics: {st} {b[:300]!r}")
    return orjson.loads(b)


def run_one(args: argparse.Namespace, mode: str, stalled: int, work: Path) -> dict[str, Any]:
    data = work / f"data-{mode}-{stalled}"
    env = {
        "TOPICS_SCHEDULER": mode,
        "TOPICS_MAX_WATCH_SESSIONS": "100000",
        "TOPICS_MAX_SSE_CONNECTIONS": "100000",
        "TOPICS_MAX_SSE_CONNECTIONS_PER_KEY": "100000",
    }
    srv = ServeProcess(data, work / f"server-{mode}-{stalled}.log", env)
    try:
        _json(srv, "PUT", f"/v0/topics/{HOT}", {"priority": HOT_PRIORITY})
        for i in range(args.cold_topics):
            _json(srv, "PUT", f"/v0/topics/{cold_name(i)}", {"priority": COLD_PRIORITY})
        ctx = mp.get_context("spawn")
        go, stop_subs, stop_writers = ctx.Event(), ctx.Event(), ctx.Event()
        # Results come back as files: a process with a thousand sockets may not
        # be able to start the feeder thread a multiprocessing queue needs.
        q_subs = work / f"subs-{mode}-{stalled}.json"
        q_writers = work / f"writers-{mode}-{stalled}.json"
        subs = ctx.Process(
            target=_subscriber,
            args=(
                srv.host,
                srv.port,
                args.cold_topics,
                args.hot_watchers,
                stalled,
                go,
                stop_subs,
                q_subs,
            ),
        )
        subs.start()
        if not go.wait(120):
            raise RuntimeError("the subscriber did not open its streams")
        writers = ctx.Process(
            target=_cold_writers,
            args=(
                srv.host,
                srv.port,
                args.cold_topics,
                args.cold_conns,
                stop_writers,
                str(q_writers),
            ),
        )
        writers.start()
        time.sleep(args.warmup)
        meter = CpuMeter([srv.proc.pid], [subs.pid or 0, writers.pid or 0]).start()
        hot = SyncConn(srv.host, srv.port)
        prefix = (
            f"POST /v0/topics/{HOT} HTTP/1.1\r\nHost: {srv.host}:{srv.port}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        interval = 1 / args.rate
        start = time.perf_counter()
        k = hot_acked = hot_throttled = 0
        hot_ack: list[int] = []
        hot_server: list[int] = []  # performance.server_total_ms of the hot writes (ns)
        while True:
            due = start + k * interval
            if due >= start + args.seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t_send = time.monotonic_ns()
            body = b'{"records":[{"data":{"t":%d}}]}' % t_send
            hot.sock.sendall(prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            st, _b = hot.read_response()
            hot_ack.append(time.monotonic_ns() - t_send)
            if st == 200:
                hot_server.append(int(orjson.loads(_b)["performance"]["server_total_ms"] * 1e6))
            hot_acked += st == 200
            hot_throttled += st == 429
            if st not in (200, 429):
                raise RuntimeError(f"hot write: {st} {_b[:200]!r}")
            k += 1
        cpu = meter.stop()
        sched = _metrics(srv)["scheduler"]
        stop_writers.set()
        writers.join(120)
        wstats = orjson.loads(q_writers.read_bytes())
        stopped = time.monotonic_ns()
        heads = {HOT: _json(srv, "GET", f"/v0/topics/{HOT}")["head_seq"]}
        for i in range(args.cold_topics):
            heads[cold_name(i)] = _json(srv, "GET", f"/v0/topics/{cold_name(i)}")["head_seq"]
        time.sleep(args.settle)
        stop_subs.set()
        subs.join(600)
        sres = orjson.loads(q_subs.read_bytes())
    finally:
        srv.stop()
    hot.close()
    # loss check and latencies
    lost = 0
    dup_or_disorder = 0
    hot_lat: list[int] = []
    for st in sres["hot"]:
        hot_lat += st["lat"]
        lost += _missing(st["seqs"], heads[HOT])
        dup_or_disorder += _disorder(st["seqs"])
    cold_lat: list[int] = []
    backlog = 0  # cold records written before the writers stopped, delivered after
    for i, st in enumerate(sres["cold"]):
        cold_lat += st["lat"]
        backlog += sum(1 for t in st["arrivals"] if t > stopped)
        lost += _missing(st["seqs"], heads[cold_name(i)])
        dup_or_disorder += _disorder(st["seqs"])
    tombstones = sum(st["tombstones"] for kind in ("hot", "cold") for st in sres[kind])
    return {
        "mode": mode,
        "stalled": stalled,
        "hot_ms": summarize(hot_lat, 1e6),
        "hot_ack_ms": summarize(hot_ack, 1e6),
        "hot_server_ms": summarize(hot_server, 1e6),
        "cold_ms": summarize(cold_lat, 1e6),
        "hot_records": heads[HOT],
        "hot_acked": hot_acked,
        "hot_throttled": hot_throttled,
        "cold_acked_per_s": round(wstats["acked"] / max(wstats["seconds"], 1e-9)),
        "cold_backlog_at_stop": backlog,
        "cold_throttled": wstats["throttled"],
        "cold_errors": wstats["errors"],
        "lost": lost,
        "disordered": dup_or_disorder,
        "tombstones": tombstones,
        "cpu": cpu,
        "scheduler": sched,
    }


def _missing(seqs: list[int], head: int) -> int:
    return len(set(range(1, head + 1)) - set(seqs))


def _disorder(seqs: list[int]) -> int:
    return sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a)


# -- report ------------------------------------------------------------------------------------
def fmt(v: Any, d: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{d}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(runs: list[dict[str, Any]]) -> str:
    head = ["metric"] + [
        f"{r['mode']}" + (f" + {r['stalled']} stalled" if r["stalled"] else "") for r in runs
    ]
    rows = [
        (
            "hot write ack p50 / p99 ms",
            lambda r: f"{r['hot_ack_ms'].get('p50')} / {r['hot_ack_ms'].get('p99')}",
        ),
        (
            "hot write: server's handler p50 / p99 ms",
            lambda r: f"{r['hot_server_ms'].get('p50')} / {r['hot_server_ms'].get('p99')}",
        ),
        ("hot delivery p50 ms", lambda r: r["hot_ms"].get("p50")),
        ("**hot delivery p99 ms**", lambda r: r["hot_ms"].get("p99")),
        ("hot delivery max ms", lambda r: r["hot_ms"].get("max")),
        ("cold delivery p50 ms", lambda r: r["cold_ms"].get("p50")),
        ("cold delivery p99 ms", lambda r: r["cold_ms"].get("p99")),
        ("cold writes acked/s", lambda r: r["cold_acked_per_s"]),
        (
            "cold records still undelivered when writing stopped",
            lambda r: r["cold_backlog_at_stop"],
        ),
        ("429 answers (cold + hot)", lambda r: r["cold_throttled"] + r["hot_throttled"]),
        ("records lost / out of order", lambda r: f"{r['lost']} / {r['disordered']}"),
        ("server cores", lambda r: r["cpu"]["server_cores"]),
        (
            "pressure at the end (deferring)",
            lambda r: f"{r['scheduler']['pressure']:.2f} ({r['scheduler']['deferring']})",
        ),
        (
            "served from the ready set B4 / B0",
            lambda r: f"{r['scheduler']['served']['B4']:,} / {r['scheduler']['served']['B0']:,}",
        ),
        (
            "served inline / coalesced",
            lambda r: f"{r['scheduler']['inline']:,} / {r['scheduler']['coalesced']:,}",
        ),
        (
            "client cores / others' cores",
            lambda r: f"{r['cpu']['client_cores']} / {r['cpu']['others_cores']}",
        ),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, get in rows:
        lines.append("| " + " | ".join([name] + [fmt(get(r)) for r in runs]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 cold topics, 5 s phases")
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default 20, quick 5)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds for the streams to catch up")
    ap.add_argument("--rate", type=float, default=200.0, help="hot writes per second")
    ap.add_argument("--hot-watchers", type=int, default=10)
    ap.add_argument("--cold-topics", type=int, help="default 1000 (quick 100)")
    ap.add_argument("--cold-conns", type=int, default=16)
    ap.add_argument(
        "--stalled", type=int, default=100, help="stalled consumers of the last run (0: skip)"
    )
    ap.add_argument("--modes", default="priority,fifo")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "overload.json")
    args = ap.parse_args()
    args.seconds = args.seconds or (5.0 if args.quick else 20.0)
    args.cold_topics = args.cold_topics or (100 if args.quick else 1000)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="topics-overload-") as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            log(f"run: {mode} ...")
            runs.append(run_one(args, mode, 0, work))
        if args.stalled:
            log(f"run: priority with {args.stalled} stalled consumers ...")
            runs.append(run_one(args, "priority", args.stalled, work))
    by = {(r["mode"], r["stalled"]): r for r in runs}
    ratios: dict[str, float | None] = {}
    pri = by.get(("priority", 0))
    fifo = by.get(("fifo", 0))
    if pri and fifo and fifo["hot_ms"].get("p99") and pri["hot_ms"].get("p99"):
        ratios["hot_p99_fifo_over_priority"] = round(
            fifo["hot_ms"]["p99"] / pri["hot_ms"]["p99"], 3
        )
    st = by.get(("priority", args.stalled))
    if pri and st and args.stalled and st["hot_ms"].get("p99") and pri["hot_ms"].get("p99"):
        ratios["hot_p99_stalled_over_unstalled"] = round(
            st["hot_ms"]["p99"] / pri["hot_ms"]["p99"], 3
        )
    report = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_rev": _rev(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
        "ratios": ratios,
    }
    print(
        f"### Overload: 1 hot topic (priority {HOT_PRIORITY}, {args.hot_watchers} watchers, "
        f"{args.rate:.0f} rec/s) vs {args.cold_topics} cold topics (priority {COLD_PRIORITY}, "
        f"1 watcher each, {args.cold_conns} writers), {args.seconds:.0f} s per run\n"
    )
    print(table(runs))
    print()
    for k, v in ratios.items():
        print(f"- {k}: {v}")
    print(
        json.dumps(
            {
                "ratios": ratios,
                "hot_p99_ms": {f"{r['mode']}+{r['stalled']}": r["hot_ms"].get("p99") for r in runs},
            }
        )
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    log(f"wrote {args.json}")
    return 0


def _rev() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
