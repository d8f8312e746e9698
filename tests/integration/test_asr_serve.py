"""``snlpgw asr-serve`` end to end: the real process with pocketsphinx workers, espeak-ng speech
sent by the gateway's own HTTP engine; and, in-process, a saturated service shedding the oldest
waiting request with a 503 the engine can retry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from devstack.broker import free_port
from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.http_engine import AsyncBackend, HttpAsrEngine, wav_bytes
from gateway.assessment.jobs import AsrJob, AsrKey, AsrOutcome, AsrResult
from gateway.assessment.pool import AsrPool
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.serve import PATH, AsrService
from gateway.metrics import Metrics
from tests.support.asr_engines import SecondEngine
from tests.support.speech import synthesize

ROOT = Path(__file__).parents[2]
START_S = 120.0  # a hang guard: the process imports and spawns workers on 2 busy cores
pytestmark = pytest.mark.timeout(3 * START_S)
LESSON = ("Good morning.", "How are you?", "I am fine, thank you.")


def _wait_listening(proc: subprocess.Popen[str]) -> None:
    """Blocks (in a thread) until the process logs that it listens; its log lines are read,
    never polled for."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if "asr-serve listening" in line:
            return
    raise AssertionError(f"asr-serve exited: {''.join(seen)[-2000:]}")


async def test_asr_serve_process_transcribes_real_speech_through_the_http_engine(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    argv = [sys.executable, "-m", "gateway", "asr-serve", "--port", str(port), "--workers", "2"]
    proc = await asyncio.to_thread(
        subprocess.Popen, argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(START_S):
            await asyncio.to_thread(_wait_listening, proc)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        # The gateway's HTTP engine, driven by the gateway's pool: two requests in flight.
        outcomes: dict[str, AsrOutcome] = {}
        done = asyncio.Event()

        def on_result(outcome: AsrOutcome) -> None:
            outcomes[outcome.key.instance_id] = outcome
            if len(outcomes) == len(LESSON) + 1:
                done.set()

        engine = HttpAsrEngine(url=base + PATH, model="pocketsphinx", timeout_s=60, retries=2)
        pool = AsrPool(
            backend=AsyncBackend(engine), metrics=AsrMetrics(Metrics()), on_result=on_result,
            workers=2, queue_limit=8,
        )  # fmt: skip
        async with asyncio.TaskGroup() as tg:
            running = tg.create_task(pool.run(), name="t.pool")
            for n, sentence in enumerate(LESSON):
                pool.submit(AsrJob(AsrKey(f"s{n}", 0, "u"), synthesize(sentence), LESSON))
            pool.submit(AsrJob(AsrKey("plain", 0, "u"), synthesize("Good morning."), ()))
            async with asyncio.timeout(START_S):
                await done.wait()
            running.cancel()
        for n, sentence in enumerate(LESSON):
            result = outcomes[f"s{n}"].result
            assert isinstance(result, AsrResult), result
            assert result.engine == "http"
            assert result.text == sentence.lower().rstrip(".?").replace(",", "")
        plain = outcomes["plain"].result
        assert isinstance(plain, AsrResult)
        assert plain.text.startswith("good")  # the stock model, no lesson prior: less sure

        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("file", b"RIFF not a wav", filename="x.wav")
            async with http.post(base + PATH, data=form) as resp:
                body = await resp.json()
                assert resp.status == 400
                assert body["error"]["code"] == "bad_audio"
            form = aiohttp.FormData()
            form.add_field("file", wav_bytes(synthesize("How are you?")), filename="x.wav")
            form.add_field("response_format", "text")
            form.add_field("prompt", "\n".join(LESSON))
            async with http.post(base + PATH, data=form) as resp:
                assert (resp.status, await resp.text()) == (200, "how are you")
            async with http.get(f"{base}/metrics") as resp:
                exposition = await resp.text()
                assert 'snlpgw_asr_serve_requests_total{status="200"} 5.0' in exposition
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "good morning" not in err.lower()  # no transcripts in the logs


async def test_a_saturated_service_sheds_the_oldest_waiting_request_with_503() -> None:
    """One worker at 1 s per job, one waiting place, four requests at once: at most two are
    transcribed, every other one is answered 503 (retryable), each counted."""
    service = AsrService(
        backend=ProcessBackend(SecondEngine, name="second"), workers=1, queue_limit=1
    )
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    wav = wav_bytes(synthesize("Good morning."))

    async def post(http: aiohttp.ClientSession, port: int) -> tuple[int, dict[str, object]]:
        form = aiohttp.FormData()
        form.add_field("file", wav, filename="x.wav")
        form.add_field("prompt", "\n".join(LESSON))
        async with http.post(f"http://127.0.0.1:{port}{PATH}", data=form) as resp:
            return resp.status, await resp.json()

    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(
            service.run("127.0.0.1", 0, on_ready=ready.set_result), name="t.serve"
        )
        port = await ready
        async with aiohttp.ClientSession() as http:
            _, warm = await post(http, port)  # the worker is up: the burst meets a busy one
            assert warm == {"text": "good morning"}
            answers = await asyncio.gather(*(post(http, port) for _ in range(4)))
        serving.cancel()
    statuses = sorted(status for status, _ in answers)
    shed = statuses.count(503)
    assert shed >= 1
    assert statuses.count(200) + shed == 4
    for status, body in answers:
        if status == 200:
            assert body == {"text": "good morning"}
        else:
            assert body["error"] == {
                "message": "transcription queue full", "type": "server_error",
                "code": "overloaded",
            }  # fmt: skip
    snapshot = service.metrics.snapshot()
    assert snapshot['snlpgw_asr_jobs_dropped_total{reason="overflow"}'] == shed
    assert snapshot['snlpgw_asr_serve_requests_total{status="503"}'] == shed
