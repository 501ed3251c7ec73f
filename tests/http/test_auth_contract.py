"""Auth, scopes, allowlists and request-limit contract tests (API §1.2-1.4, §12)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.harness import Harness, assert_error

from topics.config import ConfigError, load_config, parse_api_keys

KEYS = ",".join(
    [
        "root",  # all scopes, any name
        "reader:r",
        "writer:w",
        "rw:rw",
        "deleter:d",
        "tenant:rw+a:t1.|shared:",
        "adm::t1.",
    ]
)


@pytest.fixture
def ha() -> Iterator[Harness]:
    harness = Harness({"TOPICS_API_KEYS": KEYS})
    yield harness
    harness.close()


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_missing_or_bad_token_is_401(ha: Harness) -> None:
    assert_error(ha.get("/v0/topics"), 401, "unauthorized")
    assert_error(ha.get("/v0/topics", headers=auth("nope")), 401, "unauthorized")
    assert_error(ha.get("/v0/topics", headers={"authorization": "Basic root"}), 401, "unauthorized")
    assert ha.get("/v0/topics", headers={"authorization": "  Bearer root  "}).status_code == 200
    # ?token= is honoured only on the two SSE GETs.
    assert_error(ha.get("/v0/topics?token=root"), 401, "unauthorized")


def test_probes_skip_auth_but_metrics_needs_read(ha: Harness) -> None:
    for p in ("/healthz", "/readyz", "/v0/health", "/v0/ready"):
        assert ha.get(p).status_code == 200
    assert_error(ha.get("/v0/metrics"), 401, "unauthorized")
    assert_error(ha.get("/v0/metrics", headers=auth("writer")), 403, "forbidden")
    assert ha.get("/v0/metrics", headers=auth("reader")).status_code == 200
    strict = Harness({"TOPICS_API_KEYS": "k", "TOPICS_PROBE_AUTH": "1"})
    try:
        assert_error(strict.get("/healthz"), 401, "unauthorized")
        assert strict.get("/healthz", headers=auth("k")).status_code == 200
    finally:
        strict.close()


def test_route_scopes(ha: Harness) -> None:
    assert (
        ha.post("/v0/topics/a", {"records": [{"data": 1}]}, headers=auth("writer")).status_code
        == 201
    )
    assert_error(
        ha.post("/v0/topics/a", {"records": [{"data": 1}]}, headers=auth("reader")),
        403,
        "forbidden",
    )
    assert ha.post("/v0/topics/a/diff", {}, headers=auth("reader")).status_code == 200
    assert_error(ha.post("/v0/topics/a/diff", {}, headers=auth("writer")), 403, "forbidden")
    assert_error(ha.put("/v0/topics/a", {}, headers=auth("rw")), 403, "forbidden")
    assert ha.put("/v0/topics/a", {}, headers=auth("root")).status_code == 200
    assert_error(ha.delete("/v0/topics/a", headers=auth("rw")), 403, "forbidden")
    assert_error(
        ha.post("/v0/topics/a/delete", {"before_seq": 1}, headers=auth("rw")), 403, "forbidden"
    )
    assert (
        ha.post("/v0/topics/a/delete", {"before_seq": 1}, headers=auth("deleter")).status_code
        == 200
    )
    # Unknown sub-paths under a topic fail closed with the write scope, then 404.
    assert_error(ha.post("/v0/topics/a/zzz", {}, headers=auth("reader")), 403, "forbidden")
    assert_error(ha.post("/v0/topics/a/zzz", {}, headers=auth("writer")), 404, "not_found")
    # Wrong method on a router: admin first, then 405.
    assert_error(ha.post("/v0/routers/r", {}, headers=auth("rw")), 403, "forbidden")
    assert_error(ha.post("/v0/routers/r", {}, headers=auth("root")), 405, "method_not_allowed")
    # Auth errors win over routing and body errors.
    assert_error(ha.post("/v0/topics/a", content=b"{", headers={}), 401, "unauthorized")


def test_write_with_config_to_new_topic_needs_admin(ha: Harness) -> None:
    body = {"records": [{"data": 1}], "config": {"cap_records": 5}}
    err = assert_error(ha.post("/v0/topics/new", body, headers=auth("rw")), 403, "forbidden")
    assert err["detail"] == {"topic": "new"}
    assert (
        ha.post("/v0/topics/new", {"records": [{"data": 1}]}, headers=auth("rw")).status_code == 201
    )
    # Existing topic: config is ignored, write scope is enough.
    assert ha.post("/v0/topics/new", body, headers=auth("rw")).status_code == 200


def test_prefix_allowlists(ha: Harness) -> None:
    t = auth("tenant")
    assert ha.post("/v0/topics/t1.orders", {"records": [{"data": 1}]}, headers=t).status_code == 201
    err = assert_error(
        ha.post("/v0/topics/t2.orders", {"records": [{"data": 1}]}, headers=t), 403, "forbidden"
    )
    assert "detail" not in err
    ha.post("/v0/topics/t2.orders", {"records": [{"data": 1}]}, headers=auth("root"))
    ha.post("/v0/topics/shared:x", {"records": [{"data": 1}]}, headers=auth("root"))
    names = [x["topic"] for x in ha.get("/v0/topics", headers=t).json()["topics"]]
    assert names == ["shared:x", "t1.orders"]
    # `secret::PREFIXES` means all scopes with an allowlist.
    assert ha.put("/v0/topics/t1.cfg", {}, headers=auth("adm")).status_code == 201
    assert_error(ha.put("/v0/topics/t2.cfg", {}, headers=auth("adm")), 403, "forbidden")


def test_config_names_are_allowlisted_too(ha: Harness) -> None:
    """A config's `dead_letter` is a topic name: 403 outside the prefixes, before validation."""
    t = auth("adm")
    err = assert_error(
        ha.put("/v0/topics/t1.q", {"type": "queue", "dead_letter": "t2.dlq"}, headers=t),
        403,
        "forbidden",
    )
    assert err["detail"] == {"topic": "t2.dlq"}
    # Outside the prefix *and* malformed: the allowlist answers first (as for routers).
    assert_error(ha.put("/v0/topics/t1.q", {"dead_letter": "t2 bad!"}, headers=t), 403, "forbidden")
    # Not a string: left to the config parser.
    err = assert_error(
        ha.put("/v0/topics/t1.q", {"dead_letter": 5}, headers=t), 400, "invalid_request"
    )
    assert err["detail"] == {"dead_letter": 5}
    assert "t1.q" not in ha.engine.topics
    # An inline write config is checked the same way, even with the topic existing.
    ha.put("/v0/topics/t1.q", {"type": "queue"}, headers=t)
    body = {"records": [{"data": 1}], "config": {"type": "queue", "dead_letter": "t2.dlq"}}
    assert_error(ha.post("/v0/topics/t1.q", body, headers=t), 403, "forbidden")
    assert ha.engine.topics["t1.q"].head_seq == 0
    ok = {"type": "queue", "dead_letter": "t1.dlq", "max_deliveries": 2}
    assert ha.put("/v0/topics/t1.q", ok, headers=t).status_code == 200
    # A key without prefixes may name any dead-letter topic.
    assert (
        ha.put("/v0/topics/other", {"dead_letter": "t2.dlq"}, headers=auth("root")).status_code
        == 201
    )


