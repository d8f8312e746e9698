"""Real speech for tests: espeak-ng synthesis (the gateway's own, ``gateway.chat.espeak``) at 16 kHz
mono 16-bit, with known boundaries.

``synthesize`` returns trimmed PCM (leading/trailing silence removed by an energy gate), so a
``compose``d timeline knows exactly where each utterance starts and ends.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.chat.espeak import RATE, SAMPLE_BYTES, require_tools, silence, trim
from gateway.chat.espeak import synthesize as _synthesize

__all__ = ["RATE", "SAMPLE_BYTES", "Timeline", "Utterance", "compose", "frames", "silence",
           "synthesize", "trim"]  # fmt: skip


@functools.lru_cache(maxsize=128)
def synthesize(text: str, *, voice: str = "en-us", wpm: int = 150) -> bytes:
    """Speak ``text``; trimmed 16 kHz mono s16le PCM (cached: tests reuse sentences)."""
    require_tools()
    return _synthesize(text, voice=voice, wpm=wpm)


@dataclass(frozen=True)
class Utterance:
    text: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Timeline:
    pcm: bytes
    utterances: tuple[Utterance, ...]

    @property
    def duration_ms(self) -> float:
        return len(self.pcm) / SAMPLE_BYTES / RATE * 1000


def compose(parts: Sequence[str | int]) -> Timeline:
    """Build a timeline: ``str`` items are spoken, ``int`` items are silences in ms."""
    chunks: list[bytes] = []
    utterances: list[Utterance] = []
    pos = 0
    for part in parts:
        pcm = silence(part) if isinstance(part, int) else synthesize(part)
        if isinstance(part, str):
            start = pos / SAMPLE_BYTES / RATE * 1000
            end = (pos + len(pcm)) / SAMPLE_BYTES / RATE * 1000
            utterances.append(Utterance(part, start, end))
        chunks.append(pcm)
        pos += len(pcm)
    return Timeline(b"".join(chunks), tuple(utterances))


def frames(pcm: bytes, frame_ms: int = 60) -> list[bytes]:
    """Split PCM into whole frames, zero-padding the last one."""
    size = RATE * frame_ms // 1000 * SAMPLE_BYTES
    padded = pcm + b"\x00" * (-len(pcm) % size)
    return [padded[i : i + size] for i in range(0, len(padded), size)]
