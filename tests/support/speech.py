"""Real speech for tests: espeak-ng synthesis at 16 kHz mono 16-bit, with known boundaries.

``synthesize`` returns trimmed PCM (leading/trailing silence removed by an energy gate), so a
``compose``d timeline knows exactly where each utterance starts and ends.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RATE = 16_000
SAMPLE_BYTES = 2
_GATE = 300  # |amplitude| that counts as sound when trimming espeak's own padding
_GATE_FRAME = 160  # 10 ms


def require_tools() -> None:
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"speech fixtures need {', '.join(missing)} (make setup installs them)")


@functools.lru_cache(maxsize=128)
def synthesize(text: str, *, voice: str = "en-us", wpm: int = 150) -> bytes:
    """Speak ``text``; return trimmed 16 kHz mono s16le PCM."""
    require_tools()
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(wpm), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    raw = subprocess.run(
        [
            "sox",
            "-t",
            "wav",
            "-",
            "-r",
            str(RATE),
            "-c",
            "1",
            "-b",
            "16",
            "-e",
            "signed",
            "-t",
            "raw",
            "-",
        ],
        input=wav,
        check=True,
        capture_output=True,
    ).stdout
    return trim(raw)


def trim(pcm: bytes) -> bytes:
    samples = np.frombuffer(pcm, dtype="<i2")
    frames = len(samples) // _GATE_FRAME
    loud = [
        i
        for i in range(frames)
        if np.abs(samples[i * _GATE_FRAME : (i + 1) * _GATE_FRAME].astype(np.int32)).max() > _GATE
    ]
    if not loud:
        return b""
    start, end = loud[0] * _GATE_FRAME, (loud[-1] + 1) * _GATE_FRAME
    return samples[start:end].tobytes()


def silence(ms: int) -> bytes:
    return b"\x00\x00" * (RATE * ms // 1000)


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
