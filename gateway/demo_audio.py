"""Speech for the demo, made at run time with espeak-ng + sox (no audio is shipped).

The teacher's clips are the lesson sentences read slowly, padded with a little silence and
written as WAV files where the board simulator looks for its media (it measures each clip's
duration from the WAV header). The child's readings are trimmed PCM streamed as uplink audio.
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

RATE = 16_000
SAMPLE_BYTES = 2
_GATE = 300  # |amplitude| that counts as sound when trimming espeak's own padding
_GATE_FRAME = 160  # 10 ms


class SpeechToolsMissingError(RuntimeError):
    pass


def require_tools() -> None:
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        raise SpeechToolsMissingError(f"the demo needs {', '.join(missing)} (run `make setup`)")


def synthesize(text: str, *, wpm: int = 150, voice: str = "en-us") -> bytes:
    """``text`` spoken by espeak-ng as 16 kHz mono s16le PCM, leading/trailing silence trimmed."""
    wav = subprocess.run(  # noqa: S603 - fixed argv, no shell
        ["espeak-ng", "-v", voice, "-s", str(wpm), "--stdout", text],  # noqa: S607 - system tool
        check=True,
        capture_output=True,
    ).stdout
    to_raw = ["-r", str(RATE), "-c", "1", "-b", "16", "-e", "signed", "-t", "raw", "-"]
    raw = subprocess.run(  # noqa: S603 - fixed argv, no shell
        ["sox", "-t", "wav", "-", *to_raw],  # noqa: S607 - system tool
        input=wav,
        check=True,
        capture_output=True,
    ).stdout
    return trim(raw)


def trim(pcm: bytes) -> bytes:
    """Cut leading and trailing 10 ms frames whose peak stays under the gate."""
    frames = len(pcm) // (_GATE_FRAME * SAMPLE_BYTES)

    def loud(i: int) -> bool:
        chunk = memoryview(pcm)[i * _GATE_FRAME * SAMPLE_BYTES : (i + 1) * _GATE_FRAME * 2]
        return max(abs(s) for s in chunk.cast("h")) > _GATE

    first = next((i for i in range(frames) if loud(i)), None)
    if first is None:
        return b""
    last = next(i for i in range(frames - 1, first - 1, -1) if loud(i))
    return pcm[first * _GATE_FRAME * SAMPLE_BYTES : (last + 1) * _GATE_FRAME * SAMPLE_BYTES]


def silence(ms: int) -> bytes:
    return bytes(RATE * ms // 1000 * SAMPLE_BYTES)


def duration_ms(pcm: bytes) -> int:
    return round(len(pcm) / SAMPLE_BYTES / RATE * 1000)


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
