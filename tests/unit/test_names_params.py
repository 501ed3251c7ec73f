"""Name charsets (API §1.11) and typed body fields / predicates (API §6)."""

from __future__ import annotations

import pytest

from topics.engine.names import valid_router_name, valid_topic_name
from topics.engine.params import node_set, predicate, predicate_matches, predicate_wire, u32, u64
from topics.errors import TopicsError


def test_topic_and_router_names() -> None:
    assert valid_topic_name("a") and valid_topic_name("tenant9:orders.eu-1_x")
    assert valid_topic_name("a" * 255) and not valid_topic_name("a" * 256)
    for bad in ("", "-a", ".a", "a b", "a/b", "é", "a>b"):
        assert not valid_topic_name(bad), bad
    assert valid_router_name("clicks->warehouse") and not valid_router_name(">x")


def test_predicates() -> None:
    assert predicate("v") == ("eq", "v")
    assert predicate("p*") == ("prefix", "p")  # bare string ending in * is a Glob [src]
    assert predicate(["tag", "Glob", "*"]) == ("prefix", "")
    assert predicate_wire(predicate(["tag", "Glob", "eu:*"])) == ["tag", "Glob", "eu:*"]
    assert predicate_matches(("prefix", "eu:"), "eu:1") and not predicate_matches(("eq", "x"), None)
    for bad in (["tag", "Eq"], ["tag", "Glob", "x"], ["x", "Eq", "v"], ["tag", "Eq", 1], 5):
        with pytest.raises(TopicsError):
            predicate(bad)


def test_numeric_fields_and_node_sets() -> None:
    assert u64({"a": 2**64 - 1}, "a", 0) == 2**64 - 1
    assert u32({}, "a", 7) == 7
    for body in ({"a": -1}, {"a": True}, {"a": 1.0}, {"a": 2**64}):
        with pytest.raises(TopicsError):
            u64(body, "a", 0)
    with pytest.raises(TopicsError):
        u32({"a": 2**32}, "a", 0)
    assert node_set({"node": "x"}) == ["x"] and node_set({"node": ["a", "b"]}) == ["a", "b"]
    assert node_set({}) is None
    with pytest.raises(TopicsError):
        node_set({"node": ["a", 1]})
