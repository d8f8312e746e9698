"""Catch-up assessment: the answers shed under load are assessed when the ASR has time.

Under load the gateway sheds answers instead of assessing them (``asr_saturated``,
``queue_full``, ``voice_overload``: :mod:`gateway.assessment.path`); each such step keeps its
reason and, with the archive on, the child's answer as Ogg Opus. Every
``asr.catch_up_interval_s`` this component looks whether the ASR is idle (nothing queued, a
worker free) and the gateway's loop is calm (no voice overload). If so it assesses those steps,
the newest lesson first (what a parent opens first), through the same bounded pool, at most one
per ASR worker at a time, started only while nothing live is queued: a live answer waits at
most for the catch-up jobs already running (one job's time per worker), is never queued behind
one, and a queue that fills sheds catch-up jobs before any live answer (``AsrJob.late``). The
round stops starting jobs as soon as the ASR or the loop is busy again.

Each result is the step's own assessment, written late: an UPDATE of a step that still exists
and is still unassessed (an erased device stays erased; a step assessed meanwhile keeps its
numbers), then published on the device's assessment topic like a live one. The step keeps
``assessment_shed``: why its numbers came late. What fails for the answer itself (an
unreadable file, an engine error on it) is not tried again by this process (it remembers the
last 256; ``snlpgw reassess`` can); an ASR failure of any kind ends the round, and one that is
the engine's state (unavailable, timeout, connection) leaves the step for a later round.
In a cluster each gateway catches up only the devices it owns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Final

from gateway.archive import BlobMissing
from gateway.assessment.assessor import DEFAULT_METHODS, assess
from gateway.assessment.jobs import AsrFailure, AsrKey, FailureReason
from gateway.assessment.path import AssessmentPath, Late
from gateway.assessment.reassess import decode_answer
from gateway.metrics import Metrics
from gateway.settings import AsrSettings
from gateway.store import Store, StoredMetric
from gateway.store.assessments import (
    ShedStep,
    record_late_assessment,
    shed_devices,
    shed_steps,
)
from gateway.store.errors import StoreError

log = logging.getLogger(__name__)

BATCH: Final = 16  # steps read per round (the round usually ends sooner: the ASR gets busy)
DEVICES_READ: Final = 1_000  # devices with shed answers read per round (then those we own)
DEVICES_ASKED: Final = 200  # of which at most this many per query
TRIED_KEPT: Final = 256  # failed steps remembered (not tried again by this process)

ASSESSED: Final = "assessed"  # written and published
YIELDED: Final = "yielded"  # the queue shed it for a live answer: tried again next round
FAILED: Final = "failed"  # the ASR failed or took too long: not tried again
MISSING: Final = "missing"  # the audio went meanwhile (retention, forget)
UNDECODABLE: Final = "undecodable"  # the archived file is not Ogg Opus
GONE: Final = "gone"  # the step was erased or assessed meanwhile: nothing written
UNAVAILABLE: Final = "unavailable"  # the audio or record store failed: next round again

HALTING: Final = frozenset({YIELDED, FAILED, UNAVAILABLE})  # a round starts no job after these

# The engine's state, not the answer's: the step is tried again in a later round.
TRANSIENT: Final = frozenset(
    {
        FailureReason.ENGINE_UNAVAILABLE,
        FailureReason.TIMEOUT,
        FailureReason.CONNECTION,
        FailureReason.HTTP_STATUS,
        FailureReason.WORKER_CRASHED,
    }
)

ReadAudio = Callable[[str], Awaitable[bytes]]  # audio id → Ogg Opus (BlobMissing if not kept)
PlanOf = Callable[[str, str, str], tuple[tuple[str, ...], tuple[str, ...]]]  # methods, hints


class CatchUp:
    name = "assessment.catch_up"

    def __init__(
        self,
        *,
        path: AssessmentPath,
        store: Store,
        read_audio: ReadAudio,
        plan: PlanOf,
        owns: Callable[[str], bool],
        calm: Callable[[], bool],
        settings: AsrSettings,
        metrics: Metrics,
    ) -> None:
        self._path = path
        self._store = store
        self._read = read_audio
        self._plan = plan
        self._owns = owns
        self._calm = calm
        self._settings = settings
        self._tried: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._outcomes = metrics.counter(
            "assessment_catch_up",
            "Shed steps taken up again while the ASR was idle, by outcome (assessed: written "
            "and published late; yielded: made way for a live answer)",
            ["outcome"],
        )

    @property
    def enabled(self) -> bool:
        return self._settings.catch_up_interval_s > 0 and self._settings.engine != "none"

    async def run(self) -> None:
        if not self.enabled:
            await asyncio.Event().wait()  # nothing to catch up: stays until the service stops
        while True:
            await asyncio.sleep(self._settings.catch_up_interval_s)
            try:
                await self.catch_up()
            except StoreError as exc:  # the store is down: counted there; next round
                log.warning("catch-up assessment: %s", exc)
            except Exception:  # a bug here must not stop the gateway: logged, next round
                log.exception("catch-up assessment round failed")

    async def catch_up(self) -> int:
        """One round: assess shed answers while the ASR is idle and the loop calm, at most one
        per ASR worker at a time; the number assessed."""
        if not self._ready():
            return 0
        waiting = deque(await self._candidates())
        outcomes: list[str] = []
        async with asyncio.TaskGroup() as tg:
            running: set[asyncio.Task[str]] = set()
            while True:
                # no new job once a live answer came first or an engine or a store failed
                halted = not self._ready() or not HALTING.isdisjoint(outcomes)
                while waiting and len(running) < self._settings.workers and not halted:
                    step = waiting.popleft()
                    running.add(tg.create_task(self._counted(step), name="asr.catch-up.one"))
                    halted = not self._ready()
                if not running:
                    break
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                outcomes += [task.result() for task in done]
        return outcomes.count(ASSESSED)

    async def _counted(self, step: ShedStep) -> str:
        try:
            outcome = await self._one(step)
        except StoreError as exc:  # the record store is down: counted there; next round
            log.warning("catch-up: %s", exc)
            outcome = UNAVAILABLE
        self._outcomes.labels(outcome).inc()  # with the write and publish, in one turn
        return outcome

    def _ready(self) -> bool:
        return self._path.idle and self._calm()

    async def _candidates(self) -> list[ShedStep]:
        devices = await self._store.call(lambda db: shed_devices(db, DEVICES_READ))
        owned = [d for d in devices if self._owns(d)][:DEVICES_ASKED]
        limit = BATCH + len(self._tried)
        steps = await self._store.call(lambda db: shed_steps(db, owned, limit))
        fresh = [s for s in steps if (s.instance_id, s.step_index) not in self._tried]
        return fresh[:BATCH]

    async def _one(self, step: ShedStep) -> str:
        pcm = await self._load(step)
        if isinstance(pcm, str):
            return pcm
        methods, hints = self._methods_and_hints(step)
        key = AsrKey(step.instance_id, step.step_index, f"catch-up:{step.audio_id}")
        done: asyncio.Future[Late] = asyncio.get_running_loop().create_future()

        def finish(result: Late) -> None:
            if not done.done():
                done.set_result(result)

        self._path.transcribe_late(key, pcm, hints, finish)
        try:
            async with asyncio.timeout(2 * self._settings.job_timeout_s + 10.0):
                result = await done
        except TimeoutError:
            result = AsrFailure(FailureReason.TIMEOUT, "no result from the pool")
        if result is None:
            return YIELDED
        if isinstance(result, AsrFailure):
            log.warning(
                "catch-up: ASR failed for %s step %d: %s",
                step.instance_id,
                step.step_index,
                result.reason,
            )
            if result.reason not in TRANSIENT:  # this answer's failure, not the engine's state
                self._remember(step)
            return FAILED
        return await self._record(step, key, result.text, methods)

    async def _record(
        self, step: ShedStep, key: AsrKey, text: str, methods: tuple[str, ...]
    ) -> str:
        metrics = assess(step.expected_text, text, methods)
        assessed_at = time.time_ns() // 1_000_000
        written = await self._store.call(
            functools.partial(
                record_late_assessment,
                instance_id=step.instance_id,
                step_index=step.step_index,
                asr_text=text,
                metrics=[StoredMetric(m.method, m.value) for m in metrics],
                assessed_at=assessed_at,
            )
        )
        if not written:
            return GONE
        self._path.publish_late(
            device=step.device,
            key=key,
            prompt_text=step.prompt_text,
            expected_text=step.expected_text,
            text=text,
            metrics=metrics,
            assessed_at=assessed_at,
        )
        return ASSESSED

    async def _load(self, step: ShedStep) -> bytes | str:
        """The answer's PCM, or why there is none (remembered: not tried again)."""
        try:
            return await asyncio.to_thread(decode_answer, await self._read(step.audio_id))
        except BlobMissing:
            self._remember(step)
            return MISSING
        except ValueError as exc:
            log.warning("catch-up: %s step %d: %s", step.instance_id, step.step_index, exc)
            self._remember(step)
            return UNDECODABLE
        except Exception as exc:  # the audio store is down: counted, tried next round
            log.warning("catch-up: audio store: %s", type(exc).__name__)
            return UNAVAILABLE

    def _methods_and_hints(self, step: ShedStep) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The lesson's methods and texts from the catalog; a lesson gone from it (or since
        turned off) is assessed with the default method, its own sentence as the hint."""
        methods: tuple[str, ...] = ()
        hints: tuple[str, ...] = ()
        if step.app_id and step.task_id and step.lesson_id:
            methods, hints = self._plan(step.app_id, step.task_id, step.lesson_id)
        if not hints and step.expected_text:
            hints = (step.expected_text,)
        return methods or DEFAULT_METHODS, hints

    def _remember(self, step: ShedStep) -> None:
        self._tried[(step.instance_id, step.step_index)] = None
        while len(self._tried) > TRIED_KEPT:
            self._tried.popitem(last=False)
