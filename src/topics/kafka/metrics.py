"""The listener's figures for `/v0/metrics` (docs/KAFKA.md, "Metrics").

:class:`ListenerMetrics` is counted by the frame loop of
:mod:`topics.kafka.server`, the one place every request passes: connections
opened and closed, request frames read and response frames written (bytes),
requests per (API key, version), request frames that closed their connection,
and, once a handler's response is ready, its latency per API and the nonzero
`error_code` fields of the response object. Each request costs a few dict
increments and a walk over the response's error-code fields (top level, per
topic, per partition: never per record).

Which fields hold error codes is read once from the codec's own schemas
(:func:`error_fields`), so a response is walked along those paths only.

Consumer-group lag is not counted: :func:`consumer_lag` computes it when
`/v0/metrics` is read, from the committed-offset table and each stored
partition's `head_seq`.

:meth:`ListenerMetrics.snapshot` is the `kafka` object of the JSON form; the
HTTP shell renders the Prometheus series from it (it cannot import this
package: docs/ARCHITECTURE.md, "Layers"); the listener hands it over through
`Node.shell_metrics`.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Mapping
from typing import Any

from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.naming import partition_name

__all__ = [
    "ListenerMetrics",
    "LATENCY_BUCKETS_MS",
    "LAG_SERIES_CAP",
    "consumer_lag",
    "count_errors",
    "error_fields",
]

#: Upper bounds (ms) of the request-latency histogram; a last, open bucket
#: follows. A Fetch long-polls for up to 30 s, hence the long tail.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
)  # fmt: skip

#: The most (tenant, group, topic, partition) lag entries one scrape reports.
LAG_SERIES_CAP = 10_000

#: Kafka error code -> its name in Apache Kafka (the ones this broker returns).
ERROR_NAMES: dict[int, str] = {
    v: k for k, v in vars(E).items() if k.isupper() and type(v) is int and v != E.NONE
}

#: The error-code fields of a response, as a tree of field names: a leaf
#: (`None`) is an `error_code`; a subtree is a struct or an array of structs.
ErrorTree = tuple[tuple[str, "ErrorTree | None"], ...]


def _tree(fields: Mapping[str, Any]) -> ErrorTree:
    out: list[tuple[str, ErrorTree | None]] = []
    for name, f in fields.items():
        if name == "error_code":
            out.append((name, None))
        elif f.is_struct() or f.is_struct_array():
            sub = _tree(f.fields)
            if sub:
                out.append((name, sub))
    return tuple(out)


def error_fields() -> dict[int, ErrorTree]:
    """API key -> where its response holds error codes, from the codec's schemas."""
    return {key: _tree(cls.fields) for key, cls in P.RESPONSES.items()}


_ERROR_FIELDS = error_fields()


def count_errors(key: int, resp: Any, into: dict[tuple[int, int], int]) -> None:
    """Add one to `into[(key, code)]` for every nonzero error code of response `resp`."""
    _walk(resp, _ERROR_FIELDS[key], key, into)


def _walk(obj: Any, tree: ErrorTree, key: int, into: dict[tuple[int, int], int]) -> None:
    for name, sub in tree:
        v = getattr(obj, name, None)
        if sub is None:
            if v:
                k = (key, v)
                into[k] = into.get(k, 0) + 1
        elif type(v) is list:
            for item in v:
                _walk(item, sub, key, into)
        elif v is not None:
            _walk(v, sub, key, into)


