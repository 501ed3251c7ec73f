"""The OpenAPI document (docs/API.md, "The OpenAPI document") stays true to the server.

* the served bytes are the committed openapi.json, which is what
  :func:`topics.http.openapi_doc.build` renders (`scripts/openapi` rewrites it);
* it validates as OpenAPI 3.1;
* its paths and methods are exactly the app's route table, walked through
  :meth:`TopicsApp.classify`;
* real responses of the in-process app, successes and errors, match the
  documented status, content type, headers and body schema; so do the events
  of both Server-Sent Events streams, read over a real socket.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_spec
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from tests.support.harness import Harness
from tests.support.live import Sse, live_app

from topics.http import openapi_doc
from topics.http.openapi import document_bytes

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")
DOC_URI = "urn:topics:openapi"
KEY = "s3cret"
BEARER = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return dict(json.loads(document_bytes()))


# ------------------------------------------------------------------ the file


def test_committed_document_is_current() -> None:
    """openapi.json is what openapi_doc.build() renders: run scripts/openapi after a change."""
    assert openapi_doc.DOCUMENT_PATH.read_bytes() == openapi_doc.render(), (
        "src/topics/http/openapi.json is out of date: run scripts/openapi"
    )
    assert document_bytes() == openapi_doc.DOCUMENT_PATH.read_bytes()


def test_served_document_validates_as_openapi_31(h: Harness) -> None:
    r = h.get("/v0/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content == document_bytes()
    served = r.json()
    assert served["openapi"].startswith("3.1")
    validate_spec(served)


def test_openapi_is_public_with_auth_on() -> None:
    h = Harness(env={"TOPICS_API_KEYS": KEY})
    try:
        assert h.get("/v0/openapi.json").status_code == 200
        assert h.get("/v0/topics").status_code == 401
    finally:
        h.close()


def test_every_ref_resolves(doc: dict[str, Any]) -> None:
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str):
                    yield v
                else:
                    yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)

    for target in set(walk(doc)):
        assert target.startswith("#/"), target
        node: Any = doc
        for part in target[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]


# --------------------------------------------------------- routes vs the app


SAMPLE_PARAMS = {
    "topic": "t1",
    "router": "a->b",
    "wid": "wid_" + "A" * 22,
    "file": "index.html",
}


def concrete(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PARAMS[m.group(1)], template)


def test_paths_are_the_route_table(h: Harness, doc: dict[str, Any]) -> None:
    """Every documented operation reaches a route, every route is documented, and a
    documented path lists every method the app takes there (HEAD aside: it is GET)."""
    app = h.app
    routes = {
        id(route): (key, method)
        for key, table in app._routes.items()
        for method, route in table.items()
    }
    covered: set[tuple[str, str]] = set()
    for template, item in doc["paths"].items():
        path = concrete(template)
        documented = {m.upper() for m in item if m in HTTP_METHODS}
        assert documented, template
        for method in documented:
            m = app.classify(method, path)
            assert m.route is not None, (method, template, m.status)
            covered.add(routes[id(m.route)])
            for name in re.findall(r"\{(\w+)\}", template):
                assert m.params.get(name) == SAMPLE_PARAMS[name], (template, m.params)
        taken = {
            method
            for method in ("GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS")
            if app.classify(method, path).route is not None
        }
        assert taken == documented, (template, taken, documented)
    assert covered == set(routes.values()), set(routes.values()) - covered


def test_security_matches_the_app(doc: dict[str, Any]) -> None:
    """Public operations are the app's public/probe paths; every secured one answers 401."""
    h = Harness(env={"TOPICS_API_KEYS": KEY})
    try:
        for template, item in doc["paths"].items():
            path = concrete(template)
            for method, o in item.items():
                if method not in HTTP_METHODS:
                    continue
                sec = o.get("security", doc["security"])
                m = h.app.classify(method.upper(), path)
                public = m.public or m.probe
                assert (sec == [] or {} in sec) == public, (method, template)
                if not public:
                    assert "401" in o["responses"], (method, template)
                if m.sse_token:
                    assert {"tokenQuery": []} in sec, (method, template)
    finally:
        h.close()


