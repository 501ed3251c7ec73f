"""The asyncio client: :class:`AsyncClient`, the same API as
:class:`topics.client.Client` with coroutines and async iterators
(:class:`AsyncReader`, :class:`AsyncWatch`, :class:`AsyncWorker`).

docs/CLIENT.md is the guide; docs/API.md defines every route used here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
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
from topics.client.sync import _watch_state
from topics.client.worker import WorkerStats, lease_interval_s

__all__ = ["AsyncClient", "AsyncReader", "AsyncWatch", "AsyncWorker"]

log = logging.getLogger("topics.client")

Json = dict[str, Any]


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__


class AsyncClient:
    """An asyncio client of one server's `/v0` API.

    Same arguments, retries, errors and methods as
    :class:`topics.client.Client`; every request method is a coroutine, and
    :meth:`read`, :meth:`watch`, :meth:`list_topics` and :meth:`list_routers`
    return async iterators. Use it as ``async with AsyncClient() as c:``, or
    await :meth:`aclose`.
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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = _core.resolve_url(url)
        self._token = _core.resolve_token(token)
        headers = {"user-agent": f"topics-client/{__version__}"}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.retry = Retry(retries=retries, max_wait_s=max_retry_wait)
        self.auto_idempotency = auto_idempotency

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- plumbing ------------------------------------------------------------------

    async def _send(self, call: Call, *, extra_timeout: float = 0.0) -> tuple[int, Json, int]:
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
                r = await self._http.request(
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
                    await asyncio.sleep(self.retry.delay(attempt, None))
                    continue
                raise ConnectionFailed(
                    f"{call.method} {self.url}{call.path}: {_describe(e)}"
                ) from e
            if r.status_code < 300:
                return r.status_code, _core.answer_body(r.status_code, r.content), attempt
            err = error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
            if r.status_code in _core.RETRYABLE_STATUS and attempt <= self.retry.retries:
                await asyncio.sleep(self.retry.delay(attempt, err))
                continue
            raise err

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        safe: bool = True,
    ) -> Json:
        """Any `/v0` route: the JSON answer (see :meth:`topics.client.Client.request`,
        which takes the same arguments)."""
        body = content if content is not None else json
        call = Call(method, path, dict(params) if params else None, body, safe=safe)
        return (await self._send(call))[1]

    # -- probes and metrics ----------------------------------------------------------

    async def health(self) -> Health:
        """`GET /v0/health`."""
        return _core.health((await self._send(Call("GET", "/v0/health")))[1])

    async def ready(self) -> Readiness:
        """`GET /v0/ready` (a `503 not_ready` is an answer, not an error)."""
        try:
            r = await self._http.get("/v0/ready")
        except httpx.TransportError as e:
            raise ConnectionFailed(f"GET {self.url}/v0/ready: {_describe(e)}") from e
        if r.status_code not in (200, 503):
            raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
        return _core.readiness(r.status_code, orjson.loads(r.content) if r.content else {})

    async def metrics(self) -> Json:
        """`GET /v0/metrics`, JSON form."""
        call = Call("GET", "/v0/metrics", headers={"accept": "application/json"})
        return (await self._send(call))[1]

    async def metrics_text(self) -> str:
        """`GET /v0/metrics`, Prometheus text."""
        try:
            r = await self._http.get("/v0/metrics")
        except httpx.TransportError as e:
            raise ConnectionFailed(f"GET {self.url}/v0/metrics: {_describe(e)}") from e
        if r.status_code >= 300:
            raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
        return r.text

    # -- topics ------------------------------------------------------------------------

    async def put_topic(
        self, topic: str, config: TopicConfig | Mapping[str, Any] | None = None, **fields: Any
    ) -> PutTopicResult:
        """`PUT /v0/topics/:topic` (see :meth:`topics.client.Client.put_topic`)."""
        body = _core.config_body(config, **fields)
        call = Call("PUT", f"/v0/topics/{seg(topic)}", None, body)
        return _core.put_topic_result((await self._send(call))[1])

    create_topic = put_topic

    async def update_config(self, topic: str, **changes: Any) -> PutTopicResult:
        """Read the config, apply `changes`, PUT it back (not atomic)."""
        current = (await self.get_topic(topic, touch=False)).config
        body = _core.merged_config(current, changes)
        call = Call("PUT", f"/v0/topics/{seg(topic)}", None, body)
        return _core.put_topic_result((await self._send(call))[1])

    async def get_topic(self, topic: str, *, touch: bool = True) -> TopicState:
        """`GET /v0/topics/:topic`. Raises TopicNotFound."""
        params = None if touch else {"touch": "false"}
        call = Call("GET", f"/v0/topics/{seg(topic)}", params)
        return TopicState.from_json((await self._send(call))[1])

    async def topic_exists(self, topic: str) -> bool:
        """Whether the topic exists."""
        try:
            await self.get_topic(topic, touch=False)
        except TopicNotFound:
            return False
        return True

    async def list_topics_page(
        self, prefix: str | None = None, *, page_size: int = 100, cursor: str | None = None
    ) -> TopicPage:
        """One page of `GET /v0/topics`."""
        call = _core.list_topics_call(prefix, page_size, cursor)
        return _core.topic_page((await self._send(call))[1])

    async def list_topics(
        self, prefix: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[TopicInfo]:
        """Every topic (whose name starts with `prefix`)."""
        cursor: str | None = None
        while True:
            page = await self.list_topics_page(prefix, page_size=page_size, cursor=cursor)
            for t in page.topics:
                yield t
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def delete_topic(self, topic: str, *, if_empty: bool = False) -> DeleteTopicResult:
        """`DELETE /v0/topics/:topic`."""
        params = {"if_empty": "true"} if if_empty else None
        call = Call("DELETE", f"/v0/topics/{seg(topic)}", params, safe=False)  # see Client
        return _core.delete_topic_result((await self._send(call))[1])

    # -- writing -----------------------------------------------------------------------

    async def append(
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
        """`POST /v0/topics/:topic` (see :meth:`topics.client.Client.append`)."""
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
        _s, body, attempts = await self._send(call)
        return AppendResult.from_json(body, key=key, attempts=attempts)

    async def append_one(
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
        """Append one record whose `data` is `data`."""
        rec: dict[str, Any] = {"data": data}
        if tag is not None:
            rec["tag"] = tag
        if node is not None:
            rec["node"] = node
        if meta is not None:
            rec["meta"] = meta
        return await self.append(topic, [rec], idempotency_key=idempotency_key, create=create)

    async def delete_records(
        self, topic: str, *, before_seq: int | None = None, match: str | Sequence[str] | None = None
    ) -> DeleteRecordsResult:
        """`POST /v0/topics/:topic/delete`."""
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
        return _core.delete_records_result((await self._send(call))[1])

    # -- reading -----------------------------------------------------------------------

    async def diff(
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
        """One `POST /v0/topics/:topic/diff` (see :meth:`topics.client.Client.diff`)."""
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
        return DiffPage.from_json((await self._send(call, extra_timeout=wait_ms / 1000))[1])

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
    ) -> AsyncReader:
        """Records and tombstones after `from_seq` (see :meth:`topics.client.Client.read`)."""
        opts = _core.diff_body(
            0,
            limit=limit,
            node=node,
            include_tags=include_tags,
            include_meta=include_meta,
            wait_ms=0,
            max_batch_bytes=max_batch_bytes,
        )
        return AsyncReader(self, topic, from_seq, opts, follow, wait_ms, max_records)

    # -- watch -------------------------------------------------------------------------

    async def create_watch(self, body: Mapping[str, Any], *, lenient: bool = False) -> WatchSession:
        """`POST /v0/watch` with a ready body."""
        params = {"lenient": "true"} if lenient else None
        call = Call("POST", "/v0/watch", params, dict(body))
        return WatchSession.from_json((await self._send(call))[1])

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
    ) -> AsyncWatch:
        """Follow several topics over SSE (see :meth:`topics.client.Client.watch`)."""
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
        return AsyncWatch(
            self,
            state,
            lenient=lenient,
            reconnect=reconnect,
            reconnect_on_shutdown=reconnect_on_shutdown,
            reconnect_timeout=reconnect_timeout,
            read_timeout=2 * heartbeat_ms / 1000 + 5,
        )

    # -- routers -----------------------------------------------------------------------

    async def put_router(
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
        """`PUT /v0/routers/:router` (see :meth:`topics.client.Client.put_router`)."""
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
        call = Call("PUT", f"/v0/routers/{seg(router)}", None, body)
        return Router.from_json((await self._send(call))[1])

    async def get_router(self, router: str) -> Router:
        """`GET /v0/routers/:router`. Raises RouterNotFound."""
        return Router.from_json((await self._send(Call("GET", f"/v0/routers/{seg(router)}")))[1])

    async def list_routers_page(
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
        return _core.router_page((await self._send(call))[1])

    async def list_routers(
        self,
        prefix: str | None = None,
        *,
        source: str | None = None,
        dest: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[RouterInfo]:
        """Every router (filtered by name `prefix`, `source`, `dest`)."""
        cursor: str | None = None
        while True:
            page = await self.list_routers_page(
                prefix, source=source, dest=dest, page_size=page_size, cursor=cursor
            )
            for r in page.routers:
                yield r
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def delete_router(self, router: str) -> DeleteRouterResult:
        """`DELETE /v0/routers/:router`."""
        call = Call("DELETE", f"/v0/routers/{seg(router)}")
        return _core.delete_router_result((await self._send(call))[1])

    # -- queues ------------------------------------------------------------------------

    async def claim(
        self, topic: str, node: str, *, max: int = 1, lease_ms: int | None = None
    ) -> ClaimResult:
        """`POST /v0/topics/:topic/claim` (see :meth:`topics.client.Client.claim`)."""
        body: Json = {"node": node, "max": max}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        call = Call("POST", f"/v0/topics/{seg(topic)}/claim", None, body, safe=False)
        return _core.claim_result(topic, (await self._send(call))[1])

    async def ack(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        *,
        lease_ids: Sequence[str] | None = None,
    ) -> AckResult:
        """`POST .../ack`."""
        body = _core.lease_body(node, seqs, lease_ids)
        call = Call("POST", f"/v0/topics/{seg(topic)}/ack", None, body)
        return _core.ack_result((await self._send(call))[1])

    async def nack(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        *,
        lease_ids: Sequence[str] | None = None,
        delay_ms: int = 0,
    ) -> NackResult:
        """`POST .../nack`."""
        body = _core.lease_body(node, seqs, lease_ids)
        if delay_ms:
            body["delay_ms"] = delay_ms
        call = Call("POST", f"/v0/topics/{seg(topic)}/nack", None, body)
        return _core.nack_result((await self._send(call))[1])

    async def extend(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int | Job],
        lease_ms: int,
        *,
        lease_ids: Sequence[str] | None = None,
    ) -> ExtendResult:
        """`POST .../extend`."""
        body = _core.lease_body(node, seqs, lease_ids)
        body["lease_ms"] = lease_ms
        call = Call("POST", f"/v0/topics/{seg(topic)}/extend", None, body)
        return _core.extend_result((await self._send(call))[1])

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
    ) -> AsyncWorker:
        """An :class:`AsyncWorker` taking jobs from queue `topic` as `node`."""
        return AsyncWorker(
            self,
            topic,
            node,
            lease_ms=lease_ms,
            batch=batch,
            extend_every_ms=extend_every_ms,
            idle_wait_ms=idle_wait_ms,
            nack_delay_ms=nack_delay_ms,
        )


class AsyncReader:
    """The async iterator of :meth:`AsyncClient.read`; `cursor`, `head_seq` and
    `caught_up` as on :class:`topics.client.Reader`."""

    def __init__(
        self,
        client: AsyncClient,
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

    def __aiter__(self) -> AsyncReader:
        return self

    async def __anext__(self) -> Record | Tombstone:
        while not self._buf:
            if self._done:
                raise StopAsyncIteration
            await self._fetch()
        item, cursor = self._buf.popleft()
        self.cursor = cursor
        if isinstance(item, Record):
            self.records += 1
            if self._max is not None and self.records >= self._max:
                self._done = True
                self._buf.clear()
        return item

    async def _fetch(self) -> None:
        wait = self._wait_ms if self._follow and self.caught_up else 0
        body = dict(self._opts, from_seq=self.cursor)
        if wait:
            body["wait_ms"] = wait
        call = Call("POST", f"/v0/topics/{seg(self.topic)}/diff", None, body)
        page = DiffPage.from_json((await self.client._send(call, extra_timeout=wait / 1000))[1])
        self.head_seq = page.head_seq
        self.caught_up = page.caught_up
        items = _core.diff_items(page, self.cursor)  # the cursor it was read from
        self._buf.extend(items)
        if not items:
            self.cursor = page.next_from_seq
        if page.caught_up and not self._follow:
            self._done = True


class AsyncWatch:
    """The async iterator of :meth:`AsyncClient.watch`; `cursors`, `wid`,
    `reconnects` and `ended_by` as on :class:`topics.client.Watch`."""

    def __init__(
        self,
        client: AsyncClient,
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

    async def aclose(self) -> None:
        """Stop the watch."""
        self._closed = True
        r = self._response
        if r is not None:
            _core.interrupt(r.extensions)
            await r.aclose()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def __aiter__(self) -> AsyncIterator[Event]:
        st = self._state
        params = {"lenient": "true"} if self._lenient else None
        first = await self.client._send(Call("POST", "/v0/watch", params, st.session_body()))
        for ev in st.started(first[1]):
            yield ev
        retry = self.client.retry
        failures = 0
        self._last_ok = time.monotonic()
        while not self._closed:
            if not st.cursors:
                self.ended_by = "deleted"
                return
            try:
                async for ev in self._stream():
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
                problem = ConnectionFailed(f"watch stream: {_describe(e)}")
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
                st.wid = None
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
            await asyncio.sleep(wait)
        self.ended_by = "closed"

    async def _stream(self) -> AsyncIterator[Event]:
        st = self._state
        if st.wid is None:
            body = st.session_body()
            got = await self.client._send(Call("POST", "/v0/watch", {"lenient": "true"}, body))
            for ev in st.started(got[1]):
                yield ev
            if not st.cursors:
                return
        headers = {"accept": "text/event-stream"}
        # Always rewind to what was handed out: frames sent before a drop may not
        # have reached this watch, whole or in part.
        headers["last-event-id"] = st.resume_id()
        timeout = httpx.Timeout(self.client._timeout, read=self._read_timeout)
        async with self.client._http.stream(
            "GET", f"/v0/watch/{st.wid}", headers=headers, timeout=timeout
        ) as r:
            if r.status_code >= 300:
                await r.aread()
                raise error_from_response(r.status_code, r.content, r.headers.get("retry-after"))
            self._response = r
            self._last_ok = time.monotonic()  # connected
            try:
                parser = _core.SseParser()
                async for line in r.aiter_lines():
                    self._last_ok = time.monotonic()  # a heartbeat counts too
                    frame = parser.feed(line)
                    if frame is None:
                        continue
                    for ev in st.frame(frame):
                        yield ev
                    if not st.cursors:
                        raise WatchEnded("deleted")
            finally:
                self._response = None


Handler = Callable[[Job], Awaitable[object]] | Callable[[Job], object]


class AsyncWorker:
    """The asyncio form of :class:`topics.client.Worker`: a task extends the held
    leases while the handler runs. A coroutine handler is awaited; a plain
    function runs in a thread (so it cannot hold the event loop up)."""

    def __init__(
        self,
        client: AsyncClient,
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
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the job in hand."""
        self._stop.set()

    def lost(self, job: Job) -> bool:
        """Whether `job`'s lease could not be kept."""
        return (job.seq, job.lease_id) in self._lost

    async def _idle(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass

    async def run(
        self, handler: Handler, *, max_jobs: int | None = None, stop_when_empty: bool = False
    ) -> WorkerStats:
        """Handle jobs until :meth:`stop`, `max_jobs`, or (with `stop_when_empty`) an
        empty claim; see :meth:`topics.client.Worker.run`."""
        self._stop.clear()
        lease_ms = self.lease_ms
        if lease_ms is None:
            lease_ms = (await self.client.get_topic(self.topic, touch=False)).config.lease_ms
        keeper = asyncio.create_task(
            self._keep(lease_ms, lease_interval_s(lease_ms, self.extend_every_ms))
        )
        try:
            while not self._stop.is_set():
                want = self.batch
                if max_jobs is not None:
                    want = min(want, max_jobs - self.stats.handled)
                    if want <= 0:
                        break
                got = await self.client.claim(self.topic, self.node, max=want, lease_ms=lease_ms)
                if not got.jobs:
                    if stop_when_empty:
                        break
                    await self._idle(self.idle_wait_ms / 1000)
                    continue
                for job in got.jobs:
                    self._held[job.seq] = job
                for job in got.jobs:
                    if self._stop.is_set():
                        break
                    await self._handle(job, handler)
        finally:
            self._stop.set()
            keeper.cancel()
            try:
                await keeper
            except asyncio.CancelledError:
                pass
            left = list(self._held.values())
            self._held.clear()
            if left:
                try:
                    await self.client.nack(self.topic, self.node, left)
                except TopicsError as e:
                    log.warning("worker: could not give back %d job(s): %s", len(left), e)
        return self.stats

    async def _handle(self, job: Job, handler: Handler) -> None:
        try:
            if inspect.iscoroutinefunction(handler):
                await handler(job)
            else:
                out = await asyncio.to_thread(handler, job)
                if inspect.isawaitable(out):
                    await out
        except Exception:
            log.exception("worker: job %s of %s failed", job.seq, self.topic)
            ok = False
        else:
            ok = True
        self._held.pop(job.seq, None)
        self.stats.handled += 1
        try:
            if ok:
                r = await self.client.ack(self.topic, self.node, [job])
                self.stats.acked += r.acked
                skipped = bool(r.skipped)
            else:
                n = await self.client.nack(
                    self.topic, self.node, [job], delay_ms=self.nack_delay_ms
                )
                self.stats.failed += 1
                skipped = bool(n.skipped)
        except TopicsError as e:
            log.warning("worker: settling job %s of %s failed: %s", job.seq, self.topic, e)
            skipped = True
        if skipped:
            self.stats.lost += 1
            self._lost.add((job.seq, job.lease_id))

    async def _keep(self, lease_ms: int, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            jobs = list(self._held.values())
            if not jobs:
                continue
            try:
                r = await self.client.extend(self.topic, self.node, jobs, lease_ms)
            except TopicsError as e:
                log.warning("worker: extending %d lease(s) failed: %s", len(jobs), e)
                continue
            self.stats.extends += 1
            self._lost.update(_core.lost_leases(jobs, r.skipped))
