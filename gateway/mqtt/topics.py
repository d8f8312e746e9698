"""MQTT topic filter matching for the gateway's routes (MQTT §4.7), without allocation per level.

Routes are few (about ten) and fixed before the service starts; a filter is split once. A
topic's matching keys are worked out once and remembered: the same few topics per device come
back for every message (at 1,000 lessons, matching every message against every route was ~3 %
of the gateway's CPU). Bounded: ``CACHE_LIMIT`` topics; a new topic past it empties the cache
(a flood of distinct topics costs what it cost before, never memory).
"""

from __future__ import annotations

CACHE_LIMIT = 16_384


class TopicMatcher:
    def __init__(self) -> None:
        self._filters: list[tuple[tuple[str, ...], int]] = []
        self._known: dict[str, tuple[int, ...]] = {}  # topic -> keys (see module doc)

    def add(self, topic_filter: str, key: int) -> None:
        levels = tuple(topic_filter.split("/"))
        if "#" in levels[:-1] or any(
            ("#" in lv or "+" in lv) and lv not in ("#", "+") for lv in levels
        ):
            raise ValueError(f"invalid topic filter {topic_filter!r}")
        self._filters.append((levels, key))
        self._known.clear()

    def match(self, topic: str) -> tuple[int, ...]:
        """Keys of the filters ``topic`` matches, in the order they were added."""
        keys = self._known.get(topic)
        if keys is None:
            levels = topic.split("/")
            n = len(levels)
            keys = tuple(key for pattern, key in self._filters if _matches(pattern, levels, n))
            if len(self._known) >= CACHE_LIMIT:
                self._known.clear()
            self._known[topic] = keys
        return keys


def _matches(pattern: tuple[str, ...], levels: list[str], n: int) -> bool:
    if levels[0].startswith("$") and pattern[0] in ("+", "#"):
        return False  # wildcards never match $SYS-style topics (§4.7.2)
    for i, want in enumerate(pattern):
        if want == "#":
            return True
        if i >= n:
            return False
        if want != "+" and want != levels[i]:
            return False
    return len(pattern) == n


def matches(topic_filter: str, topic: str) -> bool:
    """One-off match (tests, tools)."""
    matcher = TopicMatcher()
    matcher.add(topic_filter, 0)
    return bool(matcher.match(topic))
