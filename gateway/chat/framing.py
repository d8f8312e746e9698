"""Binary audio frames on the WebSocket to a xiaozhi server (pure; reference §9, §10, §12).

* ``gateway`` — what a MQTT gateway speaks with ``?from=mqtt_gateway``: a 16-byte header with
  the timestamp (u32 BE) at offset 8 and the payload length (u32 BE) at 12. Uplink bytes 0-7
  are zero, as the Node gateway sends them; downlink bytes 0-7 (xiaozhi-esp32-server puts a
  version, a u16 length and its sequence there) are ignored.
* ``1`` — raw Opus, one packet per message (what the server assumes for a direct device).
* ``2`` — ``version u16 | type u16 (0 audio, 1 json) | reserved u32 | timestamp u32 |
  size u32`` then the payload.
* ``3`` — ``type u8 | reserved u8 | size u16`` then the payload.

Uplink Opus goes out unchanged (no re-encode); only a header is put in front of it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

_GATEWAY = struct.Struct(">8xII")
_V2 = struct.Struct(">HHIII")
_V3 = struct.Struct(">BBH")
TYPE_AUDIO = 0


class Framing(Enum):
    GATEWAY = "gateway"
    V1 = "1"
    V2 = "2"
    V3 = "3"

    @property
    def protocol_version(self) -> int:
        """The ``Protocol-Version`` header / hello ``version`` (the Node gateway says 2)."""
        return 2 if self is Framing.GATEWAY else int(self.value)


class FrameError(ValueError):
    """A downlink binary message that does not parse; ``reason`` is a metric label."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class AudioFrame:
    opus: bytes
    timestamp: int


def pack(framing: Framing, opus: bytes, timestamp: int = 0) -> bytes:
    """One uplink Opus packet as a binary WebSocket message."""
    ts = timestamp & 0xFFFFFFFF
    match framing:
        case Framing.GATEWAY:
            return _GATEWAY.pack(ts, len(opus)) + opus
        case Framing.V1:
            return opus
        case Framing.V2:
            return _V2.pack(2, TYPE_AUDIO, 0, ts, len(opus)) + opus
        case _:  # Framing.V3
            return _V3.pack(TYPE_AUDIO, 0, len(opus)) + opus


def unpack(framing: Framing, message: bytes) -> AudioFrame:
    """One downlink binary message → its Opus packet (:class:`FrameError` if malformed)."""
    match framing:
        case Framing.V1:
            if not message:
                raise FrameError("empty")
            return AudioFrame(message, 0)
        case Framing.GATEWAY:
            if len(message) < _GATEWAY.size:
                raise FrameError("short")
            timestamp, size = _GATEWAY.unpack_from(message)
            offset = _GATEWAY.size
        case Framing.V2:
            if len(message) < _V2.size:
                raise FrameError("short")
            _, kind, _, timestamp, size = _V2.unpack_from(message)
            if kind != TYPE_AUDIO:
                raise FrameError("not_audio")
            offset = _V2.size
        case _:  # Framing.V3
            if len(message) < _V3.size:
                raise FrameError("short")
            kind, _, size = _V3.unpack_from(message)
            if kind != TYPE_AUDIO:
                raise FrameError("not_audio")
            timestamp, offset = 0, _V3.size
    if size == 0 or len(message) - offset != size:
        raise FrameError("length")
    return AudioFrame(message[offset:], timestamp)


def opus_packet_ms(packet: bytes) -> float | None:
    """An Opus packet's duration from its TOC byte (RFC 6716 §3.1), ``None`` if malformed.

    Configs 0-11 are SILK (10/20/40/60 ms), 12-15 hybrid (10/20 ms), 16-31 CELT
    (2.5/5/10/20 ms); code 0 is one frame, 1 and 2 two, 3 carries the count in the next byte.
    """
    if not packet:
        return None
    config, code = packet[0] >> 3, packet[0] & 0x3
    if config < 12:
        frame = (10.0, 20.0, 40.0, 60.0)[config & 3]
    elif config < 16:
        frame = (10.0, 20.0)[config & 1]
    else:
        frame = (2.5, 5.0, 10.0, 20.0)[config & 3]
    if code == 0:
        return frame
    if code in (1, 2):
        return 2 * frame
    if len(packet) < 2 or not packet[1] & 0x3F:
        return None
    total = frame * (packet[1] & 0x3F)
    return total if total <= 120.0 else None
