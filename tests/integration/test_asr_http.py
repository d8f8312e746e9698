"""The HTTP engine against a real local OpenAI-compatible server (tests/support/asr_server.py):
real speech through a pocketsphinx-backed server, retries on 5xx/timeouts, none on 4xx."""

from __future__ import annotations

import socket

import pytest

from gateway.assessment.http_engine import AsyncBackend, HttpAsrEngine
from gateway.assessment.jobs import AsrFailure, AsrResult, FailureReason
from gateway.assessment.sphinx import PocketsphinxEngine
from tests.support.asr_server import AsrServer, ScriptedReply
from tests.support.speech import synthesize
from tests.unit.assessment.harness import job, running_pool

pytestmark = pytest.mark.integration

PCM = b"\x01\x00" * 1600  # 100 ms


def _fixed(_pcm: bytes) -> str:
    return " fixed text "


def _engine(url: str, *, timeout_s: float = 5.0, retries: int = 2) -> HttpAsrEngine:
    return HttpAsrEngine(
        url=url, model="whisper-1", timeout_s=timeout_s, retries=retries, backoff_s=0.01
    )


async def test_real_speech_through_a_pocketsphinx_backed_server_via_the_pool() -> None:
    engine = PocketsphinxEngine()
    lesson = ("Good morning.", "How are you?", "I like apples.", "The cat is sleeping.")
    async with (
        AsrServer(lambda pcm: engine.transcribe(pcm, lesson).text) as server,  # type: ignore[union-attr]
        running_pool(AsyncBackend(_engine(server.url))) as c,
    ):
        c.pool.submit(job(0, synthesize("I like apples.")))
        out = await c.next()
    assert isinstance(out.result, AsrResult)
    assert out.result.text == "i like apples"
    assert out.result.engine == "http"
    [request] = server.requests
    assert (request.model, request.response_format) == ("whisper-1", "json")
    assert request.pcm == synthesize("I like apples.")


async def test_5xx_is_retried_then_succeeds() -> None:
    async with AsrServer(_fixed, [ScriptedReply(503), ScriptedReply(500)]) as server:
        engine = _engine(server.url, retries=2)
        result = await engine.transcribe(PCM)
        await engine.aclose()
    assert isinstance(result, AsrResult)
    assert result.text == "fixed text"
    assert len(server.requests) == 3


async def test_5xx_beyond_the_retry_budget_is_a_typed_failure() -> None:
    async with AsrServer(_fixed, [ScriptedReply(502)] * 5) as server:
        engine = _engine(server.url, retries=2)
        result = await engine.transcribe(PCM)
        await engine.aclose()
    assert result == AsrFailure(FailureReason.HTTP_STATUS, "HTTP 502")
    assert len(server.requests) == 3


async def test_4xx_is_not_retried() -> None:
    async with AsrServer(_fixed, [ScriptedReply(400)]) as server:
        engine = _engine(server.url, retries=3)
        result = await engine.transcribe(PCM)
        await engine.aclose()
    assert isinstance(result, AsrFailure)
    assert result.reason is FailureReason.HTTP_STATUS
    assert result.detail.startswith("HTTP 400")
    assert len(server.requests) == 1


async def test_attempt_timeout_is_retried_then_succeeds() -> None:
    async with AsrServer(_fixed, [ScriptedReply(200, delay_s=3.0)]) as server:
        engine = _engine(server.url, timeout_s=0.5, retries=1)
        result = await engine.transcribe(PCM)
        await engine.aclose()
    assert isinstance(result, AsrResult)
    assert result.text == "fixed text"
    assert len(server.requests) == 2


async def test_every_attempt_timing_out_is_a_timeout_failure() -> None:
    async with AsrServer(_fixed, [ScriptedReply(200, delay_s=3.0)] * 2) as server:
        engine = _engine(server.url, timeout_s=0.5, retries=1)
        result = await engine.transcribe(PCM)
        await engine.aclose()
    assert isinstance(result, AsrFailure)
    assert result.reason is FailureReason.TIMEOUT
    assert len(server.requests) == 2


async def test_connection_refused_is_retried_then_typed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nobody listens there
    engine = _engine(f"http://127.0.0.1:{port}/v1/audio/transcriptions", retries=1)
    result = await engine.transcribe(PCM)
    await engine.aclose()
    assert isinstance(result, AsrFailure)
    assert result.reason is FailureReason.CONNECTION


async def test_pool_job_timeout_bounds_the_whole_http_job() -> None:
    async with (
        AsrServer(_fixed, [ScriptedReply(200, delay_s=3.0)]) as server,
        running_pool(AsyncBackend(_engine(server.url, timeout_s=10)), job_timeout_s=0.5) as c,
    ):
        c.pool.submit(job(0, PCM))
        c.pool.submit(job(1, PCM))
        slow, after = await c.next(), await c.next()
    assert isinstance(slow.result, AsrFailure)
    assert slow.result.reason is FailureReason.TIMEOUT
    assert isinstance(after.result, AsrResult)
    assert after.result.text == "fixed text"


async def test_bad_audio_is_rejected_before_any_request() -> None:
    engine = _engine("http://127.0.0.1:9/v1/audio/transcriptions")
    result = await engine.transcribe(b"\x00\x00\x00")
    await engine.aclose()
    assert isinstance(result, AsrFailure)
    assert result.reason is FailureReason.BAD_AUDIO
