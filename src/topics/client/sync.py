"""The synchronous client: :class:`Client`, and the iterators and helper it hands out
(:class:`Reader`, :class:`Watch`, :class:`Worker`).

docs/CLIENT.md is the guide; docs/API.md defines every route used here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
import orjson

from topics import __version__
from topics.client import _core
from topics.client._core import Call, Retry, WatchEnded, WatchState, seg
from topics.client.errors import (
    ConnectionFailed,
    NotFound,
    Throttled,
    TopicNotFound,
    TopicsError,
    Unavailable,
    error_from_response,
)
from topics.client.models import (
    AckResult,
    AppendResult,
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
    Router,
    RouterInfo,
    RouterPage,
    Tombstone,
    TopicConfig,
    TopicInfo,
    TopicPage,
    TopicState,
    WatchSession,
)
from topics.client.worker import WorkerStats, lease_interval_s

__all__ = ["Client", "Reader", "Watch", "Worker"]

log = logging.getLogger("topics.client")

Json = dict[str, Any]


def _describe(e: httpx.TransportError) -> str:
    return str(e) or type(e).__name__


class Client:
    """A synchronous client of one server's `/v0` API, over one httpx connection pool.

    `url` defaults to ``$TOPICS_URL``, else ``http://127.0.0.1:4000``; `token`
    to ``$TOPICS_TOKEN`` (sent as ``Authorization: Bearer``; none when unset,
    for a server without keys: docs/API.md, "2.1 Keys"). `timeout` is the
    per-request timeout in seconds (a diff's long-poll is added to it).

    Retries: a ``429`` or ``503`` answer is retried up to `retries` times,
    after the ``Retry-After`` the server sent (at most `max_retry_wait`
    seconds); a refused request changed nothing, so this is always safe
    (docs/API.md, "3.1 The envelope"). A connection failure is retried only
    where repeating the request cannot apply it twice: reads, PUTs, router
    deletes, `before_seq` deletes, and appends that carry an idempotency key
    (not topic deletes, tag deletes or claims). With `auto_idempotency` (the
    default) every append without a key of its own gets a fresh one, so its
    retries are safe too (docs/API.md, "7.2 Idempotent writes").

    Every method raises a :class:`~topics.client.errors.TopicsError`
    subclass picked by the error code, or
    :class:`~topics.client.errors.ConnectionFailed` when no answer came.
    Safe to share between threads. Use it as a context manager, or call
    :meth:`close`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        max_retry_wait: float = 30.0,
        auto_idempotency: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = _core.resolve_url(url)
        self._token = _core.resolve_token(token)
        headers = {"user-agent": f"topics-client/{__version__}"}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.retry = Retry(retries=retries, max_wait_s=max_retry_wait)
        self.auto_idempotency = auto_idempotency

    def close(self) -> None:
        """Close the connection pool (open watches and readers stop working)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------

    def _send(self, call: Call, *, extra_timeout: float = 0.0) -> tuple[int, Json, int]:
        """(status, JSON body, attempts) of a 2xx answer; raises otherwise."""
        headers = dict(call.headers or {})
        content = call.content()
        if content is not None:
            headers["content-type"] = "application/json"
        timeout = self._timeout + extra_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                r = self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    content=content,
                    headers=headers,
                    timeout=timeout,
                )
            except httpx.TransportError as e:
                unsent = isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)
                if (call.safe or unsent) and attempt <= self.retry.retries:
                    wait = self.retry.delay(attempt, None)
                    log.debug("%s %s: %s; retry in %.2f s", call.method, call.path, e, wait)
                    time.sleep(wait)
                    continue
                raise ConnectionFailed(
                    f"{call.method} {self.url}{call.path}: {_describe(e)}"
                ) from e
            if r.status_code < 300:
                return r.status_code, _core.answer_body(r.status_code, r.content), attempt
            err = error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
            if r.status_code in _core.RETRYABLE_STATUS and attempt <= self.retry.retries:
                wait = self.retry.delay(attempt, err)
                log.debug("%s %s: %s; retry in %.2f s", call.method, call.path, err, wait)
                time.sleep(wait)
                continue
            raise err

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        safe: bool = True,
    ) -> Json:
        """Any `/v0` route: the JSON answer, errors raised as for every method.

        The body is `json` encoded, or `content` (JSON already encoded) as it is.
        A transport failure is retried when `safe` (the default; see the class):
        pass False for a write without an idempotency key.
        """
        body = content if content is not None else json
        return self._send(Call(method, path, dict(params) if params else None, body, safe=safe))[1]

    # -- probes and metrics (docs/API.md, "15. Health, readiness and metrics") --------

    def health(self) -> Health:
        """`GET /v0/health`: status, version, uptime (ms)."""
        return _core.health(self._send(Call("GET", "/v0/health"))[1])

    def ready(self) -> Readiness:
        """`GET /v0/ready`, never retried and never raising for `503 not_ready`:
        the answer says whether the log replay is done (and its progress if not)."""
        try:
            r = self._http.get("/v0/ready")
        except httpx.TransportError as e:
            raise ConnectionFailed(f"GET {self.url}/v0/ready: {_describe(e)}") from e
        if r.status_code not in (200, 503):
            raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
        return _core.readiness(r.status_code, orjson.loads(r.content) if r.content else {})

    def metrics(self) -> Json:
        """`GET /v0/metrics` in its JSON form (``Accept: application/json``)."""
        return self._send(Call("GET", "/v0/metrics", headers={"accept": "application/json"}))[1]

    def metrics_text(self) -> str:
        """`GET /v0/metrics` as Prometheus text."""
        try:
            r = self._http.get("/v0/metrics")
        except httpx.TransportError as e:
            raise ConnectionFailed(f"GET {self.url}/v0/metrics: {_describe(e)}") from e
        if r.status_code >= 300:
            raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
        return r.text

    # -- topics (docs/API.md, "6. Topics") ---------------------------------------------

    def put_topic(
        self, topic: str, config: TopicConfig | Mapping[str, Any] | None = None, **fields: Any
    ) -> PutTopicResult:
        """`PUT /v0/topics/:topic`: create the topic, or replace its whole config.

        `config` (a :class:`TopicConfig` or a mapping) and keyword `fields` are
        merged; a field left out goes back to its default (docs/API.md, "5. The
        topic config object"). Raises BadRequest for an invalid name or config,
        TopicExistsIncompatible for another `type`, Forbidden without `admin`.
        """
        body = _core.config_body(config, **fields)
        return _core.put_topic_result(
            self._send(Call("PUT", f"/v0/topics/{seg(topic)}", None, body))[1]
        )

    create_topic = put_topic

    def update_config(self, topic: str, **changes: Any) -> PutTopicResult:
        """Change some config fields and keep the others: reads the config, applies
        `changes`, PUTs the result. Not atomic against another writer of the same
        config. Raises TopicNotFound, and ValueError for an unknown field."""
        current = self.get_topic(topic, touch=False).config
        body = _core.merged_config(current, changes)
        return _core.put_topic_result(
            self._send(Call("PUT", f"/v0/topics/{seg(topic)}", None, body))[1]
        )

    def get_topic(self, topic: str, *, touch: bool = True) -> TopicState:
        """`GET /v0/topics/:topic`: the topic's state. `touch` counts it as a read (for
        priority). Raises TopicNotFound."""
        params = None if touch else {"touch": "false"}
        return TopicState.from_json(self._send(Call("GET", f"/v0/topics/{seg(topic)}", params))[1])

    def topic_exists(self, topic: str) -> bool:
        """Whether the topic exists (a state read that does not count as a read)."""
        try:
            self.get_topic(topic, touch=False)
        except TopicNotFound:
            return False
        return True

    def list_topics_page(
        self, prefix: str | None = None, *, page_size: int = 100, cursor: str | None = None
    ) -> TopicPage:
        """One page of `GET /v0/topics` (names in byte order; `page_size` 1-1000)."""
        return _core.topic_page(self._send(_core.list_topics_call(prefix, page_size, cursor))[1])

    def list_topics(
        self, prefix: str | None = None, *, page_size: int = 100
    ) -> Iterator[TopicInfo]:
        """Every topic (whose name starts with `prefix`), fetching pages as it goes."""
        cursor: str | None = None
        while True:
            page = self.list_topics_page(prefix, page_size=page_size, cursor=cursor)
            yield from page.topics
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def delete_topic(self, topic: str, *, if_empty: bool = False) -> DeleteTopicResult:
        """`DELETE /v0/topics/:topic`, with its routers. A missing topic is not an error
        (`deleted` False). `if_empty` raises TopicNotEmpty when records are live."""
        params = {"if_empty": "true"} if if_empty else None
        return _core.delete_topic_result(
            # Not repeated after a lost answer: the topic may have been created again since.
            self._send(Call("DELETE", f"/v0/topics/{seg(topic)}", params, safe=False))[1]
        )

    # -- writing (docs/API.md, "7. Appending records") -----------------------------------

    def append(
        self,
        topic: str,
        records: Iterable[Any],
        *,
        idempotency_key: str | None = None,
        node: str | None = None,
        create: bool | None = None,
        config: TopicConfig | Mapping[str, Any] | None = None,
        return_seqs: bool = True,
        disable_backpressure: bool = False,
    ) -> AppendResult:
        """`POST /v0/topics/:topic`: append one atomic batch (1-10000 records).

        Each item of `records` is a record object (a mapping with `data` and
        optionally `tag`, `node`, `meta`) or any other JSON value, taken as the
        `data`. `node` names the writer for records that have none. `create`
        True creates a missing topic, False refuses it (TopicNotFound), None
        creates it unless `config` says ``auto_create: false``; `config` applies
        only when this write creates the topic (it needs `admin`).

        The batch is sent under `idempotency_key` (a fresh one when None and
        `auto_idempotency` is on), so a retry after a lost answer returns the
        first write (`deduped` True) instead of appending twice, within the
        topic's `idempotency_window_ms`. Raises BadRequest / BatchTooLarge /
        RecordTooLarge, TopicNotFound, TopicFull (422), Throttled when retries
        run out, InsufficientStorage (507).
        """
        key = idempotency_key
        if key is None and self.auto_idempotency:
            key = _core.new_idempotency_key()
        call = _core.append_call(
            topic,
            records,
            idempotency_key=key,
            node=node,
            create=create,
            config=config,
            return_seqs=return_seqs,
            disable_backpressure=disable_backpressure,
        )
        _s, body, attempts = self._send(call)
        return AppendResult.from_json(body, key=key, attempts=attempts)

    def append_one(
        self,
        topic: str,
        data: Any,
        *,
        tag: str | None = None,
        node: str | None = None,
        meta: Any = None,
        idempotency_key: str | None = None,
        create: bool | None = None,
    ) -> AppendResult:
        """Append one record whose `data` is `data`; its seq is the result's `first_seq`."""
        rec: dict[str, Any] = {"data": data}
        if tag is not None:
            rec["tag"] = tag
        if node is not None:
            rec["node"] = node
        if meta is not None:
            rec["meta"] = meta
        return self.append(topic, [rec], idempotency_key=idempotency_key, create=create)

    def delete_records(
        self, topic: str, *, before_seq: int | None = None, match: str | Sequence[str] | None = None
    ) -> DeleteRecordsResult:
        """`POST /v0/topics/:topic/delete`: remove records below `before_seq` and/or whose
        tag matches `match` (docs/API.md, "10. Deleting records"); readers get no tombstone."""
        body: Json = {}
        if before_seq is not None:
            body["before_seq"] = before_seq
        if match is not None:
            body["match"] = _core.tag_filter(match)
        if not body:
            raise ValueError("delete_records needs before_seq or match")
        # A tag delete covers the records stored when it runs; repeated after a lost
        # answer it would also take ones written since, so only a refused
        # connection is retried. A before_seq delete is the same when repeated.
        call = Call("POST", f"/v0/topics/{seg(topic)}/delete", None, body, safe=match is None)
        return _core.delete_records_result(self._send(call)[1])

    # -- reading (docs/API.md, "8. Reading: diff, cursors and pagination") --------------

    def diff(
        self,
        topic: str,
        from_seq: int = 0,
        *,
        limit: int = 256,
        node: str | Sequence[str] | None = None,
        include_tags: bool = False,
        include_meta: bool = True,
        wait_ms: int = 0,
        max_batch_bytes: int = 0,
    ) -> DiffPage:
        """One `POST /v0/topics/:topic/diff`: records with seq > `from_seq`.

        `limit` records at most (the server clamps it to 1000), `max_batch_bytes`
        of payload (0: 1 MiB). `wait_ms` long-polls up to that many ms (at most
        30000) when nothing is there. Raises TopicNotFound.
        """
        body = _core.diff_body(
            from_seq,
            limit=limit,
            node=node,
            include_tags=include_tags,
            include_meta=include_meta,
            wait_ms=wait_ms,
            max_batch_bytes=max_batch_bytes,
        )
        call = Call("POST", f"/v0/topics/{seg(topic)}/diff", None, body)
        return DiffPage.from_json(self._send(call, extra_timeout=wait_ms / 1000)[1])

    def read(
        self,
        topic: str,
        from_seq: int = 0,
        *,
        limit: int = _core.MAX_LIMIT,
        node: str | Sequence[str] | None = None,
        include_tags: bool = False,
        include_meta: bool = True,
        max_batch_bytes: int = 0,
        follow: bool = False,
        wait_ms: int = _core.MAX_WAIT_MS,
        max_records: int | None = None,
    ) -> Reader:
        """Records with seq > `from_seq`, page after page of diffs, as an iterator.

        Yields :class:`Record` and, where records were lost before this reader
        got to them, :class:`Tombstone` (docs/API.md, "9. Tombstones"). `limit`
        is the page size. Without `follow` it stops once caught up with the
        head; with `follow` it long-polls (`wait_ms` per request) for new
        records until closed. `max_records` stops after that many records.
        The reader's `cursor` is where to resume next time.
        """
        opts = _core.diff_body(
            0,
            limit=limit,
            node=node,
            include_tags=include_tags,
            include_meta=include_meta,
            wait_ms=0,
            max_batch_bytes=max_batch_bytes,
        )
        return Reader(self, topic, from_seq, opts, follow, wait_ms, max_records)

    # -- watch (docs/API.md, "12. Watch: multiplexed Server-Sent Events") ----------------

    def create_watch(self, body: Mapping[str, Any], *, lenient: bool = False) -> WatchSession:
        """`POST /v0/watch` with a ready body; see :meth:`watch` for the stream."""
        params = {"lenient": "true"} if lenient else None
        return WatchSession.from_json(self._send(Call("POST", "/v0/watch", params, dict(body)))[1])

    def watch(
        self,
        topics: Sequence[str] | Mapping[str, int],
        from_seq: int = 0,
        *,
        tail: bool = False,
        node: str | Sequence[str] | None = None,
        include_tags: bool = False,
        include_meta: bool = True,
        include_data: bool = True,
        limit: int = 0,
        max_batch_bytes: int = 0,
        heartbeat_ms: int = 15_000,
        lenient: bool = False,
        reconnect: bool = True,
        reconnect_on_shutdown: bool = False,
        reconnect_timeout: float | None = 60.0,
    ) -> Watch:
        """Follow several topics live over one SSE stream, as an iterator of events.

        `topics` is a list of names (each read after `from_seq`, or from its head
        with `tail`) or a mapping name -> `from_seq`. Yields :class:`Record`,
        :class:`Tombstone` (lost records; the first on each topic after a
        (re)connection says `from_seq_too_old`), :class:`CaughtUp` and
        :class:`TopicDeleted`. `limit` and `max_batch_bytes` shape frames
        (0: the server's defaults), `heartbeat_ms` the keep-alive comments.

        A dropped connection is resumed from the last frame handed out: the
        same session when it still exists, else a new one from this watch's
        cursors (after a server restart). With `reconnect` False it raises
        ConnectionFailed instead; reconnection gives up after
        `reconnect_timeout` seconds without a connection (None: never). The
        iteration ends when the server shuts down (unless
        `reconnect_on_shutdown`) and when every topic was deleted. Raises
        TopicNotFound for a missing topic unless `lenient`.
        """
        state = _watch_state(
            topics,
            from_seq,
            tail=tail,
            node=node,
            include_tags=include_tags,
            include_meta=include_meta,
            include_data=include_data,
            limit=limit,
            max_batch_bytes=max_batch_bytes,
            heartbeat_ms=heartbeat_ms,
        )
        return Watch(
            self,
            state,
            lenient=lenient,
            reconnect=reconnect,
            reconnect_on_shutdown=reconnect_on_shutdown,
            reconnect_timeout=reconnect_timeout,
            read_timeout=2 * heartbeat_ms / 1000 + 5,
        )

    # -- routers (docs/API.md, "11. Routers") ---------------------------------------------

    def put_router(
        self,
        router: str,
        source: str,
        dest: str,
        *,
        preserve_node: bool = True,
        preserve_tag: bool = True,
        create_dest: bool = True,
        filter: str | Sequence[str] | None = None,
        allow_cycle: bool = False,
        guarantee: str = "at_least_once",
    ) -> Router:
        """`PUT /v0/routers/:router`: create a router from `source` to `dest`, or update
        its options. `filter` is a tag predicate (``"order:*"``, ``["tag", "Eq", "x"]``).
        Raises TopicExistsIncompatible (fan-in, re-point), RouterCycle, TopicNotFound
        (`create_dest` False and no dest)."""
        body: Json = {
            "source": source,
            "dest": dest,
            "preserve_node": preserve_node,
            "preserve_tag": preserve_tag,
            "create_dest": create_dest,
            "filter": _core.tag_filter(filter),
            "allow_cycle": allow_cycle,
            "guarantee": guarantee,
        }
        return Router.from_json(
            self._send(Call("PUT", f"/v0/routers/{seg(router)}", None, body))[1]
        )

    def get_router(self, router: str) -> Router:
        """`GET /v0/routers/:router`, with `forwarded_total`. Raises RouterNotFound."""
        return Router.from_json(self._send(Call("GET", f"/v0/routers/{seg(router)}"))[1])

    def list_routers_page(
        self,
        prefix: str | None = None,
        *,
        source: str | None = None,
        dest: str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> RouterPage:
        """One page of `GET /v0/routers`."""
        call = _core.list_routers_call(prefix, source, dest, page_size, cursor)
        return _core.router_page(self._send(call)[1])

    def list_routers(
        self,
        prefix: str | None = None,
        *,
        source: str | None = None,
        dest: str | None = None,
        page_size: int = 100,
    ) -> Iterator[RouterInfo]:
        """Every router (filtered by name `prefix`, exact `source`, exact `dest`)."""
        cursor: str | None = None
        while True:
            page = self.list_routers_page(
                prefix, source=source, dest=dest, page_size=page_size, cursor=cursor
            )
            yield from page.routers
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def delete_router(self, router: str) -> DeleteRouterResult:
        """`DELETE /v0/routers/:router`; a missing router gives `deleted` False."""
        return _core.delete_router_result(
            self._send(Call("DELETE", f"/v0/routers/{seg(router)}"))[1]
        )

    # -- queues (docs/API.md, "14. Queues") ------------------------------------------------

    def claim(
        self, topic: str, node: str, *, max: int = 1, lease_ms: int | None = None
    ) -> ClaimResult:
        """`POST /v0/topics/:topic/claim`: lease up to `max` jobs to worker `node`
        for `lease_ms` (default: the queue's). Getting none is normal. Not retried
        after a lost answer (the leases would only run out). Raises TopicNotFound,
        NotAQueue."""
        body: Json = {"node": node, "max": max}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        call = Call("POST", f"/v0/topics/{seg(topic)}/claim", None, body, safe=False)
        return _core.claim_result(topic, self._send(call)[1])

    def ack(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        *,
        lease_ids: Sequence[str] | None = None,
    ) -> AckResult:
        """`POST .../ack`: the jobs are done and deleted. Give :class:`Job` objects (their
        lease ids fence the ack) or seqs (with optional `lease_ids`). Seqs not held by
        `node` come back in `skipped`."""
        body = _core.lease_body(node, seqs, lease_ids)
        return _core.ack_result(
            self._send(Call("POST", f"/v0/topics/{seg(topic)}/ack", None, body))[1]
        )

    def nack(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        *,
        lease_ids: Sequence[str] | None = None,
        delay_ms: int = 0,
    ) -> NackResult:
        """`POST .../nack`: give the jobs back, claimable again after `delay_ms` ms."""
        body = _core.lease_body(node, seqs, lease_ids)
        if delay_ms:
            body["delay_ms"] = delay_ms
        return _core.nack_result(
            self._send(Call("POST", f"/v0/topics/{seg(topic)}/nack", None, body))[1]
        )

    def extend(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        lease_ms: int,
        *,
        lease_ids: Sequence[str] | None = None,
    ) -> ExtendResult:
        """`POST .../extend`: move the leases' deadlines to now + `lease_ms` ms. Expired
        leases cannot be extended: they come back in `skipped`."""
        body = _core.lease_body(node, seqs, lease_ids)
        body["lease_ms"] = lease_ms
        call = Call("POST", f"/v0/topics/{seg(topic)}/extend", None, body)
        return _core.extend_result(self._send(call)[1])

    def worker(
        self,
        topic: str,
        node: str,
        *,
        lease_ms: int | None = None,
        batch: int = 1,
        extend_every_ms: int | None = None,
        idle_wait_ms: int = 500,
        nack_delay_ms: int = 0,
    ) -> Worker:
        """A :class:`Worker` taking jobs from queue `topic` as `node`."""
        return Worker(
            self,
            topic,
            node,
            lease_ms=lease_ms,
            batch=batch,
            extend_every_ms=extend_every_ms,
            idle_wait_ms=idle_wait_ms,
            nack_delay_ms=nack_delay_ms,
        )


def _watch_state(
    topics: Sequence[str] | Mapping[str, int],
    from_seq: int,
    *,
    tail: bool,
    node: str | Sequence[str] | None,
    include_tags: bool,
    include_meta: bool,
    include_data: bool,
    limit: int,
    max_batch_bytes: int,
    heartbeat_ms: int,
) -> WatchState:
    if isinstance(topics, str):
        raise TypeError("topics must be a list of names or a mapping name -> from_seq")
    if isinstance(topics, Mapping):
        cursors = {str(k): int(v) for k, v in topics.items()}
        tails: set[str] = set()
    else:
        cursors = dict.fromkeys(topics, from_seq)
        tails = set(cursors) if tail else set()
    if not cursors:
        raise ValueError("watch needs at least one topic")
    opts: Json = {
        "include_tags": include_tags,
        "include_meta": include_meta,
        "include_data": include_data,
        "heartbeat_ms": heartbeat_ms,
    }
    if node is not None:
        opts["node"] = node if isinstance(node, str) else list(node)
    if limit:
        opts["limit"] = limit
    if max_batch_bytes:
        opts["max_batch_bytes"] = max_batch_bytes
    return WatchState(cursors=cursors, tail=tails, options=opts)


class Reader:
    """An iterator over a topic's records and tombstones, a diff page at a time
    (see :meth:`Client.read`).

    `cursor` is the seq up to which this reader has handed everything out (or
    stepped over it): pass it as `from_seq` to carry on later. `head_seq` and
    `caught_up` describe the last page fetched.
    """

    def __init__(
        self,
        client: Client,
        topic: str,
        from_seq: int,
        opts: Json,
        follow: bool,
        wait_ms: int,
        max_records: int | None,
    ) -> None:
        self.client = client
        self.topic = topic
        self.cursor = from_seq
        self.head_seq = 0
        self.caught_up = False
        self.records = 0
        self._opts = opts
        self._follow = follow
        self._wait_ms = min(max(wait_ms, 0), _core.MAX_WAIT_MS)
        self._max = max_records
        self._buf: deque[tuple[Record | Tombstone, int]] = deque()
        self._done = max_records is not None and max_records <= 0

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Record | Tombstone:
        while not self._buf:
            if self._done:
                raise StopIteration
            self._fetch()
        item, cursor = self._buf.popleft()
        self.cursor = cursor
        if isinstance(item, Record):
            self.records += 1
            if self._max is not None and self.records >= self._max:
                self._done = True
                self._buf.clear()
        return item

    def _fetch(self) -> None:
        wait = self._wait_ms if self._follow and self.caught_up else 0
        body = dict(self._opts, from_seq=self.cursor)
        if wait:
            body["wait_ms"] = wait
        call = Call("POST", f"/v0/topics/{seg(self.topic)}/diff", None, body)
        page = DiffPage.from_json(self.client._send(call, extra_timeout=wait / 1000)[1])
        self._take(page)

    def _take(self, page: DiffPage) -> None:
        self.head_seq = page.head_seq
        self.caught_up = page.caught_up
        items = _core.diff_items(page, self.cursor)  # the cursor it was read from
        self._buf.extend(items)
        if not items:
            self.cursor = page.next_from_seq
        if page.caught_up and not self._follow:
            self._done = True


class Watch:
    """The events of a watch (see :meth:`Client.watch`); iterate it once.

    `cursors` maps each watched topic to the seq its events have reached (give
    it back to :meth:`Client.watch` to resume in a later process); `wid` is the
    current session, `reconnects` counts the connections after the first, and
    `ended_by` says why the iteration stopped ("shutdown", "deleted", or
    "closed"). :meth:`close` (or leaving a ``with`` block) stops it.
    """

    def __init__(
        self,
        client: Client,
        state: WatchState,
        *,
        lenient: bool,
        reconnect: bool,
        reconnect_on_shutdown: bool,
        reconnect_timeout: float | None,
        read_timeout: float,
    ) -> None:
        self.client = client
        self._state = state
        self._lenient = lenient
        self._reconnect = reconnect
        self._on_shutdown = reconnect_on_shutdown
        self._give_up = reconnect_timeout
        self._read_timeout = read_timeout
        self._closed = False
        self._response: httpx.Response | None = None
        #: When the stream last showed the server alive: connected, or any line read.
        self._last_ok = time.monotonic()
        self.reconnects = 0
        self.ended_by: str | None = None

    @property
    def cursors(self) -> dict[str, int]:
        return dict(self._state.cursors)

    @property
    def wid(self) -> str | None:
        return self._state.wid

    def close(self) -> None:
        """Stop the watch: the open stream is closed and the iteration ends."""
        self._closed = True
        r = self._response
        if r is not None:
            _core.interrupt(r.extensions)
            r.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        st = self._state
        yield from st.started(
            self.client._send(
                Call(
                    "POST",
                    "/v0/watch",
                    {"lenient": "true"} if self._lenient else None,
                    st.session_body(),
                )
            )[1]
        )
        retry = self.client.retry
        failures = 0
        self._last_ok = time.monotonic()
        while not self._closed:
            if not st.cursors:
                self.ended_by = "deleted"
                return
            try:
                for ev in self._stream():
                    failures = 0
                    yield ev
                if not st.cursors:
                    continue
                if self._closed:
                    break
                problem: BaseException = ConnectionFailed("the watch stream ended")
            except WatchEnded as e:
                if e.reason == "shutdown" and self._on_shutdown and not self._closed:
                    st.shutdown = False
                    problem = ConnectionFailed("the server shut down")
                else:
                    self.ended_by = e.reason
                    return
            except (httpx.TransportError, httpx.StreamError) as e:
                if self._closed:
                    break
                problem = ConnectionFailed(f"watch stream: {e or type(e).__name__}")
                problem.__cause__ = e
            except ConnectionFailed as e:
                problem = e
            except (Throttled, Unavailable) as e:
                # Too many streams, or the server replaying its log after a restart:
                # nothing was lost, try again once it says it is ready.
                problem = e
            except NotFound as e:
                if e.code != "not_found":
                    raise
                st.wid = None  # the session is gone (expired, or the server restarted)
                continue
            if not self._reconnect:
                raise problem
            if self._give_up is not None and time.monotonic() - self._last_ok > self._give_up:
                raise problem
            failures += 1
            self.reconnects += 1
            wait = retry.delay(
                min(failures, 6), problem if isinstance(problem, TopicsError) else None
            )
            log.info("watch: %s; reconnecting in %.2f s", problem, wait)
            time.sleep(wait)
        self.ended_by = "closed"

    def _stream(self) -> Iterator[Event]:
        st = self._state
        if st.wid is None:
            body = st.session_body()
            yield from st.started(
                self.client._send(Call("POST", "/v0/watch", {"lenient": "true"}, body))[1]
            )
            if not st.cursors:
                return
        headers = {"accept": "text/event-stream"}
        # Always rewind to what was handed out: frames sent before a drop may not
        # have reached this watch, whole or in part.
        headers["last-event-id"] = st.resume_id()
        timeout = httpx.Timeout(self.client._timeout, read=self._read_timeout)
        with self.client._http.stream(
            "GET", f"/v0/watch/{st.wid}", headers=headers, timeout=timeout
        ) as r:
            if r.status_code >= 300:
                r.read()
                raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
            self._response = r
            self._last_ok = time.monotonic()  # connected
            try:
                parser = _core.SseParser()
                for line in r.iter_lines():
                    self._last_ok = time.monotonic()  # a heartbeat counts too
                    frame = parser.feed(line)
                    if frame is None:
                        continue
                    yield from st.frame(frame)
                    if not st.cursors:
                        raise WatchEnded("deleted")
            finally:
                self._response = None


class Worker:
    """Takes jobs from a queue and keeps their leases alive while they are handled
    (docs/API.md, "14. Queues").

    :meth:`run` claims up to `batch` jobs at a time for `lease_ms` (default: the
    queue's `lease_ms`), calls the handler with each :class:`Job`, acks it when
    the handler returns and nacks it (claimable again after `nack_delay_ms`)
    when the handler raises. Meanwhile a background thread extends every held
    lease every `extend_every_ms` (default: a third of the lease), so a job
    may take longer than its lease. A lease that could not be extended (it ran
    out first, say) is reported by :meth:`lost`; its ack is then skipped by the
    server and counted in `stats.lost`. Delivery stays at-least-once: handlers
    must tolerate a repeat.
    """

    def __init__(
        self,
        client: Client,
        topic: str,
        node: str,
        *,
        lease_ms: int | None = None,
        batch: int = 1,
        extend_every_ms: int | None = None,
        idle_wait_ms: int = 500,
        nack_delay_ms: int = 0,
    ) -> None:
        self.client = client
        self.topic = topic
        self.node = node
        self.lease_ms = lease_ms
        self.batch = max(1, batch)
        self.extend_every_ms = extend_every_ms
        self.idle_wait_ms = idle_wait_ms
        self.nack_delay_ms = nack_delay_ms
        self.stats = WorkerStats()
        self._held: dict[int, Job] = {}
        self._lost: set[tuple[int, str]] = set()  # (seq, lease_id)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the job in hand (from any thread)."""
        self._stop.set()

    def lost(self, job: Job) -> bool:
        """Whether `job`'s lease could not be kept (another worker may get it)."""
        with self._lock:
            return (job.seq, job.lease_id) in self._lost

    def run(
        self,
        handler: Callable[[Job], object],
        *,
        max_jobs: int | None = None,
        stop_when_empty: bool = False,
    ) -> WorkerStats:
        """Handle jobs until :meth:`stop`, `max_jobs` handled, or (with
        `stop_when_empty`) a claim that finds none; returns the counts.

        Errors of the server or the connection while claiming propagate; a
        handler's exception is logged, counted in `stats.failed` and nacks
        the job.
        """
        self._stop.clear()
        lease_ms = self.lease_ms
        if lease_ms is None:
            lease_ms = self.client.get_topic(self.topic, touch=False).config.lease_ms
        interval = lease_interval_s(lease_ms, self.extend_every_ms)
        keeper = threading.Thread(
            target=self._keep,
            args=(lease_ms, interval),
            name=f"topics-lease-{self.topic}",
            daemon=True,
        )
        keeper.start()
        try:
            while not self._stop.is_set():
                want = self.batch
                if max_jobs is not None:
                    want = min(want, max_jobs - self.stats.handled)
                    if want <= 0:
                        break
                got = self.client.claim(self.topic, self.node, max=want, lease_ms=lease_ms)
                if not got.jobs:
                    if stop_when_empty:
                        break
                    self._stop.wait(self.idle_wait_ms / 1000)
                    continue
                with self._lock:
                    for job in got.jobs:
                        self._held[job.seq] = job
                for job in got.jobs:
                    self._handle(job, handler)
        finally:
            self._stop.set()
            keeper.join()
            with self._lock:
                left = list(self._held.values())
                self._held.clear()
            if left:  # claimed but not handled (stopped): give them back at once
                try:
                    self.client.nack(self.topic, self.node, left)
                except TopicsError as e:
                    log.warning("worker: could not give back %d job(s): %s", len(left), e)
        return self.stats

    def _handle(self, job: Job, handler: Callable[[Job], object]) -> None:
        if self._stop.is_set():
            return  # stopping: the job goes back with the others
        try:
            handler(job)
        except Exception:
            log.exception("worker: job %s of %s failed", job.seq, self.topic)
            self._settle(job, ok=False)
        else:
            self._settle(job, ok=True)

    def _settle(self, job: Job, *, ok: bool) -> None:
        with self._lock:
            self._held.pop(job.seq, None)
        self.stats.handled += 1
        try:
            if ok:
                r = self.client.ack(self.topic, self.node, [job])
                self.stats.acked += r.acked
                skipped = bool(r.skipped)
            else:
                n = self.client.nack(self.topic, self.node, [job], delay_ms=self.nack_delay_ms)
                self.stats.failed += 1
                skipped = bool(n.skipped)
        except TopicsError as e:
            log.warning("worker: settling job %s of %s failed: %s", job.seq, self.topic, e)
            skipped = True
        if skipped:
            self.stats.lost += 1
            with self._lock:
                self._lost.add((job.seq, job.lease_id))

    def _keep(self, lease_ms: int, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                jobs = list(self._held.values())
            if not jobs:
                continue
            try:
                r = self.client.extend(self.topic, self.node, jobs, lease_ms)
            except TopicsError as e:
                log.warning("worker: extending %d lease(s) failed: %s", len(jobs), e)
                continue
            self.stats.extends += 1
            if r.skipped:
                with self._lock:
                    self._lost.update(_core.lost_leases(jobs, r.skipped))
