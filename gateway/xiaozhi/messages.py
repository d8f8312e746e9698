"""Xiaozhi control JSON, both directions (reference §4, §6): parsed once at the edge.

Inbound (device → gateway) models ignore unknown keys (firmware adds features over time) but
are strict about the keys they use; anything else is a :class:`ControlError` with a stable
``reason`` label that the shell counts. Outbound messages are built by small functions that
return compact JSON bytes with the key order real servers use.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, TypeAdapter
from pydantic import ValidationError as _ValidationError

MAX_CONTROL_BYTES = 8192  # the Xiaozhi ecosystem's MQTT packet cap (reference §3.3)


class ControlError(ValueError):
    """A control payload that cannot be used; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail[:200]
        super().__init__(f"{reason}: {self.detail}" if detail else reason)


class _In(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class AudioParams(_In):
    format: StrictStr = "opus"
    sample_rate: StrictInt = 16_000
    channels: StrictInt = 1
    frame_duration: StrictInt = 60


class Hello(_In):
    type: Literal["hello"]
    version: Literal[3]
    transport: Literal["udp"]
    features: dict[str, Any] = Field(default_factory=dict)
    audio_params: AudioParams = AudioParams()
    session_id: StrictStr | None = None


class Listen(_In):
    type: Literal["listen"]
    session_id: StrictStr | None = None
    state: Literal["start", "stop", "detect"]
    mode: Literal["auto", "manual", "realtime"] | None = None
    text: StrictStr | None = None


class Abort(_In):
    type: Literal["abort"]
    session_id: StrictStr | None = None
    reason: StrictStr | None = None


class Mcp(_In):
    type: Literal["mcp"]
    session_id: StrictStr | None = None
    payload: dict[str, Any]


class Goodbye(_In):
    type: Literal["goodbye"]
    session_id: StrictStr | None = None


DeviceMessage = Hello | Listen | Abort | Mcp | Goodbye
_ADAPTER: TypeAdapter[DeviceMessage] = TypeAdapter(
    Annotated[DeviceMessage, Field(discriminator="type")]
)
KNOWN_TYPES = frozenset({"hello", "listen", "abort", "mcp", "goodbye"})


def parse_device_message(payload: bytes) -> DeviceMessage:
    """One device control message, or :class:`ControlError` (never another exception)."""
    if len(payload) > MAX_CONTROL_BYTES:
        raise ControlError("oversize", f"{len(payload)} bytes")
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ControlError("malformed_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise ControlError("not_object", type(obj).__name__)
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ControlError("missing_type")
    if kind not in KNOWN_TYPES:
        raise ControlError("unknown_type", kind)
    if kind == "hello" and obj.get("version") != 3:
        raise ControlError("unsupported_version", repr(obj.get("version")))
    if kind == "hello" and obj.get("transport") != "udp":
        raise ControlError("unsupported_transport", repr(obj.get("transport")))
    try:
        return _ADAPTER.validate_python(obj)
    except _ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ControlError("invalid", f"{kind}: {where}: {first['msg']}") from None


def message_session_id(payload: bytes) -> str | None:
    """Best-effort ``session_id`` of a payload that failed validation (for the goodbye reply)."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    sid = obj.get("session_id") if isinstance(obj, dict) else None
    return sid if isinstance(sid, str) else None


# -- outbound ---------------------------------------------------------------------------------


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def hello_reply(
    *,
    session_id: str,
    server: str,
    port: int,
    key: bytes,
    nonce: bytes,
    sample_rate: int = 16_000,
    frame_ms: int = 60,
) -> bytes:
    return _dump(
        {
            "type": "hello",
            "version": 3,
            "session_id": session_id,
            "transport": "udp",
            "udp": {
                "server": server,
                "port": port,
                "encryption": "aes-128-ctr",
                "key": key.hex(),
                "nonce": nonce.hex(),
            },
            "audio_params": {
                "format": "opus",
                "sample_rate": sample_rate,
                "channels": 1,
                "frame_duration": frame_ms,
            },
        }
    )


def goodbye(session_id: str | None) -> bytes:
    body: dict[str, Any] = {"type": "goodbye"}
    if session_id is not None:
        body["session_id"] = session_id
    return _dump(body)


def tts(
    session_id: str, state: Literal["start", "stop", "sentence_start"], text: str = ""
) -> bytes:
    body: dict[str, Any] = {"type": "tts", "state": state, "session_id": session_id}
    if state == "sentence_start":
        body["text"] = text
    return _dump(body)


def mcp(session_id: str, payload: dict[str, Any]) -> bytes:
    return _dump({"session_id": session_id, "type": "mcp", "payload": payload})


def text_message(kind: Literal["stt", "llm"], session_id: str, text: str) -> bytes:
    return _dump({"type": kind, "text": text, "session_id": session_id})
