"""MQTT packets out, sans-I/O: the bytes of CONNECT, PUBLISH, PUBACK, SUBSCRIBE, PINGREQ and
DISCONNECT (MQTT 5 and 3.1.1). Packets in are :mod:`gateway.mqtt_codec`, which re-exports these
so callers use one ``codec`` name for both directions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

V311 = 4
V5 = 5

# MQTT 5 property identifiers written here (§2.2.2.2).
_EXPIRY = 0x02
_CORRELATION = 0x09
_RECEIVE_MAXIMUM = 0x21

PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
_U16_S = struct.Struct("!H")
_U32_S = struct.Struct("!I")


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return _U16_S.pack(len(raw)) + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _length(len(body)) + body


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False


def connect(
    *,
    client_id: str,
    keepalive_s: int,
    username: str | None = None,
    password: str | None = None,
    will: Will | None = None,
    version: int = V5,
    receive_maximum: int | None = None,
) -> bytes:
    """CONNECT with a clean start (no session kept on either side)."""
    flags = 0x02
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = bytearray(_str("MQTT"))
    body += bytes((version, flags)) + _U16_S.pack(keepalive_s)
    if version == V5:
        props = (
            b""
            if receive_maximum is None
            else bytes((_RECEIVE_MAXIMUM,)) + _U16_S.pack(receive_maximum)
        )
        body += _length(len(props)) + props
    body += _str(client_id)
    if will is not None:
        if version == V5:
            body += b"\x00"  # no will properties
        body += _str(will.topic) + _str(will.payload)
    if username is not None:
        body += _str(username)
    if password is not None:
        body += _str(password)
    return _packet(0x10, bytes(body))


def publish(
    topic: bytes,
    payload: bytes,
    *,
    qos: int = 0,
    retain: bool = False,
    packet_id: int = 0,
    version: int = V5,
    properties: bytes = b"",
    dup: bool = False,
) -> bytes:
    """PUBLISH; ``topic`` UTF-8 encoded already; ``properties`` from :func:`publish_properties`."""
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    head = _U16_S.pack(len(topic)) + topic
    if qos:
        head += _U16_S.pack(packet_id)
    if version == V5:
        head += _length(len(properties)) + properties
    return bytes((first,)) + _length(len(head) + len(payload)) + head + payload


def publish_properties(correlation_data: bytes | None, expiry_s: int | None) -> bytes:
    props = b""
    if expiry_s is not None:
        props += bytes((_EXPIRY,)) + _U32_S.pack(expiry_s)
    if correlation_data is not None:
        props += bytes((_CORRELATION,)) + _str(correlation_data)
    return props


def puback(packet_id: int) -> bytes:
    """PUBACK with success (MQTT 5 allows omitting the reason code then: the same bytes)."""
    return b"\x40\x02" + _U16_S.pack(packet_id)


def subscribe(packet_id: int, filters: list[tuple[str, int]], *, version: int = V5) -> bytes:
    body = bytearray(_U16_S.pack(packet_id))
    if version == V5:
        body += b"\x00"
    for topic_filter, qos in filters:
        body += _str(topic_filter) + bytes((qos,))
    return _packet(0x82, bytes(body))
