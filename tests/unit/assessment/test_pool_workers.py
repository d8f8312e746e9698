"""Worker processes: crashes, hangs, engine bugs and failed starts become typed failures; the
pool replaces the worker and later jobs still complete; a slow job never blocks the loop."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp

from gateway.assessment.jobs import AsrFailure, AsrResult, FailureReason
from gateway.assessment.procslot import ProcessBackend
from tests.unit.assessment.engines import BrokenEngine, SlowEngine, TrapEngine
from tests.unit.assessment.harness import job, running_pool


async def test_crashing_worker_is_replaced_and_later_jobs_complete() -> None:
    async with running_pool(ProcessBackend(TrapEngine, name="trap")) as c:
        c.pool.submit(job(0, b"EXIT"))
        c.pool.submit(job(1, b"\x00\x00" * 2))
        crashed, after = await c.next(), await c.next()
        assert crashed.key.step_index == 0
        assert isinstance(crashed.result, AsrFailure)
        assert crashed.result.reason is FailureReason.WORKER_CRASHED
        assert "code 3" in crashed.result.detail
        assert after.result == AsrResult("2 samples", "trap", after.result.audio_ms, 0.1)
        assert c.figure("snlpgw_asr_worker_restarts_total") == 1
        assert c.figure('snlpgw_asr_jobs_failed_total{reason="worker_crashed"}') == 1


async def test_hung_worker_times_out_is_replaced_and_later_jobs_complete() -> None:
    async with running_pool(ProcessBackend(TrapEngine, name="trap"), job_timeout_s=1.0) as c:
        c.pool.submit(job(0, b"HANG"))
        c.pool.submit(job(1, b"\x00\x00" * 3))
        hung, after = await c.next(), await c.next()
        assert isinstance(hung.result, AsrFailure)
        assert hung.result.reason is FailureReason.TIMEOUT
        assert isinstance(after.result, AsrResult)
        assert after.result.text == "3 samples"
        assert c.figure("snlpgw_asr_jobs_timed_out_total") == 1
        assert c.figure("snlpgw_asr_worker_restarts_total") == 1


async def test_engine_exception_is_typed_and_worker_survives() -> None:
    async with running_pool(ProcessBackend(TrapEngine, name="trap")) as c:
        c.pool.submit(job(0, b"RAIS"))
        c.pool.submit(job(1, b"\x00\x00"))
        failed, after = await c.next(), await c.next()
        assert isinstance(failed.result, AsrFailure)
        assert failed.result.reason is FailureReason.ENGINE_ERROR
        assert "engine bug" in failed.result.detail
        assert isinstance(after.result, AsrResult)
        assert c.figure("snlpgw_asr_worker_restarts_total") == 0


async def test_engine_that_cannot_start_fails_jobs_typed() -> None:
    async with running_pool(ProcessBackend(BrokenEngine, name="broken")) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        out = await c.next()
        assert isinstance(out.result, AsrFailure)
        assert out.result.reason is FailureReason.ENGINE_UNAVAILABLE
        assert c.figure("snlpgw_asr_worker_restarts_total") >= 1


async def _ping_pong(rounds: int) -> int:
    """Two coroutines hand a token back and forth: only possible while the loop runs freely."""
    ping: asyncio.Queue[int] = asyncio.Queue(maxsize=1)  # hand-over of one token
    pong: asyncio.Queue[int] = asyncio.Queue(maxsize=1)

    async def echo() -> None:
        for _ in range(rounds):
            await pong.put(await ping.get() + 1)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(echo(), name="test.echo")
        value = 0
        for _ in range(rounds):
            await ping.put(value)
            value = await pong.get()
    return value


async def test_slow_engine_does_not_block_the_loop() -> None:
    ctx = mp.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    factory = functools.partial(SlowEngine, started, release, 5.0)
    async with running_pool(ProcessBackend(factory, name="slow")) as c:
        c.pool.submit(job(0, b"\x00\x00" * 10))
        async with asyncio.timeout(60):
            assert await asyncio.to_thread(started.wait, 60)
        # The job is now inside the engine (it waits for `release`, up to 5 s): the loop
        # still runs other coroutines to completion and accepts more jobs.
        assert await _ping_pong(1000) == 1000
        c.pool.submit(job(1, b"\x00\x00" * 20))
        assert c.outcomes.empty()
        release.set()
        first, second = await c.next(), await c.next()
        assert [first.key.step_index, second.key.step_index] == [0, 1]
        assert isinstance(first.result, AsrResult)
        assert first.result.text == "10 samples"
