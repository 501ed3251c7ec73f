"""Command-line entry point: `topics serve` (and `python -m topics`).

The offline tools `verify`, `dump`, `spark-export` and `repair` are wired in
from :mod:`topics.tools`, the client commands (`produce`, `consume`, `watch`,
`ls`, `routers`, `queue`, ...) from :mod:`topics.client.commands` (docs/CLI.md).

`topics serve` reads every `TOPICS_*` variable (README.md "Configuration";
flags override the matching variable), takes the data directory's lock, binds
`TOPICS_HOST:TOPICS_PORT` (default 127.0.0.1:4000), replays the WAL, writes the
bound `host:port` to `TOPICS_PORT_FILE` atomically when set, and serves until
SIGINT/SIGTERM, then shuts down gracefully.

A start that cannot proceed prints one line on stderr, no traceback, and exits
non-zero: 2 for a bad setting (a value that is not a number, a port outside
0-65535...), 1 for an unusable, locked or unrecoverable data directory or a
port that cannot be bound. A failed start leaves nothing behind: the lock file,
a data directory it created and anything recovery added are removed again.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from topics import __version__
from topics.config import PORT_MAX, ConfigError, ServerConfig, load_config, parse_port

__all__ = ["main"]

log = logging.getLogger("topics")


def _write_port_file(path: str, host: str, port: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:  # not durable data: a plain file is fine here
        f.write(f"{host}:{port}\n")
    os.replace(tmp, path)


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    return exc.strerror or str(exc)


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets for `host:port`, one per address `host` resolves to.

    What asyncio's `create_server` would bind (SO_REUSEADDR; IPv6 sockets are
    IPv6-only), done here so a bind error is reported before anything else
    starts. Raises OSError (`socket.gaierror` for an unresolvable host).
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: set[tuple[object, ...]] = set()
    socks: list[socket.socket] = []
    unavailable: OSError | None = None
    try:
        for family, type_, proto, _name, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, type_, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                unavailable = exc  # that address family is off here (as asyncio does)
                continue
            socks.append(sock)
            sock.listen(2048)
            sock.setblocking(False)
        if not socks:
            raise unavailable or OSError(errno.EADDRNOTAVAIL, "no address to bind")
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _bind_error(host: str, port: int) -> OSError | None:
    """Why `host:port` cannot be bound right now, or None (the probe is closed again)."""
    try:
        for sock in _listen(host, port):
            sock.close()
    except OSError as exc:
        return exc
    return None


async def _serve(cfg: ServerConfig) -> int:
    """Run `topics serve` until SIGINT/SIGTERM; returns the exit code.

    One :class:`~topics.node.Node` is built and handed to both shells, the
    HTTP app and the Kafka listener (docs/ARCHITECTURE.md, "Layers"). Start
    order (README.md "Durability and the data directory"): take the data
    directory's lock (creating the directory), bind the HTTP port, replay the
    WAL while answering probes with 503, start the Kafka listener, write the
    port file. Any failure logs one line and returns 1 after undoing this
    start: the lock file, a data directory this start created and whatever
    recovery added are removed; nothing that existed before is touched. The
    graceful stop runs in reverse: the Kafka listener, the HTTP server (open
    streams get their closing frame), then the node (routers drained, the
    final checkpoint, the lock released).
    """
    from topics.http.app import TopicsApp
    from topics.http.server import ServerHandle, start_server
    from topics.node import Node
    from topics.storage.lock import DataDirError

    node = Node(cfg, durable=True)
    try:
        node.lock()
    except DataDirError as exc:
        log.error("%s", exc)
        return 1
    handle: ServerHandle | None = None

    async def fail(msg: str, *args: object) -> int:
        log.error(msg, *args)
        await node.abort(discard=True)
        if handle is not None:
            await handle.stop()
        return 1

    try:
        sockets = _listen(cfg.host, cfg.port)
    except OSError as exc:
        return await fail("cannot listen on %s: %s", _addr(cfg.host, cfg.port), _why(exc))
    # An explicit TOPICS_KAFKA_PORT must bind; the default 9092 may be taken.
    kafka_explicit = bool(os.environ.get("TOPICS_KAFKA_PORT", "").strip())
    kafka_port = cfg.kafka_port
    if kafka_port:
        bound_host = str(sockets[0].getsockname()[0])
        busy = _bind_error(bound_host, kafka_port)
        if busy is not None:
            if kafka_explicit:
                for sock in sockets:
                    sock.close()
                return await fail(
                    "cannot bind the Kafka listener on %s: %s",
                    _addr(bound_host, kafka_port),
                    _why(busy),
                )
            log.error(
                "cannot bind the Kafka listener on port %d (%s); it stays off",
                kafka_port,
                _why(busy),
            )
            kafka_port = 0
    # Bind first and replay the WAL while answering probes: /v0/ready (and every
    # data route) is 503 not_ready with the replay progress until recovery ends.
    app = TopicsApp(node)
    try:
        handle = await start_server(app, cfg.host, cfg.port, sockets=sockets)
    except RuntimeError as exc:  # uvicorn refused to start (exits right after)
        return await fail("%s", exc)
    try:
        await node.start()
    except Exception as exc:
        return await fail("recovery failed, refusing to serve: %s", exc)
    kafka = None
    if kafka_port:
        from topics.kafka import start_kafka

        try:
            kafka = await start_kafka(node, handle.host, kafka_port)
        except OSError as exc:
            if kafka_explicit:
                return await fail(
                    "cannot bind the Kafka listener on %s: %s",
                    _addr(handle.host, kafka_port),
                    _why(exc),
                )
            log.error("cannot bind the Kafka listener on port %d: %s", kafka_port, _why(exc))
    _tune_gc()
    node.ready = True
    log.info(
        "topics %s listening on http://%s (data dir %s)",
        __version__,
        _addr(handle.host, handle.port),
        cfg.data_dir,
    )
    if cfg.port_file:
        try:
            _write_port_file(cfg.port_file, handle.host, handle.port)
        except OSError as exc:
            if kafka is not None:
                await kafka.stop()
            return await fail("cannot write TOPICS_PORT_FILE %s: %s", cfg.port_file, _why(exc))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    if kafka is not None:
        await kafka.stop()
    await handle.stop()
    await node.stop()
    return 0


#: How long a thread may hold the GIL while another waits for it (seconds; CPython's
#: default is 5 ms). With 0.5 ms the loop gets the GIL back from the WAL writers and
#: the read pool sooner: SSE fan-out to 100 watchers p50 1.3-1.4 ms instead of
#: 1.6-1.7 ms, at the price of about 5% of batched-write throughput
#: (docs/BENCHMARKS.md, "Before and after in one run").
GIL_SWITCH_INTERVAL_S = 0.0005


#: Container allocations (net of frees) between two young-generation collections of
#: CPython's cycle collector (its default is 700). A write of 100 records makes about
#: 200 containers and a collection walks every young object, so with the default the
#: collector took about 13% of the server's CPU under batched writes (perf); at
#: 20,000 batched-write throughput rose by about 20% (docs/BENCHMARKS.md, "Side by
#: side with Redis and NATS"). Cycles are still collected, later.
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    """Set the cycle collector for serving (docs/ARCHITECTURE.md, "Compiled code").

    Called once recovery is done: what recovery built is collected once and then
    frozen (never walked again by the collector; it lives as long as the server),
    and young collections run every :data:`GC_GEN0_THRESHOLD` container allocations.
    """
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def _run(coro_fn: object) -> int:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        import uvloop

        return int(uvloop.run(coro_fn))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover
        return int(asyncio.run(coro_fn))  # type: ignore[arg-type]


def _port_arg(text: str) -> int:
    """argparse type of `--port`: an integer 0-65535."""
    try:
        return parse_port(text, "--port")
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text.strip()!r} is not a port number (0-{PORT_MAX})"
        ) from None


_DESCRIPTION = """\
topics: a single-node event-log server with a JSON HTTP API, and its client.

