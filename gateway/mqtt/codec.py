"""MQTT packet codec, sans-I/O: bytes in, packets out; packets in, bytes out (MQTT 5 and 3.1.1).

Only what the gateway and its simulators use: CONNECT (will, username, password, clean start),
CONNACK, PUBLISH at QoS 0/1 (response topic, correlation data, message expiry), PUBACK,
SUBSCRIBE/SUBACK, PINGREQ/PINGRESP, DISCONNECT. Topic aliases are never offered (CONNECT
carries no Topic Alias Maximum), so the broker never sends one. QoS 2 is never subscribed to:
the broker delivers at most the subscription's QoS (MQTT §3.8.4), so it never arrives.

Inbound PUBLISH is the hot path: a packet with no properties (every board message) decodes
with one header read, a topic slice and a payload slice. A malformed packet raises
:class:`ProtocolError`; the connection is then closed (the broker sent something MQTT forbids).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

# -- packets out ---------------------------------------------------------------------------

V311 = 4
V5 = 5

# MQTT 5 property identifiers used here (§2.2.2.2).
_EXPIRY = 0x02
_RESPONSE_TOPIC = 0x08
_CORRELATION = 0x09
_SESSION_EXPIRY = 0x11
_SERVER_KEEPALIVE = 0x13
_REASON_STRING = 0x1F
_RECEIVE_MAXIMUM = 0x21
_MAXIMUM_QOS = 0x24
_RETAIN_AVAILABLE = 0x25
_MAX_PACKET = 0x27

_U16_S = struct.Struct("!H")
_U32_S = struct.Struct("!I")

PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


_ONE_BYTE = tuple(bytes((i,)) for i in range(128))


def _length(n: int) -> bytes:
    """A variable byte integer (MQTT §1.5.5)."""
    if n < 128:
        return _ONE_BYTE[n]  # most packets, and every property block, on the hot path
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _length_size(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16_384 else 3 if n < 2_097_152 else 4


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
    clean_start: bool = True,
    session_expiry_s: int = 0,
    maximum_packet_size: int | None = None,
) -> bytes:
    """CONNECT. ``clean_start`` False with ``session_expiry_s`` > 0 (MQTT 5) asks the broker to
    resume the session it kept and to keep this one that long after the connection ends;
    ``maximum_packet_size`` tells it the largest packet this client accepts (MQTT 5)."""
    flags = 0x02 if clean_start else 0x00
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = bytearray(_str("MQTT"))
    body += bytes((version, flags)) + _U16_S.pack(keepalive_s)
    if version == V5:
        props = b""
        if session_expiry_s:
            props += bytes((_SESSION_EXPIRY,)) + _U32_S.pack(session_expiry_s)
        if receive_maximum is not None:
            props += bytes((_RECEIVE_MAXIMUM,)) + _U16_S.pack(receive_maximum)
        if maximum_packet_size is not None:
            props += bytes((_MAX_PACKET,)) + _U32_S.pack(maximum_packet_size)
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


def publish_size(topic: int, payload: int, *, qos: int, properties: int, version: int = V5) -> int:
    """The length of a PUBLISH with a ``topic``-byte name, a ``payload``-byte body and (MQTT 5)
    a ``properties``-byte property block, without building it."""
    props = _length_size(properties) + properties if version == V5 else 0
    rest = 2 + topic + (2 if qos else 0) + props + payload
    return 1 + _length_size(rest) + rest


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


# -- packets in ----------------------------------------------------------------------------


class ProtocolError(Exception):
    """The peer broke the MQTT protocol; the connection must be closed. ``packets``: those
    decoded whole before the offending one (the decoder's callers act on them first)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.packets: list[Packet] = []


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# Every property's value shape, to skip or read any property the broker sends.
_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)
_SHAPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STR, 0x08: _STR, 0x09: _BIN, 0x0B: _VARINT, 0x11: _U32,
    0x12: _STR, 0x13: _U16, 0x15: _STR, 0x16: _BIN, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE,
    0x1A: _STR, 0x1C: _STR, 0x1F: _STR, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE,
    0x25: _BYTE, 0x26: _PAIR, 0x27: _U32, 0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK; the MQTT 5 properties the client obeys (None: not announced)."""

    reason: int  # 0 = accepted (3.1.1 return codes are mapped as they are)
    receive_maximum: int | None = None
    maximum_packet_size: int | None = None
    session_present: bool = False
    server_keepalive_s: int | None = None
    maximum_qos: int | None = None
    retain_available: bool | None = None
    reason_string: str | None = None


@dataclass(frozen=True, slots=True)
class PublishPacket:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    packet_id: int | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class PubAck:
    packet_id: int
    reason: int = 0


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reasons: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: int = 0
    reason_string: str | None = None


Packet = ConnAck | PublishPacket | PubAck | SubAck | PingResp | Disconnect


class PacketDecoder:
    """Incremental packet parser for one connection (``feed`` bytes, get whole packets)."""

    def __init__(self, version: int = V5, *, max_packet: int = 1 << 20) -> None:
        self._v5 = version == V5
        self._buf = bytearray()
        self._max_packet = max_packet

    def feed(self, data: bytes) -> list[Packet]:
        """Whole packets in ``data`` and what came before it. A malformed one raises
        :class:`ProtocolError` carrying the packets decoded before it."""
        packets: list[Packet] = []
        try:
            self._feed(data, packets)
        except ProtocolError as exc:
            exc.packets = packets
            raise
        return packets

    def _feed(self, data: bytes, packets: list[Packet]) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 2:
            header = buf[pos]
            length, shift, i, complete = 0, 0, pos + 1, False
            for _ in range(4):  # remaining length: a variable byte integer of 1-4 bytes
                if i >= end:
                    break
                b = buf[i]
                i += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    complete = True
                    break
            else:
                raise ProtocolError("remaining length over 4 bytes")
            if not complete:
                break  # the length itself is incomplete
            if length > self._max_packet:
                raise ProtocolError(f"{length}-byte packet over the limit")
            if end - i < length:
                break
            body = bytes(buf[i : i + length])
            pos = i + length
            packets.append(self._packet(header, body))
        del buf[:pos]

    def _packet(self, header: int, body: bytes) -> Packet:
        kind = header >> 4
        if kind == PacketType.PUBLISH:
            return self._publish(header, body)
        if kind == PacketType.PUBACK:
            if len(body) < 2:
                raise ProtocolError("short PUBACK")
            return PubAck(_U16_S.unpack_from(body)[0], body[2] if len(body) > 2 else 0)
        if kind == PacketType.CONNACK:
            return self._connack(body)
        if kind == PacketType.SUBACK:
            if len(body) < 3:
                raise ProtocolError("short SUBACK")
            pos = 2
            if self._v5:
                plen, pos = _varint(body, 2)
                pos += plen
            return SubAck(_U16_S.unpack_from(body)[0], tuple(body[pos:]))
        if kind == PacketType.PINGRESP:
            return PingResp()
        if kind == PacketType.DISCONNECT:
            return self._disconnect(body)
        raise ProtocolError(f"unexpected packet type {kind}")

    def _publish(self, header: int, body: bytes) -> PublishPacket:
        qos = (header >> 1) & 0x03
        if qos == 3:
            raise ProtocolError("PUBLISH with QoS 3")
        try:
            tlen = (body[0] << 8) | body[1]
            pos = 2 + tlen
            topic = body[2:pos].decode()
            packet_id = None
            if qos:
                packet_id = (body[pos] << 8) | body[pos + 1]
                pos += 2
            response_topic = correlation = None
            if self._v5:
                if body[pos] == 0:  # no properties: the common case
                    pos += 1
                else:
                    plen, pos = _varint(body, pos)
                    props = _properties(body, pos, pos + plen)
                    pos += plen
                    rt = props.get(_RESPONSE_TOPIC)
                    response_topic = rt if isinstance(rt, str) else None
                    cd = props.get(_CORRELATION)
                    correlation = cd if isinstance(cd, bytes) else None
        except (IndexError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed PUBLISH: {exc}") from None
        if pos > len(body):
            raise ProtocolError("malformed PUBLISH: truncated")
        return PublishPacket(
            topic, body[pos:], qos, bool(header & 1), packet_id, response_topic, correlation
        )

    def _connack(self, body: bytes) -> ConnAck:
        if len(body) < 2:
            raise ProtocolError("short CONNACK")
        present = bool(body[0] & 0x01)
        if not self._v5 or len(body) == 2:
            return ConnAck(body[1], session_present=present)
        plen, pos = _varint(body, 2)
        props = _properties(body, pos, pos + plen)
        rm, mp = props.get(_RECEIVE_MAXIMUM), props.get(_MAX_PACKET)
        ka, mq = props.get(_SERVER_KEEPALIVE), props.get(_MAXIMUM_QOS)
        ra, why = props.get(_RETAIN_AVAILABLE), props.get(_REASON_STRING)
        return ConnAck(
            body[1],
            rm if isinstance(rm, int) else None,
            mp if isinstance(mp, int) else None,
            present,
            ka if isinstance(ka, int) else None,
            mq if isinstance(mq, int) else None,
            bool(ra) if isinstance(ra, int) else None,
            why if isinstance(why, str) else None,
        )

    def _disconnect(self, body: bytes) -> Disconnect:
        if len(body) < 2 or not self._v5:
            return Disconnect(body[0] if body else 0)
        plen, pos = _varint(body, 1)
        why = _properties(body, pos, pos + plen).get(_REASON_STRING)
        return Disconnect(body[0], why if isinstance(why, str) else None)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    for _ in range(4):
        if pos >= len(data):
            raise ProtocolError("truncated variable byte integer")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise ProtocolError("variable byte integer over 4 bytes")


def _properties(data: bytes, pos: int, end: int) -> dict[int, object]:
    """Read a property block; user properties and repeats keep the last value (unused here)."""
    if end > len(data):
        raise ProtocolError("properties run past the packet")
    props: dict[int, object] = {}
    try:
        while pos < end:
            ident = data[pos]
            pos += 1
            shape = _SHAPES.get(ident)
            value: object
            if shape == _BYTE:
                value, pos = data[pos], pos + 1
            elif shape == _U16:
                value, pos = _U16_S.unpack_from(data, pos)[0], pos + 2
            elif shape == _U32:
                value, pos = _U32_S.unpack_from(data, pos)[0], pos + 4
            elif shape == _VARINT:
                value, pos = _varint(data, pos)
            elif shape in (_STR, _BIN):
                n = _U16_S.unpack_from(data, pos)[0]
                raw = data[pos + 2 : pos + 2 + n]
                pos += 2 + n
                value = raw.decode() if shape == _STR else bytes(raw)
            elif shape == _PAIR:
                for _ in range(2):
                    pos += 2 + _U16_S.unpack_from(data, pos)[0]
                continue
            else:
                raise ProtocolError(f"unknown property 0x{ident:02x}")
            props[ident] = value
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed properties: {exc}") from None
    if pos != end:
        raise ProtocolError("properties run past their length")
    return props
