"""topics.client without a server: retry decisions (httpx.MockTransport answers),
the error mapping, the SSE parser and the watch's cursor bookkeeping."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from topics.client import (
    BadRequest,
    Client,
    ConnectionFailed,
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
from topics.client._core import SseFrame, SseParser, WatchEnded, WatchState
from topics.client.errors import error_from_response

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
    assert st.cursors == {"a": 3, "b": 2} and st.last_event_id == "id2"  # recreated: moved back
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
