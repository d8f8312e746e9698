"""Upstream binary framing: every protocol version round-trips; malformed frames are refused."""

from __future__ import annotations

import struct

import pytest

from gateway.chat.framing import AudioFrame, FrameError, Framing, pack, unpack

OPUS = bytes(range(7, 90))


@pytest.mark.parametrize("framing", list(Framing))
def test_round_trip_keeps_opus_bytes(framing: Framing) -> None:
    frame = unpack(framing, pack(framing, OPUS, 1234))
    assert frame.opus == OPUS
    assert frame.timestamp == (0 if framing in (Framing.V1, Framing.V3) else 1234)


def test_gateway_layout_matches_the_node_gateway() -> None:
    message = pack(Framing.GATEWAY, OPUS, 0x1_0000_0005)  # timestamp wraps to u32
    assert message[:8] == bytes(8)
    assert struct.unpack_from(">II", message, 8) == (5, len(OPUS))
    assert message[16:] == OPUS


def test_gateway_downlink_ignores_the_server_prefix() -> None:
    # xiaozhi-esp32-server: [0]=1, [2..3]=len u16, [4..7]=its sequence, [8..11]=ts, [12..15]=len
    message = struct.pack(">BBHIII", 1, 0, len(OPUS), 77, 999, len(OPUS)) + OPUS
    assert unpack(Framing.GATEWAY, message) == AudioFrame(OPUS, 999)


def test_v2_v3_layouts() -> None:
    assert pack(Framing.V2, OPUS, 9)[:16] == struct.pack(">HHIII", 2, 0, 0, 9, len(OPUS))
    assert pack(Framing.V3, OPUS)[:4] == struct.pack(">BBH", 0, 0, len(OPUS))
    assert pack(Framing.V1, OPUS) == OPUS


def test_protocol_versions() -> None:
    assert [f.protocol_version for f in Framing] == [2, 1, 2, 3]


@pytest.mark.parametrize(
    ("framing", "message", "reason"),
    [
        (Framing.V1, b"", "empty"),
        (Framing.GATEWAY, bytes(15), "short"),
        (Framing.GATEWAY, bytes(16), "length"),  # empty payload
        (Framing.GATEWAY, struct.pack(">8xII", 0, 5) + b"abc", "length"),
        (Framing.V2, bytes(10), "short"),
        (Framing.V2, struct.pack(">HHIII", 2, 1, 0, 0, 2) + b"{}", "not_audio"),
        (Framing.V3, b"\x00", "short"),
        (Framing.V3, struct.pack(">BBH", 1, 0, 2) + b"{}", "not_audio"),
        (Framing.V3, struct.pack(">BBH", 0, 0, 9) + b"abc", "length"),
    ],
)
def test_malformed_downlink(framing: Framing, message: bytes, reason: str) -> None:
    with pytest.raises(FrameError) as caught:
        unpack(framing, message)
    assert caught.value.reason == reason
