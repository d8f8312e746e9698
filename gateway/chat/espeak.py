"""Speech made with espeak-ng + sox at run time, 16 kHz mono s16le PCM (no audio is shipped).

The embedded CHAT engine speaks its replies with it (:mod:`gateway.chat.engine`); the dev stack
(demo, tests, benchmarks) makes its teacher clips and children's readings with it too.
"""

from __future__ import annotations

import shutil
import subprocess

RATE = 16_000
SAMPLE_BYTES = 2
_GATE = 300  # |amplitude| that counts as sound when trimming espeak's own padding
_GATE_FRAME = 160  # 10 ms


class SpeechToolsMissingError(RuntimeError):
    pass


def require_tools() -> None:
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        raise SpeechToolsMissingError(f"speech needs {', '.join(missing)} (run `make setup`)")


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
