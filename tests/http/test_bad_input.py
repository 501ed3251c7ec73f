"""Hostile-input fuzzing of every HTTP body endpoint (API §1.4-1.7, §12).

For arbitrary JSON values, hostile JSON text (nesting past the parser's limit,
lone surrogates, numbers overflowing a double) in any field, raw bytes, wrong
content types, oversize bodies and bad path names the server must never answer 5xx; every non-2xx answer carries
exactly the canonical error envelope with a registered code and its status; and
a rejected request changes nothing observable (topic list, every topic's state,
router list, watch sessions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.harness import Harness, assert_error

# API §1.7: every error code and its HTTP status.
REGISTRY = {
    "invalid_request": 400,
    "batch_too_large": 400,
    "record_too_large": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "topic_not_found": 404,
    "router_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "not_acceptable": 406,
    "router_cycle": 409,
    "topic_exists_incompatible": 409,
    "topic_not_empty": 409,
    "not_a_queue": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "topic_full": 422,
    "throttled": 429,
    "internal": 500,
    "not_ready": 503,
    "shutting_down": 503,
}

MAX_BODY = 16384
JSON_CT = {"content-type": "application/json"}

# ------------------------------------------------------------------ endpoints

CONFIG_TEMPLATE: dict[str, Any] = {
    "type": "queue",
    "ttl_ms": 0,
    "cap_records": 50,
    "cap_bytes": 0,
    "discard": "old",
    "durable": False,
    "durability": "memory",
    "priority": 5,
    "auto_priority": True,
    "auto_create": True,
    "idempotency_window_ms": 1000,
    "dedupe_node": True,
    "lease_ms": 1000,
    "claim_jitter_ms": 0,
    "max_deliveries": 2,
    "dead_letter": "fz.dlq",
    "leases_durable": False,
}

# name -> (method, path template, target topic/router names, valid body template)
# Claims only ever target topics whose config the fuzzer cannot change (no PUT,
# no create-on-write), so no `claim_jitter_ms` window can slow the run down.
ENDPOINTS: dict[str, tuple[str, str, list[str], dict[str, Any]]] = {
    "put_topic": (
        "PUT",
        "/v0/topics/{}",
        ["fz.new", "fz.log", "fz.q2", "fz.dst", "bad name", "-x", "x" * 256],
        CONFIG_TEMPLATE,
    ),
    "write": (
        "POST",
        "/v0/topics/{}",
        ["fz.log", "fz.q", "fz.w", "fz.absent", "bad name", "x" * 256],
        {
            "records": [{"data": {"a": 1}, "tag": "t:1", "node": "n1", "meta": {"m": 1}}],
            "node": "n",
            "idempotency_key": "k",
            "create": True,
            "config": {"type": "log", "cap_records": 100},
            "disable_backpressure": False,
        },
    ),
    "diff": (
        "POST",
        "/v0/topics/{}/diff",
        ["fz.log", "fz.q", "fz.dst", "fz.absent", "bad name"],
        {
            "from_seq": 0,
            "limit": 10,
            "node": ["n1"],
            "include_tags": True,
            "include_meta": True,
            "wait_ms": 0,
            "max_batch_bytes": 1000,
        },
    ),
    "delete": (
        "POST",
        "/v0/topics/{}/delete",
        ["fz.log", "fz.absent", "bad name"],
        {"before_seq": 2, "match": ["tag", "Glob", "t:*"]},
    ),
    "claim": (
        "POST",
        "/v0/topics/{}/claim",
        ["fz.q", "fz.log", "fz.absent"],
        {"node": "w", "max": 2, "lease_ms": 1000},
    ),
    "ack": (
        "POST",
        "/v0/topics/{}/ack",
        ["fz.q", "fz.log", "fz.absent"],
        {"node": "w", "seqs": [1, 2], "lease_ids": ["lease_1", ""]},
    ),
    "nack": (
        "POST",
        "/v0/topics/{}/nack",
        ["fz.q", "fz.log", "fz.absent"],
        {"node": "w", "seqs": [3], "lease_ids": [""], "delay_ms": 10},
    ),
    "extend": (
        "POST",
        "/v0/topics/{}/extend",
        ["fz.q", "fz.log", "fz.absent"],
        {"node": "w", "seqs": [4], "lease_ids": [], "lease_ms": 1000},
    ),
    "put_router": (
        "PUT",
        "/v0/routers/{}",
        ["fz.r", "fz.r2", "bad name!", "r" * 256],
        {
            "source": "fz.log",
            "dest": "fz.dst",
            "preserve_node": True,
            "preserve_tag": True,
            "create_dest": True,
            "filter": ["tag", "Glob", "t:*"],
            "allow_cycle": False,
            "guarantee": "exactly_once",
        },
    ),
    "watch": (
        "POST",
        "/v0/watch{}",
        ["", "?lenient=true"],
        {
            "topics": {"fz.log": {"from_seq": 0, "tail": False}, "fz.q": {}},
            "node": "n",
            "limit": 10,
            "max_batch_bytes": 1000,
            "heartbeat_ms": 1000,
            "include_meta": True,
            "include_tags": False,
            "include_data": True,
            "consistency": "eventual",
        },
    ),
}


def _keys(template: Any, out: set[str]) -> set[str]:
    if isinstance(template, dict):
        for k, v in template.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(template, list):
        for v in template:
            _keys(v, out)
    return out


EXTRA_KEYS = ["fz.log", "fz.q", "fz.absent", "data", "tag", "node", "meta", "from_seq", "tail"]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2, 1000, 1001, 10_001, 2**31, 2**32, 2**63, 2**64 - 1, 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "lease_1", "lease_zz", "t:*", "*", "queue", "log", "reject", "fz.log"])
)

# Values that sit just past a documented limit (API §12) or are otherwise special.
SPECIAL = st.sampled_from(
    [
        list(range(1001)),  # queue seqs > 1000
        list(range(1000)),
        ["lease_1"] * 3,
        "x" * 257,  # tag / idempotency_key > 256 bytes
        "n" * 129,  # node > 128 bytes
        "é" * 65,
        {f"k{i}": i for i in range(65)},  # meta > 64 keys
        {"m": "x" * 16_385},  # meta > 16 KiB (and the body cap)
        [{"data": 1}] * 3,
        [{"data": None, "tag": "t:2"}],
        [{"tag": "no data"}],
        ["tag", "Glob", "nostar"],
        ["tag", "Eq", 1],
        {"fz.log": {"from_seq": -1}},
        {f"w{i}": {} for i in range(257)},
        {"type": "queue", "claim_jitter_ms": 5000},
    ]
)


def json_values(keys: list[str]) -> st.SearchStrategy[Any]:
    key = st.sampled_from(keys) | st.text(max_size=8)
    return SPECIAL | st.recursive(
        SCALARS,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(key, children, max_size=5)
        ),
        max_leaves=12,
    )


def _paths(v: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*prefix, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*prefix, i))
    return out


def _mutate(template: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    body = json.loads(json.dumps(template))
    parent = body
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if delete and isinstance(parent, dict):
        del parent[last]
    else:
        parent[last] = value
    return body


@st.composite
def bodies(draw: st.DrawFn, name: str) -> Any:
    """A random JSON value, a random object of the endpoint's fields, or a one-field mutation."""
    template = ENDPOINTS[name][3]
    keys = sorted(_keys(template, set()) | set(EXTRA_KEYS))
    values = json_values(keys)
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(values)
    if kind == 1:
        return draw(st.dictionaries(st.sampled_from(keys), values, max_size=6))
    body = template
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(_paths(body)))
        value = draw(SCALARS | values)
        body = _mutate(body, path, value, draw(st.integers(0, 3)) == 0)
    if draw(st.booleans()):
        body = {**body, draw(st.text(max_size=6)): draw(SCALARS)}
    return body


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, str, Any]:
    name = draw(st.sampled_from(sorted(ENDPOINTS)))
    method, tmpl, targets, _ = ENDPOINTS[name]
    path = tmpl.format(draw(st.sampled_from(targets)))
    return name, method, path, draw(bodies(name))


