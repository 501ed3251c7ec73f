"""Health, readiness and metrics (docs/API.md, "15. Health, readiness and metrics").

`/v0/metrics` needs `read` (docs/API.md, "2.2 The scope each route needs"). A key
with name prefixes gets the same document computed over its own share of the
instance only: the topics whose names its prefixes allow (counts, classes, live
records and bytes, queue figures and the per-topic series), the routers whose
name, source and dest are all allowed, its own watch sessions and streaming
connections. Instance-wide
internals that are not per tenant (the WAL, storage, scheduler and Kafka
listener sections) are left out for such a key. A key without prefixes sees
the whole instance.

The Kafka listener's section comes from `Node.shell_metrics["kafka"]` (the
HTTP shell does not import the Kafka shell: docs/ARCHITECTURE.md, "Layers"),
present only while a listener runs; its series are rendered here from that
JSON object (:func:`_kafka_series`).
"""

from __future__ import annotations

import itertools
import posixpath
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import orjson

from topics import __version__
from topics.auth import Principal
from topics.engine.topic import Topic
from topics.errors import TopicsError
from topics.http.app import Ctx, TopicsApp
from topics.http.responses import Resp

__all__ = ["health", "ready", "metrics", "render_prometheus", "metrics_json"]

PER_TOPIC_CAP = 1000
CLASSES = ("ephemeral", "memory", "disk", "fsync")


async def health(ctx: Ctx) -> Resp:
    uptime = int((time.monotonic() - ctx.app.node.started) * 1000)
    body = {"status": "ok", "version": __version__, "uptime_ms": uptime}
    return Resp(200, orjson.dumps(body), [(b"content-type", b"application/json")])


async def ready(ctx: Ctx) -> Resp:
    app = ctx.app
    node = app.node
    if not node.ready:
        raise TopicsError(
            503,
            "not_ready",
            "recovery in progress",
            {"replay_progress": round(node.replay_progress, 4)},
        )
    body: dict[str, Any] = {
        "status": "ready",
        "wal_replay_complete": True,
        "topics": len(app.engine.topics),
    }
    # Reads go on while writes cannot be committed (a full disk, a failed fsync):
    # still 200, but the state says so (README "When the disk fills up").
    why = node.degraded()
    if why:
        body["status"] = "degraded"
        body["writable"] = False
        body["degraded"] = {k: [posixpath.basename(d) for d in v] for k, v in why.items()}
    return Resp(200, orjson.dumps(body), [(b"content-type", b"application/json")])


def _visible(app: TopicsApp, principal: Principal | None) -> list[Topic]:
    """The topics `principal` may see (all of them when it has no prefixes), unordered."""
    topics = app.engine.topics
    if principal is not None and principal.prefixes:
        return [t for n, t in topics.items() if principal.allows_name(n)]
    return list(topics.values())


def _gather(app: TopicsApp, principal: Principal | None = None) -> dict[str, Any]:
    """Instance figures; scoped to the key's own topics when it has prefixes."""
    eng = app.engine
    now = eng.clock.now_ms()
    scoped = principal is not None and bool(principal.prefixes)
    topics = _visible(app, principal)
    by_class = dict.fromkeys(CLASSES, 0)
    queue_topics = 0
    leases = 0
    for t in topics:
        by_class[t.config.durability] += 1
        if t.queue is not None:
            queue_topics += 1
            leases += t.queue.counters(t, now)["in_flight"]
    if scoped:
        assert principal is not None
        allow: Callable[[str], bool] = principal.allows_name
        routers = sum(
            1 for r in app.routers.routers() if allow(r.name) and allow(r.source) and allow(r.dest)
        )
        records = sum(t.live_count for t in topics)
        nbytes = sum(t.live_bytes for t in topics)
        digest = principal.digest
        sse = app.sse_per_key.get(digest, 0) if digest is not None else 0
        watches = sum(
            1 for s in app.watches.sessions.values() if digest is not None and s.creator == digest
        )
    else:
        routers = len(app.routers)
        records = eng.totals.records
        nbytes = eng.totals.bytes
        sse = app.sse_total
        watches = len(app.watches)
    return {
        "scoped": scoped,
        "topic_list": topics,
        "topics": len(topics),
        "by_class": by_class,
        "routers": routers,
        "records_live": records,
        "bytes_live": nbytes,
        "queue_topics": queue_topics,
        "queue_leases_in_flight": leases,
        "sse_connections": sse,
        "watch_sessions": watches,
        "ready": app.node.ready,
        "replay_progress": app.node.replay_progress,
        "uptime_ms": int((time.monotonic() - app.node.started) * 1000),
    }


