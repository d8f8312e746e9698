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
from gateway.chat.replies import PHRASES, Reply, reply_to


class Transcriber(Protocol):
    """The assessment path's side door into its ASR pool."""

    def transcribe(
        self, key: AsrKey, pcm: bytes, hints: tuple[str, ...], on_text: OnTranscript
    ) -> bool: ...


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

    async def answer(self, dev: str, turn: int, pcm: bytes) -> Answer:
        heard = await self.transcribe(dev, turn, pcm)
        reply = reply_to(heard, self._now())
        return Answer(heard, reply, await self._speak(reply.text, self._voice))

    async def transcribe(self, dev: str, turn: int, pcm: bytes) -> str | None:
        if self._asr is None or not pcm:
            return None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()

        def deliver(text: str | None) -> None:
            if not done.done():
                done.set_result(text)

        key = AsrKey(f"chat:{dev}", turn, f"chat:{next(self._ids)}")
        if not self._asr.transcribe(key, pcm, PHRASES, deliver):
            return None
        try:
            async with asyncio.timeout(self._timeout):
                return await done
        except TimeoutError:
            return None
