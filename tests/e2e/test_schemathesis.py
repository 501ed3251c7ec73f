"""Property-based requests drawn from the OpenAPI document, against a live server.

The real `topics serve` process (auth on, one key with every scope) is asked
for its own `/v0/openapi.json`; schemathesis then generates requests for every
operation, valid and invalid ones, and checks each response: never a 5xx, the
status documented, the content type documented, the body and the documented
headers matching their schemas, invalid input refused, valid input not refused
for a reason the document does not state, and every secured operation refusing
a request without the key. Event streams are read for a moment and their events
validated.

A second test runs sequences that follow the document's links (a watch session
created, then streamed; a topic put, then read and written), as a state machine.

Bounded for two shared CPUs (about 40 s): `TOPICS_SCHEMATHESIS_EXAMPLES` (default
25) bounds the fuzzed cases per operation and the stateful scenarios (the
examples and boundary-value phases add their own, fixed, cases); generation is
derandomized (the same cases every run) unless `TOPICS_SCHEMATHESIS_RANDOM=1`.
The summary (operations, cases, stateful steps, statuses, failures) is printed
at the end of the module, and written as JSON to `TOPICS_SCHEMATHESIS_SUMMARY`
when that is set.

One thing is left to the document's prose rather than tested here: `GET /v0/ws`
(schemathesis speaks no WebSocket; tests/http/test_openapi.py checks its
plain-GET answer).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.errors import Flaky
from schemathesis import Case, CheckContext, Response

from tests.support.process import ServerProcess
from topics.http.openapi import document_bytes

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

KEY = "s3cret"
EXAMPLES = int(os.environ.get("TOPICS_SCHEMATHESIS_EXAMPLES", "25"))
RANDOM = os.environ.get("TOPICS_SCHEMATHESIS_RANDOM", "") in ("1", "true")
#: Seconds a request may take: a claim can wait out a queue's claim_jitter_ms (<= 5 s).
REQUEST_TIMEOUT = 10.0
#: Seconds an event stream is read before the client hangs up (it never ends by itself).
STREAM_SECONDS = 1.0
#: Diff long-polls are cut to this (ms) so one case cannot hold the run for 30 s.
MAX_WAIT_MS = 100
U32_MAX = (1 << 32) - 1

#: Why a schema-valid request may still be refused with 400/422: rules that tie two
#: fields together, or the request to stored state, which JSON Schema cannot say.
#: Each is stated in the operation's description or its 400/422 response (docs/API.md
#: 5, 7.1, 8.3, 11.1, 14.3). Per operation label, matched against the error message.
ALLOWED_REFUSALS: dict[str, tuple[str, ...]] = {
    "PUT /v0/topics/{topic}": ("must differ from the queue itself",),
    "POST /v0/topics/{topic}": (
        "config.",  # an inline config is checked when the write creates the topic
        "must differ from the queue itself",
        "can never fit within the topic's caps",  # a discard:reject topic's caps
        "is full (discard: reject)",  # 422 topic_full: the topic is full right now
    ),
    "PUT /v0/routers/{router}": ("router source and dest must differ",),
    "POST /v0/topics/{topic}/ack": ("lease_ids must have one entry per seq",),
    "POST /v0/topics/{topic}/nack": ("lease_ids must have one entry per seq",),
    "POST /v0/topics/{topic}/extend": ("lease_ids must have one entry per seq",),
    # A list cursor is opaque: one the server did not hand out may not decode.
    "GET /v0/topics": ("invalid cursor",),
    "GET /v0/routers": ("invalid cursor",),
}
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Summary:
    """What the run did: cases per operation, statuses seen, distinct failures."""

    cases: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    failures: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    started: float = field(default_factory=time.monotonic)

    def record_failure(self, label: str, exc: BaseException) -> None:
        for e in exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,):
            title = getattr(e, "title", type(e).__name__)
            lines = [x for x in str(getattr(e, "message", e)).splitlines() if x.strip()]
            self.failures[label].add(f"{title}: {' / '.join(lines[:3])}"[:300])

    def as_dict(self) -> dict[str, Any]:
        labels = sorted(set(self.cases) | set(self.steps))
        return {
            "operations": len(labels),
            "cases": sum(self.cases.values()),
            "stateful_steps": sum(self.steps.values()),
            "failures": sum(len(v) for v in self.failures.values()),
            "seconds": round(time.monotonic() - self.started, 1),
            "notes": self.notes,
            "per_operation": {
                label: {
                    "cases": self.cases[label],
                    "stateful_steps": self.steps[label],
                    "statuses": dict(sorted(self.statuses[label].items())),
                    "failures": sorted(self.failures.get(label, ())),
                }
                for label in labels
            },
        }

    def lines(self) -> list[str]:
        d = self.as_dict()
        out = [
            f"schemathesis summary: {d['operations']} operations, {d['cases']} cases, "
            f"{d['stateful_steps']} stateful steps, {d['failures']} distinct failures, "
            f"{d['seconds']} s"
        ]
        for label, o in d["per_operation"].items():
            statuses = " ".join(f"{s}x{n}" for s, n in o["statuses"].items())
            out.append(
                f"  {label:<32} {o['cases']:>5} cases {o['stateful_steps']:>4} steps  {statuses}"
            )
            out.extend(f"    FAILURE {f}" for f in o["failures"])
        out.extend(f"  note: {n}" for n in self.notes)
        return out


SUMMARY = Summary()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("schemathesis"), env={"TOPICS_API_KEYS": KEY})
    yield s
    code = s.stop()
    assert code == 0, s.log_text()


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> Iterator[Summary]:
    yield SUMMARY
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + "\n".join(SUMMARY.lines()), flush=True)
    out = os.environ.get("TOPICS_SCHEMATHESIS_SUMMARY")
    if out:
        Path(out).write_text(json.dumps(SUMMARY.as_dict(), indent=1) + "\n")


@pytest.fixture(scope="module")
def base(server: ServerProcess) -> str:
    """The live server's address, once it serves the committed document and holds the
    topics and router the document's examples name (so they reach the success paths)."""
    with httpx.Client(base_url=server.base, headers=AUTH, timeout=10) as c:
        assert c.get("/v0/openapi.json").content == document_bytes()
        records = [
            {"data": {"load": i / 10}, "tag": f"host:{i}", "node": "agent-1"} for i in range(6)
        ]
        assert c.post("/v0/topics/metrics.cpu", json={"records": records}).status_code == 201
        r = c.put("/v0/topics/billing.jobs", json={"type": "queue", "max_deliveries": 3})
        assert r.status_code == 201
        jobs = [{"data": {"invoice": i}} for i in range(50)]
        assert c.post("/v0/topics/billing.jobs", json={"records": jobs}).status_code == 200
        r = c.put("/v0/routers/clicks->lake", json={"source": "web.clicks", "dest": "lake.clicks"})
        assert r.status_code == 201
    return server.base


