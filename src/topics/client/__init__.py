"""Python client of the topics `/v0` HTTP API (docs/CLIENT.md; the wire contract is
docs/API.md).

>>> from topics.client import Client
>>> with Client() as c:                      # $TOPICS_URL or http://127.0.0.1:4000
...     c.append("orders", [{"data": {"sku": "B-77"}, "tag": "order:1"}])
...     for rec in c.read("orders"):
...         print(rec)

:class:`Client` is synchronous, :class:`AsyncClient` its asyncio twin. Results
are dataclasses (:mod:`topics.client.models`); failures raise
:class:`TopicsError` subclasses carrying the server's error code
(:mod:`topics.client.errors`).
"""

from topics.client.aio import AsyncClient, AsyncReader, AsyncWatch, AsyncWorker
from topics.client.errors import (
    BadRequest,
    BatchTooLarge,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InsufficientStorage,
    NotAQueue,
    NotFound,
    NotReady,
    PayloadTooLarge,
    RecordTooLarge,
    RouterCycle,
    RouterNotFound,
    ServerError,
    Throttled,
    TopicExistsIncompatible,
    TopicFull,
    TopicNotEmpty,
    TopicNotFound,
    TopicsError,
    Unauthorized,
    Unavailable,
)
from topics.client.models import (
    AckResult,
    AppendResult,
    CaughtUp,
    ClaimResult,
    DeleteRecordsResult,
    DeleteRouterResult,
    DeleteTopicResult,
    DiffPage,
    Event,
    ExtendResult,
    Health,
    Job,
    NackResult,
    PutTopicResult,
    QueueCounters,
    Readiness,
    Record,
    Router,
    RouterInfo,
    RouterPage,
    Tombstone,
    TopicConfig,
    TopicDeleted,
    TopicInfo,
    TopicPage,
    TopicState,
    WatchSession,
    WatchStart,
)
from topics.client.sync import Client, Reader, Watch, Worker
from topics.client.worker import WorkerStats

__all__ = [
    "Client",
    "AsyncClient",
    "Reader",
    "AsyncReader",
    "Watch",
    "AsyncWatch",
    "Worker",
    "AsyncWorker",
    "WorkerStats",
    # results
    "AckResult",
    "AppendResult",
    "CaughtUp",
    "ClaimResult",
    "DeleteRecordsResult",
    "DeleteRouterResult",
    "DeleteTopicResult",
    "DiffPage",
    "Event",
    "ExtendResult",
    "Health",
    "Job",
    "NackResult",
    "PutTopicResult",
    "QueueCounters",
    "Readiness",
    "Record",
    "Router",
    "RouterInfo",
    "RouterPage",
    "Tombstone",
    "TopicConfig",
    "TopicDeleted",
    "TopicInfo",
    "TopicPage",
    "TopicState",
    "WatchSession",
    "WatchStart",
    # errors
    "TopicsError",
    "ConnectionFailed",
    "BadRequest",
    "BatchTooLarge",
    "RecordTooLarge",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "TopicNotFound",
    "RouterNotFound",
    "Conflict",
    "TopicExistsIncompatible",
    "TopicNotEmpty",
    "NotAQueue",
    "RouterCycle",
    "PayloadTooLarge",
    "TopicFull",
    "Throttled",
    "ServerError",
    "Unavailable",
    "NotReady",
    "InsufficientStorage",
]
