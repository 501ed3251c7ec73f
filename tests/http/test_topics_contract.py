"""Contract tests for topic lifecycle, write, diff and record delete (API §3-6)."""

from __future__ import annotations

import base64

import orjson
from tests.support.harness import Harness, assert_error

DEFAULT_CONFIG = {
    "type": "log",
    "ttl_ms": 0,
    "cap_records": 0,
    "cap_bytes": 0,
    "discard": "old",
    "durable": False,
    "durability": "disk",
    "priority": None,
    "auto_priority": True,
    "auto_create": True,
    "idempotency_window_ms": 120000,
    "dedupe_node": True,
    "lease_ms": 30000,
    "claim_jitter_ms": 0,
    "max_deliveries": 0,
    "dead_letter": None,
    "leases_durable": False,
}


def test_put_creates_then_updates_with_full_config(h: Harness) -> None:
    r = h.put("/v0/topics/orders")
    assert r.status_code == 201
    body = r.json()
    assert body["created"] is True
    assert list(body["config"]) == list(DEFAULT_CONFIG)
    assert body["config"] == DEFAULT_CONFIG
    assert "server_total_ms" in body["performance"]
    r = h.put("/v0/topics/orders", {"cap_records": 5, "durable": True})
    assert r.status_code == 200
    cfg = r.json()["config"]
    assert r.json()["created"] is False
    assert cfg["cap_records"] == 5 and cfg["durability"] == "fsync" and cfg["durable"] is True
    # PUT replaces the whole config: omitted fields go back to defaults.
    cfg = h.put("/v0/topics/orders", {"ttl_ms": 10}).json()["config"]
    assert cfg["cap_records"] == 0 and cfg["durability"] == "disk" and cfg["ttl_ms"] == 10


def test_put_normalises_and_validates(h: Harness) -> None:
    cfg = h.put("/v0/topics/q", {"type": "queue", "lease_ms": 5, "claim_jitter_ms": 99999}).json()[
        "config"
    ]
    assert cfg["lease_ms"] == 100 and cfg["claim_jitter_ms"] == 5000
    assert_error(h.put("/v0/topics/x", {"type": "stream"}), 400, "invalid_request")
    assert_error(h.put("/v0/topics/x", {"ttl_ms": -1}), 400, "invalid_request")
    assert_error(h.put("/v0/topics/x", {"ttl_ms": "10"}), 400, "invalid_request")
    assert_error(h.put("/v0/topics/x", {"durability": "nvme"}), 400, "invalid_request")
    err = assert_error(h.put("/v0/topics/x", {"dead_letter": "bad name"}), 400, "invalid_request")
    assert err["detail"] == {"dead_letter": "bad name"}
    assert_error(
        h.put("/v0/topics/qq", {"type": "queue", "dead_letter": "qq"}), 400, "invalid_request"
    )
    assert_error(h.put("/v0/topics/-bad"), 400, "invalid_request")
    assert h.get("/v0/topics/x").status_code == 404  # nothing was created by the failures


def test_put_type_change_is_409(h: Harness) -> None:
    h.put("/v0/topics/q", {"type": "queue"})
    err = assert_error(h.put("/v0/topics/q", {}), 409, "topic_exists_incompatible")
    assert err["detail"] == {"topic": "q", "existing_type": "queue", "requested_type": "log"}


def test_write_assigns_seqs_and_reports(h: Harness) -> None:
    r = h.post("/v0/topics/orders", {"records": [{"data": {"a": 1}}, {"data": None}, {"data": 3}]})
    assert r.status_code == 201
    b = r.json()
    assert b["first_seq"] == 1 and b["last_seq"] == 3 and b["seqs"] == [1, 2, 3]
    assert b["head_seq"] == 3 and b["count"] == 3 and b["created"] is True and b["deduped"] is False
    assert {"server_total_ms", "wal_append_ms", "fsync_ms"} <= set(b["performance"])
    r = h.post("/v0/topics/orders?return_seqs=false", {"records": [{"data": 4}]})
    assert r.status_code == 200
    assert "seqs" not in r.json() and r.json()["first_seq"] == 4 and r.json()["created"] is False


