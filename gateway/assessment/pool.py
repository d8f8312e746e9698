"""The ASR pool: a bounded job queue on the loop, drained by N slots (worker processes or
async engines). The loop only ever enqueues; results come back through a callback on the loop.

Queue policy (SPEC §6): bounded at ``queue_limit``; overflow drops the *oldest* queued job
(counted, ``on_drop`` called so the service can raise an ops alarm); a newer utterance for a
step replaces that step's queued one (the last utterance counts). A job already running is not
superseded: both outcomes are delivered and the consumer keeps the newest ``utterance_id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.engine import Backend, EngineUnavailable, Slot
from gateway.assessment.jobs import AsrFailure, AsrJob, AsrOutcome, AsrResult, FailureReason
from gateway.backoff import BackoffPolicy

log = logging.getLogger(__name__)

OnResult = Callable[[AsrOutcome], None]
OnDrop = Callable[[AsrJob], None]

# A slot whose engine cannot start waits 1 s, 2 s, 4 s … up to 30 s before trying again.
_RESTART_BACKOFF = BackoffPolicy(1.0, 30.0)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _QueuedJob:
    job: AsrJob
    submitted: float  # monotonic seconds


class AsrPool:
    def __init__(
        self,
        *,
        backend: Backend,
        metrics: AsrMetrics,
        on_result: OnResult,
        on_drop: OnDrop | None = None,
        workers: int = 1,
        queue_limit: int = 32,
        job_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self._metrics = metrics
        self._on_result = on_result
        self._on_drop = on_drop
        self._workers = workers
        self._limit = queue_limit
        self._timeout = job_timeout_s
        self._clock = clock
        # Bounded by queue_limit; overflow drops the oldest entry; keyed by step (supersede).
        self._queue: OrderedDict[tuple[str, int], _QueuedJob] = OrderedDict()
        self._work = asyncio.Event()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def submit(self, job: AsrJob) -> None:
        """Enqueue without blocking or raising; never awaits anything."""
        step = job.key.step
        if self._queue.pop(step, None) is not None:
            self._metrics.dropped.labels("superseded").inc()
        elif len(self._queue) >= self._limit:
            _, oldest = self._queue.popitem(last=False)
            self._metrics.dropped.labels("overflow").inc()
            log.warning("ASR queue full (%d): dropped oldest job %s", self._limit, oldest.job.key)
            if self._on_drop is not None:
                self._safe(self._on_drop, oldest.job)
        self._queue[step] = _QueuedJob(job, self._clock())
        self._metrics.queued.inc()
        self._metrics.depth.set(len(self._queue))
        self._work.set()

    async def _take(self) -> _QueuedJob:
        while not self._queue:
            self._work.clear()
            await self._work.wait()
        _, pending = self._queue.popitem(last=False)
        self._metrics.depth.set(len(self._queue))
        return pending

    def _deliver(self, pending: _QueuedJob, result: AsrResult | AsrFailure) -> None:
        outcome = AsrOutcome(pending.job.key, result, (self._clock() - pending.submitted) * 1000)
        self._metrics.outcome(outcome)
        self._safe(self._on_result, outcome)

    @staticmethod
    def _safe(callback: Callable[[_T], None], arg: _T) -> None:
        try:
            callback(arg)
        except Exception:  # a consumer's bug must not stop the pool
            log.exception("ASR pool callback failed")

    async def _open(self, failures: int) -> Slot | None:
        try:
            return await self.backend.open_slot()
        except EngineUnavailable as exc:
            log.warning("ASR engine unavailable (attempt %d): %s", failures + 1, exc.detail)
        except Exception:  # e.g. the OS refusing a process: same as unavailable
            log.exception("ASR worker start failed (attempt %d)", failures + 1)
        return None

    async def _run_job(self, slot: Slot, job: AsrJob) -> AsrResult | AsrFailure:
        try:
            return await slot.run(job, self._timeout)
        except Exception as exc:  # a slot bug: typed failure, slot replaced, pool lives on
            log.exception("ASR slot failed on %s", job.key)
            slot.close()
            return AsrFailure(FailureReason.ENGINE_ERROR, repr(exc)[:300])

    async def _slot_loop(self, index: int) -> None:
        failures = 0
        slot: Slot | None = None
        try:
            while True:
                if slot is None:
                    slot = await self._open(failures)
                    if slot is None:
                        failures += 1
                        self._metrics.restarts.inc()
                        pending = await self._take()
                        self._deliver(
                            pending, AsrFailure(FailureReason.ENGINE_UNAVAILABLE, "cannot start")
                        )
                        await asyncio.sleep(_RESTART_BACKOFF.delay(failures))
                        continue
                    failures = 0
                pending = await self._take()
                result = await self._run_job(slot, pending.job)
                self._deliver(pending, result)
                if not slot.healthy:
                    log.warning("ASR worker %d replaced after %s", index, result)
                    slot.close()
                    slot = None
                    self._metrics.restarts.inc()
        finally:
            if slot is not None:
                slot.close()

    async def run(self) -> None:
        """Own the slots until cancelled; closes every worker and the backend on the way out."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self._workers):
                    tg.create_task(self._slot_loop(i), name=f"asr.{self.backend.name}.slot{i}")
        finally:
            await self.backend.aclose()
