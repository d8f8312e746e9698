"""The HTTP engine: an OpenAI-compatible ``POST /v1/audio/transcriptions`` server.

Multipart ``file`` (WAV), ``model``, ``response_format=json`` and, when the lesson gives them,
``prompt`` = its sentences one a line (OpenAI's prompt field; ``snlpgw asr-serve`` uses them as
the embedded engine does) → ``{"text": ...}``. The contract has no field for an answer grammar
(:class:`~gateway.assessment.jobs.AnswerGrammar`): a job's grammar is ignored here and its hints
are sent as for any other job. Each attempt
has its own timeout; 5xx, timeouts and connection errors are retried up to ``retries`` times
with a short doubling back-off; 4xx and malformed replies are not retried. Async I/O on the
loop: no worker process needed.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
import wave
from collections.abc import Sequence

import aiohttp

from gateway.assessment.jobs import (
    SAMPLE_BYTES,
    SAMPLE_RATE,
    AnswerGrammar,
    AsrFailure,
    AsrJob,
    AsrResult,
    FailureReason,
    audio_ms,
    check_pcm,
)
from gateway.backoff import BackoffPolicy

log = logging.getLogger(__name__)


def wav_bytes(pcm: bytes) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(SAMPLE_BYTES)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)
    return buf.getvalue()


class _RetryableAsrAttempt(Exception):
    def __init__(self, failure: AsrFailure) -> None:
        super().__init__(failure.detail)
        self.failure = failure


class HttpAsrEngine:
    name = "http"

    def __init__(
        self,
        *,
        url: str,
        model: str,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.2,
    ) -> None:
        self._url = url
        self._model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._retries = retries
        self._backoff = BackoffPolicy(backoff_s)  # doubling, no cap: ``retries`` bounds it
        self._session: aiohttp.ClientSession | None = None

    async def _attempt(
        self, session: aiohttp.ClientSession, wav: bytes, prompt: str
    ) -> AsrFailure | str:
        form = aiohttp.FormData()
        form.add_field("file", wav, filename="utterance.wav", content_type="audio/wav")
        form.add_field("model", self._model)
        form.add_field("response_format", "json")
        if prompt:  # the lesson's sentences, one a line: a prior, never the answer
            form.add_field("prompt", prompt)
        try:
            async with session.post(self._url, data=form, timeout=self._timeout) as resp:
                if resp.status >= 500:
                    raise _RetryableAsrAttempt(
                        AsrFailure(FailureReason.HTTP_STATUS, f"HTTP {resp.status}")
                    )
                if resp.status >= 400:
                    body = (await resp.text())[:200]
                    return AsrFailure(FailureReason.HTTP_STATUS, f"HTTP {resp.status}: {body}")
                data = await resp.json(content_type=None)
        except TimeoutError as exc:
            raise _RetryableAsrAttempt(
                AsrFailure(FailureReason.TIMEOUT, "HTTP attempt timed out")
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            raise _RetryableAsrAttempt(
                AsrFailure(FailureReason.CONNECTION, repr(exc)[:200])
            ) from exc
        except (aiohttp.ContentTypeError, ValueError) as exc:
            return AsrFailure(FailureReason.BAD_RESPONSE, repr(exc)[:200])
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str):
            return AsrFailure(FailureReason.BAD_RESPONSE, "reply has no string 'text'")
        return text.strip()

    async def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        """``grammar`` is ignored: the OpenAI-compatible contract cannot carry one."""
        bad = check_pcm(pcm)
        if bad is not None:
            return bad
        if self._session is None:
            self._session = aiohttp.ClientSession()
        start = time.perf_counter()
        wav = wav_bytes(pcm)
        prompt = "\n".join(h.replace("\n", " ") for h in hints)
        attempt = 0
        while True:
            try:
                got = await self._attempt(self._session, wav, prompt)
            except _RetryableAsrAttempt as exc:
                if attempt >= self._retries:
                    return exc.failure
                log.info("ASR HTTP attempt %d failed (%s), retrying", attempt + 1, exc)
                attempt += 1
                await asyncio.sleep(self._backoff.delay(attempt))
                continue
            if isinstance(got, AsrFailure):
                return got
            return AsrResult(got, self.name, audio_ms(pcm), (time.perf_counter() - start) * 1000)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class AsyncSlot:
    """Runs an async engine on the loop under the job timeout; never unhealthy."""

    def __init__(self, engine: HttpAsrEngine) -> None:
        self._engine = engine

    @property
    def healthy(self) -> bool:
        return True

    async def run(self, job: AsrJob, timeout_s: float) -> AsrResult | AsrFailure:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._engine.transcribe(job.pcm, job.hints, job.grammar)
        except TimeoutError:
            return AsrFailure(FailureReason.TIMEOUT, f"no result within {timeout_s:g} s")
        except Exception as exc:  # an engine bug is a typed failure, not a dead pool
            return AsrFailure(FailureReason.ENGINE_ERROR, repr(exc)[:300])

    def close(self) -> None:
        return None


class AsyncBackend:
    def __init__(self, engine: HttpAsrEngine) -> None:
        self.engine = engine
        self.name = engine.name

    async def open_slot(self) -> AsyncSlot:
        return AsyncSlot(self.engine)

    async def aclose(self) -> None:
        await self.engine.aclose()