def test_write_validation_errors_change_nothing(h: Harness) -> None:
    h.write("t", 1)
    bad = [
        ({"records": []}, 400, "invalid_request"),
        ({}, 400, "invalid_request"),
        ({"records": [{"nodata": 1}]}, 400, "invalid_request"),
        ({"records": [{"data": 1, "tag": 5}]}, 400, "invalid_request"),
        ({"records": [{"data": 1, "tag": "x" * 257}]}, 400, "invalid_request"),
        ({"records": [{"data": 1, "node": "n" * 129}]}, 400, "invalid_request"),
        (
            {"records": [{"data": 1, "meta": {str(i): i for i in range(65)}}]},
            400,
            "invalid_request",
        ),
        ({"records": [{"data": 1, "meta": {"m": "x" * 16400}}]}, 400, "invalid_request"),
        ({"records": [{"data": "x" * 1_048_577}]}, 400, "record_too_large"),
        ({"records": [{"data": 1}] * 10_001}, 400, "batch_too_large"),
        ({"records": [{"data": 1}], "idempotency_key": "k" * 257}, 400, "invalid_request"),
    ]
    for body, status, code in bad:
        assert_error(h.post("/v0/topics/t", body), status, code)
    st = h.get("/v0/topics/t").json()
    assert st["head_seq"] == 1 and st["count"] == 1


def test_write_content_type_and_json_errors(h: Harness) -> None:
    assert_error(
        h.post("/v0/topics/t", content=b'{"records":[{"data":1}]}'), 415, "unsupported_media_type"
    )
    assert_error(
        h.post(
            "/v0/topics/t",
            content=b'{"records":[{"data":1}]}',
            headers={"content-type": "text/plain"},
        ),
        415,
        "unsupported_media_type",
    )
    err = assert_error(
        h.post("/v0/topics/t", content=b"{nope", headers={"content-type": "application/json"}),
        400,
        "invalid_request",
    )
    assert err["message"].startswith("malformed JSON body")
    r = h.post(
        "/v0/topics/t",
        content=b'{"records":[{"data":1}]}',
        headers={"content-type": "  application/json; charset=utf-8"},
    )
    assert r.status_code == 201
    assert_error(h.post("/v0/topics/u", content=b"", headers={}), 415, "unsupported_media_type")


def test_auto_create_rules(h: Harness) -> None:
    assert_error(
        h.post("/v0/topics/a", {"records": [{"data": 1}], "create": False}), 404, "topic_not_found"
    )
    assert_error(
        h.post("/v0/topics/a", {"records": [{"data": 1}], "config": {"auto_create": False}}),
        404,
        "topic_not_found",
    )
    r = h.post(
        "/v0/topics/a",
        {"records": [{"data": 1}], "config": {"auto_create": False}, "create": True},
    )
    assert r.status_code == 201
    r = h.post("/v0/topics/b", {"records": [{"data": 1}], "config": {"cap_records": 7}})
    assert r.status_code == 201
    assert h.get("/v0/topics/b").json()["config"]["cap_records"] == 7
    assert_error(
        h.post("/v0/topics/bad%20name", {"records": [{"data": 1}]}), 400, "invalid_request"
    )


def test_idempotency_key_replays(h: Harness) -> None:
    body = {"records": [{"data": 1}, {"data": 2}], "idempotency_key": "k1"}
    first = h.post("/v0/topics/t", body).json()
    again = h.post("/v0/topics/t", {"records": [{"data": 9}], "idempotency_key": "k1"})
    assert again.status_code == 200
    b = again.json()
    assert b["seqs"] == first["seqs"] and b["deduped"] is True and b["created"] is False
    assert b["head_seq"] == 2 and b["count"] == 2
    hdr = h.post("/v0/topics/t", {"records": [{"data": 3}]}, headers={"Idempotency-Key": "k2"})
    assert hdr.json()["seqs"] == [3]
    hdr2 = h.post("/v0/topics/t", {"records": [{"data": 3}]}, headers={"Idempotency-Key": "k2"})
    assert hdr2.json()["deduped"] is True and hdr2.json()["seqs"] == [3]
    assert h.get("/v0/topics/t").json()["head_seq"] == 3
    h.clock.advance(120_001)
    r = h.post("/v0/topics/t", {"records": [{"data": 1}], "idempotency_key": "k1"})
    assert r.json()["deduped"] is False and r.json()["seqs"] == [4]


