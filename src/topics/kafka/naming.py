"""Where a Kafka (topic, partition) lives among `/v0` topics (docs/KAFKA.md, "Partitions").

One rule, reversible both ways:

* partition 0 of Kafka topic `T` is the `/v0` topic `NS + T`;
* partition `n >= 1` is the `/v0` topic `NS + T + ":" + str(n)` (decimal, no
  leading zero);

where `NS` is the connection's namespace ("" for a key without one). A `/v0`
name ending in `:<n>` therefore always names a partition, never a Kafka topic
of its own: the listener refuses such a name as a Kafka topic
(INVALID_TOPIC_EXCEPTION), and CreateTopics / CreatePartitions refuse to adopt
a partition name that already exists as a topic of its own. A Kafka topic has
as many partitions as the run of existing names `T`, `T:1`, `T:2`, ... is long.
"""

from __future__ import annotations

import re

__all__ = [
    "SEP",
    "MAX_PARTITIONS",
    "partition_name",
    "split_partition",
    "is_partition_name",
    "kafka_name_ok",
]

#: Separator between a topic and its partition number in a stored name.
SEP = ":"

#: The most partitions a Kafka topic may have here (CreateTopics, CreatePartitions).
MAX_PARTITIONS = 1024

_SUFFIX = re.compile(r":([1-9][0-9]{0,8})\Z")


def partition_name(base: str, index: int) -> str:
    """The `/v0` topic holding partition `index` of the topic stored as `base`."""
    return base if index == 0 else f"{base}{SEP}{index}"


def split_partition(stored: str) -> tuple[str, int]:
    """The inverse of :func:`partition_name`: `(base, index)` of a stored name."""
    m = _SUFFIX.search(stored)
    if m is None:
        return stored, 0
    return stored[: m.start()], int(m.group(1))


def is_partition_name(name: str) -> bool:
    """True when `name` ends in `:<n>` with n >= 1: it names a partition, not a topic."""
    return _SUFFIX.search(name) is not None


def kafka_name_ok(name: str) -> bool:
    """May `name` be a Kafka topic here? (Not a partition name; the `/v0` name rules
    are checked on the stored name.)"""
    return bool(name) and not is_partition_name(name)
