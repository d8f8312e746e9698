"""PCM → fixed-duration frames, and when each Opus frame goes down (pure).

A device's decoder is told one frame duration in its hello reply (60 ms by default); speech is
cut into frames of exactly that duration, the last one padded with silence, so the audio the
device plays lasts ``frames * frame_ms``. Pacing is :class:`gateway.xiaozhi.downlink.Pacing`'s
(the same rules the CHAT downlink player follows): a pre-buffer at once, then one frame per
frame duration, and ``tts stop`` once the device had time to play what it holds.
"""

from __future__ import annotations

from gateway.xiaozhi.downlink import Pacing

SAMPLE_BYTES = 2  # s16le mono
OPUS_RATES = frozenset({8_000, 12_000, 16_000, 24_000, 48_000})
OPUS_FRAME_MS = frozenset({10, 20, 40, 60})  # what one libopus encode call can make


def frame_bytes(rate: int, frame_ms: int) -> int:
    """Bytes of one frame of s16le mono PCM at ``rate`` Hz (:class:`ValueError` if Opus can't)."""
    if rate not in OPUS_RATES:
        raise ValueError(f"not an Opus sample rate: {rate}")
    if frame_ms not in OPUS_FRAME_MS:
        raise ValueError(f"not an Opus frame duration: {frame_ms} ms")
    return rate * frame_ms // 1000 * SAMPLE_BYTES


def chunk(pcm: bytes, rate: int, frame_ms: int) -> list[bytes]:
    """``pcm`` cut into whole frames, the last one padded with silence (an odd byte dropped)."""
    size = frame_bytes(rate, frame_ms)
    pcm = pcm[: len(pcm) - len(pcm) % SAMPLE_BYTES]
    padded = pcm + bytes(-len(pcm) % size)
    return [padded[i : i + size] for i in range(0, len(padded), size)]


def duration_ms(frames: int, frame_ms: int) -> int:
    """How long ``frames`` frames play on the device."""
    return frames * frame_ms


def schedule(frames: int, pacing: Pacing, start: float = 0.0) -> tuple[list[float], float]:
    """(send time of each frame, time ``tts stop`` may follow), from ``start`` (seconds)."""
    return [pacing.due(i, start) for i in range(frames)], pacing.stop_due(frames, start)
