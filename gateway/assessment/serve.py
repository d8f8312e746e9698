"""``snlpgw asr-serve``: the embedded engine (pocketsphinx) as an OpenAI-compatible ASR service,
so assessment scales beyond the gateway's host.

``POST /v1/audio/transcriptions`` (multipart): ``file`` = a WAV, 16 kHz mono s16le (what the
gateway's HTTP engine sends); ``model`` (accepted, any value); ``response_format`` = ``json``
(default, ``{"text": ...}``) or ``text``; ``prompt`` = the lesson's sentences, one a line, used
as the engine's language-model prior exactly as the embedded engine uses them (at most
:data:`MAX_HINTS` lines of :data:`MAX_HINT_CHARS`). ``GET /healthz``, ``GET /metrics``.

Inside: the gateway's own bounded ASR pool (``pool.py``) over N worker processes
(``procslot.py``), one job per worker at a time. The queue holds ``queue_limit`` requests; when
it is full the oldest waiting request is answered 503 (``overloaded``, ``Retry-After: 1``),
which the gateway's HTTP engine retries. Errors use OpenAI's shape
``{"error": {"message", "type", "code"}}``: 400 bad audio or form, 413 too large, 500 engine
failure, 503 overloaded.

Scaling out: the service is stateless (no session, no disk), so several instances — on this
host with more workers, or on other hosts — stand behind any HTTP load balancer; the gateway's
``asr.http_url`` names the balancer, and ``asr.workers`` sets how many requests it keeps in
flight. Audio and transcripts are never logged.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import wave
from collections.abc import Callable

from aiohttp import web

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.engine import Backend
from gateway.assessment.jobs import (
    SAMPLE_BYTES,
    SAMPLE_RATE,
    AsrFailure,
    AsrJob,
    AsrKey,
    AsrOutcome,
    FailureReason,
)
from gateway.assessment.pool import AsrPool
from gateway.metrics import Metrics

log = logging.getLogger(__name__)

PATH = "/v1/audio/transcriptions"
MAX_AUDIO_S = 60  # one answer of a child; longer is refused (413)
MAX_BODY = MAX_AUDIO_S * SAMPLE_RATE * SAMPLE_BYTES + 64 * 1024
MAX_HINTS = 64
MAX_HINT_CHARS = 300


class BadAsrRequest(ValueError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def pcm_from_wav(data: bytes) -> bytes:
    """The samples of a 16 kHz mono 16-bit PCM WAV; raises :class:`BadAsrRequest`."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            shape = (w.getnchannels(), w.getsampwidth(), w.getframerate())
            if shape != (1, SAMPLE_BYTES, SAMPLE_RATE):
                raise BadAsrRequest(
                    400,
                    "unsupported_audio",
                    f"expected 16 kHz mono 16-bit PCM WAV, got {shape[2]} Hz, "
                    f"{shape[0]} channel(s), {shape[1] * 8}-bit",
                )
            return w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise BadAsrRequest(400, "bad_audio", f"not a readable WAV file: {exc}") from None


def hints_from_prompt(prompt: str | None) -> tuple[str, ...]:
    """The lesson's sentences from ``prompt`` (one a line, blanks skipped, bounded)."""
    if not prompt:
        return ()
    lines = (line.strip()[:MAX_HINT_CHARS] for line in prompt.splitlines())
    return tuple(itertools.islice((line for line in lines if line), MAX_HINTS))


def _error(status: int, code: str, message: str, **headers: str) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "code": code}}
    return web.json_response(body, status=status, headers=headers or None)


class AsrService:
    """The app and its pool; :meth:`run` serves until cancelled."""

    def __init__(
        self,
        *,
        backend: Backend,
        workers: int,
        queue_limit: int,
        job_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self._waiting: dict[AsrKey, asyncio.Future[AsrOutcome | None]] = {}
        self._ids = itertools.count()
        self.pool = AsrPool(
            backend=backend,
            metrics=AsrMetrics(self.metrics),
            on_result=self._on_result,
            on_drop=self._on_drop,
            workers=workers,
            queue_limit=queue_limit,
            job_timeout_s=job_timeout_s,
        )
        self._m_requests = self.metrics.counter(
            "asr_serve_requests", "Transcription requests answered", ["status"]
        )
        self.app = web.Application(client_max_size=MAX_BODY)
        self.app.router.add_post(PATH, self.transcribe)
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/metrics", self.exposition)
        self.port: int | None = None

    # -- pool callbacks ---------------------------------------------------------------------

    def _settle(self, key: AsrKey, value: AsrOutcome | None) -> None:
        waiter = self._waiting.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _on_result(self, outcome: AsrOutcome) -> None:
        self._settle(outcome.key, outcome)

    def _on_drop(self, job: AsrJob) -> None:
        self._settle(job.key, None)

    # -- routes -------------------------------------------------------------------------------

    async def transcribe(self, request: web.Request) -> web.Response:
        response = await self._transcribe(request)
        self._m_requests.labels(str(response.status)).inc()
        return response

    async def _read_form(self, request: web.Request) -> tuple[bytes, tuple[str, ...], str]:
        """(pcm, hints, response format) from the form; raises :class:`BadAsrRequest`."""
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            raise BadAsrRequest(413, "too_large", f"at most {MAX_AUDIO_S} s of audio") from None
        except ValueError as exc:
            raise BadAsrRequest(400, "bad_form", f"expected multipart/form-data: {exc}") from None
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            raise BadAsrRequest(400, "missing_file", "the form has no 'file' upload")
        fmt = str(form.get("response_format") or "json")
        if fmt not in ("json", "text"):
            raise BadAsrRequest(400, "bad_response_format", "response_format: json or text")
        prompt = form.get("prompt")
        pcm = pcm_from_wav(upload.file.read(MAX_BODY))
        return pcm, hints_from_prompt(prompt if isinstance(prompt, str) else None), fmt

    async def _transcribe(self, request: web.Request) -> web.Response:
        try:
            pcm, hints, fmt = await self._read_form(request)
        except BadAsrRequest as exc:
            return _error(exc.status, exc.code, str(exc))
        key = AsrKey(f"req-{next(self._ids)}", 0, "u")
        waiter: asyncio.Future[AsrOutcome | None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        self.pool.submit(AsrJob(key, pcm, hints))
        try:
            outcome = await waiter
        finally:
            self._waiting.pop(key, None)  # a client gone: its late result is dropped
        if outcome is None:
            return _error(503, "overloaded", "transcription queue full", **{"Retry-After": "1"})
        result = outcome.result
        if isinstance(result, AsrFailure):
            status = 400 if result.reason is FailureReason.BAD_AUDIO else 500
            return _error(status, result.reason.value, result.detail or result.reason.value)
        if fmt == "text":
            return web.Response(text=result.text)
        return web.json_response({"text": result.text})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "queue_depth": self.pool.depth})

    async def exposition(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    # -- serving ------------------------------------------------------------------------------

    async def run(
        self, host: str, port: int, *, on_ready: Callable[[int], None] | None = None
    ) -> None:
        """Serve on ``host:port`` (0: any free port, told to ``on_ready``) until cancelled."""
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            addresses = runner.addresses
            self.port = int(addresses[0][1]) if addresses else port
            log.info("asr-serve listening on %s:%d", host, self.port)
            if on_ready is not None:
                on_ready(self.port)
            await self.pool.run()
        finally:
            await runner.cleanup()
