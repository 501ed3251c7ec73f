"""What the sync and async clients share: settings, request building, answer
parsing, retry decisions, the SSE parser and the watch's cursor bookkeeping.
Nothing here does I/O.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import orjson

from topics.client.errors import TopicsError, unreadable_answer
from topics.client.models import (
    AckResult,
    CaughtUp,
    ClaimResult,
    DeleteRecordsResult,
    DeleteRouterResult,
    DeleteTopicResult,
    DiffPage,
    Event,
    ExtendResult,
    Health,
    Job,
    NackResult,
    PutTopicResult,
    Readiness,
    Record,
    RouterInfo,
    RouterPage,
    Tombstone,
    TopicConfig,
    TopicDeleted,
    TopicInfo,
    TopicPage,
)
from topics.cursor_id import encode_composite_id

DEFAULT_URL = "http://127.0.0.1:4000"
#: The server's batch limit (docs/API.md, "16. Limits and the knobs that shape the API").
MAX_BATCH_RECORDS = 10_000
#: Records per diff page and per watch frame at most (`TOPICS_MAX_LIMIT`).
MAX_LIMIT = 1000
#: Queue seqs per ack/nack/extend at most (`TOPICS_MAX_CLAIM`).
MAX_QUEUE_SEQS = 1000
#: The longest long-poll a diff takes (docs/API.md, "8.1").
MAX_WAIT_MS = 30_000
#: Config fields a PUT accepts (docs/API.md, "5. The topic config object").
CONFIG_FIELDS = tuple(TopicConfig.__dataclass_fields__)
_RECORD_KEYS = frozenset({"data", "tag", "node", "meta"})


def resolve_url(url: str | None) -> str:
    """`url`, else `$TOPICS_URL`, else http://127.0.0.1:4000; `host:port` alone gets http://.

    Raises ValueError, naming the url, when it is not http(s), has no host, has a
    port that is not a number from 1 to 65535, or is one httpx cannot use.
    """
    u = (url or os.environ.get("TOPICS_URL") or DEFAULT_URL).strip().rstrip("/")
    if "://" not in u:
        u = "http://" + u
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"server url {u!r} must start with http:// or https://")
    try:
        parts = urlsplit(u)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"server url {u!r} is not a valid url: {e}") from None
    if not parts.hostname:
        raise ValueError(f"server url {u!r} names no host")
    if port == 0:
        raise ValueError(f"server url {u!r}: port 0 cannot be connected to")
    try:
        httpx.URL(u)  # what the connection will be made with (control characters, ...)
    except httpx.InvalidURL as e:
        raise ValueError(f"server url {u!r} is not a valid url: {e}") from None
    return u


def resolve_token(token: str | None) -> str | None:
    """`token`, else `$TOPICS_TOKEN`, else None (no Authorization header)."""
    t = token if token is not None else os.environ.get("TOPICS_TOKEN")
    return t or None


def seg(name: str) -> str:
    """A topic or router name as one path segment (`>` in router names is escaped)."""
    return quote(name, safe="")


@dataclass(slots=True)
class Call:
    """One request: `body` None means no body, bytes are sent as they are (JSON
    already encoded), anything else is encoded as JSON. `safe` says a transport
    failure may be retried (the request does not change anything twice when
    repeated)."""

    method: str
    path: str
    params: dict[str, str] | None = None
    body: Any = None
    headers: dict[str, str] | None = None
    safe: bool = True

    def content(self) -> bytes | None:
        """The request body: `body` as JSON, or as it is when it is already bytes."""
        if self.body is None:
            return None
        if isinstance(self.body, bytes | bytearray):
            return bytes(self.body)
        return orjson.dumps(self.body)


@dataclass(slots=True)
class Retry:
    """How a request is retried: at most `retries` more times after a `429` or `503`
    (waiting `Retry-After`, at most `max_wait_s`) or after a transport failure of a
    safe request (doubling from `backoff_s`, at most `max_backoff_s`)."""

    retries: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    max_wait_s: float = 30.0

    def delay(self, attempt: int, err: TopicsError | None) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        if err is not None and err.retry_after is not None:
            return min(max(err.retry_after, 0.05), self.max_wait_s)
        base = min(self.backoff_s * 2.0 ** (attempt - 1), self.max_backoff_s)
        return base * (0.75 + random.random() / 2)  # jitter


RETRYABLE_STATUS = frozenset({429, 503})


def answer_body(status: int, content: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer (a non-object value as `{"value": ...}`, no
    body as `{}`); raises TopicsError `invalid_answer` when the body is not JSON."""
    try:
        body = orjson.loads(content) if content else {}
    except orjson.JSONDecodeError:
        raise unreadable_answer(status, content) from None
    return body if isinstance(body, dict) else {"value": body}


