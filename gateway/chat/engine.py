"""The embedded engine's voice: text → espeak-ng speech → 16 kHz mono 60 ms Opus frames.

Runs off the event loop (``asyncio.to_thread``): espeak-ng and sox are subprocesses and libopus
encoding is CPU work. The frames match what the gateway announced in its hello reply
(opus/16000/1/60), so the device's decoder takes them as they are.
"""

from __future__ import annotations

import asyncio

import opuslib

from gateway.chat.espeak import synthesize

RATE = 16_000
FRAME_MS = 60
FRAME_SAMPLES = RATE * FRAME_MS // 1000
_FRAME_BYTES = FRAME_SAMPLES * 2


def encode_opus(pcm: bytes) -> list[bytes]:
    """16 kHz mono s16le → 60 ms Opus packets (the last frame padded with silence)."""
    encoder = opuslib.Encoder(RATE, 1, opuslib.APPLICATION_VOIP)
    padded = pcm + bytes(-len(pcm) % _FRAME_BYTES)
    return [
        encoder.encode(padded[i : i + _FRAME_BYTES], FRAME_SAMPLES)
        for i in range(0, len(padded), _FRAME_BYTES)
    ]


def speak_frames(text: str, voice: str = "en-us") -> list[bytes]:
    return encode_opus(synthesize(text, voice=voice))


async def tts_frames(text: str, voice: str = "en-us") -> list[bytes]:
    """``text`` as Opus frames, synthesised and encoded in a worker thread."""
    return await asyncio.to_thread(speak_frames, text, voice)