#: The instance figures after the per-class topic counts, in the order both forms of
#: `/v0/metrics` list them: (key in :func:`_gather` and in the JSON form, Prometheus
#: series, type, help).
_FIGURES = (
    ("routers", "topics_routers", "gauge", "Configured routers."),
    ("records_live", "topics_records_live", "gauge", "Live records across topics."),
    ("bytes_live", "topics_bytes_live", "gauge", "Live payload bytes across topics."),
    ("queue_topics", "topics_queue_topics", "gauge", "Topics of type queue."),
    ("queue_leases_in_flight", "topics_queue_leases_in_flight", "gauge", "Active queue leases."),
    ("sse_connections", "topics_sse_connections", "gauge", "Open SSE and WebSocket connections."),
    ("watch_sessions", "topics_watch_sessions", "gauge", "Watch sessions in memory."),
    ("ready", "topics_ready", "gauge", "1 once recovery has finished."),
    ("replay_progress", "topics_recovery_progress", "gauge", "Recovery progress from 0 to 1."),
    ("uptime_ms", "topics_uptime_ms", "counter", "Milliseconds since start."),
)

#: The storage series of an unscoped Prometheus scrape: (key in :func:`storage_stats`,
#: series, type, help); a key the stats lack (in memory mode) is left out.
_STORAGE_SERIES = (
    ("index_bytes", "topics_index_bytes", "gauge", "Bytes of the per-topic slot indexes."),
    (
        "chunk_bytes",
        "topics_chunk_bytes",
        "gauge",
        "Record bytes held in memory until checkpointed.",
    ),
    ("segments", "topics_segments", "gauge", "Segment files (pairs) on disk."),
    ("cold_segments", "topics_cold_segments", "gauge", "Segments in the cold tier."),
    (
        "reclaimed_segments",
        "topics_reclaimed_segments_total",
        "counter",
        "Segments rewritten without their deleted records' bytes.",
    ),
    (
        "reclaimed_bytes",
        "topics_reclaimed_bytes_total",
        "counter",
        "Bytes of deleted records given back by rewrites.",
    ),
    (
        "relocated_segments",
        "topics_relocated_segments_total",
        "counter",
        "Segments moved to the cold tier (committed).",
    ),
    (
        "relocation_copied_bytes",
        "topics_relocation_copied_bytes_total",
        "counter",
        "Bytes copied to the cold tier.",
    ),
    (
        "relocation_failures",
        "topics_relocation_failures_total",
        "counter",
        "Copies to the cold tier that failed (retried).",
    ),
    ("relocation_queued", "topics_relocation_queued", "gauge", "Copies waiting or running."),
    ("checkpoints", "topics_checkpoints_total", "counter", "Completed checkpoint cycles."),
    (
        "checkpoint_failures",
        "topics_checkpoint_failures_total",
        "counter",
        "Failed checkpoint cycles.",
    ),
)

#: The per-topic gauges: (series, help, the figure of a topic).
_TOPIC_SERIES: tuple[tuple[str, str, Callable[[Topic], int]], ...] = (
    ("topics_topic_head_seq", "Highest published seq.", attrgetter("head_seq")),
    ("topics_topic_earliest_seq", "First live seq.", attrgetter("earliest_seq")),
    ("topics_topic_records_live", "Live records.", attrgetter("live_count")),
    ("topics_topic_bytes_live", "Live payload bytes.", attrgetter("live_bytes")),
)

#: The per-queue gauges: (key in the queue's counters, series, help).
_QUEUE_SERIES = (
    ("ready", "topics_topic_queue_ready", "Claimable jobs."),
    ("in_flight", "topics_topic_queue_in_flight", "Leased jobs."),
)


def metrics_json(app: TopicsApp, principal: Principal | None = None) -> dict[str, Any]:
    """The JSON form of `/v0/metrics`, scoped for a prefix-restricted key.

    The figures are listed in docs/API.md, "15.3 `GET /v0/metrics`".

    `principal` None (or a key without prefixes) gives the whole instance,
    including the `wal` and `storage` sections; a key with prefixes gets the
    figures of its own topics only and no `wal`/`storage` (module docstring).
    """
    g = _gather(app, principal)
    out: dict[str, Any] = {"topics": g["topics"]}
    for c in CLASSES:
        out[f"topics_{c}"] = g["by_class"][c]
    for k, *_ in _FIGURES:
        out[k] = g[k]
    if g["scoped"]:
        return out
    wal = app.node.wal_metrics()
    if wal is not None:
        out["wal"] = wal
    out["storage"] = storage_stats(app)
    out["scheduler"] = scheduler_stats(app)
    kafka = app.node.shell_metrics.get("kafka")
    if kafka is not None:
        out["kafka"] = kafka()
    return out


