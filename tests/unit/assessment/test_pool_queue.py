"""Queue policy of the pool: drop-oldest on overflow, last utterance per step, metrics.

Jobs are submitted before the pool runs, so the queue state is deterministic; the real
process backend (with a cheap test engine) then drains it.
"""

from __future__ import annotations

from gateway.assessment.jobs import AsrJob, AsrKey, AsrResult
from gateway.assessment.procslot import ProcessBackend
from tests.unit.assessment.engines import CountEngine
from tests.unit.assessment.harness import job, running_pool


async def test_overflow_drops_oldest_and_reports_it() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), queue_limit=3, start=False
    ) as c:
        for step in range(5):
            c.pool.submit(job(step, b"\x00\x00" * (step + 1)))
        assert c.pool.depth == 3
        assert [j.key.step_index for j in c.dropped] == [0, 1]
        assert c.figure('snlpgw_asr_jobs_dropped_total{reason="overflow"}') == 2
        assert c.figure("snlpgw_asr_queue_depth") == 3


async def test_a_full_queue_sheds_a_catch_up_job_before_any_live_one() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), queue_limit=3, start=False
    ) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        c.pool.submit(AsrJob(AsrKey("old", 4, "catch-up"), b"\x00\x00", late=True))
        c.pool.submit(job(1, b"\x00\x00"))
        c.pool.submit(job(2, b"\x00\x00"))  # full: the catch-up job goes, not step 0
        assert [(j.key.instance_id, j.late) for j in c.dropped] == [("old", True)]
        c.pool.submit(job(3, b"\x00\x00"))  # no catch-up job left: the oldest live one
        assert [j.key.step_index for j in c.dropped] == [4, 0]
        assert c.pool.depth == 3


async def test_a_catch_up_job_never_takes_a_live_jobs_place() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), queue_limit=2, start=False
    ) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        c.pool.submit(job(1, b"\x00\x00"))
        full = AsrJob(AsrKey("old", 4, "catch-up"), b"\x00\x00", late=True)
        c.pool.submit(full)  # the queue is full: the catch-up job itself goes
        same_step = AsrJob(AsrKey("inst-1", 1, "catch-up"), b"\x00\x00", late=True)
        c.pool.withdraw(AsrKey("inst-1", 0, "u1"))  # room now, but step 1 is queued live
        c.pool.submit(same_step)  # it does not replace the live job of its step
        assert c.dropped == [full, same_step]
        assert c.pool.depth == 1
        late = AsrJob(AsrKey("inst-1", 7, "catch-up"), b"\x00\x00", late=True)
        c.pool.submit(late)
        c.pool.submit(job(7, b"\x00\x00", "u2"))  # a live answer of its step replaces it
        assert c.dropped == [full, same_step, late]  # and its waiter hears it
        assert c.pool.depth == 2


async def test_room_for_a_catch_up_job_counts_the_queued_ones_and_no_live_one() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), workers=2, queue_limit=4, start=False
    ) as c:
        assert c.pool.room_for_late
        c.pool.submit(AsrJob(AsrKey("old", 1, "catch-up"), b"\x00\x00", late=True))
        assert c.pool.room_for_late  # one queued catch-up job, two slots
        c.pool.submit(AsrJob(AsrKey("old", 2, "catch-up"), b"\x00\x00", late=True))
        assert not c.pool.room_for_late  # one per slot
        c.pool.withdraw(AsrKey("old", 2, "catch-up"))
        c.pool.submit(job(0, b"\x00\x00"))
        assert not c.pool.room_for_late  # a live job is waiting


async def test_newer_utterance_supersedes_queued_one_for_same_step() -> None:
    async with running_pool(
        ProcessBackend(CountEngine, name="count"), queue_limit=3, start=False
    ) as c:
        c.pool.submit(job(0, b"\x00\x00", "first"))
        c.pool.submit(job(1, b"\x00\x00"))
        c.pool.submit(job(0, b"\x00\x00" * 7, "second"))
        assert c.pool.depth == 2
        assert c.dropped == []
        assert c.figure('snlpgw_asr_jobs_dropped_total{reason="superseded"}') == 1


async def test_queued_jobs_complete_in_order_with_keys() -> None:
    async with running_pool(ProcessBackend(CountEngine, name="count"), queue_limit=4) as c:
        c.pool.submit(job(0, b"\x00\x00" * 3, "a"))
        c.pool.submit(job(1, b"\x00\x00" * 5, "b"))
        c.pool.submit(job(0, b"\x00\x00" * 4, "c"))  # supersedes "a" if still queued
        got = [await c.next(), await c.next()]
        if got[0].key.utterance_id == "a":  # "a" was already running: both delivered
            got.append(await c.next())
        last_for_step0 = [o for o in got if o.key.step_index == 0][-1]
        assert last_for_step0.key.utterance_id == "c"
        assert isinstance(last_for_step0.result, AsrResult)
        assert last_for_step0.result.text == "4 samples"
        assert c.figure("snlpgw_asr_jobs_done_total") == len(got)
        assert c.figure("snlpgw_asr_queue_depth") == 0