# The schema is the committed document, which the server serves byte for byte (checked
# by `base`, and by tests/http/test_openapi.py); loading it here, at collection,
# gives one test per operation (the fixture-loaded variant does not run on pytest 9).
schema = schemathesis.openapi.from_dict(json.loads(document_bytes())).exclude(path="/v0/ws")
schema.config.update(request_timeout=REQUEST_TIMEOUT)
# Limits are in UTF-8 bytes and the document writes them as maxLength: with ASCII
# strings the two agree (the document says so).
schema.config.generation.update(codec="ascii", with_security_parameters=False)
# Every request carries the key (`AUTH`), so security parameters are not generated;
# the ignored_auth check sends each secured operation again without it, and with a
# wrong one, and wants 401.
schema.config.checks.update(
    # positive_data_acceptance is replaced by `positive_data_accepted` below.
    excluded_check_names=["positive_data_acceptance"],
)


def _message(response: Response) -> str:
    try:
        body = json.loads(response.content)
    except ValueError:
        return ""
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("message", "")) if isinstance(err, dict) else ""


def positive_data_accepted(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Valid input is never refused with 400/406/413/415/422, save for `ALLOWED_REFUSALS`.

    schemathesis's own positive_data_acceptance without its blind spot: a rule
    that ties fields together (or to stored state) is outside JSON Schema, so the
    refusals the document states for them are accepted here, by their message.
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 406, 413, 415, 422):
        return None
    message = _message(response)
    if any(reason in message for reason in ALLOWED_REFUSALS.get(case.operation.label, ())):
        return None
    if _has_integral_float(case.body) or _has_integral_float(case.query):
        # JSON Schema counts 2.0 as an integer; the server wants `2` (the document says so).
        return None
    raise AssertionError(
        f"valid data refused with {response.status_code}: {message or response.content[:200]!r}"
    )


