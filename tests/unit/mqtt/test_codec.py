"""The MQTT packet codec: byte layouts from the MQTT 5 / 3.1.1 specifications, split reads,
malformed input (every way it can be wrong raises ProtocolError, never anything else)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mqtt import codec
from gateway.mqtt.codec import (
    ConnAck,
    Disconnect,
    PacketDecoder,
    PingResp,
    ProtocolError,
    PubAck,
    PublishPacket,
    SubAck,
)


def test_connect_v5_with_will_and_credentials() -> None:
    packet = codec.connect(
        client_id="gw",
        keepalive_s=30,
        username="u",
        password="p",
        will=codec.Will("s/t", b"off", qos=1, retain=True),
        receive_maximum=20,
    )
    body = (
        b"\x00\x04MQTT\x05"
        + bytes((0x80 | 0x40 | 0x20 | 0x08 | 0x04 | 0x02,))
        + b"\x00\x1e"
        + b"\x03\x21\x00\x14"  # properties: receive maximum 20
        + b"\x00\x02gw"
        + b"\x00"  # will properties
        + b"\x00\x03s/t\x00\x03off"
        + b"\x00\x01u\x00\x01p"
    )
    assert packet == b"\x10" + bytes((len(body),)) + body


def test_connect_v311_minimal() -> None:
    packet = codec.connect(client_id="b", keepalive_s=60, version=codec.V311)
    assert packet == b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01b"


def test_connect_v5_without_properties_has_an_empty_block() -> None:
    packet = codec.connect(client_id="b", keepalive_s=60)
    assert packet == b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01b"


@pytest.mark.parametrize("version", [codec.V5, codec.V311])
@pytest.mark.parametrize(("qos", "retain"), [(0, False), (1, True), (1, False)])
def test_publish_round_trip(version: int, qos: int, retain: bool) -> None:
    packet = codec.publish(
        b"snlp/v1/aa/cmd", b'{"v":1}', qos=qos, retain=retain, packet_id=513, version=version
    )
    (p,) = PacketDecoder(version).feed(packet)
    assert p == PublishPacket("snlp/v1/aa/cmd", b'{"v":1}', qos, retain, 513 if qos else None)


def test_publish_v311_bytes() -> None:
    assert codec.publish(b"a/b", b"x", qos=1, packet_id=10, version=codec.V311) == (
        b"\x32\x08\x00\x03a/b\x00\x0ax"
    )
    assert codec.publish(b"a", b"", retain=True, dup=True, version=codec.V311) == (
        b"\x39\x03\x00\x01a"
    )


def test_publish_with_properties_is_decoded() -> None:
    props = (
        codec.publish_properties(b"cid", 30)
        + b"\x08\x00\x03r/1"  # response topic
        + b"\x26\x00\x01k\x00\x01v"  # a user property (skipped)
        + b"\x0b\x81\x01"  # subscription identifier 129 (varint)
        + b"\x01\x01"  # payload format indicator
        + b"\x23\x00\x05"  # topic alias (two bytes)
    )
    packet = codec.publish(b"t", b"body", qos=1, packet_id=1, properties=props)
    (p,) = PacketDecoder().feed(packet)
    assert p == PublishPacket("t", b"body", 1, False, 1, "r/1", b"cid")


def test_long_payload_uses_a_multi_byte_length() -> None:
    payload = bytes(range(256)) * 80  # 20,480 bytes: a 3-byte remaining length
    packet = codec.publish(b"t", payload, qos=0)
    assert packet[1] & 0x80
    assert packet[2] & 0x80
    assert not packet[3] & 0x80
    (p,) = PacketDecoder().feed(packet)
    assert isinstance(p, PublishPacket)
    assert p.payload == payload


def test_packets_split_anywhere_and_joined_decode_the_same() -> None:
    stream = (
        codec.publish(b"a/b", b"one", qos=1, packet_id=1)
        + b"\x40\x02\x00\x07"  # PUBACK 7 (reason omitted: success)
        + b"\x40\x03\x00\x08\x10"  # PUBACK 8, reason 0x10 (no matching subscribers)
        + b"\xd0\x00"  # PINGRESP
        + b"\x20\x03\x00\x00\x00"  # CONNACK v5, no properties
        + b"\x90\x05\x00\x09\x00\x01\x87"  # SUBACK 9: granted 1, refused
        + codec.publish(b"c", b"x" * 300)
        + b"\xe0\x01\x8e"  # DISCONNECT: session taken over
    )
    expected = PacketDecoder().feed(stream)
    assert expected == [
        PublishPacket("a/b", b"one", 1, False, 1),
        PubAck(7),
        PubAck(8, 0x10),
        PingResp(),
        ConnAck(0),
        SubAck(9, (1, 0x87)),
        PublishPacket("c", b"x" * 300, 0, False),
        Disconnect(0x8E),
    ]
    for cut in range(1, len(stream)):
        d = PacketDecoder()
        assert d.feed(stream[:cut]) + d.feed(stream[cut:]) == expected
    d = PacketDecoder()
    assert [p for i in range(len(stream)) for p in d.feed(stream[i : i + 1])] == expected


def test_connack_properties_v5_and_v311() -> None:
    body = b"\x00\x00\x08\x21\x00\x0a\x27\x00\x01\x00\x00"  # receive max 10, max packet 65536
    (p,) = PacketDecoder().feed(b"\x20" + bytes((len(body),)) + body)
    assert p == ConnAck(0, receive_maximum=10, maximum_packet_size=65_536)
    (p,) = PacketDecoder(codec.V311).feed(b"\x20\x02\x00\x05")
    assert p == ConnAck(5)
    (p,) = PacketDecoder().feed(b"\x20\x02\x00\x87")
    assert p == ConnAck(0x87)


def test_suback_v311_and_disconnect_without_reason() -> None:
    assert PacketDecoder(codec.V311).feed(b"\x90\x03\x00\x02\x01") == [SubAck(2, (1,))]
    assert PacketDecoder().feed(b"\xe0\x00") == [Disconnect(0)]


def test_small_packets() -> None:
    assert codec.puback(258) == b"\x40\x02\x01\x02"
    assert codec.PINGREQ == b"\xc0\x00"
    assert codec.DISCONNECT == b"\xe0\x00"
    assert codec.subscribe(3, [("a/+", 1), ("b/#", 0)]) == (
        b"\x82\x0f\x00\x03\x00\x00\x03a/+\x01\x00\x03b/#\x00"
    )
    assert codec.subscribe(3, [("a", 1)], version=codec.V311) == b"\x82\x06\x00\x03\x00\x01a\x01"


@pytest.mark.parametrize(
    "data",
    [
        b"\x30\xff\xff\xff\xff\x01",  # remaining length over 4 bytes
        b"\x36\x03\x00\x01a",  # QoS 3
        b"\x30\x03\x00\x05a",  # topic longer than the packet
        b"\x30\x04\x00\x02\xff\xfe",  # topic not UTF-8
        b"\x32\x04\x00\x01a\x00",  # QoS 1 without a whole packet id
        b"\x30\x03\x00\x01a",  # v5 without the properties length
        b"\x30\x05\x00\x01a\x05\x02",  # properties past the packet
        b"\x30\x06\x00\x01a\x02\x7f\x00",  # unknown property
        b"\x30\x07\x00\x01a\x03\x02\x00\x00",  # property runs past its block
        b"\x30\x08\x00\x01a\x04\x08\x00\x05x",  # string property past its block
        b"\x30\x08\x00\x01a\x04\x0b\x80\x80\x80",  # varint property unterminated
        b"\x30\x0a\x00\x01a\x06\x0b\x80\x80\x80\x80\x01",  # varint property over 4 bytes
        b"\x40\x01\x00",  # short PUBACK
        b"\x20\x01\x00",  # short CONNACK
        b"\x90\x02\x00\x01",  # short SUBACK
        b"\x90\x03\x00\x01\x85",  # SUBACK properties length unterminated
        b"\x50\x02\x00\x01",  # PUBREC: never expected (no QoS 2)
        b"\x10\x00",  # CONNECT from the broker
    ],
)
def test_malformed_input_raises_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        PacketDecoder().feed(data)


def test_packet_over_the_limit_raises_before_it_is_buffered() -> None:
    d = PacketDecoder(max_packet=100)
    with pytest.raises(ProtocolError, match="over the limit"):
        d.feed(b"\x30\x80\x01")  # announces 128 bytes


def test_incomplete_length_waits_for_more() -> None:
    d = PacketDecoder()
    assert d.feed(b"\x30") == []
    assert d.feed(b"\x85") == []
    assert d.feed(b"\x00") == []  # 5 bytes announced, none yet
    assert d.feed(b"\x00\x01a\x00x") == [PublishPacket("a", b"x", 0, False)]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        PacketDecoder().feed(data)


def test_v311_publish_whose_topic_runs_past_the_packet() -> None:
    with pytest.raises(ProtocolError, match="truncated"):
        PacketDecoder(codec.V311).feed(b"\x30\x03\x00\x05a")


def test_connect_v311_with_a_will_has_no_will_properties() -> None:
    packet = codec.connect(
        client_id="b", keepalive_s=60, will=codec.Will("s", b"x"), version=codec.V311
    )
    assert packet == b"\x10\x13\x00\x04MQTT\x04\x06\x00\x3c\x00\x01b\x00\x01s\x00\x01x"


def test_publish_properties_each_alone() -> None:
    assert codec.publish_properties(b"c", None) == b"\x09\x00\x01c"
    assert codec.publish_properties(None, 5) == b"\x02\x00\x00\x00\x05"
    assert codec.publish_properties(None, None) == b""


@pytest.mark.parametrize("payload", [0, 1, 100, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("version", [codec.V5, codec.V311])
def test_publish_size_is_the_length_of_the_packet_without_building_it(
    payload: int, qos: int, version: int
) -> None:
    props = codec.publish_properties(b"c" * 200, 30) if version == codec.V5 else b""
    packet = codec.publish(
        b"t/x", b"p" * payload, qos=qos, packet_id=7, version=version, properties=props
    )
    size = codec.publish_size(3, payload, qos=qos, properties=len(props), version=version)
    assert size == len(packet)
