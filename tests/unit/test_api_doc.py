"""docs/API.md keeps up with the code: every route, error code and metric is documented.

The routes come from the app's own route table (`TopicsApp._routes`), mapped to
their documented paths below; the mapping is checked against `classify`, so it
cannot drift from the real routing. Error codes are collected from every
`TopicsError(<status>, "<code>"` in `src/topics`, WebSocket error codes from
`ws.py`, and Prometheus metric names from `ops.py` and the WAL journal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from topics.config import ServerConfig
from topics.http.app import TopicsApp, build_app

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "topics"
DOC = ROOT / "docs" / "API.md"

# Route-table key -> the path docs/API.md uses for it.
ROUTE_PATHS = {
    "topics": "/v0/topics",
    "topic": "/v0/topics/:topic",
    "diff": "/v0/topics/:topic/diff",
    "delete": "/v0/topics/:topic/delete",
    "claim": "/v0/topics/:topic/claim",
    "ack": "/v0/topics/:topic/ack",
    "nack": "/v0/topics/:topic/nack",
    "extend": "/v0/topics/:topic/extend",
    "work": "/v0/topics/:topic/work",
    "routers": "/v0/routers",
    "router": "/v0/routers/:router",
    "watch": "/v0/watch",
    "watch_stream": "/v0/watch/:wid",
    "ws": "/v0/ws",
    "health": "/v0/health",
    "ready": "/v0/ready",
    "metrics": "/v0/metrics",
    "openapi": "/v0/openapi.json",
    "console": "/console/:file",
}
# Root aliases served besides the /v0 paths.
ALIASES = {"/healthz": "health", "/readyz": "ready"}
SAMPLE = {":topic": "orders", ":router": "a->b", ":wid": "wid_x"}

_ERROR_RE = re.compile(r'TopicsError\(\s*(\d{3}),\s*"([a-z_]+)"')
_WS_ERROR_RE = re.compile(r'(?:WsError\(\s*|_error\(\s*[^,()]+,\s*)"([a-z_]+)"')
_METRIC_RE = re.compile(r'(?:metric|one)\(\s*"(topics_[a-z0-9_]+)"|name = "(topics_[a-z0-9_]+)"')


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def app() -> TopicsApp:
    return build_app(ServerConfig())


def _concrete(path: str) -> str:
    for k, v in SAMPLE.items():
        path = path.replace(k, v)
    return path


def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


def test_every_route_key_has_a_documented_path(app: TopicsApp) -> None:
    keys = set(app._routes)
    assert keys == set(ROUTE_PATHS), (
        f"new route keys {sorted(keys - set(ROUTE_PATHS))} need a path in ROUTE_PATHS "
        f"and a section in docs/API.md; stale: {sorted(set(ROUTE_PATHS) - keys)}"
    )


def test_documented_paths_route_where_the_table_says(app: TopicsApp) -> None:
    for key, path in ROUTE_PATHS.items():
        for method, route in app._routes[key].items():
            m = app.classify(method, _concrete(path))
            assert m.route is route, f"{method} {path} does not reach route {key!r}"
    for alias, key in ALIASES.items():
        assert app.classify("GET", alias).route is app._routes[key]["GET"], alias


def test_doc_mentions_every_route(app: TopicsApp, doc: str) -> None:
    missing = [
        f"{method} {path}"
        for key, path in ROUTE_PATHS.items()
        for method in app._routes[key]
        if f"{method} {path}" not in doc
    ]
    missing += [alias for alias in ALIASES if f"`{alias}`" not in doc]
    assert not missing, f"docs/API.md does not mention: {missing}"


def test_doc_tables_every_error_code(doc: str) -> None:
    found = {
        (int(m.group(1)), m.group(2))
        for text in _sources().values()
        for m in _ERROR_RE.finditer(text)
    }
    # A sanity floor, so a refactor that hides the codes cannot make this test vacuous.
    assert len(found) >= 20, found
    missing = [
        f"{status} {code}"
        for status, code in sorted(found)
        if not re.search(rf"^\|\s*{status}\s*\|\s*`{code}`\s*\|", doc, re.MULTILINE)
    ]
    assert not missing, f"docs/API.md error table lacks rows for: {missing}"


def test_doc_mentions_every_websocket_error_code(doc: str) -> None:
    text = (SRC / "http" / "ws.py").read_text(encoding="utf-8")
    codes = set(_WS_ERROR_RE.findall(text))
    assert {"invalid_json", "unsupported_message", "server_shutting_down"} <= codes, codes
    missing = sorted(c for c in codes if f"`{c}`" not in doc)
    assert not missing, f"docs/API.md does not mention WebSocket error codes: {missing}"


def test_doc_mentions_every_prometheus_metric(doc: str) -> None:
    names: set[str] = set()
    for path in (SRC / "http" / "ops.py", SRC / "storage" / "journal.py"):
        for a, b in _METRIC_RE.findall(path.read_text(encoding="utf-8")):
            names.add(a or b)
    assert "topics_wal_disk_full" in names and "topics_topics" in names, names
    missing = sorted(n for n in names if f"`{n}" not in doc)
    assert not missing, f"docs/API.md does not mention metrics: {missing}"


def test_doc_cites_only_this_repository(doc: str) -> None:
    for outside in ("../shared", "shared/spec", "SEMANTICS.md", "notes/"):
        assert outside not in doc, f"docs/API.md refers to {outside!r}"
