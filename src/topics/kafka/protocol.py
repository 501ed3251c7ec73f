"""Kafka request/response envelopes through kafka-python's generated codec.

No wire struct is written by hand here: kafka-python 3.0.12 (pinned in
pyproject.toml) ships Apache Kafka's JSON message schemas and generates an
encoder and decoder per (message, version). :func:`decode_request` turns one
request frame (without its 4-byte size prefix) into a request object;
:func:`encode_response` frames a response object for the wire.

Which APIs and versions this broker serves is the API table
(:data:`topics.kafka.apis.APIS`); this module only names the API keys and
holds the codec classes for each.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import Any

# kafka-python 3.0.12 loads its JSON schemas with importlib.resources calls that
# warn (DeprecationWarning) on Python 3.11; the warning is about its own code.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import (
        AlterConfigsRequest,
        AlterConfigsResponse,
        CreatePartitionsRequest,
        CreatePartitionsResponse,
        CreateTopicsRequest,
        CreateTopicsResponse,
        DeleteGroupsRequest,
        DeleteGroupsResponse,
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        DeleteTopicsRequest,
        DeleteTopicsResponse,
        DescribeClusterRequest,
        DescribeClusterResponse,
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        DescribeGroupsRequest,
        DescribeGroupsResponse,
        DescribeLogDirsRequest,
        DescribeLogDirsResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
        ListGroupsRequest,
        ListGroupsResponse,
    )
    from kafka.protocol.consumer import (
        FetchRequest,
        FetchResponse,
        HeartbeatRequest,
        HeartbeatResponse,
        JoinGroupRequest,
        JoinGroupResponse,
        LeaveGroupRequest,
        LeaveGroupResponse,
        ListOffsetsRequest,
        ListOffsetsResponse,
        OffsetCommitRequest,
        OffsetCommitResponse,
        OffsetDeleteRequest,
        OffsetDeleteResponse,
        OffsetFetchRequest,
        OffsetFetchResponse,
        SyncGroupRequest,
        SyncGroupResponse,
    )
    from kafka.protocol.metadata import (
        ApiVersionsRequest,
        ApiVersionsResponse,
        FindCoordinatorRequest,
        FindCoordinatorResponse,
        MetadataRequest,
        MetadataResponse,
    )
    from kafka.protocol.producer import (
        InitProducerIdRequest,
        InitProducerIdResponse,
        ProduceRequest,
        ProduceResponse,
    )
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )

__all__ = [
    "API_NAMES",
    "REQUESTS",
    "RESPONSES",
    "ProtocolError",
    "RequestHeader",
    "peek_header",
    "decode_request",
    "encode_response",
    "partition_codes",
    "refuse_partitions",
]

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
DESCRIBE_LOG_DIRS = 35
SASL_AUTHENTICATE = 36
CREATE_PARTITIONS = 37
DELETE_GROUPS = 42
INCREMENTAL_ALTER_CONFIGS = 44
OFFSET_DELETE = 47
DESCRIBE_CLUSTER = 60

REQUESTS: dict[int, Any] = {
    PRODUCE: ProduceRequest,
    FETCH: FetchRequest,
    LIST_OFFSETS: ListOffsetsRequest,
    METADATA: MetadataRequest,
    OFFSET_COMMIT: OffsetCommitRequest,
    OFFSET_FETCH: OffsetFetchRequest,
    FIND_COORDINATOR: FindCoordinatorRequest,
    JOIN_GROUP: JoinGroupRequest,
    HEARTBEAT: HeartbeatRequest,
    LEAVE_GROUP: LeaveGroupRequest,
    SYNC_GROUP: SyncGroupRequest,
    DESCRIBE_GROUPS: DescribeGroupsRequest,
    LIST_GROUPS: ListGroupsRequest,
    SASL_HANDSHAKE: SaslHandshakeRequest,
    API_VERSIONS: ApiVersionsRequest,
    CREATE_TOPICS: CreateTopicsRequest,
    DELETE_TOPICS: DeleteTopicsRequest,
    DELETE_RECORDS: DeleteRecordsRequest,
    INIT_PRODUCER_ID: InitProducerIdRequest,
    DESCRIBE_CONFIGS: DescribeConfigsRequest,
    ALTER_CONFIGS: AlterConfigsRequest,
    DESCRIBE_LOG_DIRS: DescribeLogDirsRequest,
    SASL_AUTHENTICATE: SaslAuthenticateRequest,
    CREATE_PARTITIONS: CreatePartitionsRequest,
    DELETE_GROUPS: DeleteGroupsRequest,
    INCREMENTAL_ALTER_CONFIGS: IncrementalAlterConfigsRequest,
    OFFSET_DELETE: OffsetDeleteRequest,
    DESCRIBE_CLUSTER: DescribeClusterRequest,
}

RESPONSES: dict[int, Any] = {
    PRODUCE: ProduceResponse,
    FETCH: FetchResponse,
    LIST_OFFSETS: ListOffsetsResponse,
    METADATA: MetadataResponse,
    OFFSET_COMMIT: OffsetCommitResponse,
    OFFSET_FETCH: OffsetFetchResponse,
    FIND_COORDINATOR: FindCoordinatorResponse,
    JOIN_GROUP: JoinGroupResponse,
    HEARTBEAT: HeartbeatResponse,
    LEAVE_GROUP: LeaveGroupResponse,
    SYNC_GROUP: SyncGroupResponse,
    DESCRIBE_GROUPS: DescribeGroupsResponse,
    LIST_GROUPS: ListGroupsResponse,
    SASL_HANDSHAKE: SaslHandshakeResponse,
    API_VERSIONS: ApiVersionsResponse,
    CREATE_TOPICS: CreateTopicsResponse,
    DELETE_TOPICS: DeleteTopicsResponse,
    DELETE_RECORDS: DeleteRecordsResponse,
    INIT_PRODUCER_ID: InitProducerIdResponse,
    DESCRIBE_CONFIGS: DescribeConfigsResponse,
    ALTER_CONFIGS: AlterConfigsResponse,
    DESCRIBE_LOG_DIRS: DescribeLogDirsResponse,
    SASL_AUTHENTICATE: SaslAuthenticateResponse,
    CREATE_PARTITIONS: CreatePartitionsResponse,
    DELETE_GROUPS: DeleteGroupsResponse,
    INCREMENTAL_ALTER_CONFIGS: IncrementalAlterConfigsResponse,
    OFFSET_DELETE: OffsetDeleteResponse,
    DESCRIBE_CLUSTER: DescribeClusterResponse,
}

API_NAMES: dict[int, str] = {k: v.__name__.removesuffix("Request") for k, v in REQUESTS.items()}

_HEAD = struct.Struct(">hhi")


class ProtocolError(Exception):
    """A request frame that cannot be decoded: the connection is closed."""


class RequestHeader:
    """The fixed prefix every request starts with (api key, version, correlation id)."""

    __slots__ = ("api_key", "api_version", "correlation_id")

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


def peek_header(frame: bytes) -> RequestHeader:
    """Read api key, version and correlation id from a request frame.

    Raises :class:`ProtocolError` when the frame is shorter than the 8-byte prefix.
    """
    if len(frame) < 8:
        raise ProtocolError(f"request frame of {len(frame)} bytes is shorter than its header")
    k, v, c = _HEAD.unpack_from(frame, 0)
    return RequestHeader(k, v, c)


def decode_request(frame: bytes, head: RequestHeader) -> Any:
    """Decode a whole request (header included) at the version it names.

    The caller has checked that `head.api_key` is in :data:`REQUESTS`. Raises
    :class:`ProtocolError` on a truncated or malformed body, or a version the
    codec has no schema for. Bytes after the last field are ignored.
    """
    cls = REQUESTS[head.api_key]
    if not 0 <= head.api_version <= cls.max_version:
        raise ProtocolError(f"{API_NAMES[head.api_key]} v{head.api_version} is beyond the codec")
    try:
        return cls.decode(frame, version=head.api_version, header=True)
    except Exception as exc:  # the codec raises struct/index/value/unicode errors
        raise ProtocolError(
            f"malformed {API_NAMES[head.api_key]} v{head.api_version}: {type(exc).__name__}: {exc}"
        ) from None


def encode_response(resp: Any, version: int, correlation_id: int) -> bytes:
    """Frame `resp` (size prefix + response header + body) at `version`."""
    resp.API_VERSION = version
    resp.with_header(correlation_id=correlation_id)
    return bytes(resp.encode(header=True, framed=True))


def partition_codes(
    topic_type: Any, partition_type: Any, topics: Any, code_of: Callable[[str, int], int]
) -> list[Any]:
    """Response topics mirroring request `topics`, one error code per partition.

    For APIs whose request topics have `name` and `partitions[].partition_index`
    and whose response entries take `name`/`partitions` and
    `partition_index`/`error_code` (ListOffsets, OffsetCommit, OffsetDelete);
    `code_of(topic name, partition index)` gives each code.
    """
    return [
        topic_type(
            name=t.name,
            partitions=[
                partition_type(
                    partition_index=p.partition_index, error_code=code_of(t.name, p.partition_index)
                )
                for p in t.partitions
            ],
        )
        for t in topics
    ]


def refuse_partitions(
    response: Any, topic_type: Any, partition_type: Any, req: Any, code: int
) -> Any:
    """A `response` with `code` on every partition of the request's `topics`.

    The refusal of the APIs :func:`partition_codes` serves (ListOffsets, OffsetCommit).
    """
    return response(topics=partition_codes(topic_type, partition_type, req.topics, lambda *_: code))
