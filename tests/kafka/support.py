"""Servers and uniform client helpers for the Kafka listener tests.

Every server binds 127.0.0.1; the Kafka port is picked free (the listener
treats port 0 as "off", so a test cannot ask for an ephemeral one through the
environment). Clients: confluent-kafka (librdkafka), kafka-python, aiokafka.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tests.support.process import ServerProcess

CLIENTS = ["confluent", "kafka-python", "aiokafka"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Msg(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class KafkaProcess:
    """`topics serve` with a Kafka listener; restartable on the same ports and data dir."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.kport = free_port()
        self.env = {"TOPICS_KAFKA_PORT": str(self.kport), **(env or {})}
        self.proc = ServerProcess(tmp, self.env)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kport}"

    @property
    def base(self) -> str:
        return self.proc.base

    def restart(self) -> None:
        assert self.proc.stop() == 0
        self.proc = ServerProcess(self.tmp, self.env)

    def stop(self) -> None:
        self.proc.stop()

    def log(self) -> str:
        return self.proc.log_path.read_text()


class ResponseDropper:
    """A TCP proxy in front of a Kafka listener that can lose Produce responses.

    Started on the in-process server's loop, bound to 127.0.0.1:0; the server
    advertises the proxy's address, so clients send every request through it.
    While `drop_produce_responses > 0`, the response to a Produce request is not
    forwarded: the proxy closes the client's connection instead (the write
    itself already happened), and the client retries the batch.
    """

    _REQ_HEAD = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
    _RESP_HEAD = struct.Struct(">ii")  # size, correlation_id

    def __init__(self) -> None:
        self.drop_produce_responses = 0
        self.upstream_port = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {cw, sw}
        produce: set[int] = set()

        async def requests() -> None:
            while True:
                head = await cr.readexactly(12)
                size, key, _ver, corr = self._REQ_HEAD.unpack(head)
                if key == 0:
                    produce.add(corr)
                sw.write(head + await cr.readexactly(size - 8))

        async def responses() -> None:
            while True:
                head = await sr.readexactly(8)
                size, corr = self._RESP_HEAD.unpack(head)
                body = await sr.readexactly(size - 4)
                if corr in produce:
                    produce.discard(corr)
                    if self.drop_produce_responses > 0:
                        self.drop_produce_responses -= 1
                        return
                cw.write(head + body)

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, sw):
                w.close()
                self._writers.discard(w)


