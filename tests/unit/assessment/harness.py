"""Run a real ``AsrPool`` inside a TaskGroup for one test and collect its outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.engine import Backend
from gateway.assessment.jobs import AsrJob, AsrKey, AsrOutcome
from gateway.assessment.pool import AsrPool
from gateway.metrics import Metrics


class Collected:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.outcomes: asyncio.Queue[AsrOutcome] = asyncio.Queue()  # unbounded: test only
        self.dropped: list[AsrJob] = []
        self.withdrawn: list[AsrJob] = []  # expired in the queue (on_withdrawn)
        self.pool: AsrPool

    async def next(self, timeout_s: float = 60.0) -> AsrOutcome:
        async with asyncio.timeout(timeout_s):
            return await self.outcomes.get()

    def figure(self, name: str) -> float:
        return self.metrics.snapshot().get(name, 0.0)


def job(step: int, pcm: bytes, utterance: str = "u1", hints: tuple[str, ...] = ()) -> AsrJob:
    return AsrJob(AsrKey("inst-1", step, utterance), pcm, hints)


@contextlib.asynccontextmanager
async def running_pool(
    backend: Backend,
    *,
    workers: int = 1,
    queue_limit: int = 8,
    job_timeout_s: float = 30.0,
    start: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Collected]:
    metrics = Metrics()
    c = Collected(metrics)
    c.pool = AsrPool(
        backend=backend,
        metrics=AsrMetrics(metrics),
        on_result=c.outcomes.put_nowait,
        on_drop=c.dropped.append,
        on_withdrawn=c.withdrawn.append,
        clock=clock,
        workers=workers,
        queue_limit=queue_limit,
        job_timeout_s=job_timeout_s,
    )
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(c.pool.run(), name="test.asr_pool") if start else None
        try:
            yield c
        finally:
            if task is not None:
                task.cancel()
