"""The engine interfaces: synchronous engines run in worker processes, async ones on the loop.

Both take 16 kHz s16le mono PCM plus the lesson's sentences as hints (and, when the task knows
it, the answer's grammar: pocketsphinx decodes with it, the HTTP engine cannot carry one and
ignores it), and return an
``AsrResult`` or a typed ``AsrFailure``; an exception escaping an engine is turned into
``AsrFailure(ENGINE_ERROR)`` by the slot running it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.assessment.jobs import AnswerGrammar, AsrFailure, AsrJob, AsrResult


class SyncEngine(Protocol):
    """CPU-bound engine (pocketsphinx); constructed and called inside a worker process."""

    name: str

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure: ...


class AsyncEngine(Protocol):
    """I/O-bound engine (HTTP); called on the event loop, no process needed."""

    name: str

    async def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure: ...

    async def aclose(self) -> None: ...


class Slot(Protocol):
    """Runs one job at a time. An unhealthy slot is closed and replaced by the pool."""

    @property
    def healthy(self) -> bool: ...

    async def run(self, job: AsrJob, timeout_s: float) -> AsrResult | AsrFailure: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Opens slots for the pool; ``open_slot`` raises ``EngineUnavailable`` if it cannot."""

    name: str

    async def open_slot(self) -> Slot: ...

    async def aclose(self) -> None: ...


class EngineUnavailable(Exception):
    def __init__(self, engine: str, detail: str) -> None:
        super().__init__(f"{engine}: {detail}")
        self.engine = engine
        self.detail = detail
