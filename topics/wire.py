"""Shared wire machinery: base models, bounded JSON decoding, error mapping, compact encoding.

Inbound device messages (`DeviceModel`) ignore unknown keys (firmware adds fields) but are
strictly typed on the keys they know; our own messages (`OwnModel`) forbid extras. Both are
frozen. Optional fields left at `None` are omitted on the wire unless listed in `_keep_null`.
"""

from __future__ import annotations

import json
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
    "DeviceModel",
    "EpochMs",
    "Id",
    "OwnModel",
    "WireModel",
    "check_version",
    "encode",
    "load_object",
    "validate",
]

# Field types shared by the payload models.
Id = Annotated[str, Field(min_length=1, max_length=64)]
EpochMs = Annotated[int, Field(ge=0)]

DEFAULT_MAX_BYTES = 8192
"""The Xiaozhi ecosystem's MQTT payload cap; our default for every inbound payload."""

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


def load_object(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Bytes → JSON object, bounded; every failure is a `PayloadError`."""
    if len(payload) > max_bytes:
        raise PayloadError(PayloadReason.OVERSIZE, f"{len(payload)} bytes > {max_bytes}")
    try:
        # What ``json.loads`` does with bytes: UTF-8/16/32 by the first bytes, then decode.
        obj = _DECODER.decode(payload.decode(json.detect_encoding(payload), "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise PayloadError(PayloadReason.MALFORMED_JSON, str(exc)) from None
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
