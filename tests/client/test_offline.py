"""topics.client without a server: retry decisions (httpx.MockTransport answers),
the error mapping, the SSE parser and the watch's cursor bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from topics.client import (
    BadRequest,
    Client,
    ConnectionFailed,
    DiffPage,
    InsufficientStorage,
    NotFound,
    NotReady,
    Record,
    ServerError,
    Throttled,
    Tombstone,
    TopicNotFound,
    TopicsError,
)
from topics.client._core import SseFrame, SseParser, WatchEnded, WatchState, diff_items
from topics.client.errors import error_from_response
from topics.cursor_id import decode_composite_id

APPEND_OK = {
    "topic": "t",
    "first_seq": 1,
    "last_seq": 1,
    "seqs": [1],
    "head_seq": 1,
    "count": 1,
    "created": False,
    "deduped": False,
}


def _envelope(code: str, message: str = "m", detail: dict | None = None) -> bytes:
    err: dict = {"code": code, "message": message}
    if detail is not None:
        err["detail"] = detail
    return orjson.dumps({"error": err})


def _client(handler, **kw) -> Client:  # type: ignore[no-untyped-def]
    return Client("http://server.test", transport=httpx.MockTransport(handler), **kw)


def test_429_is_retried_after_retry_after_with_the_same_key() -> None:
    seen: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(req.content))
        if len(seen) < 3:
            return httpx.Response(
                429, content=_envelope("throttled"), headers={"retry-after": "0.05"}
            )
        return httpx.Response(200, content=orjson.dumps(APPEND_OK))

    with _client(handler) as c:
        t0 = time.monotonic()
        r = c.append("t", ["x"])
        assert time.monotonic() - t0 >= 0.1
    assert r.attempts == 3 and r.idempotency_key
    assert {s["idempotency_key"] for s in seen} == {r.idempotency_key}


def test_retries_are_bounded() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(
            503,
            content=_envelope("not_ready", "replaying", {"replay_progress": 0.5}),
            headers={"retry-after": "0"},
        )

    with _client(handler, retries=2) as c, pytest.raises(NotReady) as ei:
        c.get_topic("t")
    assert calls == 3
    assert ei.value.status == 503 and ei.value.detail == {"replay_progress": 0.5}


def test_throttled_carries_retry_after() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429,
            content=_envelope("throttled", "slow down", {"retry_after_ms": 2500}),
            headers={"retry-after": "1"},
        )

    with _client(handler, retries=0) as c, pytest.raises(Throttled) as ei:
        c.append("t", [1])
    assert ei.value.retry_after == 2.5 and ei.value.code == "throttled"


def test_transport_errors_retried_only_when_safe() -> None:
    calls: list[bytes] = []
    fail = [True]

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.content)
        if fail[0]:
            fail[0] = False
            raise httpx.ReadError("connection reset")
        return httpx.Response(200, content=orjson.dumps(APPEND_OK))

    with _client(handler, auto_idempotency=False) as c:
        with pytest.raises(ConnectionFailed):
            c.append("t", [1])  # no key: not repeated
        assert len(calls) == 1
        fail[0] = True
        assert c.append("t", [1], idempotency_key="k1").attempts == 2  # a key makes it safe
    fail[0] = True
    with _client(handler) as c:
        assert c.append("t", [1]).attempts == 2  # an automatic key


def test_connect_errors_are_always_retried() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, content=orjson.dumps({"topic": "q", "claimed": [], "ready": 0}))

    with _client(handler) as c:
        assert c.claim("q", "w").jobs == []
    assert calls == 2


def test_error_mapping() -> None:
    e = error_from_response(404, _envelope("topic_not_found", "gone", {"topic": "x"}))
    assert isinstance(e, TopicNotFound) and isinstance(e, NotFound)
    assert (e.status, e.code, e.message, e.detail) == (
        404,
        "topic_not_found",
        "gone",
        {"topic": "x"},
    )
    assert str(e) == "topic_not_found: gone (HTTP 404)"
    assert isinstance(error_from_response(400, _envelope("batch_too_large")), BadRequest)
    assert isinstance(
        error_from_response(507, _envelope("insufficient_storage")), InsufficientStorage
    )
    assert isinstance(error_from_response(500, _envelope("internal")), ServerError)
    odd = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(odd, ServerError) and odd.code == "http_502" and "bad gateway" in odd.message
    unknown = error_from_response(418, _envelope("teapot"))
    assert type(unknown) is TopicsError and unknown.code == "teapot"


def test_an_answer_from_another_server_is_one_line_that_says_so() -> None:
    page = b"<!DOCTYPE HTML>\n<html>\n<head><title>Error</title></head>\n<body>\n"
    page += b"<p>Error code: 404</p>\n<p>Message: File not found.</p>\n" * 20 + b"</body></html>\n"
    e = error_from_response(404, page)
    assert type(e) is NotFound and e.code == "http_404"
    assert "\n" not in e.message and "<" not in e.message and len(e.message) < 220
    assert "Error code: 404" in e.message and "topics server" in e.message
    empty = error_from_response(404, b"")
    assert "\n" not in empty.message and "empty body" in empty.message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("nonsense:port", "not a valid url"),
        ("http://[::1", "not a valid url"),
        ("http://127.0.0.1:99999", "not a valid url"),
        ("http://:80", "names no host"),
        ("http://127.0.0.1:0", "port 0"),
        ("ftp://example.com", "must start with http"),
    ],
)
def test_a_bad_server_url_is_refused_before_any_request(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Client(url)


def test_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, content=b'{"status":"ok","version":"x","uptime_ms":1}')

    monkeypatch.setenv("TOPICS_URL", "example.test:4100")
    monkeypatch.setenv("TOPICS_TOKEN", "s3cret")
    c = Client(transport=httpx.MockTransport(handler))
    assert c.url == "http://example.test:4100"
    c.health()
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    monkeypatch.delenv("TOPICS_URL")
    monkeypatch.delenv("TOPICS_TOKEN")
    assert Client().url == "http://127.0.0.1:4000"


def test_router_names_are_escaped() -> None:
    paths: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        paths.append(req.url.raw_path.decode())
        return httpx.Response(200, content=b'{"router":"a->b","deleted":true}')

    with _client(handler) as c:
        c.delete_router("a->b")
    assert paths == ["/v0/routers/a-%3Eb"]


def _feed(p: SseParser, text: str) -> list[SseFrame]:
    return [f for line in text.split("\n") if (f := p.feed(line)) is not None]


def test_sse_parser() -> None:
    frames = _feed(
        SseParser(),
        'retry: 2000\n\nid: abc\nevent: record\ndata: {"a":1}\n\n: hb\n\nevent: x\ndata: 1\ndata: 2\n\n',
    )
    assert frames == [SseFrame("record", '{"a":1}', "abc"), SseFrame("x", "1\n2", None)]


def test_watch_state_moves_cursors() -> None:
    st = WatchState(cursors={"a": 0, "b": 0}, tail={"b"}, options={"heartbeat_ms": 1000})
    assert st.session_body()["topics"] == {"a": {"from_seq": 0}, "b": {"tail": True}}
    st.started(
        {
            "wid": "wid_1",
            "topics": {
                "a": {"from_seq": 0, "head_seq": 3, "earliest_seq": 1},
                "b": {"from_seq": 7, "head_seq": 7, "earliest_seq": 1},
            },
        }
    )
    assert st.cursors == {"a": 0, "b": 7} and not st.tail
    rec = SseFrame(
        "record",
        '{"topic":"a","from_seq":0,"head_seq":3,"records":[{"$seq":2,"$ts":5,"data":"x"}],"to_seq":3}',
        "id1",
    )
    assert list(st.frame(rec)) == [Record("a", 2, 5, "x")]
    tomb = SseFrame(
        "tombstone",
        '{"topic":"b","reason":"recreated","gap_from":1,"gap_to":2,"earliest_seq":3,"head_seq":2}',
        "id2",
    )
    [t] = list(st.frame(tomb))
    assert isinstance(t, Tombstone) and t.missed == 2
    assert st.cursors == {"a": 3, "b": 2}  # recreated: moved back
    # A reconnect rewinds the session to exactly these cursors (the server's id format).
    assert decode_composite_id(st.resume_id()) == {"a": 3, "b": 2}
    assert st.session_body()["topics"] == {"a": {"from_seq": 3}, "b": {"from_seq": 2}}
    with pytest.raises(WatchEnded):
        list(st.frame(SseFrame("error", '{"code":"server_shutting_down","message":"bye"}', None)))
    assert st.shutdown


def test_a_watch_cursor_covers_only_what_was_handed_out() -> None:
    """A consumer that stops in the middle of a frame resumes after its last event."""
    st = WatchState(cursors={"a": 0}, tail=set(), options={})
    records = ",".join(f'{{"$seq":{n},"$ts":5,"data":{n}}}' for n in (1, 2, 4))
    # Seq 3 was filtered out (another node's record): to_seq covers it.
    frame = SseFrame("record", f'{{"topic":"a","records":[{records}],"to_seq":5}}', "id1")
    events = st.frame(frame)
    seen = []
    for ev in events:
        seen.append(ev)
        if len(seen) == 2:
            break
    assert [e.seq for e in seen if isinstance(e, Record)] == [1, 2]
    assert st.cursors == {"a": 2}
    assert [e.seq for e in events if isinstance(e, Record)] == [4]
    assert st.cursors == {"a": 5}  # the last record carries the frame's to_seq
    empty = SseFrame("record", '{"topic":"a","records":[],"to_seq":9}', "id2")
    assert list(st.frame(empty)) == [] and st.cursors == {"a": 9}


def test_a_recreated_tombstone_leaves_the_cursor_before_the_new_records() -> None:
    """A cursor beyond the head of a topic made again: the tombstone covers 1..head and
    the new topic's records follow; stopping after the tombstone must not skip them."""
    tomb = (
        '{"topic":"a","reason":"recreated","gap_from":1,"gap_to":3,"earliest_seq":1,"head_seq":3}'
    )
    st = WatchState(cursors={"a": 10}, tail=set(), options={})
    [t] = list(st.frame(SseFrame("tombstone", tomb, "id1")))
    assert isinstance(t, Tombstone) and t.reason == "recreated"
    assert st.cursors == {"a": 0}
    page = DiffPage.from_json(
        {
            "topic": "a",
            "records": [{"$seq": n, "$ts": 1, "data": n} for n in (1, 2, 3)],
            "next_from_seq": 3,
            "head_seq": 3,
            "earliest_seq": 1,
            "caught_up": True,
            "tombstone": orjson.loads(tomb) | {"missed_estimate": 3},
        }
    )
    assert [at for _item, at in diff_items(page, 10)] == [0, 1, 2, 3]
    # A stream relabels its first tombstone from_seq_too_old: the cursor it was read
    # from tells the case, not the reason.
    first = tomb.replace('"recreated"', '"from_seq_too_old"')
    st = WatchState(cursors={"a": 10}, tail=set(), options={})
    list(st.frame(SseFrame("tombstone", first, "id1")))
    assert st.cursors == {"a": 0}
    # A cap tombstone read from below the gap moves the cursor to its end, as always.
    cap = '{"topic":"a","reason":"cap","gap_from":1,"gap_to":4,"earliest_seq":5,"head_seq":9}'
    st = WatchState(cursors={"a": 0}, tail=set(), options={})
    list(st.frame(SseFrame("tombstone", cap, "id1")))
    assert st.cursors == {"a": 4}


