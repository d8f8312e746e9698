"""The device's decoder parameters from the server's hello, and Opus packet durations."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.chat.audio_params import Downlink, downlink_params
from gateway.chat.framing import opus_packet_ms

DEVICE = {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        (
            {"format": "opus", "sample_rate": 24000, "frame_duration": 60},
            (Downlink(24000, 60), None),
        ),
        ({"sample_rate": 48000, "frame_duration": 20}, (Downlink(48000, 20), None)),
        ({"sample_rate": 16000}, (Downlink(16000, 60), None)),
        (None, (Downlink(16000, 60), "no_audio_params")),
        ({"format": "pcm", "sample_rate": 24000}, (Downlink(16000, 60), "bad_audio_format")),
        ({"sample_rate": 22050}, (Downlink(16000, 60), "bad_audio_params")),
        ({"sample_rate": 24000, "frame_duration": 30}, (Downlink(16000, 60), "bad_audio_params")),
        ({"sample_rate": True}, (Downlink(16000, 60), "bad_audio_params")),
    ],
)
def test_downlink_params(server: dict[str, Any] | None, expected: tuple[Any, Any]) -> None:
    assert downlink_params(server, DEVICE) == expected


def test_device_fallback_only_when_usable() -> None:
    assert downlink_params(None, {"sample_rate": 12000, "frame_duration": 20})[0] == Downlink(
        12000, 20
    )
    assert downlink_params(None, {"sample_rate": 11025})[0] == Downlink()


@pytest.mark.parametrize(
    ("packet", "ms"),
    [
        (bytes([3 << 3]), 60.0),  # SILK 60 ms, one frame
        (bytes([(1 << 3) | 1]), 40.0),  # SILK 20 ms, two frames
        (bytes([13 << 3]), 20.0),  # hybrid 20 ms
        (bytes([(31 << 3) | 3, 6]), 120.0),  # CELT 20 ms x 6
        (bytes([(16 << 3) | 2]), 5.0),  # CELT 2.5 ms x 2
        (bytes([(31 << 3) | 3, 7]), None),  # 140 ms: too long
        (bytes([(31 << 3) | 3]), None),  # code 3 without its count
        (b"", None),
    ],
)
def test_opus_packet_ms(packet: bytes, ms: float | None) -> None:
    assert opus_packet_ms(packet) == ms
