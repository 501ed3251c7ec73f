"""Connection-level request handling: who is calling, and which handler answers.

:class:`Broker` turns one request frame (size prefix already removed by
:mod:`topics.kafka.server`) into a decoded request and routes it through the
API table (:data:`topics.kafka.apis.APIS`) to the handler of its API family
(`api_*.py`). Until SASL authentication completes (when keys are configured)
only the table's pre-authentication APIs are served; anything else, an
undecodable frame or an unknown API key closes the connection. A version
outside the table's range is answered with UNSUPPORTED_VERSION (35).

Authorization mirrors `/v0` (docs/API.md, "2. Authentication, scopes and name prefixes") with the connection's API key
(docs/KAFKA.md "Tenancy and authentication"): :meth:`Broker.allowed` checks a
scope and the key's prefix allowlist for one topic name; the handlers say
which scope each API needs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from topics.auth import Authenticator, Principal
from topics.config import SCOPE_READ
from topics.kafka import errors as E
from topics.kafka import protocol as P
from topics.kafka.apis import APIS, api_versions_response
from topics.kafka.backend import KafkaBackend, Partition
from topics.kafka.groups import Coordinator
from topics.kafka.naming import kafka_name_ok, partition_name
from topics.kafka.offsets import OffsetStore
from topics.kafka.producers import ProducerIds, SequenceTable

__all__ = ["Broker", "ConnState", "Request", "CLOSE"]

log = logging.getLogger("topics.kafka")

#: What :meth:`Broker.answer` returns when the connection must be closed.
CLOSE: Any = object()


@dataclass(slots=True, eq=False)
class ConnState:
    """Per-connection state: who is calling (None until SASL succeeds when auth is on)."""

    peer: str
    principal: Principal | None
    client_id: str = ""
    sasl_mechanism: str | None = None
    sasl_raw: bool = False
    close_after: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def namespace(self) -> str:
        """The prefix this connection's topic names are stored under ("" for none)."""
        p = self.principal
        return p.namespace if p is not None else ""

    @property
    def tenant(self) -> str:
        """Whose groups and committed offsets these are: `ns:<namespace>` for a
        namespaced key (every key of the namespace shares them), else the key."""
        p = self.principal
        if p is None:
            return ""
        if p.namespace:
            return "ns:" + p.namespace
        return p.digest.hex()[:16] if p.digest is not None else ""

    def stored(self, topic: str, partition: int = 0) -> str:
        """The `/v0` topic holding `partition` of Kafka topic `topic` for this
        connection (docs/KAFKA.md, "Partitions")."""
        return partition_name(self.namespace + topic, partition)


@dataclass(slots=True, eq=False)
class Request:
    """One routed request: API key, the version to answer at, correlation id, body.

    `body` is the decoded request, or None when the request was answered
    without decoding (`ready` holds that response then).
    """

    key: int
    version: int
    correlation_id: int
    body: Any
    ready: Any = None