# ------------------------------------------------------ responses vs schemas


class Contract:
    """Looks up the documented response of a request and checks a real one against it."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.registry: Registry[Any] = Registry().with_resource(
            DOC_URI, Resource.from_contents(doc, default_specification=DRAFT202012)
        )
        self.templates = [
            (re.compile("^" + re.sub(r"\{\w+\}", "[^/]+", t) + "$"), t) for t in doc["paths"]
        ]
        self.seen: set[tuple[str, str, str]] = set()

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        hits = [t for rx, t in self.templates if rx.match(path)]
        # A literal path wins over a template (/v0/topics vs /v0/topics/{topic}).
        hits.sort(key=lambda t: t.count("{"))
        assert hits, path
        return hits[0], self.doc["paths"][hits[0]][method.lower()]

    def deref(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            target: Any = self.doc
            for part in node["$ref"][2:].split("/"):
                target = target[part.replace("~1", "/")]
            node = target
        return node

    def schema_pointer(self, *parts: str) -> str:
        return DOC_URI + "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)

    def check(self, method: str, r: httpx.Response) -> Any:
        path = r.request.url.path
        template, o = self.operation(method, path)
        status = str(r.status_code)
        assert status in o["responses"], f"{method} {template}: undocumented {status}: {r.text}"
        self.seen.add((method, template, status))
        resp = self.deref(o["responses"][status])
        for name, header in resp.get("headers", {}).items():
            header = self.deref(header)
            if header.get("required"):
                assert name.lower() in r.headers, (method, template, status, name)
            if name.lower() in r.headers:
                value: Any = r.headers[name.lower()]
                if header["schema"].get("type") == "integer":
                    value = int(value)
                Draft202012Validator(header["schema"]).validate(value)
        content = resp.get("content")
        if not content:
            return None
        ctype = r.headers["content-type"]
        assert ctype in content, (method, template, status, ctype, list(content))
        if ctype != "application/json":
            return None
        # The response's schema by its place in the document, so its "#/..." refs resolve.
        raw = o["responses"][status]
        if "$ref" in raw:
            pointer = raw["$ref"][2:].split("/") + ["content", ctype, "schema"]
            pointer = [p.replace("~1", "/") for p in pointer]
        else:
            pointer = [
                "paths",
                template,
                method.lower(),
                "responses",
                status,
                "content",
                ctype,
                "schema",
            ]
        body = r.json()
        validator = Draft202012Validator(
            {"$ref": self.schema_pointer(*pointer)}, registry=self.registry
        )
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.path))
        assert not errors, (
            f"{method} {path} {status}: {errors[0].message} at {list(errors[0].path)}"
        )
        return body


@pytest.fixture(scope="module")
def contract(doc: dict[str, Any]) -> Contract:
    return Contract(doc)


def call(h: Harness, c: Contract, method: str, path: str, **kw: Any) -> httpx.Response:
    r = h.req(method, path, **kw)
    c.check(method, r)
    return r


def test_success_responses_match(h: Harness, contract: Contract) -> None:
    c = contract

    def go(method: str, path: str, status: int, **kw: Any) -> Any:
        r = call(h, c, method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json() if r.headers["content-type"] == "application/json" else r.text

    assert go("GET", "/v0/topics", 200)["topics"] == []
    go("PUT", "/v0/topics/logs", 201)  # an empty body: all defaults
    go("PUT", "/v0/topics/logs", 200, json={"ttl_ms": 600000, "priority": None})
    go(
        "PUT",
        "/v0/topics/jobs",
        201,
        json={"type": "queue", "durability": "fsync", "max_deliveries": 2, "dead_letter": "dead"},
    )
    go("PUT", "/v0/topics/capped", 201, json={"cap_records": 2})
    ack = go(
        "POST",
        "/v0/topics/logs",
        200,
        json={
            "records": [{"data": 1, "tag": "a:1", "node": "n1", "meta": {"k": 1}}, {"data": None}]
        },
    )
    assert ack["seqs"] == [1, 2]
    go("POST", "/v0/topics/fresh", 201, json={"records": [{"data": {"x": [1, 2]}}]})
    go("POST", "/v0/topics/logs?return_seqs=false", 200, json={"records": [{"data": 3}]})
    keyed = {"records": [{"data": 4}]}
    go("POST", "/v0/topics/logs", 200, json=keyed, headers={"idempotency-key": "k1"})
    assert go("POST", "/v0/topics/logs", 200, json=keyed, headers={"idempotency-key": "k1"})[
        "deduped"
    ]
    go("POST", "/v0/topics/capped", 200, json={"records": [{"data": i} for i in range(5)]})
    d = go("POST", "/v0/topics/capped/diff", 200)  # empty body: defaults; the cap left a gap
    assert d["tombstone"] is not None
    go(
        "POST",
        "/v0/topics/logs/diff",
        200,
        json={"from_seq": 0, "include_tags": True, "node": ["x"]},
    )
    go("GET", "/v0/topics/logs", 200)
    go("GET", "/v0/topics/jobs?touch=false", 200)
    page = go("GET", "/v0/topics?page_size=1", 200)
    assert "next_cursor" in page
    go("GET", f"/v0/topics?page_size=1&cursor={page['next_cursor']}&touch=1", 200)
    go(
        "POST",
        "/v0/topics/logs/delete",
        200,
        json={"before_seq": 2, "match": ["tag", "Glob", "a:*"]},
    )
    go(
        "POST",
        "/v0/topics/jobs",
        200,
        json={"records": [{"data": {"job": i}, "tag": "j"} for i in range(3)]},
    )
    claimed = go("POST", "/v0/topics/jobs/claim", 200, json={"node": "w1", "max": 3})["claimed"]
    seqs = [j["$seq"] for j in claimed]
    ids = [j["lease_id"] for j in claimed]
    go("POST", "/v0/topics/jobs/extend", 200, json={"node": "w1", "seqs": seqs, "lease_ms": 5000})
    go("POST", "/v0/topics/jobs/nack", 200, json={"node": "w1", "seqs": seqs[:1], "delay_ms": 10})
    go(
        "POST",
        "/v0/topics/jobs/ack",
        200,
        json={"node": "w1", "seqs": seqs[1:], "lease_ids": ids[1:]},
    )
    go(
        "PUT",
        "/v0/routers/logs->copy",
        201,
        json={"source": "logs", "dest": "copy", "filter": "a:*"},
    )
    go(
        "PUT",
        "/v0/routers/logs->copy",
        200,
        json={"source": "logs", "dest": "copy", "guarantee": "exactly_once"},
    )
    go("GET", "/v0/routers/logs->copy", 200)
    go("GET", "/v0/routers?source=logs&page_size=5", 200)
    go(
        "POST",
        "/v0/watch?lenient=true",
        200,
        json={"topics": {"logs": {"from_seq": 1}, "nope": None}},
    )
    go("GET", "/v0/topics/jobs", 200)
    go("DELETE", "/v0/routers/logs->copy", 200)
    go("DELETE", "/v0/routers/logs->copy", 200)
    go("DELETE", "/v0/topics/fresh", 200)
    go("DELETE", "/v0/topics/fresh?if_empty=true", 200)
    for probe in ("/healthz", "/v0/health", "/readyz", "/v0/ready"):
        go("GET", probe, 200)
    assert go("GET", "/v0/metrics", 200).startswith("# HELP")
    go("GET", "/v0/metrics", 200, headers={"accept": "application/json"})
    go("GET", "/v0/openapi.json", 200)
    r = call(h, c, "GET", "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    call(h, c, "GET", "/console")


def test_error_responses_match(h: Harness, contract: Contract) -> None:
    c = contract

    def err(method: str, path: str, status: int, code: str, **kw: Any) -> dict[str, Any]:
        r = call(h, c, method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        assert r.json()["error"]["code"] == code
        return dict(r.json()["error"])

    err("GET", "/v0/topics/nope", 404, "topic_not_found")
    err("POST", "/v0/topics/nope/diff", 404, "topic_not_found")
    err(
        "POST",
        "/v0/topics/nope",
        404,
        "topic_not_found",
        json={"records": [{"data": 1}], "create": False},
    )
    err("POST", "/v0/topics/a", 400, "invalid_request", json={"records": []})
    err("POST", "/v0/topics/a", 400, "batch_too_large", json={"records": [{"data": 1}] * 10001})
    err(
        "POST",
        "/v0/topics/a",
        415,
        "unsupported_media_type",
        content=b"{}",
        headers={"content-type": "text/plain"},
    )
    err(
        "POST",
        "/v0/topics/a",
        400,
        "invalid_request",
        content=b"{",
        headers={"content-type": "application/json"},
    )
    err("PUT", "/v0/topics/bad name", 400, "invalid_request")
    err("POST", "/v0/topics/a/claim", 400, "invalid_request")
    err("POST", "/v0/topics/a/delete", 400, "invalid_request", json={})
    h.put("/v0/topics/q", json={"type": "queue"})
    err("PUT", "/v0/topics/q", 409, "topic_exists_incompatible", json={"type": "log"})
    h.write("log", 1)
    err("POST", "/v0/topics/log/claim", 409, "not_a_queue", json={"node": "w"})
    err("POST", "/v0/topics/log/ack", 409, "not_a_queue", json={"node": "w", "seqs": [1]})
    err(
        "POST",
        "/v0/topics/q/ack",
        400,
        "batch_too_large",
        json={"node": "w", "seqs": list(range(1001))},
    )
    err("POST", "/v0/topics/q/extend", 400, "invalid_request", json={"node": "w", "seqs": []})
    err("GET", "/v0/topics/q/work", 400, "invalid_request")
    err(
        "GET",
        "/v0/topics/q/work?node=w",
        406,
        "not_acceptable",
        headers={"accept": "application/json"},
    )
    err("GET", "/v0/topics/log/work?node=w", 409, "not_a_queue")
    err("DELETE", "/v0/topics/log?if_empty=1", 409, "topic_not_empty")
    h.put("/v0/topics/full", json={"cap_records": 1, "discard": "reject"})
    h.write("full", 1)
    err("POST", "/v0/topics/full", 422, "topic_full", json={"records": [{"data": 2}]})
    err(
        "POST",
        "/v0/topics/full",
        400,
        "record_too_large",
        json={"records": [{"data": 2}, {"data": 3}]},
    )
    err("GET", "/v0/topics?cursor=%25%25", 400, "invalid_request")
    err("GET", "/v0/routers/nope", 404, "router_not_found")
    err("PUT", "/v0/routers/x", 400, "invalid_request", json={"source": "a", "dest": "a"})
    err(
        "PUT",
        "/v0/routers/x",
        404,
        "topic_not_found",
        json={"source": "a", "dest": "zz", "create_dest": False},
    )
    h.put("/v0/routers/a->b", json={"source": "a", "dest": "b"})
    err("PUT", "/v0/routers/b->a", 409, "router_cycle", json={"source": "b", "dest": "a"})
    err(
        "PUT",
        "/v0/routers/c->b",
        409,
        "topic_exists_incompatible",
        json={"source": "c", "dest": "b"},
    )
    err("POST", "/v0/watch", 404, "topic_not_found", json={"topics": {"nope": {}}})
    err("POST", "/v0/watch", 400, "invalid_request", json={"topics": {}})
    err("GET", "/v0/watch/wid_" + "A" * 22, 404, "not_found")
    err("GET", "/v0/ws", 400, "invalid_request")
    err("GET", "/console/nope.js", 404, "not_found")
    h.node.ready = False
    h.node.replay_progress = 0.5
    e = err("GET", "/v0/topics", 503, "not_ready")
    assert e["detail"] == {"replay_progress": 0.5}
    err("GET", "/v0/ready", 503, "not_ready")
    err("GET", "/readyz", 503, "not_ready")


def test_auth_and_cap_errors_match(contract: Contract) -> None:
    env = {
        "TOPICS_API_KEYS": f"{KEY},r3ad:r,t9:rw:t9.",
        "TOPICS_MAX_TOPICS": "1",
        "TOPICS_PROBE_AUTH": "1",
    }
    h = Harness(env=env)
    c = contract
    try:
        for method, path in (("GET", "/v0/topics"), ("POST", "/v0/watch"), ("GET", "/healthz")):
            r = call(h, c, method, path)
            assert r.status_code == 401
        r = call(h, c, "GET", "/v0/topics/a/work?node=w&token=wrong")
        assert r.status_code == 401
        r = call(h, c, "PUT", "/v0/topics/a", headers={"authorization": "Bearer r3ad"})
        assert r.status_code == 403
        r = call(h, c, "GET", "/v0/topics/other", headers={"authorization": "Bearer t9"})
        assert r.status_code == 403
        assert call(h, c, "PUT", "/v0/topics/one", headers=BEARER).status_code == 201
        r = call(h, c, "PUT", "/v0/topics/two", headers=BEARER)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["detail"] == {"limit": "max_topics", "max": 1}
        r = call(
            h,
            c,
            "GET",
            "/v0/metrics",
            headers={"authorization": "Bearer t9", "accept": "application/json"},
        )
        assert r.status_code == 200 and "wal" not in r.json()
    finally:
        h.close()


# ------------------------------------------------------------ event streams


def event_validators(contract: Contract, schema: str) -> dict[str, tuple[Any, Any]]:
    """Per event name: (validator of the event object, validator of its JSON data)."""
    out: dict[str, tuple[Any, Any]] = {}
    for i, branch in enumerate(contract.doc["components"]["schemas"][schema]["anyOf"]):
        name = branch["properties"]["event"]["const"]
        base = ["components", "schemas", schema, "anyOf", str(i)]
        out[name] = (
            Draft202012Validator(
                {"$ref": contract.schema_pointer(*base)}, registry=contract.registry
            ),
            Draft202012Validator(
                {"$ref": contract.schema_pointer(*base, "properties", "data", "contentSchema")},
                registry=contract.registry,
            ),
        )
    return out


def check_event(validators: dict[str, tuple[Any, Any]], block: dict[str, Any]) -> None:
    event, data = validators[block["event"]]
    wire = {"event": block["event"], "data": json.dumps(block["data"])}
    if "id" in block:
        wire["id"] = block["id"]
    event.validate(wire)
    data.validate(block["data"])


def test_event_streams_match(contract: Contract) -> None:
    watch_events = event_validators(contract, "WatchEvent")
    work_events = event_validators(contract, "WorkEvent")

    async def main() -> None:
        async with asyncio.timeout(20), live_app() as srv:
            c = srv.http
            await c.put("/v0/topics/capped", json={"cap_records": 2})
            await c.post("/v0/topics/capped", json={"records": [{"data": i} for i in range(4)]})
            await c.post(
                "/v0/topics/q",
                json={"records": [{"data": {"n": 1}, "tag": "t"}], "config": {"type": "queue"}},
            )
            w = (
                await c.post("/v0/watch", json={"topics": {"capped": {}}, "include_tags": True})
            ).json()
            async with c.stream("GET", w["stream_url"]) as resp:
                contract.check("GET", resp)  # headers and content type; no body to read
                sse = Sse(resp)
                seen = [await sse.event() for _ in range(3)]
                await c.delete("/v0/topics/capped")
                seen.append(await sse.event())
            assert [e["event"] for e in seen] == [
                "tombstone",
                "record",
                "caught-up",
                "topic-deleted",
            ]
            for block in seen:
                check_event(watch_events, block)
            async with c.stream("GET", "/v0/topics/q/work?node=w1&max=2") as resp:
                contract.check("GET", resp)
                sse = Sse(resp)
                job = await sse.event()
                check_event(work_events, job)
                await c.put("/v0/topics/q", json={"type": "log"})  # 409: the queue stays
                await c.delete("/v0/topics/q")
                end = await sse.event()
                check_event(work_events, end)
                assert end["data"]["code"] == 409

    asyncio.run(main())


def test_a_405_lists_the_methods_the_path_takes() -> None:
    """RFC 9110: a 405 carries `Allow` (docs/API.md, "3.3 Every error code")."""
    from topics.errors import TopicsError
    from topics.http.responses import error_resp

    err = TopicsError(405, "method_not_allowed", "PATCH is not allowed here")
    err.allow = ("GET", "HEAD")
    assert (b"allow", b"GET, HEAD") in error_resp(err).headers