def _b(v: bool) -> str:
    return "true" if v else "false"


# -- records -------------------------------------------------------------------------


def record_body(r: Any) -> dict[str, Any]:
    """A record to write: a mapping with `data` (and optionally `tag`, `node`, `meta`)
    is taken as is; any other value is the record's `data`."""
    if isinstance(r, Record):
        out: dict[str, Any] = {"data": r.data}
        if r.tag is not None:
            out["tag"] = r.tag
        if r.node is not None:
            out["node"] = r.node
        if r.meta is not None:
            out["meta"] = r.meta
        return out
    if isinstance(r, Mapping) and "data" in r and set(r) <= _RECORD_KEYS:
        return dict(r)
    return {"data": r}


def new_idempotency_key() -> str:
    """A fresh key for one logical write (docs/API.md, "7.2 Idempotent writes")."""
    return f"auto-{uuid.uuid4().hex}"


def append_call(
    topic: str,
    records: Iterable[Any],
    *,
    idempotency_key: str | None,
    node: str | None,
    create: bool | None,
    config: TopicConfig | Mapping[str, Any] | None,
    return_seqs: bool,
    disable_backpressure: bool,
) -> Call:
    recs = [record_body(r) for r in records]
    if not recs:
        raise ValueError("append needs at least one record")
    body: dict[str, Any] = {"records": recs}
    if node is not None:
        body["node"] = node
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if create is not None:
        body["create"] = create
    if config is not None:
        body["config"] = config_body(config)
    if disable_backpressure:
        body["disable_backpressure"] = True
    params = None if return_seqs else {"return_seqs": "false"}
    # A write is safe to repeat only under an idempotency key.
    return Call("POST", f"/v0/topics/{seg(topic)}", params, body, safe=idempotency_key is not None)


