"""The embedded (offline) engine: one segment's audio → ASR → a rule reply → speech frames.

ASR goes through the assessment path's bounded pool (the same engine and worker processes as
lesson assessment, :meth:`AssessmentPath.transcribe`), so CHAT adds no second ASR stack and its
jobs obey the same overflow policy. The reply comes from :mod:`gateway.chat.replies`; speech
from espeak-ng, encoded to Opus off the loop (:mod:`gateway.chat.engine`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gateway.assessment.jobs import AsrKey, OnTranscript
from gateway.chat.engine import tts_frames
from gateway.chat.replies import PHRASES, Reply, greeting, reply_to


class Transcriber(Protocol):
    """The assessment path's side door into its ASR pool."""

    def transcribe(
        self, key: AsrKey, pcm: bytes, hints: tuple[str, ...], on_text: OnTranscript
    ) -> bool: ...


class EngineError(Exception):
    """The engine could not answer (``reason``: a metric label): the device hears the failure
    cue at once and goes to standby (voice-session v1 §3.3)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class Answer:
    heard: str | None
    reply: Reply
    frames: list[bytes]


class EmbeddedEngine:
    def __init__(
        self,
        *,
        asr: Transcriber | None,
        voice: str = "en-us",
        asr_timeout_s: float = 15.0,
        speak: Callable[[str, str], Awaitable[list[bytes]]] = tts_frames,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self._asr = asr
        self._voice = voice
        self._timeout = asr_timeout_s
        self._speak = speak
        self._now = now
        self._ids = itertools.count(1)
        self._greeting: tuple[str, list[bytes]] | None = None  # said the same every time

    async def greeting(self) -> tuple[str, list[bytes]]:
        """The greeting's text and speech (synthesised once, then kept)."""
        if self._greeting is None:
            text = greeting(self._voice)
            self._greeting = (text, await self._speak(text, self._voice))
        return self._greeting

    async def answer(self, dev: str, turn: int, pcm: bytes) -> Answer:
        heard = await self.transcribe(dev, turn, pcm)
        reply = reply_to(heard, self._now())
        return Answer(heard, reply, await self._speak(reply.text, self._voice))

    async def transcribe(self, dev: str, turn: int, pcm: bytes) -> str | None:
        """The words heard (None: nothing recognised); raises :class:`EngineError` when the ASR
        pool refused the job (full) or gave no result in time."""
        if self._asr is None or not pcm:
            return None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()

        def deliver(text: str | None) -> None:
            if not done.done():
                done.set_result(text)

        key = AsrKey(f"chat:{dev}", turn, f"chat:{next(self._ids)}")
        if not self._asr.transcribe(key, pcm, PHRASES, deliver):
            raise EngineError("asr_refused")
        try:
            async with asyncio.timeout(self._timeout):
                return await done
        except TimeoutError:
            raise EngineError("asr_timeout") from None
