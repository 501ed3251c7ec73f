"""Reads and writes through a running server's `/v0` API (docs/SPARK.md). No pyspark import.

* :class:`Client`: the topics client (:mod:`topics.client`) with the bearer token
  (docs/API.md, "2.1 Keys"), its retries of transport errors, `429` and `503`
  (honouring `Retry-After`), and the error envelope (docs/API.md, "3.1 The
  envelope") turned into :class:`ServerError`.
* Offsets are per-topic cursors: `{"topic": seq}` where `seq` is the last seq a
  read has covered, i.e. the `from_seq` of the next `diff` (docs/API.md, "8. Reading:
  diff, cursors and pagination"). A range `(start, end]` of one topic is read
  with :func:`read_range`.
* :func:`read_range` follows Spark's Kafka source on data loss: a tombstone
  (docs/SPARK.md, "Data loss": records evicted by cap/TTL/source trim, or the topic recreated)
  raises :class:`DataLossError` with the gap when `fail_on_data_loss`, and is
  logged and skipped otherwise. Deletes a user asked for are silent (no
  tombstone), so they are never data loss.
* :class:`RecordSink`: the sink's per-partition writer; it posts chunks of
  records with idempotency keys (docs/API.md, "7.2 Idempotent writes") so a retried task replays its
  chunks instead of appending them twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from topics.spark.segments import arrow_schema

__all__ = [
    "ServerError",
    "DataLossError",
    "Client",
    "TopicRange",
    "read_range",
    "records_to_batch",
    "RecordSink",
    "SinkStats",
    "MAX_RECORDS_PER_REQUEST",
]

log = logging.getLogger(__name__)

#: The server's batch limit (docs/API.md, "16. Limits and the knobs that shape the API").
MAX_RECORDS_PER_REQUEST = 10000
#: `diff` page size: the server clamps `limit` to 1000 and `max_batch_bytes` to 8 MiB.
_DIFF_LIMIT = 1000
_DIFF_BYTES = 8 * 1024 * 1024
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$")


class ServerError(RuntimeError):
    """A non-2xx answer from the server: `status`, `code`, `message`.

    See docs/API.md, "3.3 Every error code".
    """

    def __init__(self, method: str, path: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class DataLossError(RuntimeError):
    """Records a query had not read yet are gone (a tombstone, docs/API.md, "9. Tombstones").

    Attributes: `topic`, `gap_from`, `gap_to` (inclusive seqs), `reason`
    (`cap`, `ttl`, `mixed`, `source_trim`, `recreated`, or `deleted` when the
    topic itself is gone).
    """

    def __init__(self, topic: str, gap_from: int, gap_to: int, reason: str) -> None:
        super().__init__(
            f"topic {topic}: records {gap_from}..{gap_to} were lost ({reason}) before this "
            "query read them. Set the option failOnDataLoss=false to log lost ranges and go on."
        )
        self.topic = topic
        self.gap_from = gap_from
        self.gap_to = gap_to
        self.reason = reason


def check_topic_name(name: str) -> str:
    """`name` if it is a valid topic name (docs/API.md, "1. Basics"), else ValueError."""
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{name!r} is not a valid topic name (1-255 of A-Z a-z 0-9 . _ : -, "
            "starting with a letter or digit)"
        )
    return name


class Client:
    """The Spark package's view of a server: :class:`topics.client.Client` underneath.

    `url` is the server base (`http://host:port`), `token` an API key sent as
    `Authorization: Bearer` (None: no header, for servers with auth off),
    `timeout_s` the per-request timeout, `retries` how many times a transport
    error, `429` or `503` is retried (with `Retry-After`, else a doubling
    backoff from 0.1 s capped at 2 s; the topics client's rules, docs/CLIENT.md).
    Raises ServerError for other non-2xx answers and when retries run out.
    """

    def __init__(
        self, url: str, token: str | None = None, *, timeout_s: float = 30.0, retries: int = 8
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"option url={url!r} must start with http:// or https://")
        from topics.client import Client as TopicsClient

        # An empty token means none: the Spark options never fall back to $TOPICS_TOKEN.
        self._c = TopicsClient(url.rstrip("/"), token or "", timeout=timeout_s, retries=retries)
        self.retries = retries

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, Any] | None = None,
        ok404: bool = False,
    ) -> dict[str, Any] | None:
        """The JSON answer; None for a 404 when `ok404`. Retries as the class says.

        Every request this package sends may be repeated (reads, and appends that
        carry an idempotency key), so transport failures are retried too.
        """
        from topics.client import TopicsError

        try:
            out = self._c.request(
                method,
                path,
                params={k: str(v) for k, v in (params or {}).items()} or None,
                content=body,
            )
        except TopicsError as e:
            if e.status == 404 and ok404:
                return None
            raise ServerError(method, path, e.status, e.code, e.message) from e
        return dict(out)

    # -- endpoints --------------------------------------------------------------------

    def topic_state(self, topic: str) -> dict[str, Any] | None:
        """`GET /v0/topics/:t?touch=false`, None when the topic does not exist.

        See docs/API.md, "6.2 `GET /v0/topics/:topic`".
        """
        return self.request("GET", f"/v0/topics/{topic}", params={"touch": "false"}, ok404=True)

    def list_topics(self) -> list[str]:
        """Every topic name the key may see (`GET /v0/topics`, all pages).

        See docs/API.md, "6.3 `GET /v0/topics`".
        """
        names: list[str] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"page_size": 1000}
            if cursor:
                params["cursor"] = cursor
            page = self.request("GET", "/v0/topics", params=params)
            assert page is not None
            names.extend(str(t["topic"]) for t in page.get("topics") or [])
            cursor = page.get("next_cursor")
            if not cursor:
                return names

    def diff(self, topic: str, from_seq: int, limit: int = _DIFF_LIMIT) -> dict[str, Any] | None:
        """`POST /v0/topics/:t/diff` with tags and meta; None when the topic is gone.

        See docs/API.md, "8.1 `POST /v0/topics/:topic/diff`".
        """
        body = orjson.dumps(
            {
                "from_seq": from_seq,
                "limit": limit,
                "include_tags": True,
                "include_meta": True,
                "max_batch_bytes": _DIFF_BYTES,
            }
        )
        return self.request("POST", f"/v0/topics/{topic}/diff", body=body, ok404=True)

    def append(self, topic: str, body: bytes) -> dict[str, Any]:
        """`POST /v0/topics/:t?return_seqs=false` with a ready JSON body.

        See docs/API.md, "7.1 `POST /v0/topics/:topic`".
        """
        out = self.request(
            "POST", f"/v0/topics/{topic}", body=body, params={"return_seqs": "false"}
        )
        assert out is not None
        return out


# -- reading ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRange:
    """Seqs `(start, end]` of one topic: `start` is the cursor (`from_seq`), `end` inclusive."""

    topic: str
    start: int
    end: int


def records_to_batch(
    topic: str, records: Sequence[dict[str, Any]], value_format: str
) -> pa.RecordBatch:
    """`diff` records (docs/API.md, "4. Records") as one record batch of :func:`arrow_schema`."""
    dumps = orjson.dumps
    data: list[Any]
    if value_format == "binary":
        data = [dumps(r.get("data")) for r in records]
    else:
        data = [dumps(r.get("data")).decode() for r in records]
    meta = [dumps(r["meta"]).decode() if "meta" in r else None for r in records]
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.array([r["$seq"] for r in records], pa.int64()),
            pa.array([r["$ts"] * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            pa.array([r.get("$tag") for r in records], pa.string()),
            pa.array([r.get("$node") for r in records], pa.string()),
            pa.array(meta, pa.string()),
            pa.array(data, pa.binary() if value_format == "binary" else pa.string()),
        ],
        schema=arrow_schema(value_format),
    )


def _lost(topic: str, gap_from: int, gap_to: int, reason: str, fail: bool) -> None:
    err = DataLossError(topic, gap_from, gap_to, reason)
    if fail:
        raise err
    log.warning("%s (skipped: failOnDataLoss=false)", err)


def read_range(
    client: Client, rng: TopicRange, value_format: str = "json", *, fail_on_data_loss: bool = True
) -> Iterator[pa.RecordBatch]:
    """The records of `rng` from the server, one batch per `diff` page.

    Raises DataLossError on a tombstone inside the range, or when the topic is
    gone, if `fail_on_data_loss`; otherwise logs it and reads on (a recreated
    topic ends the range: its old seqs no longer exist). ServerError propagates
    (also for a server that cannot be reached: status 0).
    """
    cur = rng.start
    while cur < rng.end:
        r = client.diff(rng.topic, cur, min(_DIFF_LIMIT, rng.end - cur))
        if r is None:
            _lost(rng.topic, cur + 1, rng.end, "deleted", fail_on_data_loss)
            return
        tomb = r.get("tombstone")
        if tomb:
            g_from, g_to = int(tomb["gap_from"]), int(tomb["gap_to"])
            reason = str(tomb.get("reason", "cap"))
            if reason == "recreated":
                _lost(rng.topic, cur + 1, rng.end, reason, fail_on_data_loss)
                return
            _lost(rng.topic, g_from, min(g_to, rng.end), reason, fail_on_data_loss)
        recs = [x for x in r["records"] if x["$seq"] <= rng.end]
        if recs:
            yield records_to_batch(rng.topic, recs, value_format)
        nxt = int(r["next_from_seq"])
        if nxt <= cur:
            if int(r.get("head_seq", 0)) < rng.end:
                # The head went below the planned end without a tombstone: the topic
                # was replaced by a younger instance between planning and reading.
                _lost(rng.topic, cur + 1, rng.end, "recreated", fail_on_data_loss)
            return
        cur = nxt


# -- writing ------------------------------------------------------------------------


@dataclass(slots=True)
class SinkStats:
    """What one sink task did: records and requests sent, and requests the server deduped."""

    records: int = 0
    requests: int = 0
    deduped: int = 0


class RecordSink:
    """Buffers one task's records per topic and posts them in chunks with idempotency keys.

    A chunk is flushed at `max_records` records or `max_bytes` of JSON body. Its
    key is `f"{key_prefix}:{topic}:{n}"` with `n` the chunk's number within the
    topic for this task, so the same input in the same order (a retried task)
    produces the same keys and the server returns the first write instead of
    appending again, within the topic's `idempotency_window_ms` (docs/API.md,
    "7.2 Idempotent writes").
    """

    def __init__(
        self,
        client: Client,
        key_prefix: str,
        *,
        max_records: int = 5000,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.max_records = max(1, min(max_records, MAX_RECORDS_PER_REQUEST))
        self.max_bytes = max_bytes
        self._buf: dict[str, list[bytes]] = {}
        self._size: dict[str, int] = {}
        self._chunk: dict[str, int] = {}
        self.stats = SinkStats()

    def add(self, topic: str, record_json: bytes) -> None:
        """Queue one record (its JSON object bytes: `data`, `tag`, `node`, `meta`)."""
        buf = self._buf.get(topic)
        if buf is None:
            check_topic_name(topic)
            buf = self._buf[topic] = []
            self._size[topic] = 0
        if buf and (
            len(buf) >= self.max_records or self._size[topic] + len(record_json) > self.max_bytes
        ):
            self._flush(topic)
            buf = self._buf[topic]
        buf.append(record_json)
        self._size[topic] += len(record_json) + 1

    def flush(self) -> SinkStats:
        """Post everything still buffered; returns the task's totals."""
        for topic in list(self._buf):
            if self._buf[topic]:
                self._flush(topic)
        return self.stats

    def _flush(self, topic: str) -> None:
        recs = self._buf[topic]
        n = self._chunk.get(topic, 0)
        self._chunk[topic] = n + 1
        key = f"{self.key_prefix}:{topic}:{n}"
        if len(key.encode()) > 256:
            raise ValueError(f"idempotency key longer than 256 bytes: {key!r}")
        body = b'{"idempotency_key":%b,"records":[%b]}' % (orjson.dumps(key), b",".join(recs))
        out = self.client.append(topic, body)
        self.stats.records += len(recs)
        self.stats.requests += 1
        if out.get("deduped"):
            self.stats.deduped += 1
        self._buf[topic] = []
        self._size[topic] = 0
