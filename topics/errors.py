"""Typed errors of the wire layer: every bad topic or payload raises a `WireError` subclass."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PayloadError", "PayloadReason", "TopicError", "WireError", "excerpt"]

_EXCERPT_CHARS = 120


def excerpt(value: object, limit: int = _EXCERPT_CHARS) -> str:
    """A short printable excerpt for messages and logs; never the whole payload."""
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value[: limit + 1]).decode("utf-8", "replace")
    else:
        text = str(value)
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class WireError(ValueError):
    """Base of every error raised by `topics` for bad input."""


class TopicError(WireError):
    """A topic that is not part of the tree (bad id, level count, kind, wildcard)."""

    def __init__(self, topic: str, detail: str) -> None:
        self.topic = excerpt(topic)
        self.detail = detail
        super().__init__(f"bad topic {self.topic!r}: {detail}")


class PayloadReason(StrEnum):
    """Why a payload was refused; stable strings, used as metric labels."""

    OVERSIZE = "oversize"
    MALFORMED_JSON = "malformed_json"
    NOT_OBJECT = "not_object"
    INVALID = "invalid"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_DEEP = "too_deep"  # arrays/objects nested past topics.wire.MAX_JSON_DEPTH
    INVALID_UNICODE = "invalid_unicode"  # a lone surrogate: not a Unicode scalar value


class PayloadError(WireError):
    """A payload that cannot be turned into a typed message; `detail` names the field path."""

    def __init__(self, reason: PayloadReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = excerpt(detail)
        super().__init__(f"{reason.value}: {self.detail}" if self.detail else reason.value)