def scheduler_stats(app: TopicsApp) -> dict[str, Any]:
    """The delivery scheduler's figures plus the SSE lag counts (docs/SCHEDULER.md, "Watching it")."""
    out = app.node.delivery.stats()
    out["sse_lagged"] = app.sse_lagged
    out["sse_lagged_total"] = app.sse_lagged_total
    return out


#: The scheduler's single-value series: (key in :func:`scheduler_stats`, series, type, help).
_SCHEDULER_SERIES = (
    ("pressure", "topics_scheduler_pressure", "gauge", "Governor pressure, 0 to 1."),
    ("inline", "topics_scheduler_inline_total", "counter", "Publications served at once."),
    ("coalesced", "topics_scheduler_coalesced_total", "counter", "Publications folded into a service."),
    ("deferring", "topics_scheduler_deferring", "gauge", "1 while band B0 and routers are deferred."),
    ("deferrals", "topics_scheduler_deferral_changes_total", "counter", "Deferral starts and ends."),
    ("commit_window_ms", "topics_scheduler_commit_window_ms", "gauge", "Group-commit window."),
    ("coalesce_window_ms", "topics_scheduler_coalesce_window_ms", "gauge", "Coalescing window."),
    ("rejected", "topics_scheduler_throttled_total", "counter", "Writes refused with 429 under pressure."),
    ("sse_lagged", "topics_sse_lagged", "gauge", "SSE streams lagged behind a slow reader."),
    ("sse_lagged_total", "topics_sse_lagged_total", "counter", "SSE streams ever marked lagged."),
)  # fmt: skip


def _scheduler_series(
    metric: Callable[[str, str, str, list[tuple[str, Any]]], None], st: dict[str, Any]
) -> None:
    """The scheduler series in Prometheus text form, through `metric` (name, type, help, samples)."""
    for key, name, typ, help_ in _SCHEDULER_SERIES:
        metric(name, typ, help_, [("", st[key])])
    for key, name, typ, help_ in (
        ("ready", "topics_scheduler_ready", "gauge", "Topics waiting for delivery, per band."),
        ("served", "topics_scheduler_served_total", "counter", "Topics served from the ready set, per band."),
    ):  # fmt: skip
        metric(name, typ, help_, [(f'{{band="{b}"}}', n) for b, n in st[key].items()])
    lat = st["latency_ms"]
    metric(
        "topics_scheduler_latency_ms",
        "histogram",
        "Delivery scheduling latency (marked to served).",
        _histogram(lat["buckets"], lat["counts"], lat["sum"]),
    )


def _histogram(
    bounds: list[float], counts: list[int], total: float, labels: str = ""
) -> list[tuple[str, Any]]:
    """The samples of one histogram: `counts` per bucket (the last one above every
    bound, not cumulative), `total` their sum; `labels` (`a="x",b="y"`) on each line."""
    cumulative = list(itertools.accumulate(counts))
    les = [*map(str, bounds), "+Inf"]
    pre = labels + "," if labels else ""
    own = f"{{{labels}}}" if labels else ""
    samples: list[tuple[str, Any]] = [
        (f'_bucket{{{pre}le="{le}"}}', n) for le, n in zip(les, cumulative, strict=True)
    ]
    samples += [(f"_sum{own}", total), (f"_count{own}", cumulative[-1])]
    return samples


