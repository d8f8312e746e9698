"""Xiaozhi control JSON at the channel's edge, over the wire contract in ``topics.xiaozhi``.

Inbound: ``topics.parse_xiaozhi`` (bounded, typed, unknown keys ignored) plus the channel's own
acceptance rules for ``hello`` (version 3, transport "udp"); every refusal is a
:class:`ControlError` with a stable ``reason`` label the shell counts. Outbound: the contract's
models, encoded compactly with the key order real servers use.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from topics.errors import PayloadError
from topics.xiaozhi import (
    Abort,
    AudioParams,
    DeviceGoodbye,
    DeviceHello,
    DeviceMcp,
    DeviceMessage,
    Iot,
    Listen,
    McpRequest,
    Ping,
    ServerGoodbye,
    ServerHello,
    ServerMcp,
    Stt,
    Tts,
    UdpParams,
    UdpTimeout,
    encode_xiaozhi,
    parse_xiaozhi,
)

__all__ = [
    "Abort",
    "ControlError",
    "DeviceGoodbye",
    "DeviceHello",
    "DeviceMcp",
    "DeviceMessage",
    "Iot",
    "Listen",
    "Ping",
    "UdpTimeout",
    "goodbye",
    "hello_reply",
    "mcp",
    "parse_device_message",
    "stt",
    "tts",
]

MAX_CONTROL_BYTES = 8192  # the Xiaozhi ecosystem's MQTT packet cap (reference §3.3)


class ControlError(ValueError):
    """A control payload that cannot be used; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail[:200]
        super().__init__(f"{reason}: {self.detail}" if detail else reason)


def parse_device_message(payload: bytes) -> DeviceMessage:
    """One device control message, or :class:`ControlError` (never another exception)."""
    try:
        msg = parse_xiaozhi(payload, max_bytes=MAX_CONTROL_BYTES)
    except PayloadError as exc:
        raise ControlError(exc.reason.value, exc.detail) from None
    if isinstance(msg, DeviceHello):
        if msg.version != 3:
            raise ControlError("unsupported_version", f"hello version {msg.version}")
        if msg.transport != "udp":
            raise ControlError("unsupported_transport", f"hello transport {msg.transport!r}")
    return msg


# -- outbound ---------------------------------------------------------------------------------


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
    return encode_xiaozhi(
        ServerHello(
            session_id=session_id,
            udp=UdpParams(server=server, port=port, key=key.hex(), nonce=nonce.hex()),
            audio_params=AudioParams(
                format="opus", sample_rate=sample_rate, channels=1, frame_duration=frame_ms
            ),
        )
    )


def goodbye(session_id: str | None) -> bytes:
    """A gateway goodbye; ``None`` (a device message that carried none) becomes ``""``."""
    return encode_xiaozhi(ServerGoodbye(session_id=session_id or ""))


def tts(
    session_id: str, state: Literal["start", "stop", "sentence_start"], text: str = ""
) -> bytes:
    return encode_xiaozhi(
        Tts(state=state, text=text if state == "sentence_start" else None, session_id=session_id)
    )


def mcp(session_id: str, payload: dict[str, Any]) -> bytes:
    request = McpRequest.model_validate(payload, strict=False)
    return encode_xiaozhi(ServerMcp(payload=request, session_id=session_id))


def stt(session_id: str, text: str) -> bytes:
    return encode_xiaozhi(Stt(text=text, session_id=session_id))


def mcp_payload(msg: DeviceMcp) -> dict[str, Any]:
    """The JSON-RPC object of a device ``mcp`` message, as plain JSON data."""
    data: dict[str, Any] = json.loads(msg.payload.model_dump_json())
    return data