def config_body(config: TopicConfig | Mapping[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """A config object to send: `config` (a TopicConfig or a mapping) updated by `fields`."""
    base: dict[str, Any] = {}
    if isinstance(config, TopicConfig):
        base = config.to_dict()
    elif config is not None:
        base = dict(config)
    base.update(fields)
    return base


# -- topics ----------------------------------------------------------------------------


def list_topics_call(prefix: str | None, page_size: int, cursor: str | None) -> Call:
    params = {"page_size": str(page_size)}
    if prefix:
        params["prefix"] = prefix
    if cursor:
        params["cursor"] = cursor
    return Call("GET", "/v0/topics", params)


def topic_page(d: Mapping[str, Any]) -> TopicPage:
    return TopicPage(
        [TopicInfo.from_json(t) for t in d.get("topics") or []], d.get("next_cursor") or None
    )


def put_topic_result(d: Mapping[str, Any]) -> PutTopicResult:
    return PutTopicResult(
        str(d["topic"]), bool(d.get("created")), TopicConfig.from_dict(d.get("config") or {})
    )


def delete_topic_result(d: Mapping[str, Any]) -> DeleteTopicResult:
    return DeleteTopicResult(
        str(d["topic"]), bool(d.get("deleted")), [str(r) for r in d.get("routers_removed") or []]
    )


def merged_config(current: TopicConfig, changes: Mapping[str, Any]) -> dict[str, Any]:
    """`current` with `changes` applied, as a PUT body. Setting `durable` without
    `durability` drops the current `durability` (which would win over it)."""
    unknown = sorted(set(changes) - set(CONFIG_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown config field(s) {', '.join(unknown)} (known: {', '.join(CONFIG_FIELDS)})"
        )
    body = current.to_dict()
    body.update(changes)
    if "durable" in changes and "durability" not in changes:
        del body["durability"]
    return body


def delete_records_result(d: Mapping[str, Any]) -> DeleteRecordsResult:
    return DeleteRecordsResult(
        str(d["topic"]),
        int(d["deleted"]),
        int(d["earliest_seq"]),
        int(d["head_seq"]),
        int(d["count"]),
        int(d["bytes"]),
    )


# -- diff ------------------------------------------------------------------------------


def diff_body(
    from_seq: int,
    *,
    limit: int,
    node: str | Sequence[str] | None,
    include_tags: bool,
    include_meta: bool,
    wait_ms: int,
    max_batch_bytes: int,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from_seq": from_seq,
        "limit": limit,
        "include_tags": include_tags,
        "include_meta": include_meta,
    }
    if node is not None:
        body["node"] = node if isinstance(node, str) else list(node)
    if wait_ms:
        body["wait_ms"] = min(wait_ms, MAX_WAIT_MS)
    if max_batch_bytes:
        body["max_batch_bytes"] = max_batch_bytes
    return body


# -- routers ---------------------------------------------------------------------------


def list_routers_call(
    prefix: str | None, source: str | None, dest: str | None, page_size: int, cursor: str | None
) -> Call:
    params = {"page_size": str(page_size)}
    for k, v in (("prefix", prefix), ("source", source), ("dest", dest), ("cursor", cursor)):
        if v:
            params[k] = v
    return Call("GET", "/v0/routers", params)


def router_page(d: Mapping[str, Any]) -> RouterPage:
    return RouterPage(
        [RouterInfo.from_json(r) for r in d.get("routers") or []], d.get("next_cursor") or None
    )


def tag_filter(f: str | Sequence[str] | None) -> Any:
    """A router filter: None, a predicate list, or a string (a final `*` makes it a
    glob; docs/API.md, "10. Deleting records" gives the forms)."""
    if f is None or isinstance(f, str):
        return f
    return list(f)


def delete_router_result(d: Mapping[str, Any]) -> DeleteRouterResult:
    return DeleteRouterResult(str(d["router"]), bool(d.get("deleted")))


# -- queues ----------------------------------------------------------------------------


def claim_result(topic: str, d: Mapping[str, Any]) -> ClaimResult:
    t = str(d.get("topic", topic))
    return ClaimResult(
        t, [Job.from_json(t, j) for j in d.get("claimed") or []], int(d.get("ready", 0))
    )


def lease_body(
    node: str, seqs: Sequence[int | Job], lease_ids: Sequence[str] | None
) -> dict[str, Any]:
    """`node`, `seqs` and `lease_ids` for ack/nack/extend: Jobs bring their lease ids."""
    plain: list[int] = []
    ids: list[str] = []
    fenced = lease_ids is not None
    for i, s in enumerate(seqs):
        if isinstance(s, Job):
            plain.append(s.seq)
            ids.append(s.lease_id)
            fenced = True
        else:
            plain.append(int(s))
            ids.append(lease_ids[i] if lease_ids is not None else "")
    if len(plain) > MAX_QUEUE_SEQS:
        raise ValueError(f"at most {MAX_QUEUE_SEQS} seqs per call, got {len(plain)}")
    body: dict[str, Any] = {"node": node, "seqs": plain}
    if fenced:
        body["lease_ids"] = ids
    return body


def ack_result(d: Mapping[str, Any]) -> AckResult:
    return AckResult(
        str(d["topic"]),
        int(d["acked"]),
        [int(s) for s in d.get("skipped") or []],
        int(d.get("ready", 0)),
        int(d.get("in_flight", 0)),
    )


def nack_result(d: Mapping[str, Any]) -> NackResult:
    return NackResult(
        str(d["topic"]),
        int(d["nacked"]),
        [int(s) for s in d.get("skipped") or []],
        int(d.get("ready", 0)),
        int(d.get("in_flight", 0)),
    )


def extend_result(d: Mapping[str, Any]) -> ExtendResult:
    return ExtendResult(
        str(d["topic"]),
        int(d["extended"]),
        [int(s) for s in d.get("skipped") or []],
        {int(k): int(v) for k, v in (d.get("deadlines") or {}).items()},
    )


# -- probes ----------------------------------------------------------------------------


def health(d: Mapping[str, Any]) -> Health:
    return Health(str(d.get("status", "")), str(d.get("version", "")), int(d.get("uptime_ms", 0)))


def readiness(status: int, d: Mapping[str, Any]) -> Readiness:
    if status == 200:
        return Readiness(
            ready=True,
            status=str(d.get("status", "ready")),
            topics=d.get("topics"),
            writable=bool(d.get("writable", True)),
            degraded=d.get("degraded"),
        )
    err = d.get("error") if isinstance(d.get("error"), dict) else {}
    detail = (err or {}).get("detail") or {}
    progress = detail.get("replay_progress")
    return Readiness(
        ready=False,
        status=str((err or {}).get("code", "not_ready")),
        replay_progress=float(progress) if isinstance(progress, int | float) else None,
    )


def interrupt(extensions: Mapping[str, Any]) -> None:
    """Shut the socket under a streaming response down, so a read blocked on it in
    another thread (or task) returns at once instead of at the next frame."""
    stream = extensions.get("network_stream")
    get = getattr(stream, "get_extra_info", None)
    if get is None:
        return
    sock = get("socket")
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass


# -- SSE -------------------------------------------------------------------------------


@dataclass(slots=True)
class SseFrame:
    """One Server-Sent Events frame: `event` ("message" when absent), `data` (the
    data lines joined by newlines), `id` (None when the frame had none)."""

    event: str
    data: str
    id: str | None


@dataclass(slots=True)
class SseParser:
    """Turns the stream's lines into frames (the WHATWG event-stream format)."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None
    _has_id: bool = False

    def feed(self, line: str) -> SseFrame | None:
        """Take one line (without its end); a frame when `line` ends one."""
        if line == "":
            if not self._data and not self._event:
                self._has_id = False
                return None
            frame = SseFrame(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id, self._has_id = "", [], None, False
            return frame
        if line.startswith(":"):
            return None  # a comment: the heartbeat
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
            self._has_id = True
        return None


# -- watch -----------------------------------------------------------------------------


class WatchEnded(Exception):
    """Internal: the stream ended for good (`reason` "shutdown" or "deleted")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def cursor_after(tomb: Tombstone, before: int) -> int:
    """The cursor once `tomb` is handed out, `before` being the cursor it was read from.

    Usually the tombstone's `gap_to`. A cursor beyond the topic's head (the topic
    was deleted and made again) gets a tombstone over `1..head_seq`, followed by
    the new topic's records from `earliest_seq` (docs/API.md, "9."): the cursor
    then goes to just before them, so a consumer that stops after the tombstone
    still gets them when it resumes. The case is told by `before`, not by the
    reason, which a stream's first tombstone replaces with `from_seq_too_old`.
    """
    if before > tomb.gap_to:
        return max(0, min(tomb.gap_to, tomb.earliest_seq - 1))
    return tomb.gap_to


def diff_items(page: DiffPage, from_seq: int) -> list[tuple[Record | Tombstone, int]]:
    """A diff page (read after `from_seq`): its tombstone and records, each with the
    reader's cursor once it is handed out; the last carries the page's `next_from_seq`."""
    items: list[Record | Tombstone] = []
    if page.tombstone is not None:
        items.append(page.tombstone)
    items.extend(page.records)
    last = len(items) - 1
    out: list[tuple[Record | Tombstone, int]] = []
    for i, item in enumerate(items):
        if i == last:
            at = page.next_from_seq
        elif isinstance(item, Record):
            at = item.seq
        else:
            at = cursor_after(item, from_seq)
        out.append((item, at))
    return out


def lost_leases(jobs: Iterable[Job], skipped: Iterable[int]) -> set[tuple[int, str]]:
    """The `(seq, lease_id)` leases among `jobs` whose seq the server `skipped`.

    A worker keys lost leases by lease, not by seq: the same job claimed again
    later carries a new lease, which is not lost.
    """
    gone = set(skipped)
    return {(j.seq, j.lease_id) for j in jobs if j.seq in gone}


@dataclass(slots=True)
class WatchState:
    """The cursors of a watch, as the frames it has handed out moved them
    (docs/API.md, "12.3 Frames"), and what a new session needs to resume."""

    cursors: dict[str, int]
    tail: set[str]
    options: dict[str, Any]
    wid: str | None = None
    shutdown: bool = False

    def session_body(self) -> dict[str, Any]:
        """The `POST /v0/watch` body: each topic from its cursor (or its head, for a
        topic that asked for `tail` and has seen no frame yet)."""
        topics: dict[str, Any] = {}
        for name, cur in self.cursors.items():
            topics[name] = {"tail": True} if name in self.tail else {"from_seq": cur}
        return {"topics": topics, **self.options}

    def started(self, session: Mapping[str, Any]) -> list[Event]:
        """A session was created: tail cursors become real ones; topics the server
        left out (gone meanwhile, under `lenient`) are reported deleted."""
        self.wid = str(session["wid"])
        starts = session.get("topics") or {}
        gone: list[Event] = []
        for name in list(self.cursors):
            st = starts.get(name)
            if st is None:
                del self.cursors[name]
                self.tail.discard(name)
                gone.append(TopicDeleted(name))
            elif name in self.tail:
                self.cursors[name] = int(st["from_seq"])
                self.tail.discard(name)
        return gone

    def frame(self, f: SseFrame) -> Iterator[Event]:
        """The events of one frame, one at a time, each topic's cursor moved as each
        event is handed out: to a record's own seq, and to the frame's `to_seq`
        with its last record (docs/CLIENT.md, "Watching topics live"). A consumer
        that stops in the middle of a frame keeps a cursor that covers exactly the
        events it got, so resuming from it skips nothing.

        Raises WatchEnded on the shutdown frame, TopicsError on another error
        frame. (Ending the watch after the frame that removed the last topic is
        the caller's part.)
        """
        if f.event == "error":
            try:
                code = orjson.loads(f.data).get("code")
            except (orjson.JSONDecodeError, AttributeError):
                code = None
            if code == "server_shutting_down":
                self.shutdown = True
                raise WatchEnded("shutdown")
            raise TopicsError(0, str(code or "stream_error"), f.data)
        try:
            d = orjson.loads(f.data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(d, dict) or "topic" not in d:
            return
        topic = str(d["topic"])
        if f.event == "record":
            records = [Record.from_json(topic, r) for r in d.get("records") or []]
            to_seq = int(d.get("to_seq", 0))
            last = len(records) - 1
            for i, rec in enumerate(records):
                self._move(topic, to_seq if i == last else rec.seq)
                yield rec
            if not records:  # every record filtered out: the cursor still moves
                self._move(topic, to_seq)
        elif f.event == "tombstone":
            tomb = Tombstone.from_json(topic, d)
            self._move(topic, cursor_after(tomb, self.cursors.get(topic, 0)))
            yield tomb
        elif f.event == "caught-up":
            head = int(d.get("head_seq", 0))
            self._move(topic, head)
            yield CaughtUp(topic, head)
        elif f.event == "topic-deleted":
            self.cursors.pop(topic, None)
            self.tail.discard(topic)
            yield TopicDeleted(topic)

    def resume_id(self) -> str:
        """The `Last-Event-ID` that rewinds a session to this watch's cursors: what
        it handed out, which may be less than the frames the server sent before a
        connection broke (docs/API.md, "12.2", "12.3"; the server only ever moves a
        cursor back)."""
        return encode_composite_id(self.cursors)

    def _move(self, topic: str, seq: int) -> None:
        # The server's cursor, as sent: a `recreated` tombstone moves it back.
        if topic in self.cursors:
            self.tail.discard(topic)
            self.cursors[topic] = seq