def _has_integral_float(value: Any) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(_has_integral_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_integral_float(v) for v in value)
    return False


def _bound(case: Case) -> dict[str, Any]:
    """Keep one case short: cut a diff's long-poll, read an event stream for a moment."""
    body = case.body
    if case.operation.path == "/v0/topics/{topic}/diff" and isinstance(body, dict):
        wait = body.get("wait_ms")
        if isinstance(wait, int) and not isinstance(wait, bool) and MAX_WAIT_MS < wait <= U32_MAX:
            body["wait_ms"] = MAX_WAIT_MS
    if case.operation.path in ("/v0/topics/{topic}/work", "/v0/watch/{wid}"):
        return {"timeout": STREAM_SECONDS}
    return {}


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)
def test_api_conforms_to_its_document(case: Case, base: str, summary: Summary) -> None:
    label = case.operation.label
    summary.cases[label] += 1
    kwargs = _bound(case)
    try:
        response = case.call(base_url=base, headers=AUTH, **kwargs)
        summary.statuses[label][response.status_code] += 1
        case.validate_response(
            response,
            headers=AUTH,
            additional_checks=[positive_data_accepted],
            transport_kwargs={"base_url": base, "headers": AUTH, **kwargs},
        )
    except BaseException as exc:
        summary.record_failure(label, exc)
        raise


# ------------------------------------------------------------------ stateful

#: The live server's address for the state machine (set by `test_stateful_sequences`).
_LIVE: list[str] = []


class Workflow(schema.as_state_machine()):  # type: ignore[misc]
    """Sequences that follow the document's links (and the ones schemathesis infers):
    a topic PUT then read, written, diffed, deleted; a watch session then streamed."""

    def get_call_kwargs(self, case: Case) -> dict[str, Any]:
        return {"base_url": _LIVE[0], "headers": AUTH, **_bound(case)}

    def call(self, case: Case, **kwargs: Any) -> Response:
        label = case.operation.label
        SUMMARY.steps[label] += 1
        response = case.call(**kwargs)
        SUMMARY.statuses[label][response.status_code] += 1
        return response

    def validate_response(
        self, response: Response, case: Case, additional_checks: Any = None, **kwargs: Any
    ) -> None:
        try:
            case.validate_response(
                response,
                headers=AUTH,
                additional_checks=[positive_data_accepted],
                transport_kwargs=kwargs,
            )
        except BaseException as exc:
            SUMMARY.record_failure(case.operation.label, exc)
            raise


def test_stateful_sequences(base: str, summary: Summary) -> None:
    _LIVE[:] = [base]
    before = sum(len(v) for v in summary.failures.values())
    try:
        _run_workflow()
    except Flaky:
        # The live server's state moved between two runs of the same scenario (a topic
        # deleted since, a lease expired): Hypothesis cannot replay it. Only a check
        # failure counts, as in schemathesis's own runner.
        if sum(len(v) for v in summary.failures.values()) > before:
            raise
        summary.notes.append("stateful run ended early: the server's state moved between replays")


def _run_workflow() -> None:
    Workflow.run(
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=8,
            deadline=None,
            derandomize=not RANDOM,
            database=None,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
    )