def test_discard_reject_never_acks_then_drops(h: Harness) -> None:
    h.put("/v0/topics/r", {"cap_records": 3, "discard": "reject"})
    h.write("r", 1, 2)
    err = assert_error(
        h.post("/v0/topics/r", {"records": [{"data": 3}, {"data": 4}]}), 422, "topic_full"
    )
    assert err["detail"] == {
        "topic": "r",
        "cap_records": 3,
        "cap_bytes": 0,
        "head_seq": 2,
        "earliest_seq": 1,
    }
    assert_error(h.post("/v0/topics/r", {"records": [{"data": 1}] * 4}), 400, "record_too_large")
    h.write("r", 3)
    assert [x["data"] for x in h.diff("r")["records"]] == [1, 2, 3]


def test_cap_records_tombstone_and_earliest(h: Harness) -> None:
    h.put("/v0/topics/c", {"cap_records": 3})
    h.write("c", *range(1, 11))
    d = h.diff("c", from_seq=0)
    assert d["tombstone"] == {
        "gap_from": 1,
        "gap_to": 7,
        "reason": "cap",
        "missed_estimate": 7,
        "earliest_seq": 8,
        "head_seq": 10,
    }
    assert [x["$seq"] for x in d["records"]] == [8, 9, 10]
    assert d["caught_up"] is True and d["lag"] == 0 and d["next_from_seq"] == 10
    st = h.get("/v0/topics/c").json()
    assert st["earliest_seq"] == 8 and st["count"] == 3
    # A cursor inside the live range gets no tombstone.
    assert h.diff("c", from_seq=8)["tombstone"] is None


def test_ttl_expiry_and_mixed_reason(h: Harness) -> None:
    h.put("/v0/topics/t", {"ttl_ms": 1000, "cap_records": 4})
    h.write("t", 1, 2)
    h.clock.advance(1001)
    h.write("t", 3, 4, 5, 6, 7)
    d = h.diff("t", from_seq=0)
    # seqs 1-2 expired (ttl) and 1-3 fell out of the 4-seq window (cap).
    assert d["tombstone"]["reason"] == "mixed"
    assert d["tombstone"]["gap_to"] == 3
    assert [x["data"] for x in d["records"]] == [4, 5, 6, 7]
    h.clock.advance(1001)
    d = h.diff("t", from_seq=7)
    assert d["records"] == [] and d["tombstone"] is None
    st = h.get("/v0/topics/t").json()
    assert st["count"] == 0 and st["earliest_seq"] == 8


def test_diff_node_filter_limit_and_budget(h: Harness) -> None:
    h.post(
        "/v0/topics/n",
        {
            "records": [
                {"data": 1, "node": "a"},
                {"data": 2, "node": "b"},
                {"data": 3},
                {"data": 4, "node": "a"},
            ]
        },
    )
    d = h.diff("n", node="a")
    assert [x["data"] for x in d["records"]] == [2, 3]
    assert d["next_from_seq"] == 4 and d["caught_up"] is True
    assert d["records"][0]["$node"] == "b" and "$node" not in d["records"][1]
    d = h.diff("n", node=["a", "b"], limit=1)
    assert [x["data"] for x in d["records"]] == [3] and d["next_from_seq"] == 3
    d = h.diff("n", limit=2)
    assert d["next_from_seq"] == 2 and d["lag"] == 2 and d["caught_up"] is False
    d = h.diff("n", max_batch_bytes=1)
    assert len(d["records"]) == 1 and d["next_from_seq"] == 1
    h.put("/v0/topics/n2", {"dedupe_node": False})
    h.write("n2", 1, node="a")
    assert len(h.diff("n2", node="a")["records"]) == 1