# ------------------------------------------------------------------ checking


def seed(h: Harness) -> None:
    """Topics, a router, a queue with leased and unleased jobs, a watch session."""
    assert h.put("/v0/topics/fz.q", {"type": "queue", "lease_ms": 60000}).status_code == 201
    assert h.put("/v0/topics/fz.q2", {"type": "queue"}).status_code == 201
    assert h.put("/v0/routers/fz.r", {"source": "fz.log", "dest": "fz.dst"}).status_code == 201
    h.write("fz.log", {"a": 1}, {"b": 2}, tag="t:1", node="n1", meta={"m": 1})
    h.write("fz.log", 3, 4)
    h.write("fz.q", *range(20), tag="job")
    assert h.post("/v0/topics/fz.q/claim", {"node": "w", "max": 5}).status_code == 200
    assert h.post("/v0/watch", {"topics": {"fz.log": {}}}).status_code == 200


IGNORED = {"last_read_ts", "effective_priority", "performance"}


def snapshot(h: Harness) -> dict[str, Any]:
    listed = h.get("/v0/topics?page_size=1000")
    assert listed.status_code == 200, listed.text
    topics = [{k: v for k, v in t.items() if k not in IGNORED} for t in listed.json()["topics"]]
    states = {}
    for t in topics:
        r = h.get(f"/v0/topics/{t['topic']}?touch=false")
        assert r.status_code == 200, r.text
        states[t["topic"]] = {k: v for k, v in r.json().items() if k not in IGNORED}
    routers = h.get("/v0/routers?page_size=1000")
    assert routers.status_code == 200, routers.text
    return {
        "topics": topics,
        "states": states,
        "routers": routers.json()["routers"],
        "watch_sessions": len(h.app.watches.sessions),
    }


