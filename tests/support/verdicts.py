"""SPEC §2.4: metrics are numbers, never verdicts. One list of forbidden names, one walker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

FORBIDDEN = frozenset(
    {"passed", "grade", "level", "good", "bad", "score_verdict", "retry_count", "verdict"}
)


def keys(node: Any) -> Iterator[str]:
    """Every mapping key anywhere in a JSON-like value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from keys(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from keys(item)


def verdict_keys(node: Any) -> set[str]:
    return {k for k in keys(node) if k.lower() in FORBIDDEN}