def test_diff_includes_and_errors(h: Harness) -> None:
    h.post("/v0/topics/i", {"records": [{"data": 1, "tag": "x", "meta": {"m": 1}}]})
    rec = h.diff("i")["records"][0]
    assert rec["meta"] == {"m": 1} and "$tag" not in rec
    rec = h.diff("i", include_tags=True, include_meta=False)["records"][0]
    assert rec["$tag"] == "x" and "meta" not in rec
    assert list(rec) == ["$seq", "$ts", "$tag", "data"]
    assert_error(h.post("/v0/topics/none/diff", {}), 404, "topic_not_found")
    assert_error(h.post("/v0/topics/i/diff", {"from_seq": -1}), 400, "invalid_request")
    assert_error(h.post("/v0/topics/i/diff", {"limit": "x"}), 400, "invalid_request")
    r = h.post("/v0/topics/i/diff", content=b"")
    assert r.status_code == 200
    assert h.diff("i", limit=5000, wait_ms=999999, max_batch_bytes=10**12)["records"]


def test_recreated_tombstone(h: Harness) -> None:
    h.write("re", 1, 2, 3)
    h.delete("/v0/topics/re")
    h.write("re", 9)
    d = h.diff("re", from_seq=3)
    assert d["tombstone"]["reason"] == "recreated"
    assert (d["tombstone"]["gap_from"], d["tombstone"]["gap_to"]) == (1, 1)
    assert [x["data"] for x in d["records"]] == [9]


def test_record_delete_is_silent_and_point_in_time(h: Harness) -> None:
    for i in range(1, 7):
        h.post("/v0/topics/d", {"records": [{"data": i, "tag": f"g:{i % 2}"}]})
    r = h.post("/v0/topics/d/delete", {"match": ["tag", "Eq", "g:0"]})
    b = r.json()
    assert b["deleted"] == 3 and b["count"] == 3 and b["head_seq"] == 6
    d = h.diff("d", from_seq=0)
    assert d["tombstone"] is None and [x["data"] for x in d["records"]] == [1, 3, 5]
    b = h.post("/v0/topics/d/delete", {"before_seq": 4}).json()
    assert b["deleted"] == 2 and b["earliest_seq"] == 5
    assert h.diff("d", from_seq=0)["tombstone"] is None  # purely deleted gap is silent
    h.post("/v0/topics/d", {"records": [{"data": 7, "tag": "g:1"}]})
    b = h.post("/v0/topics/d/delete", {"match": "g:*"}).json()
    assert b["deleted"] == 2 and b["count"] == 0
    assert h.post("/v0/topics/d/delete", {"match": "g:*"}).json()["deleted"] == 0
    assert_error(h.post("/v0/topics/d/delete", {}), 400, "invalid_request")
    assert_error(
        h.post("/v0/topics/d/delete", {"match": ["tag", "Glob", "x"]}), 400, "invalid_request"
    )
    assert_error(
        h.post("/v0/topics/d/delete", {"match": ["node", "Eq", "x"]}), 400, "invalid_request"
    )
    assert_error(
        h.post("/v0/topics/d/delete", {"match": ["tag", "Re", "x"]}), 400, "invalid_request"
    )
    assert_error(h.post("/v0/topics/d/delete", {"match": ["tag", "Eq"]}), 400, "invalid_request")
    assert_error(h.post("/v0/topics/zz/delete", {"before_seq": 1}), 404, "topic_not_found")


def test_state_list_and_pagination(h: Harness) -> None:
    for n in ("b", "a", "c"):
        h.write(n, 1)
    st = h.get("/v0/topics/a").json()
    assert st["next_seq"] == 2 and st["type"] == "log" and st["last_read_ts"] == h.clock.now_ms()
    assert st["effective_priority"] == 500
    r = h.get("/v0/topics?page_size=2").json()
    assert [t["topic"] for t in r["topics"]] == ["a", "b"]
    assert list(r["topics"][0]) == [
        "topic",
        "head_seq",
        "earliest_seq",
        "count",
        "bytes",
        "durable",
        "effective_priority",
    ]
    cur = r["next_cursor"]
    assert orjson.loads(base64.b64decode(cur)) == {"after": "b"}
    r2 = h.get(f"/v0/topics?page_size=2&cursor={cur}").json()
    assert [t["topic"] for t in r2["topics"]] == ["c"] and "next_cursor" not in r2
    assert_error(h.get("/v0/topics?cursor=%%%"), 400, "invalid_request")
    assert [t["topic"] for t in h.get("/v0/topics?prefix=b").json()["topics"]] == ["b"]
    assert_error(h.get("/v0/topics/nope"), 404, "topic_not_found")


