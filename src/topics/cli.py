"""Command-line entry point: `topics serve` (and `python -m topics`).

The offline tools `verify`, `dump` and `spark-export` are wired in from
:mod:`topics.tools`.

`topics serve` reads every `TOPICS_*` variable (API §13; flags override the
matching variable), binds `TOPICS_HOST:TOPICS_PORT` (default 127.0.0.1:4000),
writes the bound `host:port` to `TOPICS_PORT_FILE` atomically when set, and
serves until SIGINT/SIGTERM, then shuts down gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from topics import __version__
from topics.config import ConfigError, ServerConfig, load_config

__all__ = ["main"]

log = logging.getLogger("topics")


def _write_port_file(path: str, host: str, port: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:  # not durable data: a plain file is fine here
        f.write(f"{host}:{port}\n")
    os.replace(tmp, path)


async def _serve(cfg: ServerConfig) -> int:
    from topics.clock import SystemClock
    from topics.engine.core import Engine
    from topics.http.app import TopicsApp
    from topics.http.server import start_server
    from topics.storage.checkpoint import CheckpointConfig
    from topics.storage.fs import RealFs
    from topics.storage.lock import DataDirLock, DataDirLocked
    from topics.storage.runtime import Storage, StorageConfig

    try:
        lock = DataDirLock(cfg.data_dir)
    except DataDirLocked as exc:
        log.error("%s", exc)
        return 1
    fs = RealFs()
    clock = SystemClock()
    engine = Engine(clock=clock, limits=cfg.limits, fs=fs)
    app = TopicsApp(cfg, clock=clock, engine=engine)
    # Bind first and replay the WAL while answering probes: /v0/ready (and every
    # data route) is 503 not_ready with the replay progress until recovery ends.
    app.ready = False
    app.replay_progress = 0.0
    handle = await start_server(app, cfg.host, cfg.port)

    def on_progress(f: float) -> None:
        app.replay_progress = f

    storage_cfg = StorageConfig(
        cfg.data_dir,
        cfg.wal_shards,
        CheckpointConfig(
            segment_max_events=cfg.segment_max_events,
            segment_max_bytes=cfg.segment_max_bytes,
            segment_max_age_ms=cfg.segment_max_age_ms,
            interval_ms=cfg.checkpoint_interval_ms,
            wal_bytes=cfg.checkpoint_wal_bytes,
            # Triggers are checked every 5 s (SEMANTICS §17), or 4 times per interval.
            check_s=min(5.0, max(0.02, cfg.checkpoint_interval_ms / 4000))
            if cfg.checkpoint_interval_ms
            else 5.0,
        ),
        cold_dir=cfg.cold_dir,
    )
    try:
        storage = await Storage.open(engine, fs, storage_cfg, progress=on_progress)
    except Exception as exc:
        log.error("recovery failed, refusing to serve: %s", exc)
        await handle.stop()
        lock.release()
        return 1
    report = storage.report
    log.info(
        "recovered %d topics: snapshot %d, %d records from %d segment files, "
        "%d records from %d WAL frames in %d shard(s), in %.3f s%s",
        report.topics,
        report.snapshot,
        report.segment_records,
        report.segments,
        report.records,
        report.frames,
        report.shards,
        report.seconds,
        f"; torn tails truncated: {report.torn}" if report.torn else "",
    )
    storage.start()
    app.storage = storage

    async def close_storage(_app: TopicsApp) -> None:
        await storage.close()
        lock.release()

    app.hooks_shutdown.append(close_storage)
    kafka = None
    if cfg.kafka_port:
        from topics.kafka import start_kafka

        try:
            kafka = await start_kafka(engine, cfg, handle.host, cfg.kafka_port)
        except OSError as exc:
            # An explicit TOPICS_KAFKA_PORT must bind; the default 9092 may be taken.
            log.error("cannot bind the Kafka listener on port %d: %s", cfg.kafka_port, exc)
            if "TOPICS_KAFKA_PORT" in os.environ:
                await handle.stop()
                return 1
    app.replay_progress = 1.0
    app.ready = True
    log.info(
        "topics %s listening on http://%s:%d (data dir %s)",
        __version__,
        handle.host,
        handle.port,
        cfg.data_dir,
    )
    if cfg.port_file:
        try:
            _write_port_file(cfg.port_file, handle.host, handle.port)
        except OSError as exc:
            log.error("cannot write TOPICS_PORT_FILE %s: %s", cfg.port_file, exc)
            await handle.stop()
            return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    if kafka is not None:
        await kafka.stop()
    await handle.stop()
    return 0


def _run(coro_fn: object) -> int:
    try:
        import uvloop

        return int(uvloop.run(coro_fn))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover
        return int(asyncio.run(coro_fn))  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="topics", description="topics event-log server")
    parser.add_argument("--version", action="version", version=f"topics {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the server (configured by TOPICS_* variables)")
    serve.add_argument("--host", help="bind host (overrides TOPICS_HOST)")
    serve.add_argument("--port", type=int, help="bind port, 0 = ephemeral (overrides TOPICS_PORT)")
    serve.add_argument("--data-dir", help="data directory (overrides TOPICS_DATA_DIR)")
    serve.add_argument("--port-file", help="write host:port here once bound (TOPICS_PORT_FILE)")
    from topics import tools

    tools.add_subcommands(sub)
    args = parser.parse_args(argv)
    if args.cmd in ("verify", "dump", "spark-export", "repair"):
        return tools.run(args)

    if args.cmd == "serve":
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
        return _run(_serve(cfg))
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