class ListenerMetrics:
    """Counters of one listener (module docstring); every figure starts at 0."""

    __slots__ = (
        "open",
        "accepted",
        "closed",
        "sasl_failures",
        "refused",
        "bytes_in",
        "bytes_out",
        "requests",
        "errors",
        "latency",
    )

    def __init__(self) -> None:
        self.open = 0
        self.accepted = 0
        self.closed = 0
        self.sasl_failures = 0
        self.refused = 0
        self.bytes_in = 0
        self.bytes_out = 0
        #: (api key, version) -> requests
        self.requests: dict[tuple[int, int], int] = {}
        #: (api key, error code) -> responses (or topics, partitions) with that code
        self.errors: dict[tuple[int, int], int] = {}
        #: api key -> [bucket counts..., sum ms]
        self.latency: dict[int, list[float]] = {}

    def request(self, key: int, version: int) -> None:
        k = (key, version)
        self.requests[k] = self.requests.get(k, 0) + 1

    def answered(self, key: int, resp: Any, started: float, now: float) -> None:
        """A handler's response `resp` (None: no response) is ready `now` (loop time, s)."""
        ms = (now - started) * 1000.0
        h = self.latency.get(key)
        if h is None:
            h = self.latency[key] = [0.0] * (len(LATENCY_BUCKETS_MS) + 2)
        h[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        h[-1] += ms
        if resp is not None:
            _walk(resp, _ERROR_FIELDS[key], key, self.errors)
            if key == P.SASL_AUTHENTICATE and resp.error_code:
                self.sasl_failures += 1

    def on_done(self, key: int, started: float) -> Callable[[asyncio.Future[Any]], None]:
        """A done-callback that records a handler future's outcome like :meth:`answered`."""

        def done(fut: asyncio.Future[Any]) -> None:
            resp = None
            if not fut.cancelled() and fut.exception() is None:
                resp = fut.result()
            self.answered(key, resp, started, fut.get_loop().time())

        return done

    def snapshot(self, lag: tuple[list[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """The `kafka` object of the JSON form of `/v0/metrics` (docs/API.md, "15.3")."""
        names = P.API_NAMES
        lat = {
            names[k]: {"counts": [int(c) for c in h[:-1]], "sum": round(h[-1], 3)}
            for k, h in sorted(self.latency.items())
        }
        entries, truncated = lag if lag is not None else ([], False)
        return {
            "connections": self.open,
            "connections_accepted": self.accepted,
            "connections_closed": self.closed,
            "sasl_failures": self.sasl_failures,
            "requests_refused": self.refused,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "requests": [
                {"api": names[k], "version": v, "count": n}
                for (k, v), n in sorted(self.requests.items())
            ],
            "errors": [
                {"api": names[k], "code": c, "error": ERROR_NAMES.get(c, str(c)), "count": n}
                for (k, c), n in sorted(self.errors.items())
            ],
            "latency_ms": {"buckets": list(LATENCY_BUCKETS_MS), "apis": lat},
            "consumer_lag": entries,
            "consumer_lag_truncated": truncated,
        }


Key = tuple[str, str, str, int]


def consumer_lag(
    table: Mapping[Key, tuple[int, Any, int]],
    head_seq: Callable[[str], int | None],
    cap: int = LAG_SERIES_CAP,
) -> tuple[list[dict[str, Any]], bool]:
    """Lag per committed (tenant, group, topic, partition), and whether `cap` cut it.

    `table` is the committed-offset table (:attr:`OffsetStore.table`);
    `head_seq(stored name)` the head seq of a stored partition (None when it
    is gone). Lag is `head_seq - committed offset` in records (Kafka offset =
    seq - 1, so the high watermark is `head_seq`), never below 0. Entries
    whose partition no longer exists or whose committed offset is negative
    are left out; the rest come sorted by tenant, group, topic, partition.
    """
    out: list[dict[str, Any]] = []
    for key in sorted(table):
        committed = table[key][0]
        if committed < 0:
            continue
        tenant, group, topic, partition = key
        ns = tenant[3:] if tenant.startswith("ns:") else ""
        head = head_seq(partition_name(ns + topic, partition))
        if head is None:
            continue
        if len(out) >= cap:
            return out, True
        out.append(
            {
                "tenant": tenant,
                "group": group,
                "topic": topic,
                "partition": partition,
                "committed": committed,
                "head_seq": head,
                "lag": max(head - committed, 0),
            }
        )
    return out, False
