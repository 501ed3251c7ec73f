"""The API table: every Kafka API this broker serves, its versions and its handler.

:data:`APIS` is the one place an API is registered: its version range (what
ApiVersions advertises, docs/KAFKA.md "Supported APIs and versions"), the
handler of its family module (`api_*.py`), the builder of its refusal
response, and whether it is served before SASL authentication. All three
clients tested (librdkafka, kafka-python, aiokafka) negotiate inside these
ranges. Fetch stays at v12 or lower because v13+ addresses topics by id only.

A handler is called as `handle(broker, conn, request, version)` and returns
the response object, a coroutine resolving to it, or None for no response
(Produce with acks=0). A refusal is called as `refuse(broker, request, code)`
and returns the response with `code` in every error field of the API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from topics.kafka import (
    api_admin,
    api_configs,
    api_fetch,
    api_groups,
    api_metadata,
    api_offsets,
    api_produce,
    api_sasl,
)
from topics.kafka import protocol as P

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = ["Api", "APIS", "SUPPORTED", "api_versions_response"]

Handler = Callable[["Broker", "ConnState", Any, int], Any]
Refusal = Callable[["Broker", Any, int], Any]


@dataclass(frozen=True, slots=True)
class Api:
    """One served API: version range, handler, refusal builder, pre-authentication flag.

    `pre_auth` APIs are served before SASL authentication completes and are
    answered synchronously, before the next frame is read, so a change of
    authentication state applies to that next frame.
    """

    min_version: int
    max_version: int
    handle: Handler
    refuse: Refusal
    pre_auth: bool = False


def api_versions_response(version: int, error_code: int = 0) -> Any:
    """The ApiVersions answer listing :data:`SUPPORTED`.

    An unsupported ApiVersions version is answered with `error_code` 35 in the
    v0 body layout, which every client parses before retrying lower (KIP-511).
    """
    R = P.RESPONSES[P.API_VERSIONS]
    keys = [
        R.ApiVersion(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(SUPPORTED.items())
    ]
    return R(version=version, error_code=error_code, api_keys=keys, throttle_time_ms=0)


def api_versions(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """ApiVersions: :data:`SUPPORTED`, at the version asked for."""
    return api_versions_response(v)


def error_only(key: int) -> Refusal:
    """The refusal of an API whose response has one top-level `error_code`."""
    R = P.RESPONSES[key]

    def refuse(broker: Broker, req: Any, code: int) -> Any:
        return R(error_code=code)

    return refuse


#: api key -> how it is served. ApiVersions advertises exactly these ranges.
APIS: dict[int, Api] = {
    P.PRODUCE: Api(3, 9, api_produce.produce, api_produce.refuse_produce),
    P.FETCH: Api(4, 12, api_fetch.fetch, api_fetch.refuse_fetch),
    P.LIST_OFFSETS: Api(1, 7, api_fetch.list_offsets, api_fetch.refuse_list_offsets),
    P.METADATA: Api(0, 12, api_metadata.metadata, api_metadata.refuse_metadata),
    P.OFFSET_COMMIT: Api(2, 8, api_offsets.offset_commit, api_offsets.refuse_offset_commit),
    P.OFFSET_FETCH: Api(1, 7, api_offsets.offset_fetch, api_offsets.refuse_offset_fetch),
    P.FIND_COORDINATOR: Api(0, 4, api_groups.find_coordinator, api_groups.refuse_find_coordinator),
    P.JOIN_GROUP: Api(0, 7, api_groups.join_group, error_only(P.JOIN_GROUP)),
    P.HEARTBEAT: Api(0, 4, api_groups.heartbeat, error_only(P.HEARTBEAT)),
    P.LEAVE_GROUP: Api(0, 4, api_groups.leave_group, api_groups.refuse_leave_group),
    P.SYNC_GROUP: Api(0, 5, api_groups.sync_group, error_only(P.SYNC_GROUP)),
    P.DESCRIBE_GROUPS: Api(0, 6, api_groups.describe_groups, api_groups.refuse_describe_groups),
    P.LIST_GROUPS: Api(0, 5, api_groups.list_groups, error_only(P.LIST_GROUPS)),
    P.SASL_HANDSHAKE: Api(
        0, 1, api_sasl.sasl_handshake, error_only(P.SASL_HANDSHAKE), pre_auth=True
    ),
    P.API_VERSIONS: Api(0, 3, api_versions, error_only(P.API_VERSIONS), pre_auth=True),
    P.CREATE_TOPICS: Api(2, 7, api_admin.create_topics, api_admin.refuse_create_topics),
    P.DELETE_TOPICS: Api(1, 5, api_admin.delete_topics, api_admin.refuse_delete_topics),
    P.DELETE_RECORDS: Api(0, 2, api_admin.delete_records, api_admin.refuse_delete_records),
    P.INIT_PRODUCER_ID: Api(0, 4, api_produce.init_producer_id, error_only(P.INIT_PRODUCER_ID)),
    P.DESCRIBE_CONFIGS: Api(
        0, 4, api_configs.describe_configs, api_configs.refuse_describe_configs
    ),
    P.ALTER_CONFIGS: Api(0, 2, api_configs.alter_configs, api_configs.refuse_alter_configs),
    P.DESCRIBE_LOG_DIRS: Api(
        0, 4, api_configs.describe_log_dirs, api_configs.refuse_describe_log_dirs
    ),
    P.SASL_AUTHENTICATE: Api(
        0, 2, api_sasl.sasl_authenticate, error_only(P.SASL_AUTHENTICATE), pre_auth=True
    ),
    P.CREATE_PARTITIONS: Api(0, 3, api_admin.create_partitions, api_admin.refuse_create_partitions),
    P.DELETE_GROUPS: Api(0, 2, api_groups.delete_groups, api_groups.refuse_delete_groups),
    P.INCREMENTAL_ALTER_CONFIGS: Api(
        0,
        1,
        api_configs.incremental_alter_configs,
        api_configs.refuse_incremental_alter_configs,
    ),
    P.OFFSET_DELETE: Api(0, 0, api_groups.offset_delete, api_groups.refuse_offset_delete),
    P.DESCRIBE_CLUSTER: Api(0, 2, api_configs.describe_cluster, error_only(P.DESCRIBE_CLUSTER)),
}

#: api key -> (min, max) version this broker answers, derived from :data:`APIS`.
SUPPORTED: dict[int, tuple[int, int]] = {k: (a.min_version, a.max_version) for k, a in APIS.items()}

if set(APIS) != set(P.REQUESTS):  # the codec and the table must name the same APIs
    raise RuntimeError("the API table and the codec's request classes disagree")