def test_inflight_cap_is_per_key() -> None:
    hc = Harness({"TOPICS_API_KEYS": "k", "TOPICS_MAX_INFLIGHT_PER_KEY": "1"})
    try:
        hc.app.inflight[hc.app.auth.authenticate("k").digest] = 1  # one request in flight
        err = assert_error(hc.get("/v0/topics", headers=auth("k")), 429, "throttled")
        assert err["detail"] == {"limit": "max_inflight_per_key", "max": 1}
        hc.app.inflight[hc.app.auth.authenticate("k").digest] = 0
        assert hc.get("/v0/topics", headers=auth("k")).status_code == 200
        assert hc.app.inflight[hc.app.auth.authenticate("k").digest] == 0  # released
    finally:
        hc.close()


def test_topic_and_byte_caps() -> None:
    hc = Harness({"TOPICS_MAX_TOPICS": "2", "TOPICS_MAX_TOTAL_BYTES": "10"})
    try:
        hc.write("a", 1)
        hc.put("/v0/topics/b")
        err = assert_error(hc.put("/v0/topics/c"), 429, "throttled")
        assert err["detail"] == {"limit": "max_topics", "max": 2}
        assert_error(hc.post("/v0/topics/c", {"records": [{"data": 1}]}), 429, "throttled")
        assert hc.put("/v0/topics/b", {"ttl_ms": 5}).status_code == 200  # updates still work
        err = assert_error(
            hc.post("/v0/topics/a", {"records": [{"data": "x" * 20}]}), 429, "throttled"
        )
        assert err["detail"] == {"limit": "max_total_bytes", "max": 10}
        assert hc.get("/v0/topics/a").json()["count"] == 1
    finally:
        hc.close()


def test_key_parsing_and_startup_refusal() -> None:
    keys = parse_api_keys(" a , b:r+w , c:rw:x|y: , d::p ,, ")
    assert [sorted(k.scopes) for k in keys] == [
        ["admin", "delete", "read", "write"],
        ["read", "write"],
        ["read", "write"],
        ["admin", "delete", "read", "write"],
    ]
    assert keys[2].prefixes == ("x", "y:") and keys[3].prefixes == ("p",)
    with pytest.raises(ConfigError):
        parse_api_keys("a:bogus")
    with pytest.raises(ConfigError):
        load_config({"TOPICS_HOST": "0.0.0.0"})
    assert (
        load_config({"TOPICS_HOST": "0.0.0.0", "TOPICS_ALLOW_INSECURE_NO_AUTH": "true"}).host
        == "0.0.0.0"
    )
    assert load_config({"TOPICS_HOST": "0.0.0.0", "TOPICS_API_KEYS": "k"}).auth_enabled
    cfg = load_config({"TOPICS_HOST": "127.0.0.1:5001", "TOPICS_PORT": "9"})
    assert (cfg.host, cfg.port, cfg.limits.max_topics) == ("127.0.0.1", 5001, 100000)
    # An unparsable number falls back to the default (README "Configuration").
    assert load_config({"TOPICS_MAX_TOPICS": "x"}).limits.max_topics == 100000
