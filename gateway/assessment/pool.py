"""The ASR pool: a bounded job queue on the loop, drained by N slots (worker processes or
async engines). The loop only ever enqueues; results come back through a callback on the loop.

Queue policy (SPEC §6): bounded at ``queue_limit``; overflow drops the *oldest* queued job
(counted, ``on_drop`` called so the service can raise an ops alarm); a newer utterance for a
step replaces that step's queued one (the last utterance counts). A job already running is not
superseded: both outcomes are delivered and the consumer keeps the newest ``utterance_id``.

Withdrawal (inline ASR, nobody waits any more): a job with ``max_wait_ms`` still queued that
long after its submit is dropped when a slot dequeues it (``expired``; ``on_withdrawn`` is
told), and ``withdraw(key)`` removes a queued job at once (``withdrawn``: the task stopped; its
caller knows). Neither is transcribed; both are counted in ``asr_jobs_dropped{reason}``, and
neither raises the ops alarm (nobody lost an answer they still wait for). Jobs without
``max_wait_ms`` (post-assessment) are never withdrawn at dequeue.
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
from gateway.assessment.jobs import (
    AsrFailure,
    AsrJob,
    AsrKey,
    AsrOutcome,
    AsrResult,
    FailureReason,
)
from gateway.backoff import BackoffPolicy

log = logging.getLogger(__name__)

OnResult = Callable[[AsrOutcome], None]
OnDrop = Callable[[AsrJob], None]

# The drop reasons (the label set of asr_jobs_dropped is these four, nothing else).
DROP_SUPERSEDED = "superseded"
DROP_OVERFLOW = "overflow"
DROP_EXPIRED = "expired"  # still queued at its max_wait_ms: the consumer has given up
DROP_WITHDRAWN = "withdrawn"  # withdrawn by its consumer (the task stopped)

# A slot whose engine cannot start waits 1 s, 2 s, 4 s … up to 30 s before trying again.
_RESTART_BACKOFF = BackoffPolicy(1.0, 30.0)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _QueuedJob:
    job: AsrJob
    submitted: float  # monotonic seconds
    expires: float | None  # monotonic seconds; None: never withdrawn at dequeue


class AsrPool:
    def __init__(
        self,
        *,
        backend: Backend,
        metrics: AsrMetrics,
        on_result: OnResult,
        on_drop: OnDrop | None = None,
        on_withdrawn: OnDrop | None = None,
        workers: int = 1,
        queue_limit: int = 32,
        job_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self._metrics = metrics
        self._on_result = on_result
        self._on_drop = on_drop
        self._on_withdrawn = on_withdrawn
        self._workers = workers
        self._limit = queue_limit
        self._timeout = job_timeout_s
        self._clock = clock
        # Bounded by queue_limit; overflow drops the oldest entry; keyed by step (supersede).
        self._queue: OrderedDict[tuple[str, int], _QueuedJob] = OrderedDict()
        self._work = asyncio.Event()
        self._running = 0  # jobs a slot is transcribing now

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def room_for_late(self) -> bool:
        """No live job queued and a slot for one more catch-up job: submitted now, it starts as
        soon as the catch-up jobs just queued are taken (they are few: one per slot at most)."""
        late = sum(1 for q in self._queue.values() if q.job.late)
        return late == len(self._queue) and self._running + late < self._workers

    def submit(self, job: AsrJob) -> None:
        """Enqueue without blocking or raising; never awaits anything. A catch-up job
        (``job.late``) never takes a live job's place: it is dropped itself when the queue is
        full or holds its step, and is the first to go when a live job needs room."""
        step = job.key.step
        queued = self._queue.get(step)
        if job.late and (queued is not None or len(self._queue) >= self._limit):
            self._drop(job, DROP_OVERFLOW if queued is None else DROP_SUPERSEDED)
            return
        if queued is not None:
            del self._queue[step]
            self._metrics.dropped.labels(DROP_SUPERSEDED).inc()
            if queued.job.late and self._on_drop is not None:  # its waiter must hear it
                self._safe(self._on_drop, queued.job)
        elif len(self._queue) >= self._limit:
            # a catch-up job goes before any live one (at most one per worker is queued)
            late = next((k for k, q in self._queue.items() if q.job.late), None)
            oldest = (
                self._queue.pop(late) if late is not None else self._queue.popitem(last=False)[1]
            )
            self._drop(oldest.job, DROP_OVERFLOW)
        now = self._clock()
        wait = job.max_wait_ms
        expires = None if wait is None else now + wait / 1000.0
        self._queue[step] = _QueuedJob(job, now, expires)
        self._metrics.queued.inc()
        self._metrics.depth.set(len(self._queue))
        self._work.set()

    def _drop(self, job: AsrJob, reason: str) -> None:
        self._metrics.dropped.labels(reason).inc()
        log.warning("ASR queue (%d): dropped job %s (%s)", self._limit, job.key, reason)
        if self._on_drop is not None:
            self._safe(self._on_drop, job)

    def withdraw(self, key: AsrKey) -> bool:
        """Remove ``key``'s job if it is still queued (never a running one): True if removed."""
        queued = self._queue.get(key.step)
        if queued is None or queued.job.key != key:
            return False
        del self._queue[key.step]
        self._metrics.dropped.labels(DROP_WITHDRAWN).inc()
        self._metrics.depth.set(len(self._queue))
        return True

    async def _take(self) -> _QueuedJob:
        while True:
            while not self._queue:
                self._work.clear()
                await self._work.wait()
            _, pending = self._queue.popitem(last=False)
            self._metrics.depth.set(len(self._queue))
            if pending.expires is None or self._clock() < pending.expires:
                return pending
            self._metrics.dropped.labels(DROP_EXPIRED).inc()
            if self._on_withdrawn is not None:
                self._safe(self._on_withdrawn, pending.job)

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
                self._running += 1
                try:
                    result = await self._run_job(slot, pending.job)
                finally:
                    self._running -= 1
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