def check_response(r: httpx.Response) -> None:
    """Never 5xx; errors carry exactly the canonical envelope with a registered code."""
    assert r.status_code < 500, (r.status_code, r.text)
    if r.request.method == "HEAD":
        return  # no body
    if r.status_code < 300:
        body = r.json()
        assert isinstance(body, dict) and "error" not in body, body
        return
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict) and {"code", "message"} <= set(err), err
    assert set(err) <= {"code", "message", "detail"}, err
    assert err["code"] in REGISTRY, err
    assert REGISTRY[err["code"]] == r.status_code, (r.status_code, err)
    assert isinstance(err["message"], str) and err["message"], err
    if "detail" in err:
        assert isinstance(err["detail"], dict), err
    if r.status_code in (429, 503):
        assert r.headers.get("retry-after") == "1"


def send_checked(h: Harness, method: str, path: str, **kw: Any) -> httpx.Response:
    """Send one request; if it is rejected, assert that nothing changed."""
    before = snapshot(h)
    r = h.req(method, path, **kw)
    check_response(r)
    if r.status_code >= 300:
        after = snapshot(h)
        assert after == before, (method, path, kw.get("content", b"")[:200], r.text)
    return r


# The second instance runs at tight resource caps (API §12), so 429s and their
# roll-backs (router/dead-letter auto-create, topic auto-create) are exercised too.
TIGHT = {
    "TOPICS_MAX_TOPICS": "5",
    "TOPICS_MAX_ROUTERS": "2",
    "TOPICS_MAX_WATCH_SESSIONS": "3",
    "TOPICS_MAX_TOTAL_BYTES": "400",
}


@pytest.fixture(scope="module", params=["default", "tight"])
def fz(request: pytest.FixtureRequest) -> Iterator[Harness]:
    env = {"TOPICS_MAX_BODY_BYTES": str(MAX_BODY)}
    if request.param == "tight":
        env.update(TIGHT)
    harness = Harness(env)
    seed(harness)
    yield harness
    harness.close()


@pytest.fixture
def fresh() -> Iterator[Harness]:
    """A freshly seeded instance for the deterministic tests."""
    harness = Harness({"TOPICS_MAX_BODY_BYTES": str(MAX_BODY)})
    seed(harness)
    yield harness
    harness.close()


def _no_long_poll(name: str, body: Any) -> Any:
    """A positive in-range `wait_ms` would long-poll in real time: zero it."""
    if name == "diff" and isinstance(body, dict):
        w = body.get("wait_ms")
        if isinstance(w, int) and not isinstance(w, bool) and 0 < w < 2**64:
            return {**body, "wait_ms": 0}
    return body


