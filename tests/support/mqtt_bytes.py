"""A broker's side of MQTT 5 as bytes, for unit tests of the client: packets a broker sends
(built here by hand from the specification, not by the client's codec) and a reader of the
packets a client sends (CONNECT, SUBSCRIBE, PUBLISH, PUBACK, PINGREQ, DISCONNECT)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# CONNACK property identifiers (MQTT 5 §3.2.2.3).
SERVER_KEEPALIVE = 0x13
RECEIVE_MAXIMUM = 0x21
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
MAXIMUM_PACKET_SIZE = 0x27
REASON_STRING = 0x1F

_U16 = {SERVER_KEEPALIVE, RECEIVE_MAXIMUM}
_U32 = {MAXIMUM_PACKET_SIZE}
_BYTE = {MAXIMUM_QOS, RETAIN_AVAILABLE}


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("!H", len(raw)) + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def properties(props: dict[int, int | str]) -> bytes:
    out = bytearray()
    for ident, value in props.items():
        out.append(ident)
        if isinstance(value, str):
            out += utf8(value)
        elif ident in _U16:
            out += struct.pack("!H", value)
        elif ident in _U32:
            out += struct.pack("!I", value)
        else:
            out.append(value)
    return varint(len(out)) + bytes(out)


def connack(
    reason: int = 0, *, present: bool = False, props: dict[int, int | str] | None = None
) -> bytes:
    return packet(0x20, bytes((int(present), reason)) + properties(props or {}))


def puback(packet_id: int, reason: int = 0) -> bytes:
    if reason == 0:
        return packet(0x40, struct.pack("!H", packet_id))
    return packet(0x40, struct.pack("!HB", packet_id, reason) + b"\x00")


def suback(packet_id: int, *codes: int) -> bytes:
    return packet(0x90, struct.pack("!H", packet_id) + b"\x00" + bytes(codes))


def disconnect(reason: int, reason_string: str | None = None) -> bytes:
    props = {} if reason_string is None else {REASON_STRING: reason_string}
    return packet(0xE0, bytes((reason,)) + properties(props))


def publish(topic: str, payload: bytes, *, qos: int = 0, packet_id: int = 0) -> bytes:
    head = utf8(topic) + (struct.pack("!H", packet_id) if qos else b"") + b"\x00"
    return packet(0x30 | (qos << 1), head + payload)


PINGRESP = b"\xd0\x00"


# -- what a client sends -------------------------------------------------------------------


@dataclass
class ClientPacket:
    kind: int  # the packet type (1 CONNECT, 3 PUBLISH, 4 PUBACK, 8 SUBSCRIBE, 12 PINGREQ, 14)
    flags: int
    body: bytes
    raw: bytes
    props: dict[int, int] = field(default_factory=dict)  # CONNECT's numeric properties

    @property
    def packet_id(self) -> int:
        if self.kind == 3:
            (n,) = struct.unpack_from("!H", self.body)
            return int(struct.unpack_from("!H", self.body, 2 + n)[0])
        return int(struct.unpack_from("!H", self.body)[0])

    @property
    def topic(self) -> str:
        (n,) = struct.unpack_from("!H", self.body)
        return self.body[2 : 2 + n].decode()

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def dup(self) -> bool:
        return bool(self.flags & 0x08)

    @property
    def retain(self) -> bool:
        return bool(self.flags & 0x01)


def read_packets(buf: bytearray) -> list[ClientPacket]:
    """Take every whole packet off the front of ``buf``."""
    out: list[ClientPacket] = []
    while len(buf) >= 2:
        length, shift, i = 0, 0, 1
        while True:
            if i >= len(buf):
                return out
            b = buf[i]
            length |= (b & 0x7F) << shift
            shift += 7
            i += 1
            if not b & 0x80:
                break
        if len(buf) < i + length:
            return out
        raw = bytes(buf[: i + length])
        body = raw[i:]
        del buf[: i + length]
        found = ClientPacket(raw[0] >> 4, raw[0] & 0x0F, body, raw)
        if found.kind == 1:
            found.props = _connect_props(body)
        out.append(found)
    return out


def connect_flags(p: ClientPacket) -> int:
    return p.body[7]


def connect_keepalive(p: ClientPacket) -> int:
    return int(struct.unpack_from("!H", p.body, 8)[0])


def connect_client_id(p: ClientPacket) -> str:
    """The client id of a CONNECT (MQTT 5: the first field after the properties)."""
    body = p.body
    pos, length, shift = 10, 0, 0
    while True:
        byte = body[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    pos += length
    (n,) = struct.unpack_from("!H", body, pos)
    return body[pos + 2 : pos + 2 + n].decode()


def _connect_props(body: bytes) -> dict[int, int]:
    if body[6] != 5:
        return {}
    pos, length, shift = 10, 0, 0
    while True:
        b = body[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    props: dict[int, int] = {}
    end = pos + length
    while pos < end:
        ident = body[pos]
        pos += 1
        if ident in (0x11, 0x27):
            props[ident] = int(struct.unpack_from("!I", body, pos)[0])
            pos += 4
        elif ident in (0x21, 0x22):
            props[ident] = int(struct.unpack_from("!H", body, pos)[0])
            pos += 2
        else:
            raise ValueError(f"CONNECT property 0x{ident:02x} not expected from this client")
    return props
