"""The downlink audio parameters a device is told in its hello reply (pure).

The firmware configures its Opus decoder from the hello's ``audio_params.sample_rate`` and
``frame_duration`` (``ParseServerHello`` → ``SetDecodeSampleRate``, esp_audio_codec's
``esp_opus_dec``): a rate Opus decodes at (8, 12, 16, 24 or 48 kHz) and a frame duration of
its enum (2.5-120 ms; the integral ones are usable in JSON). Bridged, they are the xiaozhi
server's own (its hello); a server hello without usable ones leaves the device's own (what the
device announced for its uplink), and the problem is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPUS_RATES = frozenset({8_000, 12_000, 16_000, 24_000, 48_000})
FRAME_MS = frozenset({10, 20, 40, 60, 80, 100, 120})


@dataclass(frozen=True, slots=True)
class Downlink:
    sample_rate: int = 16_000
    frame_ms: int = 60


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        return None
    return int(value)


def downlink_params(
    server: dict[str, Any] | None, device: dict[str, Any] | None = None
) -> tuple[Downlink, str | None]:
    """(parameters for the device's decoder, a metric label when the server's were unusable)."""
    fallback = Downlink()
    if device:
        rate, frame = _int(device.get("sample_rate")), _int(device.get("frame_duration"))
        if rate in OPUS_RATES and frame in FRAME_MS:
            fallback = Downlink(rate, frame)
    if server is None:
        return fallback, "no_audio_params"
    if server.get("format", "opus") != "opus":
        return fallback, "bad_audio_format"
    rate, frame = _int(server.get("sample_rate")), _int(server.get("frame_duration", 60))
    if rate is None or frame is None or rate not in OPUS_RATES or frame not in FRAME_MS:
        return fallback, "bad_audio_params"
    return Downlink(rate, frame), None