def _sse(*frames: tuple[str, str]) -> bytes:
    return b"".join(f"id: x\nevent: {event}\ndata: {data}\n\n".encode() for event, data in frames)


class _Streams:
    """A watch server in a MockTransport: POST /v0/watch makes `wid_1`; each GET of
    its stream takes the next answer from `answers` and records its headers."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.gets: list[httpx.Headers] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            body = {"wid": "wid_1", "topics": {"a": {"from_seq": 0, "head_seq": 1}}}
            return httpx.Response(200, json=body | {"stream_url": "/v0/watch/wid_1"})
        self.gets.append(req.headers)
        return self.answers.pop(0)


def _record(seq: int) -> tuple[str, str]:
    rec = {"$seq": seq, "$ts": 1, "data": seq}
    return ("record", orjson.dumps({"topic": "a", "records": [rec], "to_seq": seq}).decode())


def test_a_watch_retries_a_stream_refused_while_the_server_replays() -> None:
    """503 not_ready (a restart's log replay) or 429 on the stream: wait, reconnect,
    and rewind the session to the cursors handed out."""
    streams = _Streams(
        httpx.Response(200, content=_sse(_record(1))),
        httpx.Response(503, content=_envelope("not_ready"), headers={"retry-after": "0"}),
        httpx.Response(429, content=_envelope("throttled"), headers={"retry-after": "0"}),
        httpx.Response(200, content=_sse(_record(2))),
    )
    with Client("http://server.test", transport=httpx.MockTransport(streams)) as c:
        w = c.watch(["a"], reconnect_timeout=30)
        got = []
        for ev in w:
            got.append(ev.seq)  # type: ignore[union-attr]
            if len(got) == 2:
                break
        assert got == [1, 2] and w.reconnects == 3
    assert [decode_composite_id(h["last-event-id"]) for h in streams.gets] == [
        {"a": 0},
        {"a": 1},
        {"a": 1},
        {"a": 1},
    ]


def test_heartbeats_keep_a_quiet_watch_alive_past_its_reconnect_timeout() -> None:
    """`reconnect_timeout` counts from the last sign of life (a heartbeat included),
    not from the last event: a quiet live tail survives a dropped connection."""

    def quiet() -> Iterator[bytes]:
        for _ in range(6):
            time.sleep(0.1)
            yield b": hb\n\n"

    streams = _Streams(
        httpx.Response(200, content=_sse(_record(1))),
        httpx.Response(200, content=quiet()),
        httpx.Response(200, content=_sse(_record(2))),
    )
    with Client("http://server.test", transport=httpx.MockTransport(streams)) as c:
        got = []
        for ev in c.watch(["a"], reconnect_timeout=0.3):
            got.append(ev.seq)  # type: ignore[union-attr]
            if len(got) == 2:
                break
    assert got == [1, 2]


def test_an_async_watch_retries_a_refused_stream_and_rewinds_too() -> None:
    import asyncio

    from topics.client import AsyncClient

    streams = _Streams(
        httpx.Response(200, content=_sse(_record(1))),
        httpx.Response(503, content=_envelope("not_ready"), headers={"retry-after": "0"}),
        httpx.Response(200, content=_sse(_record(2))),
    )

    async def main() -> tuple[list[int], int]:
        got: list[int] = []
        transport = httpx.MockTransport(streams)
        async with AsyncClient("http://server.test", transport=transport) as c:
            async with c.watch(["a"], reconnect_timeout=30) as w:
                async for ev in w:
                    got.append(ev.seq)  # type: ignore[union-attr]
                    if len(got) == 2:
                        break
                return got, w.reconnects

    assert asyncio.run(main()) == ([1, 2], 2)
    assert [decode_composite_id(h["last-event-id"]) for h in streams.gets] == [
        {"a": 0},
        {"a": 1},
        {"a": 1},
    ]


def test_a_success_answer_that_is_not_json_is_a_topics_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<html><body>Welcome to nginx!</body></html>")

    with pytest.raises(TopicsError) as e, _client(handler) as c:
        c.health()
    assert e.value.code == "invalid_answer" and e.value.status == 200
    assert "Welcome to nginx!" in e.value.message and "\n" not in e.value.message
