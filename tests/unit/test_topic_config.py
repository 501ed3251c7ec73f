"""Topic config parsing, defaults, normalisation and wire order (API §1.12)."""

from __future__ import annotations

import pytest

from topics.engine.topic_config import TopicConfig, parse_topic_config
from topics.errors import TopicsError


def test_defaults_and_order() -> None:
    cfg = parse_topic_config({})
    assert cfg == TopicConfig()
    assert list(cfg.to_wire())[:7] == [
        "type",
        "ttl_ms",
        "cap_records",
        "cap_bytes",
        "discard",
        "durable",
        "durability",
    ]
    assert len(cfg.to_wire()) == 17


def test_durability_resolution() -> None:
    assert parse_topic_config({"durable": True}).durability == "fsync"
    assert parse_topic_config({"durable": False}).durability == "disk"
    c = parse_topic_config({"durable": True, "durability": "memory"})
    assert c.durability == "memory" and c.durable is False
    assert parse_topic_config({"durability": "fsync"}).durable is True


def test_clamps_and_unknown_fields() -> None:
    c = parse_topic_config({"lease_ms": 10**12, "claim_jitter_ms": 6000, "whatever": 1})
    assert c.lease_ms == 86_400_000 and c.claim_jitter_ms == 5000


@pytest.mark.parametrize(
    "body",
    [
        {"type": "x"},
        {"discard": "new"},
        {"priority": "1"},
        {"priority": 2**40},
        {"ttl_ms": 1.5},
        {"ttl_ms": True},
        {"auto_create": "yes"},
        {"dead_letter": 5},
        {"dead_letter": "bad name"},
        [],
    ],
)
def test_rejections(body: object) -> None:
    with pytest.raises(TopicsError) as e:
        parse_topic_config(body, "t")
    assert e.value.status == 400 and e.value.code == "invalid_request"


def test_queue_cannot_dead_letter_to_itself() -> None:
    with pytest.raises(TopicsError):
        parse_topic_config({"type": "queue", "dead_letter": "q"}, "q")
    assert parse_topic_config({"type": "log", "dead_letter": "q"}, "q").dead_letter == "q"
