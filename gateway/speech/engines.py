"""Where speech comes from: espeak-ng (offline default), an OpenAI-compatible HTTP TTS server,
or a lesson clip on disk — each turned into mono s16le PCM at the session's output rate (sox
resamples), then into Opus frames (libopus) of the session's frame duration.

All blocking work (subprocesses, libopus) runs in worker threads (``asyncio.to_thread``); the
HTTP engine uses the service's aiohttp session with a timeout. Failures raise
:class:`SynthesisError` whose ``reason`` is a bounded metric label.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import aiohttp
import opuslib

from gateway.chat.espeak import trim
from gateway.speech.frames import chunk

_RAW = ["-c", "1", "-b", "16", "-e", "signed", "-t", "raw", "-"]
_MAX_HTTP_AUDIO = 32 * 1024 * 1024  # a TTS answer larger than this is refused


class SynthesisError(Exception):
    """Speech could not be made (``reason``: a metric label)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TtsEngine(Protocol):
    """Text → PCM (mono s16le at ``rate``)."""

    name: str  # part of the phrase cache key and a metric label

    def voices(self) -> frozenset[str]: ...

    async def pcm(self, http: aiohttp.ClientSession, text: str, voice: str, rate: int) -> bytes: ...


def _run(argv: list[str], data: bytes | None = None, timeout_s: float = 30.0) -> bytes:
    try:
        return subprocess.run(  # noqa: S603 - fixed argv, no shell
            argv, input=data, check=True, capture_output=True, timeout=timeout_s
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SynthesisError(f"{Path(argv[0]).name}_failed") from exc


def to_pcm(audio: bytes, kind: str, rate: int) -> bytes:
    """Encoded audio (``kind``: a sox file type such as wav, mp3) → mono s16le at ``rate``."""
    return _run(["sox", "-t", kind, "-", "-r", str(rate), *_RAW], audio)


def decode_file(path: Path, rate: int) -> bytes:
    """A clip file (WAV, MP3, FLAC, Ogg…, whatever sox reads) → mono s16le at ``rate``."""
    if not path.is_file():
        raise SynthesisError("clip_missing")
    return _run(["sox", str(path), "-r", str(rate), *_RAW])


def encode(pcm: bytes, rate: int, frame_ms: int) -> tuple[bytes, ...]:
    """Mono s16le at ``rate`` → Opus packets of ``frame_ms`` each (the last frame padded)."""
    encoder = opuslib.Encoder(rate, 1, opuslib.APPLICATION_VOIP)
    samples = rate * frame_ms // 1000
    return tuple(encoder.encode(frame, samples) for frame in chunk(pcm, rate, frame_ms))


class EspeakTts:
    """espeak-ng → WAV → sox (resample to ``rate``) → PCM, leading/trailing silence trimmed."""

    name = "espeak"

    def __init__(self, voices: Mapping[str, str], *, wpm: int = 150) -> None:
        self._voices = dict(voices)  # our voice ("en", "zh") → espeak-ng voice
        self._wpm = wpm

    def voices(self) -> frozenset[str]:
        return frozenset(self._voices)

    def synthesize(self, text: str, voice: str, rate: int) -> bytes:
        argv = ["espeak-ng", "-v", self._voices[voice], "-s", str(self._wpm), "--stdout", text]
        return trim(to_pcm(_run(argv), "wav", rate))

    async def pcm(self, http: aiohttp.ClientSession, text: str, voice: str, rate: int) -> bytes:
        return await asyncio.to_thread(self.synthesize, text, voice, rate)


class HttpTts:
    """An OpenAI-compatible ``POST /v1/audio/speech``: JSON ``{model, input, voice,
    response_format: "wav"}`` in, WAV bytes out (resampled by sox to ``rate``)."""

    name = "http"

    def __init__(
        self, *, url: str, model: str, voices: Mapping[str, str], timeout_s: float
    ) -> None:
        self._url = url
        self._model = model
        self._voices = dict(voices)  # our voice → the server's voice name
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def voices(self) -> frozenset[str]:
        return frozenset(self._voices)

    async def pcm(self, http: aiohttp.ClientSession, text: str, voice: str, rate: int) -> bytes:
        body = {
            "model": self._model,
            "input": text,
            "voice": self._voices[voice],
            "response_format": "wav",
        }
        try:
            async with http.post(self._url, json=body, timeout=self._timeout) as response:
                if response.status != 200:
                    raise SynthesisError("http_status")
                if (response.content_length or 0) > _MAX_HTTP_AUDIO:
                    raise SynthesisError("http_too_large")
                audio = await response.content.read(_MAX_HTTP_AUDIO + 1)
        except TimeoutError:
            raise SynthesisError("http_timeout") from None
        except aiohttp.ClientError:
            raise SynthesisError("http_error") from None
        if len(audio) > _MAX_HTTP_AUDIO:
            raise SynthesisError("http_too_large")
        if not audio:
            raise SynthesisError("http_empty")
        return await asyncio.to_thread(to_pcm, audio, "wav", rate)