Run the server with `topics serve`; the other commands talk to a running server
(produce, consume, watch, ls/get/create/config/delete, routers, queue) or read a
data directory directly (verify, dump, repair, spark-export). `topics COMMAND
--help` describes each one.
"""

_EPILOG = """\
examples:
  topics serve                                   # 127.0.0.1:4000, data in ./topics-data
  printf 'hello\\nworld\\n' | topics produce greetings
  topics consume greetings --format text
  topics ls

environment:
  TOPICS_URL, TOPICS_TOKEN   the server and API key the client commands use
                             (default http://127.0.0.1:4000, no key); --url, --token
  TOPICS_*                   the server's settings: see `topics serve --help`

Docs: docs/CLI.md (this command), docs/API.md (the HTTP API), README.md.
"""

_SERVE_DESCRIPTION = """\
Run the server: take the data directory's lock, bind TOPICS_HOST:TOPICS_PORT
(default 127.0.0.1:4000), replay the log (answering /v0/ready with 503 until
done), then serve until SIGINT or SIGTERM and shut down gracefully (open streams
get a closing frame). Every setting is an environment variable; the flags below
override the matching one. A start that cannot proceed prints one line and exits
2 (a bad setting) or 1 (data directory unusable or locked, port busy, failed
recovery).
"""

#: (variable, default, meaning) for `topics serve --help`; README.md "Configuration"
#: is the full table (src/topics/config.py reads them).
SERVE_ENV: tuple[tuple[str, str, str], ...] = (
    ("TOPICS_HOST", "127.0.0.1", "bind host; host:port also sets the port"),
    ("TOPICS_PORT", "4000", "bind port (0: any free port)"),
    ("TOPICS_PORT_FILE", "unset", "write the bound host:port to this file"),
    ("TOPICS_DATA_DIR", "./topics-data", "data directory"),
    ("TOPICS_API_KEYS", "unset", "keys secret[:scopes[:prefixes]],...; unset: no auth"),
    ("TOPICS_PROBE_AUTH", "false", "require a key on /v0/health and /v0/ready"),
    ("TOPICS_ALLOW_INSECURE_NO_AUTH", "false", "allow a non-loopback bind without keys"),
    ("TOPICS_LOG", "info", "log level (RUST_LOG is read too)"),
    ("TOPICS_SCHEDULER", "priority", "delivery order: priority or fifo"),
    ("TOPICS_MAX_BODY_BYTES", "67108864", "request body / WebSocket message limit"),
    ("TOPICS_HTTP_HEADER_TIMEOUT_MS", "10000", "time allowed for a request head"),
    ("TOPICS_MAX_CONNECTIONS", "16384", "open connections (0: no cap)"),
    ("TOPICS_MAX_CONNECTIONS_PER_IP", "4096", "open connections per client address"),
    ("TOPICS_MAX_TOPICS", "100000", "topics"),
    ("TOPICS_MAX_ROUTERS", "10000", "routers"),
    ("TOPICS_MAX_WATCH_SESSIONS", "10000", "watch sessions"),
    ("TOPICS_MAX_SSE_CONNECTIONS", "10000", "open SSE streams and WebSockets"),
    ("TOPICS_MAX_SSE_CONNECTIONS_PER_KEY", "1000", "the same, per API key"),
    ("TOPICS_MAX_INFLIGHT_PER_KEY", "1000", "requests in flight per API key"),
    ("TOPICS_MAX_TOTAL_BYTES", "0", "live payload bytes of all topics (0: no cap)"),
    ("TOPICS_MAX_BATCH_RECORDS", "10000", "records per write"),
    ("TOPICS_MAX_RECORD_BYTES", "1048576", "data + meta of one record"),
    ("TOPICS_MAX_META_BYTES", "16384", "meta of one record"),
    ("TOPICS_MAX_TAG_BYTES", "256", "a record's tag"),
    ("TOPICS_MAX_NODE_BYTES", "128", "a record's node"),
    ("TOPICS_MAX_LIMIT", "1000", "records per read at most"),
    ("TOPICS_MAX_WATCH_TOPICS", "256", "topics per watch session"),
    ("TOPICS_MAX_CLAIM", "1000", "jobs per claim"),
    ("TOPICS_WAL_SHARDS", "min(cpus, 8)", "write-ahead log shards"),
    ("TOPICS_WAL_FILE_BYTES", "67108864", "size of each WAL file"),
    ("TOPICS_SEGMENT_MAX_EVENTS", "10000", "seal a segment after this many records"),
    ("TOPICS_SEGMENT_MAX_BYTES", "67108864", "... or this many bytes"),
    ("TOPICS_SEGMENT_MAX_AGE_MS", "3600000", "... or this age"),
    ("TOPICS_CHECKPOINT_INTERVAL_MS", "60000", "checkpoint at least this often (0: off)"),
    ("TOPICS_CHECKPOINT_WAL_BYTES", "67108864", "checkpoint after this much log (0: off)"),
    ("TOPICS_MAX_OPEN_SEGMENT_FILES", "256", "segment files held open for reads"),
    ("TOPICS_COLD_DIR", "unset", "cold tier: a directory or s3://bucket/prefix"),
    ("TOPICS_HOT_RETAIN_SEGMENTS", "4", "sealed segments each topic keeps hot"),
    ("TOPICS_HOT_RETAIN_BYTES", "0", "... and bytes (0: no byte bound)"),
    ("TOPICS_RELOCATE_BYTES_PER_S", "67108864", "pace of copies to the cold tier"),
    ("TOPICS_COLD_TIMEOUT_MS", "10000", "object-store request timeout"),
    ("TOPICS_COLD_CONNECT_TIMEOUT_MS", "3000", "object-store connect timeout"),
    ("TOPICS_COLD_RETRIES", "3", "object-store retries"),
    ("TOPICS_KAFKA_PORT", "9092", "Kafka listener port (0: off)"),
    ("TOPICS_KAFKA_ADVERTISED", "bound", "host:port the Kafka listener advertises"),
    ("TOPICS_KAFKA_FETCH_COMPRESSION", "none", "none, gzip, snappy, lz4 or zstd"),
    ("TOPICS_KAFKA_MAX_FRAME_BYTES", "67108864", "largest Kafka request frame"),
    ("TOPICS_KAFKA_IDLE_TIMEOUT_MS", "600000", "close idle Kafka connections (0: never)"),
    ("TOPICS_KAFKA_FRAME_TIMEOUT_MS", "30000", "time allowed for one Kafka frame"),
)


def _serve_epilog() -> str:
    width = max(len(name) for name, _d, _m in SERVE_ENV)
    dwidth = max(len(d) for _n, d, _m in SERVE_ENV)
    rows = [f"  {n.ljust(width)}  {d.ljust(dwidth)}  {m}" for n, d, m in SERVE_ENV]
    return (
        'environment (unset or empty: the default; README.md "Configuration" has them all):\n'
        + "\n".join(rows)
        + "\n\nexamples:\n"
        "  topics serve\n"
        "  TOPICS_DATA_DIR=/var/lib/topics TOPICS_PORT=8080 topics serve\n"
        "  TOPICS_API_KEYS='s3cret,reader:r' topics serve --host 0.0.0.0\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`topics ...`; returns the exit code.

    `serve` exits 0 after a graceful stop, 2 on a configuration error (a bad
    `TOPICS_*` value or flag) and 1 when startup fails (data directory unusable
    or locked, port busy, recovery failed); each error is one line on stderr.
    argparse usage errors exit 2. `verify`, `dump`, `spark-export` and `repair`
    are described in :mod:`topics.tools`; the client commands (produce,
    consume, ...) in :mod:`topics.client.commands` and docs/CLI.md.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # KEY=VALUE arguments after an option (`create T --config J k=v`): argparse
        # leaves them over; they belong to the command's pairs.
        if isinstance(getattr(args, "pairs", None), list) and all(
            "=" in x and not x.startswith("-") for x in extra
        ):
            args.pairs.extend(extra)
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "client_command", None) is not None:
        from topics.client import commands

        return commands.run(args)
    if args.cmd in ("verify", "dump", "spark-export", "repair"):
        from topics import tools

        return tools.run(args)

    if args.cmd == "serve":
        return _serve_command(args)
    return 2  # pragma: no cover


def build_parser() -> argparse.ArgumentParser:
    """The `topics` command's argument parser, every subcommand included."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="topics", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=raw
    )
    parser.add_argument("--version", action="version", version=f"topics {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the server (configured by TOPICS_* variables)",
        description=_SERVE_DESCRIPTION,
        epilog=_serve_epilog(),
        formatter_class=raw,
    )
    serve.add_argument("--host", help="bind host (overrides TOPICS_HOST)")
    serve.add_argument(
        "--port", type=_port_arg, help="bind port, 0 = ephemeral (overrides TOPICS_PORT)"
    )
    serve.add_argument("--data-dir", help="data directory (overrides TOPICS_DATA_DIR)")
    serve.add_argument("--port-file", help="write host:port here once bound (TOPICS_PORT_FILE)")
    from topics import tools
    from topics.client import commands

    commands.add_subcommands(sub)
    tools.add_subcommands(sub)
    return parser


def _serve_command(args: argparse.Namespace) -> int:
    """`topics serve`: the flags over the environment, then the server until it stops."""
    env = dict(os.environ)
    if args.host is not None:
        env["TOPICS_HOST"] = args.host
    if args.port is not None:
        env["TOPICS_PORT"] = str(args.port)
    if args.data_dir is not None:
        env["TOPICS_DATA_DIR"] = args.data_dir
    if args.port_file is not None:
        env["TOPICS_PORT_FILE"] = args.port_file
    try:
        cfg = load_config(env)
    except ConfigError as exc:
        print(f"topics: {exc}", file=sys.stderr)
        return 2
    level = {"trace": "DEBUG", "debug": "DEBUG", "warn": "WARNING"}.get(
        cfg.log_level, cfg.log_level.upper()
    )
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _run(_serve(cfg))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers are installed
        print("topics: interrupted during startup", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
