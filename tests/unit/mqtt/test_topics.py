"""Topic filter matching (MQTT §4.7), as the gateway's routes use it."""

from __future__ import annotations

import pytest

from gateway.mqtt import topics as mqtt_topics
from gateway.mqtt.topics import TopicMatcher, matches


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("snlp/v1/+/evt", "snlp/v1/aa_bb_cc_dd_ee_ff/evt", True),
        ("snlp/v1/+/evt", "snlp/v1/aa_bb_cc_dd_ee_ff/ack", False),
        ("snlp/v1/+/evt", "snlp/v1/evt", False),
        ("snlp/v1/+/evt", "snlp/v1/a/evt/x", False),
        ("sport/#", "sport", True),  # '#' also matches the parent level
        ("sport/#", "sport/tennis/player1", True),
        ("#", "a/b/c", True),
        ("+/+", "/finance", True),  # an empty level is a level
        ("+", "/finance", False),
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
        ("#", "$SYS/broker/load", False),  # wildcards never match $ topics
        ("+/broker/load", "$SYS/broker/load", False),
        ("$SYS/#", "$SYS/broker/load", True),
    ],
)
def test_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected


def test_every_matching_route_in_the_order_added() -> None:
    matcher = TopicMatcher()
    matcher.add("snlp/v1/+/evt", 0)
    matcher.add("snlp/#", 1)
    matcher.add("other/+", 2)
    assert matcher.match("snlp/v1/x/evt") == (0, 1)
    assert matcher.match("other/y") == (2,)
    assert matcher.match("nothing") == ()


def test_a_topic_is_matched_again_after_a_new_route_and_past_the_cache_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    matcher = TopicMatcher()
    matcher.add("a/+", 0)
    assert matcher.match("a/x") == (0,)
    matcher.add("+/x", 1)  # a route added later: remembered answers are dropped
    assert matcher.match("a/x") == (0, 1)
    monkeypatch.setattr(mqtt_topics, "CACHE_LIMIT", 2)
    assert [matcher.match(t) for t in ("a/y", "b/x", "a/x", "a/x")] == [(0,), (1,), (0, 1), (0, 1)]
    assert len(matcher._known) <= 2


@pytest.mark.parametrize("bad", ["a/#/b", "a/b#", "a+/b", "a/+b"])
def test_invalid_filters_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid topic filter"):
        TopicMatcher().add(bad, 0)
