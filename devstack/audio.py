"""The demo's lesson audio: the teacher's clips as WAV files where the board simulator reads
them (it measures each clip's duration from the WAV header); speech from
:mod:`gateway.chat.espeak`."""

from __future__ import annotations

import wave
from pathlib import Path

from gateway.chat.espeak import RATE, SAMPLE_BYTES, silence, synthesize


def write_wav(path: Path, pcm: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(SAMPLE_BYTES)
        out.setframerate(RATE)
        out.writeframes(pcm)


def teacher_clip(text: str, *, pad_ms: int = 400) -> bytes:
    """The teacher reading ``text`` slowly, with ``pad_ms`` of silence on both sides."""
    return silence(pad_ms) + synthesize(text, wpm=130) + silence(pad_ms)
