"""Shared wire machinery: base models, bounded JSON decoding, error mapping, compact encoding.

Inbound device messages (`DeviceModel`) ignore unknown keys (firmware adds fields) but are
strictly typed on the keys they know; our own messages (`OwnModel`) forbid extras. Both are
frozen. Optional fields left at `None` are omitted on the wire unless listed in `_keep_null`.

Every JSON the gateway takes from outside (MQTT payloads through `load_object`, HTTP bodies
through `load_json`) passes the same bounds, each a `PayloadError` reason: size (`oversize`),
nesting (`too_deep`, past `MAX_JSON_DEPTH`, checked on the text before it is decoded, so no
decoder recursion is ever spent on it) and Unicode (`invalid_unicode`: a string holding a lone
surrogate, raw or as a `\\udXXX` escape, which no UTF-8 reply could carry).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from topics.errors import PayloadError, PayloadReason

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_JSON_DEPTH",
    "DeviceModel",
    "EpochMs",
    "Id",
    "OwnModel",
    "WireModel",
    "check_depth",
    "check_unicode",
    "check_version",
    "encode",
    "load_json",
    "load_object",
    "validate",
]

# Field types shared by the payload models.
Id = Annotated[str, Field(min_length=1, max_length=64)]
EpochMs = Annotated[int, Field(ge=0)]

DEFAULT_MAX_BYTES = 8192
"""The Xiaozhi ecosystem's MQTT payload cap; our default for every inbound payload."""

MAX_JSON_DEPTH = 32
"""Arrays and objects nested deeper than this are refused (`too_deep`). Real messages nest three
or four levels (an MCP result: message, payload, result, content list, item); Python's decoder
would only fail near 1,000 levels, with a RecursionError."""

V1 = Literal[1]
M = TypeVar("M")