# Raise for a deeper local run, e.g. `TOPICS_FUZZ_SCALE=20 pytest tests/http/test_bad_input.py`.
SCALE = float(os.environ.get("TOPICS_FUZZ_SCALE", "1"))


def _n(base: int) -> int:
    return max(1, int(base * SCALE))


FUZZ = settings(
    max_examples=_n(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# ------------------------------------------------------------------ tests


@FUZZ
@given(req=requests())
def test_arbitrary_json_bodies(fz: Harness, req: tuple[str, str, str, Any]) -> None:
    name, method, path, body = req
    body = _no_long_poll(name, body)
    send_checked(fz, method, path, content=json.dumps(body).encode(), headers=JSON_CT)


CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=utf-8",
    "  application/json",
    "application/jsonx",
    "APPLICATION/JSON",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "json",
]


@settings(
    max_examples=_n(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(sorted(ENDPOINTS)),
    target=st.integers(0, 10),
    raw=st.binary(max_size=64)
    | st.sampled_from(
        [b"", b" ", b"{", b"[", b"null", b"{}", b'{"a":', b"\xff\xfe", b"1e999", b"NaN"]
    )
    | st.text(max_size=32).map(str.encode),
    ct=st.sampled_from(CONTENT_TYPES),
)
def test_raw_bytes_and_content_types(
    fz: Harness, name: str, target: int, raw: bytes, ct: str | None
) -> None:
    method, tmpl, targets, _ = ENDPOINTS[name]
    path = tmpl.format(targets[target % len(targets)])
    headers = {} if ct is None else {"content-type": ct}
    r = send_checked(fz, method, path, content=raw, headers=headers)
    if r.status_code == 415:
        assert ct is None or not ct.lstrip().startswith("application/json")


# ------------------------------------------------------------ hostile JSON values

# JSON text no conforming parse may accept (docs/HTTP_INPUT.md "JSON"): nesting
# past 1024 levels, lone UTF-16 surrogates (escaped, or encoded into the UTF-8
# bytes), numbers that overflow a double, the non-JSON constants.
REFUSED = {
    "deep_array": b"[" * 1100 + b"]" * 1100,
    "deep_object": b'{"a":' * 1100 + b"1" + b"}" * 1100,
    "deep_mixed": b'[{"k":' * 520 + b"0" + b"}]" * 520,
    "high_surrogate": b'"\\ud800"',
    "low_surrogate": b'"x\\udc00y"',
    "reversed_pair": b'"\\ude00\\ud83d"',
    "utf8_surrogate": b'"\xed\xa0\x80"',
    "inf": b"1e400",
    "neg_inf": b"-1e400",
    "inf_in_array": b"[1, 2.5, 1e309]",
    "long_exponent": b"1" + b"0" * 400,
    "nan": b"NaN",
    "infinity": b"-Infinity",
}
# Valid JSON that must still never be stored or echoed in a way that breaks later:
# nesting that parses but is past what can be serialised again, a huge but finite
# number, a long string, every wrong type.
ODD = {
    "deep_storable_limit": b"[" * 300 + b"]" * 300,
    "deep_object_300": b'{"a":' * 300 + b"1" + b"}" * 300,
    "max_double": b"1.7976931348623157e308",
    "tiny": b"1e-400",
    "surrogate_pair": b'"\\ud83d\\ude00"',
    "wide_int": b"123456789012345678901234567890",
    "neg_zero": b"-0.0",
    "nul_char": b'"a\\u0000b"',
    "object": b'{"x":[1,{"y":null}]}',
    "empty_string": b'""',
    "bool": b"true",
}
MARK = "\u0001HOSTILE\u0001"
MARK_JSON = json.dumps(MARK).encode()


def _splice(body: Any, hostile: bytes) -> bytes:
    """`body` as JSON with the marker string replaced by the hostile JSON text."""
    text = json.dumps(body).encode()
    assert MARK_JSON in text, body
    return text.replace(MARK_JSON, hostile)


@st.composite
def hostile_requests(draw: st.DrawFn, table: dict[str, bytes]) -> tuple[str, str, str, bytes]:
    """A valid body of a random endpoint with one hostile value put somewhere in it.

    The value replaces a field (any depth), is added under a new key, is wrapped
    in an array or object, or a key itself is made hostile (lone surrogate).
    """
    name = draw(st.sampled_from(sorted(ENDPOINTS)))
    method, tmpl, targets, template = ENDPOINTS[name]
    path = tmpl.format(draw(st.sampled_from(targets)))
    kind = draw(st.sampled_from(sorted(table)))
    hostile = table[kind]
    where = draw(st.integers(0, 5))
    mark: Any = MARK
    if where == 4:
        mark = draw(st.sampled_from([[1, MARK], {"k": MARK}, [[MARK]]]))
    if where == 5:  # the whole body
        return name, method, path, hostile
    if where == 3 or not _paths(template):
        body = {**template, draw(st.sampled_from(sorted(EXTRA_KEYS))): mark}
    else:
        body = _mutate(template, draw(st.sampled_from(_paths(template))), mark, False)
    raw = _splice(body, hostile)
    if draw(st.integers(0, 4)) == 0:  # a hostile key as well
        raw = raw.replace(b'{"', b'{"\\ud800', 1)
    return name, method, path, raw


def render_everything(h: Harness) -> None:
    """Every stored record and every listing still renders (no 500 later)."""
    snap = snapshot(h)
    for t in snap["topics"]:
        r = h.post(f"/v0/topics/{t['topic']}/diff", {"from_seq": 0, "limit": 1000})
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["records"], list)


HOSTILE = settings(
    max_examples=_n(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@HOSTILE
@given(req=hostile_requests(REFUSED))
def test_hostile_json_is_refused_everywhere(fz: Harness, req: tuple[str, str, str, bytes]) -> None:
    """Any refused value in any field of any body endpoint: 400, canonical body, no change."""
    name, method, path, raw = req
    r = send_checked(fz, method, path, content=raw, headers=JSON_CT)
    assert_error(r, 400, "invalid_request")
    assert r.json()["error"]["message"].startswith("malformed JSON body"), r.text


@HOSTILE
@given(req=hostile_requests(ODD))
def test_odd_but_valid_json_never_breaks_anything(
    fz: Harness, req: tuple[str, str, str, bytes]
) -> None:
    """Valid JSON of awkward shapes in any field: never 5xx, and everything renders after."""
    name, method, path, raw = req
    send_checked(fz, method, path, content=_no_long_poll_raw(name, raw), headers=JSON_CT)
    render_everything(fz)


def _no_long_poll_raw(name: str, raw: bytes) -> bytes:
    if name != "diff":
        return raw
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    fixed = _no_long_poll(name, body)
    return raw if fixed is body else json.dumps(fixed).encode()


def test_hostile_values_in_stored_fields_are_refused_before_storing(fresh: Harness) -> None:
    """The fields that are stored and rendered later, one by one."""
    deep = b"[" * 300 + b"]" * 300
    cases = [
        ("POST", "/v0/topics/fz.log", b'{"records":[{"data":%s}]}'),
        ("POST", "/v0/topics/fz.log", b'{"records":[{"data":1,"meta":{"m":%s}}]}'),
        ("POST", "/v0/topics/fz.log", b'{"records":[{"data":1,"tag":%s}]}'),
        ("POST", "/v0/topics/fz.log", b'{"records":[{"data":1,"node":%s}]}'),
        ("POST", "/v0/topics/fz.log", b'{"records":[{"data":1}],"node":%s}'),
        ("POST", "/v0/topics/fz.new", b'{"records":[{"data":1}],"config":{"dead_letter":%s}}'),
        ("PUT", "/v0/topics/fz.new", b'{"type":"queue","dead_letter":%s}'),
        ("PUT", "/v0/routers/fz.r9", b'{"source":"fz.log","dest":%s}'),
        ("PUT", "/v0/routers/fz.r9", b'{"source":"fz.log","dest":"fz.d","filter":["tag","Eq",%s]}'),
        ("POST", "/v0/watch", b'{"topics":{"fz.log":{}},"node":%s}'),
        ("POST", "/v0/topics/fz.q/claim", b'{"node":%s}'),
        ("POST", "/v0/topics/fz.q/ack", b'{"node":"w","seqs":[1],"lease_ids":[%s]}'),
    ]
    for method, path, tmpl in cases:
        for kind in ("deep_array", "high_surrogate", "utf8_surrogate", "inf", "neg_inf"):
            value = REFUSED[kind]
            r = send_checked(fresh, method, path, content=tmpl % value, headers=JSON_CT)
            assert_error(r, 400, "invalid_request")
        r = send_checked(fresh, method, path, content=tmpl % deep, headers=JSON_CT)
        assert 400 <= r.status_code < 500, (path, tmpl, r.text)
    render_everything(fresh)


def test_wrong_content_type_is_415_for_every_body_endpoint(fresh: Harness) -> None:
    for name, (method, tmpl, targets, template) in ENDPOINTS.items():
        path = tmpl.format(targets[0])
        for ct in ("text/plain", "APPLICATION/JSON", "application/xml", None):
            headers = {} if ct is None else {"content-type": ct}
            r = send_checked(
                fresh, method, path, content=json.dumps(template).encode(), headers=headers
            )
            assert_error(r, 415, "unsupported_media_type")
        # empty bodies: PUT topic and diff treat them as {}; claim => 400; others => 415/400
        r = send_checked(fresh, method, path, content=b"")
        if name in ("put_topic", "diff"):
            assert r.status_code in (200, 201), (name, r.text)
        elif name == "claim":
            assert_error(r, 400, "invalid_request")
        else:
            assert_error(r, 415, "unsupported_media_type")
            r = send_checked(fresh, method, path, content=b"", headers=JSON_CT)
            assert_error(r, 400, "invalid_request")


def test_oversize_bodies_are_413_before_parsing(fresh: Harness) -> None:
    for name, (method, tmpl, targets, template) in ENDPOINTS.items():
        path = tmpl.format(targets[0])
        big = json.dumps({**template, "pad": "x" * MAX_BODY}).encode()
        assert len(big) > MAX_BODY
        for headers in (JSON_CT, {"content-type": "text/plain"}, {}):
            assert_error(
                send_checked(fresh, method, path, content=big, headers=headers),
                413,
                "payload_too_large",
            )
        garbage = b"\x00" * (MAX_BODY + 1)
        assert_error(
            send_checked(fresh, method, path, content=garbage, headers=JSON_CT),
            413,
            "payload_too_large",
        )

        # chunked upload without a content-length is counted as it arrives
        async def chunks() -> Any:
            for _ in range(MAX_BODY // 512 + 2):
                yield b" " * 512

        assert_error(
            send_checked(fresh, method, path, content=chunks(), headers=JSON_CT),
            413,
            "payload_too_large",
        )
        # a body of exactly the limit is not refused for its size
        exact = json.dumps(template).encode()
        exact += b" " * (MAX_BODY - len(exact))
        r = send_checked(fresh, method, path, content=exact, headers=JSON_CT)
        assert r.status_code != 413, (name, r.text)
    # routing (404/405) is decided before the body size
    big = b"x" * (MAX_BODY + 1)
    assert_error(send_checked(fresh, "POST", "/v0/nowhere", content=big), 404, "not_found")
    assert_error(
        send_checked(fresh, "PATCH", "/v0/topics/fz.log", content=big), 405, "method_not_allowed"
    )


def test_oversize_after_auth_and_scope() -> None:
    ha = Harness({"TOPICS_MAX_BODY_BYTES": "64", "TOPICS_API_KEYS": "root,reader:r"})
    try:
        big = b"{" + b" " * 100 + b"}"
        assert_error(ha.post("/v0/topics/a", content=big), 401, "unauthorized")
        assert_error(
            ha.post("/v0/topics/a", content=big, headers={"authorization": "Bearer reader"}),
            403,
            "forbidden",
        )
        assert_error(
            ha.post("/v0/topics/a", content=big, headers={"authorization": "Bearer root"}),
            413,
            "payload_too_large",
        )
    finally:
        ha.close()


SEGMENTS = st.sampled_from(
    [
        "fz.log",
        "fz.q2",
        "fz.absent",
        "fz.r",
        "bad name",
        "-x",
        "x" * 256,
        "a>b",
        "é",
        "%",
        "a:b",
        ".",
    ]
) | st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="/?#"),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=_n(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
    kind=st.sampled_from(["topic", "sub", "router", "watch", "other"]),
    seg=SEGMENTS,
    sub=st.sampled_from(["diff", "delete", "claim", "ack", "nack", "extend", "work", "zzz", ""]),
    body=st.sampled_from([None, b"{}", b'{"node":"w","seqs":[]}', b"garbage"]),
)
def test_bad_names_and_unknown_things_in_paths(
    method: str, kind: str, seg: str, sub: str, body: bytes | None, pz: Harness
) -> None:
    seg = quote(seg, safe="")
    if kind == "topic":
        path = f"/v0/topics/{seg}"
    elif kind == "sub":
        path = f"/v0/topics/{seg}/{sub}"
    elif kind == "router":
        path = f"/v0/routers/{seg}"
    elif kind == "watch":
        path = f"/v0/watch/{seg}"  # never a real wid
    else:
        path = f"/v0/{seg}"
    kw: dict[str, Any] = {}
    if body is not None:
        kw = {"content": body, "headers": JSON_CT}
    if path == "/v0/ws" and method in ("GET", "HEAD"):
        return  # plain-HTTP GET /v0/ws: see test_plain_get_on_ws_is_an_error
    r = send_checked(pz, method, path, **kw)
    if method == "HEAD":
        return
    if kind == "router" and method == "GET" and r.status_code == 404:
        assert r.json()["error"]["code"] in ("router_not_found", "not_found")


@pytest.fixture(scope="module")
def pz() -> Iterator[Harness]:
    """A separate instance for path fuzzing (it may delete the seeded topics)."""
    harness = Harness({"TOPICS_MAX_BODY_BYTES": str(MAX_BODY)})
    seed(harness)
    yield harness
    harness.close()


def test_unknown_topics_routers_and_wids(fresh: Harness) -> None:
    assert_error(send_checked(fresh, "GET", "/v0/topics/fz.none"), 404, "topic_not_found")
    assert_error(send_checked(fresh, "GET", "/v0/topics/bad%20name"), 404, "topic_not_found")
    assert_error(
        send_checked(fresh, "POST", "/v0/topics/fz.none/diff", json={}), 404, "topic_not_found"
    )
    assert_error(
        send_checked(fresh, "POST", "/v0/topics/fz.none/delete", json={"before_seq": 1}),
        404,
        "topic_not_found",
    )
    assert_error(
        send_checked(
            fresh, "POST", "/v0/topics/fz.none", json={"records": [{"data": 1}], "create": False}
        ),
        404,
        "topic_not_found",
    )
    assert_error(
        send_checked(fresh, "POST", "/v0/topics/bad%20name", json={"records": [{"data": 1}]}),
        400,
        "invalid_request",
    )
    assert_error(
        send_checked(fresh, "PUT", "/v0/topics/bad%20name", json={}), 400, "invalid_request"
    )
    r = send_checked(fresh, "DELETE", "/v0/topics/fz.none")
    assert r.status_code == 200 and r.json()["deleted"] is False
    err = assert_error(send_checked(fresh, "GET", "/v0/routers/fz.none"), 404, "router_not_found")
    assert err["detail"] == {"router": "fz.none"}
    r = send_checked(fresh, "DELETE", "/v0/routers/fz.none")
    assert r.status_code == 200 and r.json()["deleted"] is False
    for wid in ("wid_AAAAAAAAAAAAAAAAAAAAAA", "nope", "wid_"):
        assert_error(send_checked(fresh, "GET", f"/v0/watch/{wid}"), 404, "not_found")
    assert_error(
        send_checked(fresh, "POST", "/v0/watch", json={"topics": {"fz.none": {}}}),
        404,
        "topic_not_found",
    )
    assert_error(
        send_checked(fresh, "POST", "/v0/watch", json={"topics": {}}), 400, "invalid_request"
    )
    assert_error(
        send_checked(
            fresh, "POST", "/v0/watch", json={"topics": {f"t{i}": {} for i in range(257)}}
        ),
        400,
        "invalid_request",
    )


def test_plain_get_on_ws_is_an_error(fresh: Harness) -> None:
    r = fresh.get("/v0/ws")
    check_response(r)
    assert 400 <= r.status_code < 500
