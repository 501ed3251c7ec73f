"""Contract tests for router CRUD and forwarding over HTTP (API §7, SEMANTICS §12)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from tests.support.harness import Harness, assert_error

ROUTER_FIELDS = [
    "router",
    "source",
    "dest",
    "preserve_node",
    "preserve_tag",
    "filter",
    "allow_cycle",
    "guarantee",
]

KEYS = ",".join(
    [
        "root",  # all scopes, any name
        "reader:r",
        "t1adm:a+r+d:t1.",  # admin/read/delete limited to t1.*
    ]
)


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def ha() -> Iterator[Harness]:
    harness = Harness({"TOPICS_API_KEYS": KEYS})
    yield harness
    harness.close()


def put_router(h: Harness, name: str, source: str, dest: str, **kw: Any) -> dict[str, Any]:
    r = h.put(f"/v0/routers/{name}", {"source": source, "dest": dest, **kw})
    assert r.status_code in (200, 201), r.text
    return dict(r.json())


def decode_cursor(c: str) -> Any:
    assert len(c) % 4 == 0  # standard base64 with padding
    return orjson.loads(base64.b64decode(c))


# ----------------------------------------------------------------- CRUD shapes


def test_put_creates_then_updates_with_router_object(h: Harness) -> None:
    r = h.put(
        "/v0/routers/clicks->warehouse",
        {
            "source": "clicks",
            "dest": "warehouse",
            "preserve_tag": False,
            "filter": "eu:*",
            "guarantee": "exactly_once",
            "create_dest": True,
            "unknown_field": [1, 2],
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert list(body) == ["router", "created", *ROUTER_FIELDS[1:], "performance"]
    assert body["router"] == "clicks->warehouse" and body["created"] is True
    assert (body["source"], body["dest"]) == ("clicks", "warehouse")
    assert body["preserve_node"] is True and body["preserve_tag"] is False
    assert body["filter"] == ["tag", "Glob", "eu:*"]
    assert body["allow_cycle"] is False and body["guarantee"] == "exactly_once"
    assert "create_dest" not in body
    assert "server_total_ms" in body["performance"]
    # both topics were auto-created with the default config
    for t in ("clicks", "warehouse"):
        st = h.get(f"/v0/topics/{t}").json()
        assert st["type"] == "log" and st["head_seq"] == 0
    # update: 200, created false, every mutable field replaced (defaults for omitted ones)
    r = h.put(
        "/v0/routers/clicks->warehouse",
        {"source": "clicks", "dest": "warehouse", "filter": ["tag", "Eq", "x"]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["created"] is False
    assert body["filter"] == ["tag", "Eq", "x"]
    assert body["preserve_tag"] is True and body["guarantee"] == "at_least_once"
    # bare string without * is Eq; null filter is echoed as null
    assert put_router(h, "r2", "clicks", "warehouse", filter="plain")["filter"] == [
        "tag",
        "Eq",
        "plain",
    ]
    assert put_router(h, "r2", "clicks", "warehouse", filter=None)["filter"] is None


def test_get_reports_forwarded_total_and_404(h: Harness) -> None:
    h.write("src", "old")  # written before the router: never forwarded (no backfill)
    put_router(h, "r", "src", "dst")
    h.write("src", 1, 2, 3)
    r = h.get("/v0/routers/r")
    assert r.status_code == 200
    body = r.json()
    assert list(body) == [*ROUTER_FIELDS, "forwarded_total", "performance"]
    assert body["forwarded_total"] == 3
    assert [x["data"] for x in h.diff("dst")["records"]] == [1, 2, 3]
    err = assert_error(h.get("/v0/routers/nope"), 404, "router_not_found")
    assert err["detail"] == {"router": "nope"}


def test_list_filters_and_paging(h: Harness) -> None:
    put_router(h, "a.1", "s1", "d1")
    put_router(h, "a.2", "s1", "d2", guarantee="exactly_once")
    put_router(h, "b.1", "s2", "d3")
    put_router(h, "b.2", "s1", "d1")  # same source+dest as a.1: allowed
    r = h.get("/v0/routers")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"routers", "performance"}  # no next_cursor on the last page
    assert [x["router"] for x in body["routers"]] == ["a.1", "a.2", "b.1", "b.2"]
    for item in body["routers"]:
        assert list(item) == ["router", "source", "dest", "guarantee", "forwarded_total"]
    assert body["routers"][1] == {
        "router": "a.2",
        "source": "s1",
        "dest": "d2",
        "guarantee": "exactly_once",
        "forwarded_total": 0,
    }
    names = lambda q: [x["router"] for x in h.get(f"/v0/routers?{q}").json()["routers"]]  # noqa: E731
    assert names("prefix=b.") == ["b.1", "b.2"]
    assert names("source=s1") == ["a.1", "a.2", "b.2"]
    assert names("dest=d1") == ["a.1", "b.2"]
    assert names("source=s1&dest=d1&prefix=b") == ["b.2"]
    assert names("source=nope") == []
    # forwarded_total in the list after forwarding (GET drives the router)
    h.write("s1", "x")
    h.get("/v0/routers/a.1")
    assert h.get("/v0/routers?prefix=a.1").json()["routers"][0]["forwarded_total"] == 1
    # cursor paging
    p1 = h.get("/v0/routers?page_size=3").json()
    assert [x["router"] for x in p1["routers"]] == ["a.1", "a.2", "b.1"]
    assert decode_cursor(p1["next_cursor"]) == {"after": "b.1"}
    p2 = h.get("/v0/routers", params={"page_size": "3", "cursor": p1["next_cursor"]}).json()
    assert [x["router"] for x in p2["routers"]] == ["b.2"] and "next_cursor" not in p2
    p = h.get("/v0/routers?page_size=2&source=s1").json()
    assert [x["router"] for x in p["routers"]] == ["a.1", "a.2"]
    p = h.get("/v0/routers", params={"source": "s1", "cursor": p["next_cursor"]}).json()
    assert [x["router"] for x in p["routers"]] == ["b.2"]
    # page_size clamp/unparsable, empty cursor, bad cursor
    assert len(h.get("/v0/routers?page_size=0").json()["routers"]) == 1
    assert len(h.get("/v0/routers?page_size=zz").json()["routers"]) == 4
    assert len(h.get("/v0/routers?cursor=").json()["routers"]) == 4
    assert_error(h.get("/v0/routers?cursor=%25%25%25"), 400, "invalid_request")
    no_after = base64.b64encode(b'{"x":1}').decode()
    assert len(h.get("/v0/routers", params={"cursor": no_after}).json()["routers"]) == 4


def test_delete_true_then_false_and_copies_stay(h: Harness) -> None:
    put_router(h, "r", "a", "b")
    h.write("a", 1)
    assert h.diff("b")["records"][0]["data"] == 1
    r = h.delete("/v0/routers/r")
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["router", "deleted", "performance"]
    assert body["router"] == "r" and body["deleted"] is True
    h.write("a", 2)  # forwarding stopped at once
    assert [x["data"] for x in h.diff("b")["records"]] == [1]
    assert_error(h.get("/v0/routers/r"), 404, "router_not_found")
    r = h.delete("/v0/routers/r")
    assert r.status_code == 200 and r.json()["deleted"] is False and r.json()["router"] == "r"
    assert h.get("/v0/routers").json()["routers"] == []


# ------------------------------------------------------------ processing order


def test_body_errors_are_400(h: Harness) -> None:
    bad: list[Any] = [
        {},
        {"source": "a"},
        {"dest": "b"},
        {"source": 1, "dest": "b"},
        {"source": "a", "dest": ["b"]},
        {"source": "a", "dest": "b", "preserve_node": "yes"},
        {"source": "a", "dest": "b", "preserve_tag": 1},
        {"source": "a", "dest": "b", "create_dest": "false"},
        {"source": "a", "dest": "b", "allow_cycle": 0},
        {"source": "a", "dest": "b", "guarantee": "at_most_once"},
        {"source": "a", "dest": "b", "guarantee": 1},
        {"source": "a", "dest": "b", "filter": ["tag", "Glob", "nostar"]},
        {"source": "a", "dest": "b", "filter": ["tag", "Like", "x"]},
        {"source": "a", "dest": "b", "filter": ["node", "Eq", "x"]},
        {"source": "a", "dest": "b", "filter": ["tag", "Eq"]},
        {"source": "a", "dest": "b", "filter": 5},
        {"source": "a", "dest": "a"},  # source == dest
        {"source": "bad name", "dest": "b"},
        {"source": "a", "dest": "-b"},
        [1, 2],
        "string",
        None,
    ]
    for body in bad:
        r = h.put(
            "/v0/routers/r",
            content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )
        assert_error(r, 400, "invalid_request")
    assert_error(h.put("/v0/routers/r", content=b"{"), 415, "unsupported_media_type")
    assert_error(
        h.put("/v0/routers/r", content=b"{", headers={"content-type": "application/json"}),
        400,
        "invalid_request",
    )
    assert_error(h.put("/v0/routers/r", content=b""), 415, "unsupported_media_type")
    # router name charset (">" allowed, "!" not)
    assert_error(
        h.put("/v0/routers/bad!name", {"source": "a", "dest": "b"}), 400, "invalid_request"
    )
    assert_error(
        h.put("/v0/routers/" + "r" * 256, {"source": "a", "dest": "b"}), 400, "invalid_request"
    )
    assert h.put("/v0/routers/" + "r" * 255, {"source": "a", "dest": "b"}).status_code == 201
    # nothing else was created by the failures
    assert [t["topic"] for t in h.get("/v0/topics").json()["topics"]] == ["a", "b"]
    assert len(h.get("/v0/routers").json()["routers"]) == 1


def test_bad_body_beats_allowlist_beats_name_charset(ha: Harness) -> None:
    t1 = auth("t1adm")
    # 400 (type error) wins over the body allowlist
    assert_error(
        ha.put("/v0/routers/t1.r", {"source": 5, "dest": "zz"}, headers=t1), 400, "invalid_request"
    )
    assert_error(ha.put("/v0/routers/t1.r", {"source": "t1.a"}, headers=t1), 400, "invalid_request")
    # body allowlist (403 with detail) wins over the router-name charset and source == dest
    err = assert_error(
        ha.put("/v0/routers/t1.bad!", {"source": "other", "dest": "t1.b"}, headers=t1),
        403,
        "forbidden",
    )
    assert err["detail"] == {"topic": "other"}
    err = assert_error(
        ha.put("/v0/routers/t1.r", {"source": "t1.a", "dest": "zz"}, headers=t1), 403, "forbidden"
    )
    assert err["detail"] == {"topic": "zz"}
    err = assert_error(
        ha.put("/v0/routers/t1.r", {"source": "x", "dest": "x"}, headers=t1), 403, "forbidden"
    )
    assert err["detail"] == {"topic": "x"}
    # path allowlist (no detail) wins over the body
    err = assert_error(ha.put("/v0/routers/other", {"source": 5}, headers=t1), 403, "forbidden")
    assert "detail" not in err
    # scope: admin is required to PUT
    assert_error(
        ha.put("/v0/routers/r", {"source": "a", "dest": "b"}, headers=auth("reader")),
        403,
        "forbidden",
    )
    # then the router-name charset is checked
    assert_error(
        ha.put("/v0/routers/t1.bad!", {"source": "t1.a", "dest": "t1.b"}, headers=t1),
        400,
        "invalid_request",
    )
    assert (
        ha.put("/v0/routers/t1.r", {"source": "t1.a", "dest": "t1.b"}, headers=t1).status_code
        == 201
    )
    # no 401 -> everything else
    assert_error(ha.put("/v0/routers/t1.r", {"source": 5}), 401, "unauthorized")


def test_source_equal_dest_beats_charset_and_create_dest_false(h: Harness) -> None:
    assert_error(h.put("/v0/routers/r", {"source": "-x", "dest": "-x"}), 400, "invalid_request")
    err = assert_error(
        h.put("/v0/routers/r", {"source": "a", "dest": "missing", "create_dest": False}),
        404,
        "topic_not_found",
    )
    assert err["detail"] == {"topic": "missing"}
    assert h.get("/v0/topics/a").status_code == 404  # source not auto-created either
    h.put("/v0/topics/exists")
    r = h.put("/v0/routers/r", {"source": "a", "dest": "exists", "create_dest": False})
    assert r.status_code == 201 and "create_dest" not in r.json()
    assert h.get("/v0/topics/a").status_code == 200  # the source is auto-created


def test_fan_in_and_repoint_are_409(h: Harness) -> None:
    put_router(h, "r1", "a", "b")
    put_router(h, "r2", "c", "d")
    # fan-in: another router already feeds b from a different source
    err = assert_error(
        h.put("/v0/routers/r3", {"source": "c", "dest": "b"}), 409, "topic_exists_incompatible"
    )
    assert err["detail"] == {"topic": "b", "reason": "router_dest_fan_in"}
    # fan-in wins over re-point
    err = assert_error(
        h.put("/v0/routers/r2", {"source": "c", "dest": "b"}), 409, "topic_exists_incompatible"
    )
    assert err["detail"] == {"topic": "b", "reason": "router_dest_fan_in"}
    # re-point
    err = assert_error(
        h.put("/v0/routers/r1", {"source": "a", "dest": "e"}), 409, "topic_exists_incompatible"
    )
    assert err["detail"] == {
        "router": "r1",
        "reason": "router_repoint_forbidden",
        "existing_source": "a",
        "existing_dest": "b",
    }
    err = assert_error(
        h.put("/v0/routers/r1", {"source": "z", "dest": "b"}), 409, "topic_exists_incompatible"
    )
    # only r1 itself feeds b, so this is a re-point, not a fan-in
    assert err["detail"]["reason"] == "router_repoint_forbidden"
    err = assert_error(
        h.put("/v0/routers/r2", {"source": "d", "dest": "c"}), 409, "topic_exists_incompatible"
    )
    assert err["detail"]["reason"] == "router_repoint_forbidden"
    # same source and dest under another name is allowed (not a fan-in)
    assert h.put("/v0/routers/r4", {"source": "a", "dest": "b"}).status_code == 201
    # neither "e" nor "z" was auto-created by the rejected PUTs
    assert h.get("/v0/topics/e").status_code == 404 and h.get("/v0/topics/z").status_code == 404


def test_router_cap_is_429_before_cycle_and_updates_still_work() -> None:
    hc = Harness({"TOPICS_MAX_ROUTERS": "1"})
    try:
        put_router(hc, "r1", "a", "b")
        err = assert_error(hc.put("/v0/routers/r2", {"source": "x", "dest": "y"}), 429, "throttled")
        assert err["detail"] == {"limit": "max_routers", "max": 1}
        # the cap is checked before the cycle check
        err = assert_error(hc.put("/v0/routers/r2", {"source": "b", "dest": "a"}), 429, "throttled")
        assert err["detail"] == {"limit": "max_routers", "max": 1}
        # ... and before any auto-create
        assert hc.get("/v0/topics/x").status_code == 404
        # updating an existing router at capacity is fine
        assert (
            hc.put(
                "/v0/routers/r1", {"source": "a", "dest": "b", "guarantee": "exactly_once"}
            ).status_code
            == 200
        )
    finally:
        hc.close()


def test_topic_cap_failure_rolls_back_new_router() -> None:
    hc = Harness({"TOPICS_MAX_TOPICS": "2"})
    try:
        hc.put("/v0/topics/a")
        put_router(hc, "r1", "a", "b")
        err = assert_error(hc.put("/v0/routers/r2", {"source": "a", "dest": "c"}), 429, "throttled")
        assert err["detail"] == {"limit": "max_topics", "max": 2}
        assert hc.get("/v0/routers/r2").status_code == 404
        assert [t["topic"] for t in hc.get("/v0/topics").json()["topics"]] == ["a", "b"]
        hc.delete("/v0/topics/b")
        err = assert_error(hc.put("/v0/routers/r3", {"source": "x", "dest": "y"}), 429, "throttled")
        assert [t["topic"] for t in hc.get("/v0/topics").json()["topics"]] == ["a"]
    finally:
        hc.close()


def test_cycle_is_409_with_exact_path(h: Harness) -> None:
    put_router(h, "bc", "b", "c")
    put_router(h, "ca", "c", "a")
    err = assert_error(h.put("/v0/routers/ab", {"source": "a", "dest": "b"}), 409, "router_cycle")
    assert err["detail"] == {"cycle": ["a", "b", "c", "a"]}
    # a two-node cycle
    put_router(h, "xy", "x", "y")
    err = assert_error(h.put("/v0/routers/yx", {"source": "y", "dest": "x"}), 409, "router_cycle")
    assert err["detail"] == {"cycle": ["y", "x", "y"]}
    assert h.get("/v0/routers/ab").status_code == 404
    # allow_cycle skips the check; its edges then take part in later checks
    r = h.put("/v0/routers/ab", {"source": "a", "dest": "b", "allow_cycle": True})
    assert r.status_code == 201 and r.json()["allow_cycle"] is True
    err = assert_error(h.put("/v0/routers/ca", {"source": "c", "dest": "a"}), 409, "router_cycle")
    assert err["detail"] == {"cycle": ["c", "a", "b", "c"]}
    # the hop cap terminates forwarding around the allowed cycle
    h.write("a", "loop")
    for t in ("a", "b", "c"):
        assert 1 <= len(h.diff(t)["records"]) <= 9


# ----------------------------------------------------------------- forwarding


def test_read_your_writes_preserves_node_and_tag(h: Harness) -> None:
    put_router(h, "r", "src", "dst")
    put_router(h, "strip", "src", "dst2", preserve_node=False, preserve_tag=False)
    h.write("src", {"k": 1}, node="gw-1", tag="t:1", meta={"m": 1})
    d = h.diff("dst", include_tags=True)
    assert len(d["records"]) == 1
    rec = d["records"][0]
    assert rec["$node"] == "gw-1" and rec["$tag"] == "t:1"
    assert rec["data"] == {"k": 1} and rec["meta"] == {"m": 1} and rec["$seq"] == 1
    rec2 = h.diff("dst2", include_tags=True)["records"][0]
    assert "$node" not in rec2 and "$tag" not in rec2 and rec2["data"] == {"k": 1}
    # node filters never propagate; the copy is filtered on read like any record
    assert h.diff("dst", node="gw-1")["records"] == []
    # topic state also drains first
    h.write("src", 2)
    st = h.get("/v0/topics/dst").json()
    assert st["head_seq"] == 2 and st["count"] == 2


def test_read_your_writes_through_a_chain(h: Harness) -> None:
    put_router(h, "ab", "a", "b")
    put_router(h, "bc", "b", "c")
    h.write("a", "x", node="n")
    rec = h.diff("c")["records"]
    assert [(r["data"], r["$node"]) for r in rec] == [("x", "n")]


def test_filter_glob_and_eq(h: Harness) -> None:
    put_router(h, "eu", "src", "eu", filter=["tag", "Glob", "eu:*"])
    put_router(h, "eq", "src", "one", filter=["tag", "Eq", "eu:1"])
    put_router(h, "all", "src", "tagged", filter="*")
    h.write("src", 1, tag="eu:1")
    h.write("src", 2, tag="us:1")
    h.write("src", 3)  # untagged never matches
    h.write("src", 4, tag="eu:2")
    assert [r["data"] for r in h.diff("eu")["records"]] == [1, 4]
    assert [r["data"] for r in h.diff("one")["records"]] == [1]
    assert [r["data"] for r in h.diff("tagged")["records"]] == [1, 2, 4]
    # skipped source seqs still count as consumed, not as forwarded
    assert h.get("/v0/routers/eu").json()["forwarded_total"] == 2


def test_exactly_once_adds_router_meta(h: Harness) -> None:
    put_router(h, "xo", "src", "dst", guarantee="exactly_once")
    h.write("src", 1, meta={"trace": "t"})
    h.write("src", 2)
    h.write("src", 3, meta=[1, 2])
    recs = h.diff("dst")["records"]
    assert [r["data"] for r in recs] == [1, 2, 3]
    src_state = h.engine.topics["src"]
    info = {
        "idempotency_key": f"router:xo:{src_state.topic_id}:{src_state.epoch}:1",
        "router": "xo",
        "source_topic": "src",
        "source_topic_id": src_state.topic_id,
        "source_epoch": src_state.epoch,
        "source_seq": 1,
    }
    assert recs[0]["meta"] == {"trace": "t", "_topics_router": info}
    assert recs[1]["meta"]["_topics_router"]["source_seq"] == 2
    assert set(recs[1]["meta"]) == {"_topics_router"}
    assert recs[2]["meta"]["_topics_original_meta"] == [1, 2]
    assert recs[2]["meta"]["_topics_router"]["source_seq"] == 3
    # at_least_once copies carry meta verbatim
    put_router(h, "alo", "src", "dst2")
    h.write("src", 4, meta={"trace": "u"})
    assert h.diff("dst2")["records"][0]["meta"] == {"trace": "u"}
    assert h.get("/v0/routers/xo").json()["forwarded_total"] == 4


def test_delete_topic_reports_routers_removed_sorted(h: Harness) -> None:
    put_router(h, "z-out", "t", "x")
    put_router(h, "a-in", "y", "t")
    put_router(h, "m-out", "t", "w")
    put_router(h, "other", "y", "q")
    r = h.delete("/v0/topics/t")
    assert r.status_code == 200
    body = r.json()
    assert body["deleted"] is True and body["topic"] == "t"
    assert body["routers_removed"] == ["a-in", "m-out", "z-out"]
    assert [x["router"] for x in h.get("/v0/routers").json()["routers"]] == ["other"]
    assert_error(h.get("/v0/routers/z-out"), 404, "router_not_found")
    r = h.delete("/v0/topics/t")
    assert r.json()["deleted"] is False and r.json()["routers_removed"] == []


# ------------------------------------------------------------------ allowlists


def test_allowlisted_listing_get_and_delete(ha: Harness) -> None:
    root, t1 = auth("root"), auth("t1adm")
    for name, src, dst in [
        ("t1.ok", "t1.a", "t1.b"),
        ("t1.out", "t1.a", "t2.b"),  # dest not allowed
        ("t1.in", "t2.a", "t1.c"),  # source not allowed
        ("t2.r", "t1.c", "t1.d"),  # name not allowed
    ]:
        r = ha.put(f"/v0/routers/{name}", {"source": src, "dest": dst}, headers=root)
        assert r.status_code == 201, r.text
    listed = ha.get("/v0/routers", headers=t1).json()["routers"]
    assert [x["router"] for x in listed] == ["t1.ok"]
    assert len(ha.get("/v0/routers", headers=root).json()["routers"]) == 4
    # filtering happens before paging: page 1 is full of allowed routers
    p = ha.get("/v0/routers?page_size=1", headers=t1).json()
    assert [x["router"] for x in p["routers"]] == ["t1.ok"] and "next_cursor" not in p
    assert ha.get("/v0/routers/t1.ok", headers=t1).status_code == 200
    err = assert_error(ha.get("/v0/routers/t1.in", headers=t1), 403, "forbidden")
    assert err["detail"] == {"topic": "t2.a"}
    err = assert_error(ha.get("/v0/routers/t1.out", headers=t1), 403, "forbidden")
    assert err["detail"] == {"topic": "t2.b"}
    err = assert_error(ha.delete("/v0/routers/t1.in", headers=t1), 403, "forbidden")
    assert err["detail"] == {"topic": "t2.a"}
    err = assert_error(ha.get("/v0/routers/t2.r", headers=t1), 403, "forbidden")
    assert "detail" not in err  # the path name: message only
    assert ha.get("/v0/routers/t1.in", headers=root).status_code == 200  # not deleted
    # absent router under an allowed name: plain 404 / deleted:false
    assert_error(ha.get("/v0/routers/t1.none", headers=t1), 404, "router_not_found")
    assert ha.delete("/v0/routers/t1.none", headers=t1).json()["deleted"] is False
    assert ha.delete("/v0/routers/t1.ok", headers=t1).json()["deleted"] is True
    # scopes: read lists and gets, delete needs delete
    assert ha.get("/v0/routers", headers=auth("reader")).status_code == 200
    assert ha.get("/v0/routers/t1.in", headers=auth("reader")).status_code == 200
    assert_error(ha.delete("/v0/routers/t1.in", headers=auth("reader")), 403, "forbidden")


def test_order_create_dest_before_repoint_and_fan_in_before_cap() -> None:
    hc = Harness({"TOPICS_MAX_ROUTERS": "2"})
    try:
        put_router(hc, "r1", "a", "b")
        put_router(hc, "r2", "c", "d")
        # create_dest:false with an absent dest (404) wins over the re-point (409)
        err = assert_error(
            hc.put("/v0/routers/r1", {"source": "a", "dest": "e", "create_dest": False}),
            404,
            "topic_not_found",
        )
        assert err["detail"] == {"topic": "e"}
        # fan-in (409) wins over the router cap (429)
        err = assert_error(
            hc.put("/v0/routers/r3", {"source": "c", "dest": "b"}), 409, "topic_exists_incompatible"
        )
        assert err["detail"]["reason"] == "router_dest_fan_in"
        err = assert_error(hc.put("/v0/routers/r3", {"source": "c", "dest": "x"}), 429, "throttled")
        assert err["detail"] == {"limit": "max_routers", "max": 2}
    finally:
        hc.close()


def test_source_trim_holes_reach_the_dest_as_tombstone(h: Harness) -> None:
    h.put("/v0/topics/src", {"cap_records": 2})
    put_router(h, "r", "src", "dst")
    h.write("src", 1, 2, 3, 4, 5)  # seqs 1-3 are evicted before they are forwarded
    d = h.diff("dst")
    assert [r["data"] for r in d["records"]] == [4, 5]
    assert d["tombstone"] is not None and d["tombstone"]["reason"] == "source_trim"
    assert (d["tombstone"]["gap_from"], d["tombstone"]["gap_to"]) == (1, 3)
    assert d["head_seq"] == 5 and d["earliest_seq"] == 4
    assert h.get("/v0/routers/r").json()["forwarded_total"] == 5


def test_a_refused_router_put_leaves_no_auto_created_topic() -> None:
    """Each refusal comes before any topic is created: the topic cap with two new
    topics, the cap with one, and a bad filter; nothing is left behind."""
    hc = Harness({"TOPICS_MAX_TOPICS": "1"})
    try:
        assert_error(hc.put("/v0/routers/r", {"source": "x", "dest": "y"}), 429, "throttled")
        assert hc.get("/v0/topics/x").status_code == 404
        assert hc.get("/v0/topics/y").status_code == 404
        assert hc.put("/v0/topics/a").status_code in (200, 201)
        assert_error(hc.put("/v0/routers/r", {"source": "a", "dest": "y2"}), 429, "throttled")
        assert hc.get("/v0/topics/y2").status_code == 404
    finally:
        hc.close()
    h2 = Harness({})
    try:
        bad = {"source": "x", "dest": "y", "filter": {"bogus": 1}}
        assert_error(h2.put("/v0/routers/r", bad), 400, "invalid_request")
        assert h2.get("/v0/topics").json()["topics"] == []
    finally:
        h2.close()
