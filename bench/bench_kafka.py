"""Kafka listener throughput with librdkafka (confluent-kafka) against `topics serve`.

Starts a fresh server (`python -m topics serve`, temp data dir, Kafka on a free
127.0.0.1 port) for each produce phase and the consume phase that reads its topic:

* produce N messages of `--size` bytes with acks=1, then acks=all (each to
  its own new single-partition topic of the server's default class, `disk`),
  optionally `--fsync` for a third run on an `fsync`-class topic;
* produce N keyed messages with acks=all to a topic of one partition and to
  one of `--partitions` partitions (default 8), uncompressed and then
  lz4-compressed;
* consume the acks=1 topic from offset 0 with assign(), and the partitioned
  topic with a group of `--members` consumer processes (default 4).

Reported as a table and as JSON: messages/s (wall clock from the first
produce() call to the last delivery report; for consumers from the first
message any member got to the last) and server CPU per message (utime+stime
of the server process from /proc over the phase).

    .venv/bin/python bench/bench_kafka.py                 # N=500000, 100-byte JSON values
    .venv/bin/python bench/bench_kafka.py -n 200000 --value binary --fsync
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _client import ServeProcess

CLK = os.sysconf("SC_CLK_TCK")
KEYS = [b"user-%d" % i for i in range(1000)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK


def make_value(kind: str, size: int, i: int) -> bytes:
    if kind == "binary":
        return os.urandom(size)
    if kind == "text":
        return (b"line %d " % i).ljust(size, b"x")
    head = b'{"n":%d,"pad":"' % i
    return head + b"a" * max(size - len(head) - 2, 0) + b'"}'


class Server(ServeProcess):
    """The server under test with a Kafka listener on a free port."""

    def __init__(self, tmp: Path) -> None:
        self.kport = free_port()
        env = {"TOPICS_KAFKA_PORT": str(self.kport), "TOPICS_LOG": "warning"}
        super().__init__(tmp / "data", tmp / "server.log", env, ready_timeout_s=30)
        self.base = self.url

    def put(self, topic: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(
            f"{self.base}/v0/topics/{topic}",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"content-type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).read()


def produce(
    srv: Server,
    topic: str,
    values: list[bytes],
    acks: str,
    *,
    keyed: bool = False,
    compression: str = "none",
) -> dict[str, Any]:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{srv.kport}",
            "acks": acks,
            "linger.ms": 5,
            "compression.type": compression,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 4_000_000,
        }
    )
    p.list_topics(topic, timeout=10)  # metadata (and auto-create) outside the timing
    errors = 0
    done = 0

    def cb(err: Any, _msg: Any) -> None:
        nonlocal errors, done
        done += 1
        if err is not None:
            errors += 1

    c0 = cpu_s(srv.proc.pid)
    t0 = time.perf_counter()
    for i, v in enumerate(values):
        key = KEYS[i % len(KEYS)] if keyed else None
        while True:
            try:
                p.produce(topic, v, key, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    dt = time.perf_counter() - t0
    cpu = cpu_s(srv.proc.pid) - c0
    n = len(values)
    return {
        "acks": acks,
        "compression": compression,
        "messages": n,
        "errors": errors,
        "msg_per_s": round(n / dt),
        "seconds": round(dt, 3),
        "server_cpu_s": round(cpu, 2),
        "server_us_per_msg": round(cpu / n * 1e6, 2),
    }


def consume(srv: Server, topic: str, n: int) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{srv.kport}",
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 8 << 20,
        }
    )
    c.list_topics(topic, timeout=10)
    got = 0
    c0 = cpu_s(srv.proc.pid)
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, 0, 0)])
    while got < n:
        msgs = c.consume(10_000, 1.0)
        got += sum(1 for m in msgs if not m.error())
        if time.perf_counter() - t0 > 300:
            break
    dt = time.perf_counter() - t0
    cpu = cpu_s(srv.proc.pid) - c0
    c.close()
    return {
        "messages": got,
        "msg_per_s": round(got / dt),
        "seconds": round(dt, 3),
        "server_cpu_s": round(cpu, 2),
        "server_us_per_msg": round(cpu / max(got, 1) * 1e6, 2),
    }


def create(srv: Server, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{srv.kport}"})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)


def _member(
    port: int, topic: str, group: str, n: int, got: Any, first: Any, last: Any, slot: int
) -> None:
    """One group member (its own process): consume until the group has `n` messages."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 8 << 20,
        }
    )
    c.subscribe([topic])
    deadline = time.monotonic() + 300
    while got.value < n and time.monotonic() < deadline:
        k = sum(1 for m in c.consume(10_000, 0.5) if not m.error())
        if k:
            now = time.time()
            if not first[slot]:
                first[slot] = now
            last[slot] = now
            with got.get_lock():
                got.value += k
    c.close()