def test_auto_priority_decay(h: Harness) -> None:
    h.write("p", 1)
    h.diff("p")
    h.clock.advance(15_000)
    assert h.get("/v0/topics/p?touch=false").json()["effective_priority"] == 354
    h.clock.advance(300_000)
    assert h.get("/v0/topics/p?touch=false").json()["effective_priority"] == 0
    h.put("/v0/topics/p", {"priority": 750})
    assert h.get("/v0/topics/p").json()["effective_priority"] == 750


def test_delete_topic(h: Harness) -> None:
    r = h.delete("/v0/topics/none").json()
    assert r["deleted"] is False and r["routers_removed"] == []
    h.write("x", 1)
    assert_error(h.delete("/v0/topics/x?if_empty=true"), 409, "topic_not_empty")
    r = h.delete("/v0/topics/x").json()
    assert r["deleted"] is True
    assert h.get("/v0/topics/x").status_code == 404
    h.write("x", 1)
    assert h.get("/v0/topics/x").json()["head_seq"] == 1


def test_routing_errors(h: Harness) -> None:
    assert_error(h.get("/v0/nothing"), 404, "not_found")
    assert_error(h.get("/v1/topics"), 404, "not_found")
    assert_error(h.req("PATCH", "/v0/topics/x"), 405, "method_not_allowed")
    assert_error(h.get("/v0/topics/x/diff"), 405, "method_not_allowed")
    assert_error(h.post("/v0/topics/x/unknown", {}), 404, "not_found")
    assert_error(h.post("/v0/topics", {}), 405, "method_not_allowed")


def test_body_limit(h: Harness) -> None:
    small = Harness({"TOPICS_MAX_BODY_BYTES": "100"})
    try:
        r = small.post("/v0/topics/t", {"records": [{"data": "x" * 200}]})
        assert_error(r, 413, "payload_too_large")
        assert small.get("/v0/topics/t").status_code == 404
    finally:
        small.close()


def test_reject_topic_never_drops_an_acked_record_after_mid_log_deletes(h: Harness) -> None:
    h.put("/v0/topics/r", {"cap_records": 3, "discard": "reject"})
    h.write("r", 1, 2)
    h.post("/v0/topics/r", {"records": [{"data": 3, "tag": "x"}]})
    h.post("/v0/topics/r/delete", {"match": "x"})
    # Two live records, but the 3-seq window would pass seq 1: refuse instead of evicting it.
    assert_error(h.post("/v0/topics/r", {"records": [{"data": 4}]}), 422, "topic_full")
    assert [x["data"] for x in h.diff("r")["records"]] == [1, 2]
    h.post("/v0/topics/r/delete", {"before_seq": 2})
    assert h.post("/v0/topics/r", {"records": [{"data": 4}]}).status_code == 200
    d = h.diff("r")
    assert [x["data"] for x in d["records"]] == [2, 4]
    # The window floor (L_cap = 1) now covers seq 1, which had been deleted: the §6
    # pseudo-code still reports it as a cap gap (tombstones use the involuntary floor).
    assert d["tombstone"]["gap_to"] == 1 and d["tombstone"]["reason"] == "cap"


def test_u32_fields_reject_out_of_range(h: Harness) -> None:
    h.write("u", 1)
    for body in ({"limit": 2**32}, {"wait_ms": 2**32}, {"limit": -1}):
        assert_error(h.post("/v0/topics/u/diff", body), 400, "invalid_request")
    assert h.diff("u", limit=2**32 - 1)["records"]


def test_failed_commit_is_500_and_publishes_nothing(h: Harness) -> None:
    from topics.engine.events import Event, RecordsAppended
    from topics.engine.journal import DONE, NOT_LOGGED, Handle, MemoryJournal

    class FailingJournal(MemoryJournal):
        def log(self, event: Event) -> Handle:
            return NOT_LOGGED if isinstance(event, RecordsAppended) else DONE

    h.write("f", 1)
    h.engine.journal = FailingJournal()
    assert_error(h.post("/v0/topics/f", {"records": [{"data": 2}]}), 500, "internal")
    h.engine.journal = MemoryJournal()
    d = h.diff("f")
    assert [x["data"] for x in d["records"]] == [1] and d["tombstone"] is None
    assert h.write("f", 3)["seqs"] == [3]  # the failed seq stays a silent hole
