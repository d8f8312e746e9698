"""Pool lifecycle: parallel workers, shutdown with a job in flight, no leaked processes,
settings-driven construction, and queue invariants under arbitrary submit sequences."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.factory import build_pool
from gateway.assessment.http_engine import AsyncBackend
from gateway.assessment.jobs import AsrResult
from gateway.assessment.pool import AsrPool
from gateway.assessment.procslot import ProcessBackend
from gateway.metrics import Metrics
from gateway.settings import AsrSettings
from tests.unit.assessment.engines import CountEngine, GateEngine, SlowEngine
from tests.unit.assessment.harness import job, running_pool


def _asr_children() -> list[mp.process.BaseProcess]:
    return [p for p in mp.active_children() if p.name.startswith("asr-")]


async def test_two_workers_run_jobs_in_parallel() -> None:
    ctx = mp.get_context("spawn")
    started, release = ctx.Semaphore(0), ctx.Event()
    backend = ProcessBackend(functools.partial(GateEngine, started, release), name="gate")
    async with running_pool(backend, workers=2) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        c.pool.submit(job(1, b"\x00\x00"))
        # both engines are inside a job before either is released: they run at the same time
        async with asyncio.timeout(60):
            assert await asyncio.to_thread(started.acquire, True, 60)
            assert await asyncio.to_thread(started.acquire, True, 60)
        release.set()
        outs = {(await c.next()).key.step_index, (await c.next()).key.step_index}
    assert outs == {0, 1}


async def test_shutdown_with_a_job_in_flight_leaves_no_process() -> None:
    ctx = mp.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    backend = ProcessBackend(functools.partial(SlowEngine, started, release, 60.0), name="slow")
    async with running_pool(backend, workers=2) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        async with asyncio.timeout(60):
            assert await asyncio.to_thread(started.wait, 60)
        assert len(_asr_children()) == 2
    # running_pool cancelled the pool while the engine was still busy
    assert _asr_children() == []
    assert c.outcomes.empty()


async def test_clean_exit_reaps_every_worker() -> None:
    async with running_pool(ProcessBackend(CountEngine, name="count"), workers=2) as c:
        c.pool.submit(job(0, b"\x00\x00"))
        assert isinstance((await c.next()).result, AsrResult)
    assert _asr_children() == []


def test_settings_choose_the_engine() -> None:
    metrics = Metrics()
    assert build_pool(AsrSettings(engine="none"), metrics=metrics, on_result=print) is None
    sphinx = build_pool(AsrSettings(), metrics=metrics, on_result=print)
    assert sphinx is not None
    assert isinstance(sphinx.backend, ProcessBackend)
    assert sphinx.backend.name == "pocketsphinx"
    http = build_pool(AsrSettings(engine="http"), metrics=Metrics(), on_result=print)
    assert http is not None
    assert isinstance(http.backend, AsyncBackend)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 5),
    submits=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=30),
)
def test_queue_invariants(limit: int, submits: list[tuple[int, int]]) -> None:
    dropped: list[object] = []
    metrics = Metrics()
    pool = AsrPool(
        backend=ProcessBackend(CountEngine, name="never-started"),
        metrics=AsrMetrics(metrics),
        on_result=print,
        on_drop=dropped.append,
        queue_limit=limit,
    )
    latest: dict[int, str] = {}
    for n, (step, _) in enumerate(submits):
        pool.submit(job(step, b"", f"u{n}"))
        latest[step] = f"u{n}"
        assert pool.depth <= limit
    queued = [p.job.key for p in pool._queue.values()]  # white-box: the queue is the subject
    # The queue holds, oldest first, the newest utterance of the most recently submitted steps.
    recency = list(dict.fromkeys(reversed([step for step, _ in submits])))[::-1]
    expect_steps = recency[-limit:] if recency else []
    assert [k.step_index for k in queued] == expect_steps
    assert all(k.utterance_id == latest[k.step_index] for k in queued)
    # every submit is queued, superseded later, or dropped by overflow (and reported)
    snap = metrics.snapshot()
    superseded = snap.get('snlpgw_asr_jobs_dropped_total{reason="superseded"}', 0)
    overflow = snap.get('snlpgw_asr_jobs_dropped_total{reason="overflow"}', 0)
    assert len(submits) == len(queued) + superseded + len(dropped)
    assert overflow == len(dropped)