def group_consume(srv: Server, topic: str, n: int, members: int) -> dict[str, Any]:
    """Consume `topic` with a group of `members` processes until `n` messages arrived."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    got = ctx.Value("q", 0)
    first = ctx.Array("d", members)
    last = ctx.Array("d", members)
    group = f"bench-group-{int(time.time())}"
    c0 = cpu_s(srv.proc.pid)
    procs = [
        ctx.Process(target=_member, args=(srv.kport, topic, group, n, got, first, last, i))
        for i in range(members)
    ]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(360)
    cpu = cpu_s(srv.proc.pid) - c0
    starts = [t for t in first if t]
    dt = max(last) - min(starts) if starts else float("inf")
    total = got.value
    return {
        "members": members,
        "members_that_got_data": len(starts),
        "messages": total,
        "msg_per_s": round(total / dt) if dt > 0 else 0,
        "seconds": round(dt, 3),
        "server_cpu_s": round(cpu, 2),
        "server_us_per_msg": round(cpu / max(total, 1) * 1e6, 2),
    }


def table(phases: list[dict[str, Any]]) -> str:
    rows = [("phase", "msg/s", "server us/msg", "seconds", "errors")]
    for r in phases:
        rows.append(
            (
                r["phase"],
                f"{r['msg_per_s']:,}",
                f"{r['server_us_per_msg']:.2f}",
                f"{r['seconds']:.2f}",
                str(r.get("errors", "-")),
            )
        )
    w = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row))
        for row in rows
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=500_000, help="messages per phase")
    ap.add_argument("--size", type=int, default=100, help="value bytes")
    ap.add_argument("--value", choices=["json", "text", "binary"], default="json")
    ap.add_argument("--fsync", action="store_true", help="also acks=all on an fsync topic")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the keyed topic")
    ap.add_argument("--members", type=int, default=4, help="group members consuming it")
    ap.add_argument("--json", default="bench/results/kafka.json", help="write results here")
    args = ap.parse_args()
    import confluent_kafka

    values = [make_value(args.value, args.size, i) for i in range(args.n)]
    out: dict[str, Any] = {
        "librdkafka": confluent_kafka.libversion()[0],
        "value": args.value,
        "size": args.size,
        "phases": [],
    }
    parts = args.partitions
    # Each group of phases runs on a fresh server: a server already holding the
    # millions of records of earlier phases spends more CPU per message (its
    # heap is larger), which would skew whichever phase comes last.
    # (phase name, partitions or None for an auto-created topic, acks, keyed,
    # codec, fsync, then: "assign" / "group" / None)
    plan: list[tuple[str, int | None, str, bool, str, bool, str | None]] = [
        ("produce acks=1", None, "1", False, "none", False, "assign"),
        ("produce acks=all", None, "all", False, "none", False, None),
    ]
    if args.fsync:
        plan.append(("produce acks=all, fsync topic", None, "all", False, "none", True, None))
    # Keys become tags (an index entry per record), so the partitioned runs are
    # compared with keyed single-partition runs of the same codec.
    for codec in ("none", "lz4"):
        for n_parts in (1, parts):
            then = "group" if (codec, n_parts) == ("none", parts) else None
            label = f"produce acks=all, {n_parts} partition(s), keyed, {codec}"
            plan.append((label, n_parts, "all", True, codec, False, then))
    for label, n_parts, acks, keyed, codec, fsync, then in plan:
        with tempfile.TemporaryDirectory(prefix="bench-kafka-") as d:
            srv = Server(Path(d))
            try:
                t = f"bench-{int(time.time())}"
                if fsync:
                    srv.put(t, {"durability": "fsync"})
                elif n_parts is not None:
                    create(srv, t, n_parts)
                r = produce(srv, t, values, acks, keyed=keyed, compression=codec)
                r["phase"] = label
                out["phases"].append(r)
                print(r, flush=True)
                if then == "assign":
                    r = consume(srv, t, args.n)
                    r["phase"] = "consume (assign, 1 partition, from 0)"
                elif then == "group":
                    r = group_consume(srv, t, args.n, args.members)
                    r["phase"] = f"consume (group of {args.members}, {parts} partitions)"
                if then is not None:
                    out["phases"].append(r)
                    print(r, flush=True)
            finally:
                srv.stop()
    print()
    print(table(out["phases"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
