"""Compare ASGI servers for the topics HTTP API (a benchmark script, not a test).

Every candidate serves the same minimal raw-ASGI JSON app (POST body
``{"key":"k1","value":"hello world","n":42}`` -> ``{"ok":true,"seq":N}`` via
orjson) as a subprocess on 127.0.0.1 and a free port:

* ``uvicorn-httptools``: uvicorn + uvloop + httptools (HTTP/1.1 only)
* ``uvicorn-autoproto``: the same uvicorn config with ``topics.http.server.AutoProtocol``
  (HTTP/1.1 via httptools + h2c prior knowledge on the same port)
* ``granian``: granian ASGI, ``--http auto --workers 1 --loop uvloop``
* ``hypercorn``: hypercorn with the uvloop worker

For each: h2c prior-knowledge support (one httpx HTTP/2 request), 1-connection
HTTP/1.1 latency p50/p99 (sequential keep-alive POSTs from a raw-socket client),
32-connection HTTP/1.1 throughput (``wrk`` if on PATH, else an asyncio
raw-socket client) and, where h2c works, 1-connection HTTP/2 latency from a
python-h2 client (includes that client's own h2 processing cost).

Usage::

    .venv/bin/python bench/asgi_servers.py [--requests 3000] [--duration 5]

Prints a markdown table and writes ``bench/results/asgi_servers.json``.  The
numbers come from one run on a shared 2-vCPU machine where the load generator
competes with the server for CPU: treat them as rough and compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_BIN = Path(sys.executable).parent
BODY = b'{"key":"k1","value":"hello world","n":42}'
PATH = "/v0/topics/bench/records"

# -- the app under test ------------------------------------------------------------
_seq = 0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Minimal raw ASGI JSON app: read the body, answer ``{"ok": true, "seq": N}``."""
    global _seq
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    _seq += 1
    out = orjson.dumps({"ok": True, "seq": _seq})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def serve_uvicorn(kind: str, port: int) -> None:
    """Subprocess entry point for the two uvicorn candidates (identical config but ``http``)."""
    sys.path.insert(0, str(ROOT / "src"))
    import uvicorn

    from topics.http.server import AutoProtocol, build_config

    http: Any = AutoProtocol if kind == "autoproto" else "httptools"
    uvicorn.Server(build_config(app, "127.0.0.1", port, http=http)).run()


# -- candidates ----------------------------------------------------------------------
def candidates(port: int, tmp: Path) -> dict[str, list[str]]:
    py, me = sys.executable, str(Path(__file__).resolve())
    hypercorn_config = tmp / "hypercorn.toml"
    hypercorn_config.write_text("keep_alive_max_requests = 100000000\n")
    return {
        "uvicorn-httptools": [py, me, "--serve", "httptools", "--port", str(port)],
        "uvicorn-autoproto": [py, me, "--serve", "autoproto", "--port", str(port)],
        "granian": [
            str(VENV_BIN / "granian"),
            *("--interface", "asgi", "--http", "auto", "--workers", "1", "--loop", "uvloop"),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
            "asgi_servers:app",
        ],
        "hypercorn": [
            str(VENV_BIN / "hypercorn"),
            *("-k", "uvloop", "-b", f"127.0.0.1:{port}", "--log-level", "warning"),
            # hypercorn closes keep-alive connections after 1000 requests by default
            *("--config", str(hypercorn_config)),
            "asgi_servers:app",
        ],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], port: int, cpus: set[int] | None) -> subprocess.Popen[bytes]:
    """Start a server (pinned to ``cpus``, inherited by its workers) and wait until it listens."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT / "src")]))
    proc = subprocess.Popen(
        cmd,
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=0.2),
        ):
            return proc
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"{cmd[0]} did not start listening on {port}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server we started, by its PID (then its own process group, for workers)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftover worker children of *this* server only


# -- clients -------------------------------------------------------------------------
REQUEST = (
    b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (PATH.encode(), len(BODY), BODY)
)


def read_response(sock: socket.socket, buf: bytes = b"") -> bytes:
    """Read one HTTP/1.1 response (content-length or chunked); returns its body."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected response: {head[:80]!r}")
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    while (len(rest) < int(m.group(1))) if m else not rest.endswith(b"0\r\n\r\n"):
        rest += sock.recv(65536)
    return rest


def h1_latency(port: int, n: int, warmup: int) -> dict[str, float]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        samples = []
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            sock.sendall(REQUEST)
            body = read_response(sock)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
        assert b'"ok":true' in body, body
    return percentiles(samples)


def h2_latency(port: int, n: int, warmup: int) -> dict[str, float]:
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
    headers = [
        (b":method", b"POST"),
        (b":path", PATH.encode()),
        (b":scheme", b"http"),
        (b":authority", b"127.0.0.1:%d" % port),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(BODY)),
    ]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        samples = []
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, headers)
            conn.send_data(sid, BODY, end_stream=True)
            sock.sendall(conn.data_to_send())
            done = False
            while not done:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("server closed the h2 connection")
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    done = done or (
                        isinstance(event, h2.events.StreamEnded) and event.stream_id == sid
                    )
                if out := conn.data_to_send():
                    sock.sendall(out)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
    return percentiles(samples)


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    q = statistics.quantiles(samples_ns, n=100)
    return {
        "p50_us": round(q[49] / 1000, 1),
        "p99_us": round(q[98] / 1000, 1),
        "n": len(samples_ns),
    }