class Broker:
    """The Kafka APIs of one server on top of :class:`KafkaBackend`.

    Holds what the handlers share (the backend, the group coordinator, the
    committed-offset store, producer ids and sequences, the advertised
    address) and routes each request to its handler.
    """

    def __init__(
        self,
        backend: KafkaBackend,
        *,
        advertised: tuple[str, int],
        auth: Authenticator,
        now_ms: int,
    ) -> None:
        self.backend = backend
        self.advertised = advertised
        self.auth = auth
        self.auth_enabled = auth.enabled
        self.groups = Coordinator()
        self.offsets = OffsetStore(backend)
        self.pids = ProducerIds(now_ms)
        self.seqs = SequenceTable()

    # ---------------------------------------------------------- authorization

    def allowed(self, conn: ConnState, scope: str, name: str) -> bool:
        """May the connection's key use `scope` on topic `name` (a visible topic name)?"""
        p = conn.principal
        return (
            p is not None
            and p.has(scope)
            and p.allows_name(name)
            and name not in self.backend.hidden
        )

    def locate(self, conn: ConnState, topic: str, index: int) -> tuple[str, Partition | None]:
        """Partition `index` of Kafka topic `topic` for this connection: its stored
        `/v0` name and watermarks, or None for watermarks when no such partition
        exists (an absent topic or partition, a negative index, or a name that
        itself names a partition: docs/KAFKA.md, "Partitions"). No scope check."""
        stored = conn.stored(topic, index)
        if index < 0 or not kafka_name_ok(topic):
            return stored, None
        return stored, self.backend.partition(stored)

    @staticmethod
    def group_allowed(conn: ConnState) -> bool:
        """May the connection's key join groups and commit offsets (`read` scope)?"""
        p = conn.principal
        return p is not None and p.has(SCOPE_READ)

    # --------------------------------------------------------- authentication

    def plain_login(self, conn: ConnState, token: bytes) -> str | None:
        """Check a SASL/PLAIN token; sets the principal. Returns an error message or None.

        The token is `authzid NUL username NUL password`; the password is a
        `TOPICS_API_KEYS` secret, the username is free text (logged only).
        """
        parts = bytes(token).split(b"\x00")
        if len(parts) != 3:
            return "malformed PLAIN token"
        try:
            user = parts[1].decode()
            secret = parts[2].decode()
        except UnicodeDecodeError:
            return "malformed PLAIN token"
        if not self.auth_enabled:
            return None
        principal = self.auth.authenticate(secret)
        if principal is None:
            log.info("kafka: SASL/PLAIN rejected for user %r from %s", user, conn.peer)
            return "bad credentials"
        conn.principal = principal
        return None

    # --------------------------------------------------------------- dispatch

    def parse(self, conn: ConnState, frame: bytes) -> Request | None:
        """Read one request frame; None (after one log line) when the connection must close.

        Closes on a frame too short for its header, an unknown API key, an API
        other than the pre-authentication ones before SASL authentication, or
        a body that does not decode. An ApiVersions above the supported range
        is answered at v0 without decoding its body (a newer client's body may
        not parse). Records the client id of the connection.
        """
        try:
            head = P.peek_header(frame)
        except P.ProtocolError as exc:
            log.warning("kafka: closing %s: %s", conn.peer, exc)
            return None
        key, ver = head.api_key, head.api_version
        api = APIS.get(key)
        if api is None:
            log.warning("kafka: closing %s: unknown API key %d", conn.peer, key)
            return None
        if conn.principal is None and not api.pre_auth:
            log.warning(
                "kafka: closing %s: %s before SASL authentication", conn.peer, P.API_NAMES[key]
            )
            return None
        if key == P.API_VERSIONS and ver > api.max_version:
            ready = api_versions_response(0, E.UNSUPPORTED_VERSION)
            return Request(key, 0, head.correlation_id, None, ready)
        try:
            body = P.decode_request(frame, head)
        except P.ProtocolError as exc:
            log.warning("kafka: closing %s: %s", conn.peer, exc)
            return None
        hdr = body.header
        if hdr is not None and hdr.client_id:
            conn.client_id = hdr.client_id
        return Request(key, ver, head.correlation_id, body)

    def answer(self, conn: ConnState, req: Request) -> Any:
        """Start answering `req`: a response, a future of one, None (no response) or CLOSE.

        The handlers of pre-authentication APIs are synchronous and run to
        completion here, so authentication state has changed before the next
        frame is read. A handler that is a coroutine starts as a task; an
        unexpected failure in one closes only this connection.
        """
        if req.body is None:
            return req.ready
        api = APIS[req.key]
        name = P.API_NAMES[req.key]
        ver = req.version
        if not api.min_version <= ver <= api.max_version:
            log.info(
                "kafka: %s v%d from %s is outside %d-%d: UNSUPPORTED_VERSION",
                name,
                ver,
                conn.peer,
                api.min_version,
                api.max_version,
            )
            try:
                return api.refuse(self, req.body, E.UNSUPPORTED_VERSION)
            except Exception:
                log.warning("kafka: closing %s: cannot answer %s v%d", conn.peer, name, ver)
                return CLOSE
        res = api.handle(self, conn, req.body, ver)
        if asyncio.iscoroutine(res):
            return asyncio.ensure_future(self._guard(conn, req.key, res))
        return res

    async def _guard(self, conn: ConnState, key: int, coro: Any) -> Any:
        """Run a handler in its own journal request scope (it waits for the log frames
        it wrote, never another request's: docs/ARCHITECTURE.md, "The write path");
        an unexpected failure closes only this connection."""
        node = self.backend.node
        token = node.open_request()
        try:
            return await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kafka: %s handler failed for %s", P.API_NAMES[key], conn.peer)
            raise
        finally:
            node.close_request(token)
