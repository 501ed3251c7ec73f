"""Health, readiness and metrics (API §11)."""

from __future__ import annotations

from tests.support.harness import Harness, assert_error


def test_health_and_ready(h: Harness) -> None:
    b = h.get("/healthz").json()
    assert b["status"] == "ok" and isinstance(b["uptime_ms"], int) and b["version"]
    assert h.get("/v0/health").json()["status"] == "ok"
    h.write("a", 1)
    assert h.get("/readyz").json() == {"status": "ready", "wal_replay_complete": True, "topics": 1}
    h.node.ready = False
    h.node.replay_progress = 0.25
    err = assert_error(h.get("/v0/ready"), 503, "not_ready")
    assert err["detail"] == {"replay_progress": 0.25}


def test_prometheus_metrics(h: Harness) -> None:
    h.put("/v0/topics/q", {"type": "queue", "durability": "fsync"})
    h.write("q", 1, 2)
    h.write("a:b.c-d", 1)
    r = h.get("/v0/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4"
    text = r.text
    for name in (
        "topics_topics",
        "topics_routers",
        "topics_records_live",
        "topics_bytes_live",
        "topics_queue_topics",
        "topics_queue_leases_in_flight",
        "topics_sse_connections",
        "topics_watch_sessions",
        "topics_ready",
        "topics_recovery_progress",
        "topics_uptime_ms",
        "topics_topic_head_seq",
        "topics_topic_earliest_seq",
        "topics_topic_records_live",
        "topics_topic_bytes_live",
        "topics_topic_queue_ready",
        "topics_topic_queue_in_flight",
        "topics_topic_metrics_truncated",
    ):
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, name
    for c in ("ephemeral", "memory", "disk", "fsync"):
        assert f'topics_topics_by_class{{class="{c}"}}' in text
    assert 'topics_topics_by_class{class="fsync"} 1' in text
    assert "topics_records_live 3" in text
    assert 'topics_topic_queue_ready{topic="q"} 2' in text
    assert 'topics_topic_head_seq{topic="a:b.c-d"} 1' in text
    from topics.http.ops import _esc

    assert _esc('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert "# TYPE topics_uptime_ms counter" in text


def test_metrics_json(h: Harness) -> None:
    h.write("a", 1)
    m = h.get("/v0/metrics", headers={"accept": "application/json"}).json()
    assert m["topics"] == 1 and m["topics_disk"] == 1 and m["records_live"] == 1
    assert m["ready"] is True
    for k in (
        "topics_ephemeral",
        "topics_memory",
        "topics_fsync",
        "routers",
        "bytes_live",
        "queue_topics",
        "queue_leases_in_flight",
        "sse_connections",
        "watch_sessions",
        "replay_progress",
        "uptime_ms",
    ):
        assert k in m