def h2c_supported(port: int) -> bool:
    import httpx

    try:
        with httpx.Client(http1=False, http2=True, timeout=3) as client:
            r = client.post(f"http://127.0.0.1:{port}{PATH}", content=BODY)
            return r.http_version == "HTTP/2" and r.status_code == 200 and r.json()["ok"] is True
    except Exception:
        return False


def throughput_wrk(port: int, conns: int, duration: float, tmp: Path) -> dict[str, Any]:
    script = tmp / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{BODY.decode()}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    url = f"http://127.0.0.1:{port}{PATH}"
    base = ["wrk", "-t2", f"-c{conns}", "--latency", "-s", str(script)]
    subprocess.run([*base, "-d1s", url], capture_output=True, check=True)  # warm-up
    out = subprocess.run(
        [*base, f"-d{duration:g}s", url], capture_output=True, text=True, check=True
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    return {
        "tool": "wrk",
        "rps": round(rps),
        "p50": f"{p50.group(1)}{p50.group(2)}" if p50 else None,
        "errors": errors.group(0) if errors else None,
    }


async def _throughput_asyncio(port: int, conns: int, duration: float) -> dict[str, Any]:
    done = 0
    deadline = time.monotonic() + duration

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline:
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            await reader.readexactly(int(m.group(1)))  # type: ignore[union-attr]
            done += 1
        writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))
    return {"tool": "asyncio", "rps": round(done / duration), "p50": None, "errors": None}


def throughput(port: int, conns: int, duration: float, tmp: Path) -> dict[str, Any]:
    if shutil.which("wrk"):
        return throughput_wrk(port, conns, duration, tmp)
    return asyncio.run(_throughput_asyncio(port, conns, duration))


# -- driver --------------------------------------------------------------------------
def versions() -> dict[str, str]:
    names = ["uvicorn", "uvloop", "httptools", "h2", "granian", "hypercorn", "orjson"]
    out = {"python": platform.python_version()}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    if shutil.which("wrk"):
        out["wrk"] = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split()[1]
    return out


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Pin this (client) process to ``cpus`` for the duration of the block."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure(
    name: str, args: argparse.Namespace, tmp: Path, pins: tuple[Any, Any]
) -> dict[str, Any]:
    """Start candidate ``name``, run every measurement against it, stop it."""
    server_cpus, client_cpus = pins
    port = free_port()
    row: dict[str, Any] = {"server": name, "loadavg_before": os.getloadavg()[0]}
    print(f"== {name} on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    proc = start(candidates(port, tmp)[name], port, server_cpus)
    row["pid"] = proc.pid
    steps = {
        "h2c": lambda: h2c_supported(port),
        "h1_latency": lambda: h1_latency(port, args.requests, args.warmup),
        "h2_latency": lambda: h2_latency(port, args.requests, args.warmup) if row["h2c"] else None,
        "throughput": lambda: throughput(port, args.connections, args.duration, tmp),
    }
    try:
        for key, step in steps.items():
            try:
                with pinned(client_cpus if key.endswith("latency") else None):
                    row[key] = step()
            except Exception as exc:
                row[key] = None
                row.setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}")
    finally:
        stop(proc)
    print(f"   {row}", file=sys.stderr, flush=True)
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    # On 2+ CPUs pin server and latency client to different CPUs: unpinned, the
    # scheduler flips between same-core and cross-core ping-pong (a ~40 us swing).
    cpus = sorted(os.sched_getaffinity(0))
    pins = ({cpus[-1]}, {cpus[0]}) if not args.no_pin and len(cpus) >= 2 else (None, None)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        return [measure(name, args, tmp, pins) for name in args.only or list(candidates(0, tmp))]


def table(results: list[dict[str, Any]], conns: int) -> str:
    lines = [
        f"| server | h2c | h1 1-conn p50 µs | h1 1-conn p99 µs | h1 {conns}-conn req/s | h2 1-conn p50 µs | h2 1-conn p99 µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        h1, h2, tp = r.get("h1_latency") or {}, r.get("h2_latency") or {}, r.get("throughput") or {}
        cells = [
            r["server"],
            "yes" if r.get("h2c") else "no",
            h1.get("p50_us", "-"),
            h1.get("p99_us", "-"),
            tp.get("rps", "-"),
            h2.get("p50_us", "-"),
            h2.get("p99_us", "-"),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        for error in r.get("errors", []):
            lines.append(f"| ↳ {r['server']} error: {error} ||||||")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="measured sequential requests")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0, help="throughput run, seconds")
    parser.add_argument("--only", nargs="*", help="subset of candidate names")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server/client CPUs")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "asgi_servers.json")
    parser.add_argument("--serve", choices=["httptools", "autoproto"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_uvicorn(args.serve, args.port)
        return
    results = run(args)
    note = (
        f"single run on a shared, noisy {os.cpu_count()}-vCPU machine; the load generator competes "
        "with the server for CPU, so compare rows within one run rather than across runs"
    )
    if not args.no_pin and len(os.sched_getaffinity(0)) >= 2:
        note += "; servers pinned to the last CPU, latency clients to the first (wrk unpinned)"
    print(table(results, args.connections))
    print(f"\nNote: {note}. h2 latency uses a python-h2 client (its own cost included).")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions(),
        "params": {k: v for k, v in vars(args).items() if k not in ("serve", "port", "out")},
        "note": note,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
