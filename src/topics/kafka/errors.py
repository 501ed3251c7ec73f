"""Kafka protocol error codes this broker returns, and where engine refusals map.

The codes are Apache Kafka's (`Errors.java`); only the ones the handlers use
are named, and the numbers are part of the wire contract every client maps to
its own exception types. :data:`ENGINE_ERRORS` is the one table from this
server's refusals (TopicsError codes and statuses, engine conditions) to those
codes; every handler goes through :func:`from_engine`.
"""

from __future__ import annotations

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
RECORD_LIST_TOO_LARGE = 18
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_PRODUCER_ID = 59
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
FETCH_SESSION_ID_NOT_FOUND = 70
UNSUPPORTED_COMPRESSION_TYPE = 76
GROUP_SUBSCRIBED_TO_TOPIC = 86
INVALID_RECORD = 87
UNSUPPORTED_ENDPOINT_TYPE = 119

# ------------------------------------------------------------ engine refusals
#
# What the listener was doing when the engine refused (the first half of a key
# of :data:`ENGINE_ERRORS`).
WRITE = "write"  # Produce: staging a batch on a topic
CREATE = "create"  # CreateTopics: creating or validating a topic
AUTO_CREATE = "auto_create"  # Metadata: creating a topic on first use
DELETE = "delete"  # DeleteTopics
COMMIT = "commit"  # OffsetCommit: the durable write to the offsets topic
ALTER = "alter"  # AlterConfigs, IncrementalAlterConfigs: replacing a topic's config

#: A staged Produce write that reached its commit point and failed there (the
#: engine condition behind `Staged.committed()` returning False); not a
#: TopicsError code, used as one in :data:`ENGINE_ERRORS`.
NOT_COMMITTED = "not_committed"

#: (operation, what the engine said) -> Kafka error code (docs/KAFKA.md "Errors").
#:
#: What the engine said is tried from the most to the least specific: the
#: TopicsError `code` (src/topics/errors.py; docs/API.md, "3.3 Every error code"), then its HTTP `status`,
#: then None (anything else the operation can meet).
ENGINE_ERRORS: dict[tuple[str, str | int | None], int] = {
    (WRITE, "record_too_large"): MESSAGE_TOO_LARGE,
    (WRITE, "batch_too_large"): RECORD_LIST_TOO_LARGE,
    (WRITE, 404): UNKNOWN_TOPIC_OR_PARTITION,  # topic_not_found: deleted meanwhile
    (WRITE, 422): POLICY_VIOLATION,  # topic_full: a `discard=reject` topic at its cap
    (WRITE, 429): REQUEST_TIMED_OUT,  # throttled
    (WRITE, 400): INVALID_RECORD,  # invalid_request and other refused input
    (WRITE, NOT_COMMITTED): KAFKA_STORAGE_ERROR,
    (WRITE, None): KAFKA_STORAGE_ERROR,  # internal, insufficient_storage, ...
    (CREATE, 400): INVALID_CONFIG,  # invalid_request: a config `/v0` refuses
    (CREATE, 429): POLICY_VIOLATION,  # throttled: the topic count cap
    (CREATE, None): KAFKA_STORAGE_ERROR,
    (AUTO_CREATE, None): UNKNOWN_TOPIC_OR_PARTITION,  # as if auto-create were off
    (DELETE, None): KAFKA_STORAGE_ERROR,
    (COMMIT, None): COORDINATOR_NOT_AVAILABLE,  # the client retries the commit
    (ALTER, 400): INVALID_CONFIG,  # invalid_request: a config `/v0` refuses
    (ALTER, 404): UNKNOWN_TOPIC_OR_PARTITION,  # topic_not_found: deleted meanwhile
    (ALTER, 409): INVALID_CONFIG,  # topic_exists_incompatible: a `type` change
    (ALTER, None): KAFKA_STORAGE_ERROR,
}


def from_engine(operation: str, code: str, status: int = 500) -> int:
    """The Kafka error code for an engine refusal during `operation`.

    `operation` is one of WRITE, CREATE, AUTO_CREATE, DELETE, COMMIT, ALTER; `code`
    and `status` are the refusal's TopicsError code and HTTP status (or
    NOT_COMMITTED). Looks up :data:`ENGINE_ERRORS` by (operation, code), then
    (operation, status), then (operation, None). Raises KeyError for an
    unknown operation.
    """
    for what in (code, status):
        found = ENGINE_ERRORS.get((operation, what))
        if found is not None:
            return found
    return ENGINE_ERRORS[(operation, None)]