def _kafka_series(
    metric: Callable[[str, str, str, list[tuple[str, Any]]], None], st: dict[str, Any]
) -> None:
    """The Kafka listener's series from its JSON section (docs/KAFKA.md, "Metrics")."""
    metric(
        "topics_kafka_connections", "gauge", "Open Kafka connections.", [("", st["connections"])]
    )
    metric(
        "topics_kafka_connections_accepted_total",
        "counter",
        "Kafka connections accepted.",
        [("", st["connections_accepted"])],
    )
    metric(
        "topics_kafka_connections_closed_total",
        "counter",
        "Kafka connections closed, by either side.",
        [("", st["connections_closed"])],
    )
    metric(
        "topics_kafka_sasl_failures_total",
        "counter",
        "Failed SASL/PLAIN logins.",
        [("", st["sasl_failures"])],
    )
    metric(
        "topics_kafka_requests_refused_total",
        "counter",
        "Kafka request frames that closed their connection (too large, undecodable, "
        "unknown API, before SASL authentication).",
        [("", st["requests_refused"])],
    )
    metric(
        "topics_kafka_bytes_in_total",
        "counter",
        "Bytes of Kafka request frames read (size prefix included).",
        [("", st["bytes_in"])],
    )
    metric(
        "topics_kafka_bytes_out_total",
        "counter",
        "Bytes of Kafka response frames written (size prefix included).",
        [("", st["bytes_out"])],
    )
    metric(
        "topics_kafka_requests_total",
        "counter",
        "Kafka requests per API and version.",
        [(f'{{api="{r["api"]}",version="{r["version"]}"}}', r["count"]) for r in st["requests"]],
    )
    metric(
        "topics_kafka_errors_total",
        "counter",
        "Nonzero error codes in Kafka responses (top level, per topic, per partition).",
        [
            (f'{{api="{e["api"]}",code="{e["code"]}",error="{e["error"]}"}}', e["count"])
            for e in st["errors"]
        ],
    )
    lat = st["latency_ms"]
    samples: list[tuple[str, Any]] = []
    for api, h in lat["apis"].items():
        samples += _histogram(lat["buckets"], h["counts"], h["sum"], f'api="{api}"')
    metric(
        "topics_kafka_request_latency_ms",
        "histogram",
        "Kafka request latency per API in ms, from the request read to its response "
        "ready; a Fetch includes its long-poll wait.",
        samples,
    )
    metric(
        "topics_kafka_consumer_lag",
        "gauge",
        "Records a consumer group is behind: head seq minus committed offset.",
        [
            (
                f'{{tenant="{_esc(c["tenant"])}",group="{_esc(c["group"])}",'
                f'topic="{_esc(c["topic"])}",partition="{c["partition"]}"}}',
                c["lag"],
            )
            for c in st["consumer_lag"]
        ],
    )
    metric(
        "topics_kafka_consumer_lag_truncated",
        "gauge",
        "1 when the lag series were cut at 10000.",
        [("", int(st["consumer_lag_truncated"]))],
    )


def storage_stats(app: TopicsApp) -> dict[str, Any]:
    """Index and checkpoint figures of the app's node (:meth:`topics.node.Node.storage_stats`)."""
    return app.node.storage_stats()


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(app: TopicsApp, principal: Principal | None = None) -> bytes:
    """Prometheus text exposition 0.0.4 with HELP/TYPE lines.

    The series are listed in docs/API.md, "15.3 `GET /v0/metrics`".

    Scoped like :func:`metrics_json`: a key with prefixes sees only its own
    topics' series and figures, and no WAL/storage metrics.
    """
    g = _gather(app, principal)
    lines: list[str] = []

    def metric(name: str, typ: str, help_: str, samples: list[tuple[str, Any]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {typ}")
        for labels, value in samples:
            if isinstance(value, bool):
                value = int(value)
            lines.append(f"{name}{labels} {value}")

    metric("topics_topics", "gauge", "Live topic instances.", [("", g["topics"])])
    metric(
        "topics_topics_by_class",
        "gauge",
        "Topics per durability class.",
        [(f'{{class="{c}"}}', g["by_class"][c]) for c in CLASSES],
    )
    for key, name, typ, help_ in _FIGURES:
        metric(name, typ, help_, [("", g[key])])

    eng = app.engine
    visible: list[Topic] = sorted(g["topic_list"], key=lambda t: t.name)
    truncated = len(visible) > PER_TOPIC_CAP
    topics = [(f'{{topic="{_esc(t.name)}"}}', t) for t in visible[:PER_TOPIC_CAP]]
    for name, help_, figure in _TOPIC_SERIES:
        metric(name, "gauge", help_, [(lb, figure(t)) for lb, t in topics])
    now = eng.clock.now_ms()
    qs = [(lb, t.queue.counters(t, now)) for lb, t in topics if t.queue is not None]
    for key, name, help_ in _QUEUE_SERIES:
        metric(name, "gauge", help_, [(lb, c[key]) for lb, c in qs])
    metric(
        "topics_topic_metrics_truncated",
        "gauge",
        "1 when the per-topic series were cut at 1000 topics.",
        [("", int(truncated))],
    )
    if g["scoped"]:
        return ("\n".join(lines) + "\n").encode()
    lines.extend(app.node.wal_prometheus_lines())
    _scheduler_series(metric, scheduler_stats(app))
    st = storage_stats(app)
    for key, name, typ, help_ in _STORAGE_SERIES:
        if key in st:
            metric(name, typ, help_, [("", st[key])])
    kafka = app.node.shell_metrics.get("kafka")
    if kafka is not None:
        _kafka_series(metric, kafka())
    return ("\n".join(lines) + "\n").encode()


async def metrics(ctx: Ctx) -> Resp:
    """`GET /v0/metrics`: Prometheus text, or JSON when `Accept` asks for it."""
    accept = ctx.header(b"accept") or ""
    p = ctx.principal
    if "application/json" in accept:
        return Resp(
            200, orjson.dumps(metrics_json(ctx.app, p)), [(b"content-type", b"application/json")]
        )
    return Resp(
        200, render_prometheus(ctx.app, p), [(b"content-type", b"text/plain; version=0.0.4")]
    )
