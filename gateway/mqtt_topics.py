"""MQTT topic filter matching for the gateway's routes (MQTT §4.7), without allocation per level.

Routes are few (about ten) and fixed before the service starts; every received message is
matched against all of them, so a filter is split once and a topic once per message.
"""

from __future__ import annotations


class TopicMatcher:
    def __init__(self) -> None:
        self._filters: list[tuple[tuple[str, ...], int]] = []

    def add(self, topic_filter: str, key: int) -> None:
        levels = tuple(topic_filter.split("/"))
        if "#" in levels[:-1] or any(
            ("#" in lv or "+" in lv) and lv not in ("#", "+") for lv in levels
        ):
            raise ValueError(f"invalid topic filter {topic_filter!r}")
        self._filters.append((levels, key))

    def match(self, topic: str) -> list[int]:
        """Keys of the filters ``topic`` matches, in the order they were added."""
        levels = topic.split("/")
        n = len(levels)
        keys = []
        for pattern, key in self._filters:
            if _matches(pattern, levels, n):
                keys.append(key)
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
