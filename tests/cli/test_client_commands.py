"""The `topics` client commands as a user runs them, against a real server: golden
outputs (timestamps masked), exit codes, one-line errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.support import mask, run
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout


def fails(p: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one stderr line of a failed command (no traceback)."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_produce_then_consume_json_and_text(server: ServerProcess) -> None:
    u = server.base
    out = ok(run("produce", "greetings", url=u, input="hello\nworld\n\n"))
    assert out == "produced 2 records to greetings: seqs 1-2 (1 batch)\n"
    assert mask(ok(run("consume", "greetings", url=u))) == (
        '{"$seq":1,"$ts":TS,"data":"hello"}\n{"$seq":2,"$ts":TS,"data":"world"}\n'
    )
    assert mask(ok(run("consume", "greetings", "--format", "text", url=u))) == (
        "#1 TIME hello\n#2 TIME world\n"
    )
    assert mask(ok(run("tail", "greetings", "--from-seq", "1", url=u))) == (
        '{"$seq":2,"$ts":TS,"data":"world"}\n'
    )


def test_produce_json_records_tags_and_batches(server: ServerProcess) -> None:
    u = server.base
    lines = [
        '{"data": {"sku": "B-77"}, "tag": "order:1", "meta": {"src": "web"}}',
        "42",
        '{"sku": "A-1"}',
        '"text"',
    ]
    out = ok(
        run(
            "produce",
            "orders",
            "--json",
            "--batch",
            "3",
            "--tag",
            "dflt",
            url=u,
            input="\n".join(lines),
        )
    )
    assert out == "produced 4 records to orders: seqs 1-4 (2 batches)\n"
    assert mask(ok(run("consume", "orders", url=u))) == (
        '{"$seq":1,"$ts":TS,"$tag":"order:1","data":{"sku":"B-77"},"meta":{"src":"web"}}\n'
        '{"$seq":2,"$ts":TS,"$tag":"dflt","data":42}\n'
        '{"$seq":3,"$ts":TS,"$tag":"dflt","data":{"sku":"A-1"}}\n'
        '{"$seq":4,"$ts":TS,"$tag":"dflt","data":"text"}\n'
    )
    assert mask(
        ok(run("consume", "orders", "--format", "text", "--limit", "2", "--no-meta", url=u))
    ) == ('#1 TIME tag=order:1 {"sku":"B-77"}\n#2 TIME tag=dflt 42\n')
    assert mask(ok(run("consume", "orders", "--no-tags", "--from-seq", "3", url=u))) == (
        '{"$seq":4,"$ts":TS,"data":"text"}\n'
    )


def test_bad_json_line_sends_what_came_before(server: ServerProcess) -> None:
    p = run("produce", "halfway", "--json", url=server.base, input="1\n2\nnot json\n3\n")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [
        "topics: produced 2 records to halfway: seqs 1-2 (1 batch) before the error",
        "topics: stdin line 3 is not JSON (Expecting value: line 1 column 1 (char 0))",
    ]


def test_tombstones_in_both_formats(server: ServerProcess) -> None:
    u = server.base
    ok(run("create", "capped", "cap_records=2", url=u))
    ok(run("produce", "capped", "-q", url=u, input="a\nb\nc\nd\n"))
    assert mask(ok(run("consume", "capped", "--format", "text", url=u))) == (
        "--- tombstone: 2 records lost, seqs 1-2 (cap); reading on from 3 ---\n"
        "#3 TIME c\n#4 TIME d\n"
    )
    assert mask(ok(run("consume", "capped", url=u))).splitlines()[0] == (
        '{"tombstone":{"gap_from":1,"gap_to":2,"reason":"cap","missed_estimate":2,'
        '"earliest_seq":3,"head_seq":4}}'
    )


def test_topic_management(server: ServerProcess) -> None:
    u = server.base
    created = json.loads(
        ok(run("topic", "create", "m.jobs", "type=queue", "lease_ms=60000", url=u))
    )
    assert created["created"] is True and created["config"]["type"] == "queue"
    assert created["config"]["lease_ms"] == 60000
    line = fails(run("create", "m.jobs", url=u))
    assert line.startswith("topics: topic 'm.jobs' already exists")
    conf = json.loads(
        ok(run("create", "m.log", "--config", '{"cap_records": 10}', "ttl_ms=5000", url=u))
    )["config"]
    assert (conf["cap_records"], conf["ttl_ms"]) == (10, 5000)
    changed = json.loads(ok(run("config", "m.log", "discard=reject", "durable=true", url=u)))
    assert (changed["cap_records"], changed["discard"], changed["durability"]) == (
        10,
        "reject",
        "fsync",
    )
    assert json.loads(ok(run("topic", "config", "m.log", url=u))) == changed
    state = json.loads(ok(run("get", "m.jobs", url=u)))
    assert state["topic"] == "m.jobs" and state["queue"] == {
        "ready": 0,
        "in_flight": 0,
        "dead_lettered": 0,
    }
    assert "performance" not in state
    ok(run("produce", "m.log", "-q", url=u, input="x\n"))
    assert ok(run("ls", "--prefix", "m.", url=u)) == (
        "TOPIC   HEAD  EARLIEST  COUNT  BYTES  DURABLE\n"
        "m.jobs  0     1         0      0      no\n"
        "m.log   1     1         1      3      yes\n"
    )
    listed = [
        json.loads(x)
        for x in ok(run("topic", "ls", "--prefix", "m.", "--json", url=u)).splitlines()
    ]
    assert [t["topic"] for t in listed] == ["m.jobs", "m.log"]
    line = fails(run("delete", "m.log", "--if-empty", url=u))
    assert line.startswith("topics: ") and line.endswith("(topic_not_empty, HTTP 409)")
    assert json.loads(ok(run("topic", "delete", "m.log", url=u))) == {
        "topic": "m.log",
        "deleted": True,
        "routers_removed": [],
    }
    gone = run("delete", "m.log", url=u)
    assert gone.returncode == 0 and json.loads(gone.stdout)["deleted"] is False
    assert gone.stderr == "topics: there was no topic 'm.log'\n"


def test_errors_are_one_line(server: ServerProcess) -> None:
    u = server.base
    assert fails(run("consume", "nowhere", url=u)) == (
        'topics: topic "nowhere" does not exist (topic_not_found, HTTP 404)'
    )
    assert fails(run("get", "bad name", url=u)).endswith("(topic_not_found, HTTP 404)")
    assert fails(run("config", "greetings", "nope=1", url=u), 2).startswith(
        "topics: unknown config field 'nope'"
    )
    assert fails(run("create", "x.y", "--config", "[1]", url=u), 2) == (
        "topics: --config must be a JSON object"
    )
    line = fails(run("ls", "--retries", "0", url="http://127.0.0.1:9", env={"TOPICS_TOKEN": "t"}))
    assert line.startswith("topics: cannot reach the server: GET http://127.0.0.1:9/v0/topics")
    assert fails(run("queue", "claim", "greetings", "--node", "w", url=u)) == (
        'topics: topic "greetings" is not a queue (not_a_queue, HTTP 409)'
    )
    usage = run("consume", url=u)
    assert usage.returncode == 2 and "usage: topics consume" in usage.stderr
    # A url that cannot be one is a usage error, before any request.
    assert fails(run("ls", "--url", "nonsense:port"), 2) == (
        "topics: server url 'http://nonsense:port' is not a valid url: "
        "Port could not be cast to integer value as 'port'"
    )
    assert fails(run("ls", url="http://[::1"), 2).endswith("is not a valid url: Invalid IPv6 URL")
    assert fails(run("ls", url="http://a\x01b"), 2).startswith(
        "topics: server url 'http://a\\x01b' is not a valid url: Invalid non-printable"
    )


def test_url_flag_and_token(server: ServerProcess) -> None:
    # --url wins over $TOPICS_URL
    out = ok(run("status", "--url", server.base, url="http://127.0.0.1:9"))
    assert json.loads(out)["ready"]["ready"] is True


def test_routers_and_queue(server: ServerProcess) -> None:
    u = server.base
    put = json.loads(
        ok(
            run(
                "routers",
                "put",
                "r.copy",
                "--source",
                "r.src",
                "--dest",
                "r.dst",
                "--filter",
                "keep:*",
                url=u,
            )
        )
    )
    assert put["created"] is True and put["filter"] == ["tag", "Glob", "keep:*"]
    ok(run("produce", "r.src", "--tag", "keep:1", "-q", url=u, input="copied\n"))
    assert (
        mask(ok(run("consume", "r.dst", url=u)))
        == '{"$seq":1,"$ts":TS,"$tag":"keep:1","data":"copied"}\n'
    )
    assert ok(run("routers", "ls", url=u)).splitlines() == [
        "ROUTER  SOURCE  DEST   GUARANTEE      FORWARDED",
        "r.copy  r.src   r.dst  at_least_once  1",
    ]
    assert json.loads(ok(run("router", "get", "r.copy", url=u)))["forwarded_total"] == 1
    assert json.loads(ok(run("routers", "delete", "r.copy", url=u)))["deleted"] is True
    assert fails(run("routers", "get", "r.copy", url=u)).endswith("(router_not_found, HTTP 404)")

    ok(run("create", "r.q", "type=queue", url=u))
    ok(run("produce", "r.q", "-q", url=u, input="job1\njob2\n"))
    jobs = [
        json.loads(x)
        for x in ok(run("queue", "claim", "r.q", "--node", "w1", "--max", "2", url=u)).splitlines()
    ]
    assert [(j["$seq"], j["data"], j["deliveries"]) for j in jobs] == [
        (1, "job1", 1),
        (2, "job2", 1),
    ]
    ext = json.loads(
        ok(run("queue", "extend", "r.q", "1", "--node", "w1", "--lease-ms", "60000", url=u))
    )
    assert ext["extended"] == 1
    stale = json.loads(ok(run("queue", "ack", "r.q", "1:lease_ffff", "--node", "w1", url=u)))
    assert stale["skipped"] == [1]
    acked = json.loads(
        ok(run("queue", "ack", "r.q", f"1:{jobs[0]['lease_id']}", "--node", "w1", url=u))
    )
    assert (acked["acked"], acked["skipped"]) == (1, [])
    nacked = json.loads(ok(run("queue", "nack", "r.q", "2", "--node", "w1", url=u)))
    assert nacked["nacked"] == 1
    again = ok(run("queue", "claim", "r.q", "--node", "w2", url=u))
    assert json.loads(again)["deliveries"] == 2
    empty = run("queue", "claim", "r.q", "--node", "w3", url=u)
    assert (
        empty.returncode == 0
        and empty.stdout == ""
        and empty.stderr == "topics: no job ready in r.q\n"
    )


def _spawn(*args: str, url: str) -> subprocess.Popen[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env["TOPICS_URL"] = url
    return subprocess.Popen(
        [sys.executable, "-m", "topics", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_stream(url: str, topic: str, before: int) -> None:
    """Until the server counts a new SSE connection (the follower is listening)."""
    import httpx

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = httpx.get(f"{url}/v0/metrics", headers={"accept": "application/json"}).json()
        if m["sse_connections"] > before:
            return
        time.sleep(0.05)
    raise AssertionError("the follower did not connect")


def _sse(url: str) -> int:
    import httpx

    return int(
        httpx.get(f"{url}/v0/metrics", headers={"accept": "application/json"}).json()[
            "sse_connections"
        ]
    )


def test_consume_follow_and_watch(server: ServerProcess) -> None:
    u = server.base
    ok(run("produce", "f.a", "-q", url=u, input="old\n"))
    ok(run("produce", "f.b", "-q", url=u, input="b-old\n"))
    before = _sse(u)
    follower = _spawn("consume", "f.a", "--follow", "--limit", "1", "--format", "text", url=u)
    _wait_stream(u, "f.a", before)
    ok(run("produce", "f.a", "-q", url=u, input="new\n"))
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert mask(out) == "#2 TIME new\n"  # --follow starts at the head

    before = _sse(u)
    watcher = _spawn("watch", "f.a", "f.b", "--from-beginning", "--limit", "4", url=u)
    _wait_stream(u, "f.a", before)
    ok(run("produce", "f.b", "-q", url=u, input="b-new\n"))
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert mask(out) == (
        '{"topic":"f.a","$seq":1,"$ts":TS,"data":"old"}\n'
        '{"topic":"f.a","$seq":2,"$ts":TS,"data":"new"}\n'
        '{"topic":"f.b","$seq":1,"$ts":TS,"data":"b-old"}\n'
        '{"topic":"f.b","$seq":2,"$ts":TS,"data":"b-new"}\n'
    )

    # Ctrl-C: exit 130, and where each topic stopped, for --from-seq to carry on.
    follower = _spawn("watch", "f.a", "f.b", "--from-beginning", url=u)
    assert follower.stdout is not None
    printed = [follower.stdout.readline() for _ in range(4)]  # each line is flushed
    assert all(line.startswith('{"topic":"f.') for line in printed), printed
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 130, err
    assert err.strip().splitlines() == ["topics: interrupted; stopped (f.a at 2, f.b at 2)"]
    assert out == ""