class WireModel(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True)
    _keep_null: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_unset_optionals(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in _omittable(type(self)):
            if data.get(key, 0) is None:
                del data[key]
        return data


# Per model class: the wire keys of its optional fields not in ``_keep_null`` (worked out once;
# every encode of a command or task event used to walk ``model_fields`` again). Bounded by the
# number of model classes.
_OMITTABLE: dict[type[WireModel], tuple[str, ...]] = {}


def _omittable(cls: type[WireModel]) -> tuple[str, ...]:
    keys = _OMITTABLE.get(cls)
    if keys is None:
        keys = _OMITTABLE[cls] = tuple(
            key
            for name, field in cls.model_fields.items()
            if not field.is_required() and (key := field.alias or name) not in cls._keep_null
        )
    return keys


class DeviceModel(WireModel):
    """Sent by a device: unknown keys ignored, known keys strictly typed."""

    model_config = ConfigDict(extra="ignore")


class OwnModel(WireModel):
    """Sent by us (gateway/backend contract): unknown keys are an error."""

    model_config = ConfigDict(extra="forbid")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


# One decoder for every payload: ``json.loads`` with a keyword builds a new one per call (its
# scanner included), a fifth of the cost of a board ack's JSON.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


# A JSON string token (escapes included), to blank strings out before counting brackets.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Brackets to +1 / -1 (as signed bytes), every other byte deleted.
_NESTING = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u escape of a surrogate (a pair too, which is fine: only then are strings searched).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_UTF8 = frozenset({"utf-8", "utf-8-sig"})


def check_depth(data: bytes, *, limit: int = MAX_JSON_DEPTH) -> None:
    """`PayloadError` (`too_deep`) if the UTF-8 JSON ``data`` nests arrays/objects past
    ``limit`` (UTF-8: a bracket byte is always a bracket, never part of another character).

    Cheap where it matters: a text with at most ``limit`` brackets opening in all (every board
    event, ack and heartbeat) cannot nest deeper, which two ``bytes.count`` calls show. Only past
    that are strings blanked out and the brackets left mapped to +1/-1 bytes: more than
    ``limit`` openers in a row is the usual attack, found by one substring search; otherwise
    the running depth is taken (``accumulate``, ``max``: ~40 ns a bracket, at most as much
    as decoding that text would cost)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    steps = _STRING.sub(b"", data).translate(_NESTING, _NOT_BRACKETS)
    if (
        b"\x01" * (limit + 1) in steps
        or max(accumulate(memoryview(steps).cast("b")), default=0) > limit
    ):
        raise PayloadError(PayloadReason.TOO_DEEP, f"nested deeper than {limit} levels")


def check_unicode(text: str, obj: object) -> None:
    """`PayloadError` (`invalid_unicode`) if a string of ``obj`` (decoded from ``text``), key
    or value, holds a lone surrogate. Cheap where it matters: an ASCII text holds no raw
    surrogate, and without a ``\\uD800``-``\\uDFFF`` escape in it no string can hold one,
    so the decoded strings are searched only then."""
    if not text.isascii() and _SURROGATE.search(text) is not None:
        raise PayloadError(PayloadReason.INVALID_UNICODE, "a lone surrogate in the text")
    if _SURROGATE_ESCAPE.search(text) is not None and _has_surrogate(obj):
        raise PayloadError(PayloadReason.INVALID_UNICODE, "a lone surrogate in a string")


def _has_surrogate(obj: object) -> bool:
    # Recursion is bounded: check_depth ran first.
    if isinstance(obj, str):
        return _SURROGATE.search(obj) is not None
    if isinstance(obj, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_surrogate(item) for item in obj)
    return False


def load_json(payload: bytes, *, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Any:
    """Bytes → a JSON value within every bound (size unless ``max_bytes`` is None — an HTTP
    body the server already capped —, depth, Unicode); every failure is a `PayloadError`."""
    if max_bytes is not None and len(payload) > max_bytes:
        raise PayloadError(PayloadReason.OVERSIZE, f"{len(payload)} bytes > {max_bytes}")
    try:
        # What ``json.loads`` does with bytes: UTF-8/16/32 by the first bytes, then decode.
        encoding = json.detect_encoding(payload)
        text = payload.decode(encoding, "surrogatepass")
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise PayloadError(PayloadReason.MALFORMED_JSON, str(exc)) from None
    check_depth(payload if encoding in _UTF8 else text.encode("utf-8", "surrogatepass"))
    try:
        obj = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:  # malformed text can still fool check_depth
        raise PayloadError(PayloadReason.MALFORMED_JSON, str(exc)) from None
    check_unicode(text, obj)
    return obj


def load_object(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Bytes → JSON object, bounded (:func:`load_json`); every failure is a `PayloadError`."""
    obj = load_json(payload, max_bytes=max_bytes)
    if not isinstance(obj, dict):
        raise PayloadError(PayloadReason.NOT_OBJECT, f"top level is {type(obj).__name__}")
    return obj


def check_version(obj: dict[str, Any], *, required: bool = False) -> None:
    if "v" not in obj and not required:
        return
    if obj.get("v") != 1 or isinstance(obj.get("v"), bool):
        raise PayloadError(PayloadReason.UNSUPPORTED_VERSION, f"v={obj.get('v')!r}")


def validate(adapter: TypeAdapter[M], obj: object) -> M:
    """Validate a decoded object; unknown discriminator tags become `unknown_type`."""
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        path = ".".join(str(p) for p in first["loc"]) or "<root>"
        reason = (
            PayloadReason.UNKNOWN_TYPE
            if any(e["type"] == "union_tag_invalid" for e in errors)
            else PayloadReason.INVALID
        )
        raise PayloadError(reason, f"{path}: {first['msg']}") from None


def encode(model: BaseModel) -> bytes:
    """Compact JSON bytes (no spaces, field order as declared, UTF-8 unescaped)."""
    return model.model_dump_json(by_alias=True).encode()