class InProcess:
    """A memory-mode node + Kafka listener on a private event loop in a thread (test
    hooks reachable); `http=True` also serves the node's HTTP app (`.base`).
    `router_retry_s` overrides the node's stalled-router retry period (s)."""

    def __init__(
        self,
        cfg: Any = None,
        *,
        http: bool = False,
        router_retry_s: float | None = None,
        dropper: bool = False,
    ) -> None:
        from dataclasses import replace

        from topics.config import ServerConfig
        from topics.kafka.server import KafkaServer
        from topics.node import ROUTER_RETRY_S, Node

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        cfg = cfg or ServerConfig(kafka_port=1)
        #: With `dropper`, clients reach the listener through a ResponseDropper.
        self.dropper: ResponseDropper | None = None
        if dropper:
            self.dropper = ResponseDropper()
            self.call(self.dropper.start())
            cfg = replace(cfg, kafka_advertised=f"127.0.0.1:{self.dropper.port}")
        self.node = Node(
            cfg,
            router_retry_s=ROUTER_RETRY_S if router_retry_s is None else router_retry_s,
        )
        self.engine = self.node.engine
        self.server = KafkaServer(self.node)
        self.http: Any = None
        self.call(self.node.start())
        self.call(self.server.start("127.0.0.1", 0))
        self.bootstrap = f"127.0.0.1:{self.server.port}"
        if self.dropper is not None:
            self.dropper.upstream_port = self.server.port
            self.bootstrap = f"127.0.0.1:{self.dropper.port}"
        self.base = ""
        if http:
            self.call(self._start_http())

    async def _start_http(self) -> None:
        from topics.http.app import TopicsApp
        from topics.http.server import start_server

        self.http = await start_server(
            TopicsApp(self.node), "127.0.0.1", 0, timeout_graceful_shutdown=2
        )
        self.base = f"http://127.0.0.1:{self.http.port}"

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def run(self, fn: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return fn()

        return self.call(go())

    def close(self) -> None:
        if self.dropper is not None:
            self.call(self.dropper.stop())
        self.call(self.server.stop())
        if self.http is not None:
            self.call(self.http.stop())
        self.call(self.node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# ------------------------------------------------------------------ client configs


def ck_conf(bs: str, sasl: tuple[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bs, **extra}
    if sasl:
        conf.update(
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": sasl[0],
                "sasl.password": sasl[1],
            }
        )
    return conf


def py_conf(bs: str, sasl: tuple[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap_servers": bs, **extra}
    if sasl:
        conf.update(
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": sasl[0],
                "sasl_plain_password": sasl[1],
            }
        )
    return conf


Item = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def produce(
    client: str,
    bs: str,
    topic: str,
    items: list[Item],
    *,
    acks: str = "1",
    idempotent: bool = False,
    sasl: tuple[str, str] | None = None,
    compression: str | None = None,
) -> list[int]:
    """Produce `items` (key, value, headers) in order, batches compressed with
    `compression` (gzip, snappy, lz4, zstd) when given; returns their offsets."""
    if client == "confluent":
        from confluent_kafka import Producer

        extra: dict[str, Any] = {"enable.idempotence": idempotent, "linger.ms": 5}
        if compression:
            extra["compression.type"] = compression
        p = Producer(ck_conf(bs, sasl, acks=acks, **extra))
        offsets: list[int] = [-1] * len(items)
        errors: list[Any] = []

        def cb(i: int) -> Callable[[Any, Any], None]:
            def done(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    offsets[i] = msg.offset()

            return done

        for i, (k, v, h) in enumerate(items):
            p.produce(topic, key=k, value=v, headers=h or None, on_delivery=cb(i))
            p.poll(0)
        assert p.flush(30) == 0
        assert not errors, errors
        return offsets
    if client == "kafka-python":
        from kafka import KafkaProducer

        kp = KafkaProducer(
            **py_conf(
                bs,
                sasl,
                acks=acks if acks == "all" else int(acks),
                enable_idempotence=idempotent,
                linger_ms=5,
                compression_type=compression,
            )
        )
        futs = [kp.send(topic, key=k, value=v, headers=h) for k, v, h in items]
        kp.flush(30)
        out = [f.get(30).offset for f in futs]
        kp.close()
        return out

    async def go() -> list[int]:
        from aiokafka import AIOKafkaProducer

        ap = AIOKafkaProducer(
            **py_conf(
                bs,
                sasl,
                acks=acks if acks == "all" else int(acks),
                enable_idempotence=idempotent,
                linger_ms=5,
                compression_type=compression,
            )
        )
        await ap.start()
        try:
            futs = [await ap.send(topic, value=v, key=k, headers=h) for k, v, h in items]
            return [(await f).offset for f in futs]
        finally:
            await ap.stop()

    return asyncio.run(go())


def consume_assign(
    client: str,
    bs: str,
    topic: str,
    start: int,
    n: int,
    *,
    sasl: tuple[str, str] | None = None,
    reset: str = "earliest",
    timeout: float = 20.0,
) -> list[Msg]:
    """assign() partition 0 of `topic`, seek to `start`, read `n` messages (or time out).

    With `reset="none"` an out-of-range offset raises the client's error.
    """
    deadline = time.monotonic() + timeout
    out: list[Msg] = []
    if client == "confluent":
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer(
            ck_conf(
                bs,
                sasl,
                **{
                    "group.id": "assign-only",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "error" if reset == "none" else reset,
                },
            )
        )
        try:
            c.assign([TopicPartition(topic, 0, start)])
            while len(out) < n and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    raise KafkaException(m.error())
                out.append(Msg(m.offset(), m.key(), m.value(), list(m.headers() or [])))
        finally:
            c.close()
        return out
    if client == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition

        kc = KafkaConsumer(**py_conf(bs, sasl, enable_auto_commit=False, auto_offset_reset=reset))
        try:
            tp = TopicPartition(topic, 0)
            kc.assign([tp])
            kc.seek(tp, start)
            while len(out) < n and time.monotonic() < deadline:
                for recs in kc.poll(timeout_ms=200).values():
                    out.extend(Msg(r.offset, r.key, r.value, list(r.headers)) for r in recs)
        finally:
            kc.close()
        return out[:n] if len(out) > n else out

    async def go() -> list[Msg]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        ac = AIOKafkaConsumer(
            **py_conf(bs, sasl, enable_auto_commit=False, auto_offset_reset=reset)
        )
        await ac.start()
        try:
            tp = TopicPartition(topic, 0)
            ac.assign([tp])
            ac.seek(tp, start)
            while len(out) < n and time.monotonic() < deadline:
                got = await ac.getmany(tp, timeout_ms=200)
                for recs in got.values():
                    out.extend(Msg(r.offset, r.key, r.value, list(r.headers)) for r in recs)
        finally:
            await ac.stop()
        return out

    return asyncio.run(go())


def group_consume(
    client: str,
    bs: str,
    topic: str,
    group: str,
    n: int,
    *,
    sasl: tuple[str, str] | None = None,
    timeout: float = 30.0,
) -> list[Msg]:
    """subscribe() in `group`, process exactly `n` messages, commit synchronously, close."""
    deadline = time.monotonic() + timeout
    out: list[Msg] = []
    if client == "confluent":
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            ck_conf(
                bs,
                sasl,
                **{
                    "group.id": group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                },
            )
        )
        try:
            c.subscribe([topic])
            while len(out) < n and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                out.append(Msg(m.offset(), m.key(), m.value(), list(m.headers() or [])))
            if out:
                c.commit(offsets=[TopicPartition(topic, 0, out[-1].offset + 1)], asynchronous=False)
        finally:
            c.close()
        return out
    if client == "kafka-python":
        from kafka.structs import OffsetAndMetadata

        from kafka import KafkaConsumer, TopicPartition

        kc = KafkaConsumer(
            **py_conf(
                bs,
                sasl,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=n,
            )
        )
        try:
            kc.subscribe([topic])
            while len(out) < n and time.monotonic() < deadline:
                for recs in kc.poll(timeout_ms=200, max_records=n - len(out)).values():
                    out.extend(Msg(r.offset, r.key, r.value, list(r.headers)) for r in recs)
            if out:
                tp = TopicPartition(topic, 0)
                kc.commit({tp: OffsetAndMetadata(out[-1].offset + 1, "", -1)})
        finally:
            kc.close()
        return out

    async def go() -> list[Msg]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        ac = AIOKafkaConsumer(
            topic,
            **py_conf(
                bs, sasl, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest"
            ),
        )
        await ac.start()
        try:
            while len(out) < n and time.monotonic() < deadline:
                got = await ac.getmany(timeout_ms=200, max_records=n - len(out))
                for recs in got.values():
                    out.extend(Msg(r.offset, r.key, r.value, list(r.headers)) for r in recs)
            if out:
                await ac.commit({TopicPartition(topic, 0): out[-1].offset + 1})
        finally:
            await ac.stop()
        return out

    return asyncio.run(go())


def list_topics(client: str, bs: str, *, sasl: tuple[str, str] | None = None) -> set[str]:
    """Topic names the cluster metadata shows this client."""
    if client == "confluent":
        from confluent_kafka.admin import AdminClient

        md = AdminClient(ck_conf(bs, sasl)).list_topics(timeout=10)
        return set(md.topics)
    if client == "kafka-python":
        from kafka import KafkaConsumer

        kc = KafkaConsumer(**py_conf(bs, sasl))
        try:
            return set(kc.topics())
        finally:
            kc.close()

    async def go() -> set[str]:
        from aiokafka import AIOKafkaConsumer

        ac = AIOKafkaConsumer(**py_conf(bs, sasl))
        await ac.start()
        try:
            return set(await ac.topics())
        finally:
            await ac.stop()

    return asyncio.run(go())


def items(n: int, prefix: str = "") -> list[Item]:
    """`n` records with a JSON value, a key and one header."""
    return [
        (f"{prefix}k{i}".encode(), b'{"i":%d,"p":"%s"}' % (i, prefix.encode()), [("h", b"%d" % i)])
        for i in range(n)
    ]
