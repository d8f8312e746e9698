"""The voice-session v1 cues as Opus frames the gateway sends down the UDP channel.

Made once at start-up, no audio shipped: sine tones (numpy, 16 kHz mono, 8 ms raised-cosine
edges so they do not click) encoded like the embedded engine's speech (:func:`encode_opus`,
60 ms frames; Opus decodes them at whatever rate the device's decoder was told). Short, as the
spec asks (§5: the segment-end cue ≤ 200 ms):

=============  ===================================  ===============================
cue            tones (Hz, ms)                       moment (voice-session v1)
=============  ===================================  ===============================
START          880/120                              end of the speech before listening (§1.3, §1.6)
SEGMENT_END    1320/90                              the segment ended (§1.4, §5)
TIMEOUT        660/120, pause 60, 440/180           silence after the start cue, then standby (§4)
FAILURE        330/150, pause 60, 330/150           the engine failed, then standby (§3.3)
=============  ===================================  ===============================
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gateway.chat.engine import FRAME_MS, RATE, encode_opus
from gateway.chat.voice_events import CueKind

Cues = Mapping[CueKind, tuple[bytes, ...]]

TONES: dict[CueKind, tuple[tuple[float, int], ...]] = {  # (Hz, ms); 0 Hz: a pause
    CueKind.START: ((880.0, 120),),
    CueKind.SEGMENT_END: ((1320.0, 90),),
    CueKind.TIMEOUT: ((660.0, 120), (0.0, 60), (440.0, 180)),
    CueKind.FAILURE: ((330.0, 150), (0.0, 60), (330.0, 150)),
}
LEVEL = 0.3  # of full scale: audible over a small speaker, not harsh
_EDGE_MS = 8


def tone_pcm(parts: tuple[tuple[float, int], ...]) -> bytes:
    """16 kHz mono s16le: each (Hz, ms) a faded sine, 0 Hz silence."""
    chunks = []
    edge = RATE * _EDGE_MS // 1000
    for hz, ms in parts:
        n = RATE * ms // 1000
        if hz <= 0:
            chunks.append(np.zeros(n))
            continue
        wave = np.sin(2 * np.pi * hz * np.arange(n) / RATE)
        ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(edge) / edge)
        wave[:edge] *= ramp
        wave[-edge:] *= ramp[::-1]
        chunks.append(wave)
    samples = np.concatenate(chunks) * LEVEL * 32767
    return samples.astype("<i2").tobytes()


def build_cues() -> dict[CueKind, tuple[bytes, ...]]:
    """Every cue as 60 ms Opus frames (a few ms of CPU; done once)."""
    return {kind: tuple(encode_opus(tone_pcm(parts))) for kind, parts in TONES.items()}


def cue_ms(frames: tuple[bytes, ...]) -> int:
    return len(frames) * FRAME_MS
