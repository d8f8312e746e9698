"""Withdrawing jobs nobody waits for: ``max_wait_ms`` (dropped at dequeue once passed) and
``withdraw(key)`` (the task stopped); post-assessment jobs (no ``max_wait_ms``) always run.

The pool's clock is a test clock moved by hand: jobs are submitted, the clock moves past their
wait, and only then does the slot (a real worker process) dequeue them.
"""

from __future__ import annotations

from gateway.assessment.jobs import AsrJob, AsrKey, AsrResult
from gateway.assessment.procslot import ProcessBackend
from tests.unit.assessment.engines import CountEngine
from tests.unit.assessment.harness import running_pool

PCM = b"\x00\x00" * 5


class HandClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def inline(step: int, wait_ms: float | None, utterance: str = "u1") -> AsrJob:
    return AsrJob(AsrKey("inst-1", step, utterance), PCM, max_wait_ms=wait_ms)


async def test_a_job_queued_past_its_wait_is_dropped_at_dequeue_and_counted() -> None:
    clock = HandClock()
    async with running_pool(ProcessBackend(CountEngine, name="count"), clock=clock) as c:
        c.pool.submit(inline(0, 4_000.0))
        c.pool.submit(inline(1, None))  # post-assessment: never withdrawn
        c.pool.submit(inline(2, 4_000.0))
        c.pool.submit(inline(3, 9_000.0))  # still within its wait
        clock.now += 5.0
        done = [await c.next(), await c.next()]
        assert [o.key.step_index for o in done] == [1, 3]
        assert all(isinstance(o.result, AsrResult) for o in done)
        assert [j.key.step_index for j in c.withdrawn] == [0, 2]
        assert c.figure('snlpgw_asr_jobs_dropped_total{reason="expired"}') == 2
        assert c.figure("snlpgw_asr_jobs_done_total") == 2
        assert c.dropped == []  # not the overflow hook: no alarm for these
        assert c.figure("snlpgw_asr_queue_depth") == 0


async def test_withdraw_removes_only_the_queued_job_with_that_key() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), queue_limit=4, start=False
    ) as c:
        c.pool.submit(inline(0, 4_000.0, "a"))
        c.pool.submit(inline(1, None))
        assert not c.pool.withdraw(AsrKey("inst-1", 0, "older"))  # another utterance
        assert not c.pool.withdraw(AsrKey("inst-1", 7, "a"))  # nothing queued there
        assert c.pool.withdraw(AsrKey("inst-1", 0, "a"))
        assert not c.pool.withdraw(AsrKey("inst-1", 0, "a"))  # already gone
        assert c.pool.depth == 1
        assert c.figure('snlpgw_asr_jobs_dropped_total{reason="withdrawn"}') == 1
        assert c.figure("snlpgw_asr_queue_depth") == 1
        assert c.withdrawn == []  # the caller withdrew it: it knows


async def test_a_withdrawn_job_is_never_transcribed() -> None:
    async with running_pool(ProcessBackend(CountEngine, name="count")) as c:
        c.pool.submit(inline(0, 4_000.0, "gone"))
        c.pool.submit(inline(1, 4_000.0, "kept"))
        assert c.pool.withdraw(AsrKey("inst-1", 0, "gone"))
        out = await c.next()
        assert out.key.utterance_id == "kept"
        assert c.figure("snlpgw_asr_jobs_done_total") == 1
