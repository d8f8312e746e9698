"""Engines built for tests; module-level so spawned worker processes can import them."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event, Semaphore

from gateway.assessment.jobs import AnswerGrammar, AsrFailure, AsrResult, audio_ms


class CountEngine:
    """Transcribes PCM as ``"<n> samples"`` (deterministic, cheap)."""

    name = "count"

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        return AsrResult(f"{len(pcm) // 2} samples", self.name, audio_ms(pcm), 0.1)


class TrapEngine(CountEngine):
    """Misbehaves on magic PCM: b"EXIT" kills its process, b"HANG" never returns, b"RAIS"
    raises; anything else is counted normally."""

    name = "trap"

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        if pcm == b"EXIT":
            os._exit(3)
        if pcm == b"HANG":
            while True:
                time.sleep(3600)
        if pcm == b"RAIS":
            raise RuntimeError("engine bug")
        return super().transcribe(pcm, hints, grammar)


class SlowEngine(CountEngine):
    """Takes up to ``seconds`` per job: sets ``started``, waits for ``release`` or the time."""

    name = "slow"

    def __init__(self, started: Event, release: Event, seconds: float = 5.0) -> None:
        self._started = started
        self._release = release
        self._seconds = seconds

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        self._started.set()
        self._release.wait(self._seconds)
        return super().transcribe(pcm, hints, grammar)


class BrokenEngine(CountEngine):
    name = "broken"

    def __init__(self) -> None:
        raise RuntimeError("model files missing")


class GateEngine(CountEngine):
    """Releases ``started`` (a semaphore) as a job begins, then waits for ``release``."""

    name = "gate"

    def __init__(self, started: Semaphore, release: Event) -> None:
        self._started = started
        self._release = release

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        self._started.release()
        self._release.wait(60)
        return super().transcribe(pcm, hints, grammar)
