"""The assessment side path: utterance → ASR (off the loop) → metrics → store → topic.

Nothing here can delay stepping: ``submit_utterance`` only enqueues into the bounded ASR pool.

Shedding rule: the queue holds ``asr.queue_limit`` jobs, one per step (a newer utterance of a
step replaces its queued one). When it is full, the *oldest* queued job is shed: its step is
stored with ``assessment_shed = "queue_full"`` (no transcript, no metrics), counted in
``assessments_shed_total{reason}`` and alarmed (``asr_dropped``) — never silently lost. The
oldest goes because it has waited longest (its answer is the stalest for anyone listening live)
and because it bounds every kept job's wait to ``queue_limit`` service times.

Decode on demand: a lesson window is decoded only when its answer can be assessed. When it
opens, :meth:`claim_answer` asks whether the ASR can take its answer (the queue's free places
and the ASR's measured throughput over the window's length, :mod:`gateway.assessment.claims`);
a refused window is only captured by the voice channel (its Opus packets archived, no decode,
no VAD) and its step is stored with ``assessment_shed = "asr_saturated"``, counted like the
others. Decoding answers that the full queue would shed anyway was a third of the gateway's
CPU at 1,000 speaking lessons, and it made the lessons' timers late. Results arrive whenever they arrive — after the
next clip started, or after the lesson ended — and are applied to the step they belong to.
Several utterances in one window: only the latest one submitted for a step is applied; an
earlier one finishing later is discarded (counted). A failed job gives ``asr_text = null`` and
``metrics = []``; the assessment is still published so the backend sees the step was handled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway import store as st
from gateway.assessment.assessor import assess
from gateway.assessment.claims import AnswerClaims
from gateway.assessment.engine import Backend
from gateway.assessment.factory import build_pool
from gateway.assessment.jobs import (
    SHED_VOICE_OVERLOAD,
    AnswerGrammar,
    AsrFailure,
    AsrJob,
    AsrKey,
    AsrOutcome,
    AsrResult,
    OnTranscript,
)
from gateway.assessment.pool import AsrPool
from gateway.assessment.similarity import MetricValue
from gateway.service import Context
from gateway.settings import AsrSettings
from gateway.store.alarms import RateLimitedAlarm
from topics import Assessment, Metric, TopicKind, build_topic, encode

log = logging.getLogger(__name__)

SHED_QUEUE_FULL = "queue_full"  # the step's reason when the full queue shed its utterance
PENDING_KEPT = 4_096  # jobs whose context we remember; oldest forgotten (its result dropped)

OnText = Callable[[str, str, int, str], None]  # device, instance_id, step_index, text
# A catch-up job's end: the ASR's result, or None when live work came first.
Late = AsrResult | AsrFailure | None
OnLate = Callable[[Late], None]


@dataclass(frozen=True, slots=True)
class _StepContext:
    device: str
    prompt_text: str | None
    expected_text: str | None
    methods: tuple[str, ...]


class AssessmentPath:
    name = "assessment"

    def __init__(
        self,
        *,
        ctx: Context,
        settings: AsrSettings,
        store: st.Store | None,
        on_text: OnText,
        backend: Backend | None = None,
    ) -> None:
        """``on_text`` hears each recognised text of a step (the task runtime's inbox);
        ``backend`` overrides the engine ``settings.asr.engine`` names (e.g. a test engine)."""
        self._settings = settings
        self._store = store
        self._mqtt = ctx.mqtt
        # One alarm per interval however many are shed (each shed step is counted and stored):
        # at 1,000 lessons an alarm per shed answer was ~250 QoS 1 publishes a second.
        self._alarm_dropped = RateLimitedAlarm("asr_dropped", ctx.ops.alarm, interval_s=10.0)
        self._alarm_overload = RateLimitedAlarm("voice_overload", ctx.ops.alarm, interval_s=10.0)
        self._on_text = on_text
        self._pending: OrderedDict[AsrKey, _StepContext] = OrderedDict()
        self._latest: OrderedDict[tuple[str, int], str] = OrderedDict()
        # Jobs submitted by transcribe() (not assessed); bounded like _pending.
        self._transcripts: OrderedDict[AsrKey, OnTranscript] = OrderedDict()
        # Catch-up jobs (transcribe_late): one per worker at most; bounded like _pending.
        self._late: OrderedDict[AsrKey, OnLate] = OrderedDict()
        # None: ASR is off (settings), every utterance is counted as skipped.
        self._pool: AsrPool | None = build_pool(
            settings,
            metrics=ctx.metrics,
            on_result=self._on_result,
            on_drop=self._on_drop,
            backend=backend,
            on_withdrawn=self._on_withdrawn,
        )
        self._m_published = ctx.metrics.counter("assessments_published", "Assessments published")
        self._m_stale = ctx.metrics.counter(
            "assessments_superseded", "ASR results discarded: a newer utterance of the step exists"
        )
        self._m_shed = ctx.metrics.counter(
            "assessments_shed", "Utterances shed by the full ASR queue (step stored)", ["reason"]
        )
        self._m_skipped = ctx.metrics.counter(
            "assessments_skipped", "Utterances not assessed", ["reason"]
        )
        self._claims = AnswerClaims()  # lesson windows whose answers the ASR can take
        self._m_claims = ctx.metrics.counter(
            "assessment_claims",
            "Lesson windows opened, by whether the ASR queue kept a place for their answer "
            "(refused: captured undecoded, stored asr_saturated)",
            ["outcome"],
        )

    async def run(self) -> None:
        if self._pool is None:
            await asyncio.Event().wait()
        else:
            await self._pool.run()

    # -- UtteranceSink -----------------------------------------------------------------------

    def claim_answer(self, device: str) -> bool:
        """A lesson window of ``device`` opens: True (decode it) while the ASR can take its
        answer (:mod:`gateway.assessment.claims`), which then holds a claim until
        :meth:`release_answer`; True when ASR is off (no queue to shed from)."""
        if self._pool is None:
            return True
        free = self._settings.queue_limit - self._pool.depth
        kept = self._claims.claim(device, time.monotonic(), free)
        self._m_claims.labels("kept" if kept else "refused").inc()
        return kept

    def release_answer(self, device: str) -> None:
        """``device``'s window closed: its answer is in the queue now, or there was none."""
        self._claims.release(device, time.monotonic())

    def submit_utterance(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        utterance_id: str,
        pcm: bytes,
        prompt_text: str | None,
        expected_text: str | None,
        methods: tuple[str, ...],
        hints: tuple[str, ...],
    ) -> None:
        if self._pool is None:
            self._m_skipped.labels("asr_off").inc()
            return
        if not methods:
            self._m_skipped.labels("assessment_disabled").inc()
            return
        key = AsrKey(instance_id, step_index, utterance_id)
        self._pending[key] = _StepContext(device, prompt_text, expected_text, methods)
        self._latest[(instance_id, step_index)] = utterance_id
        while len(self._pending) > PENDING_KEPT:
            self._pending.popitem(last=False)
        while len(self._latest) > PENDING_KEPT:
            self._latest.popitem(last=False)
        self._pool.submit(AsrJob(key, pcm, hints))

    def shed_utterance(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        reason: str,
        methods: tuple[str, ...],
    ) -> None:
        """A step's answer not assessed now (a window captured under voice overload, or one the
        ASR could not have taken): stored with ``assessment_shed = reason``, counted, alarmed."""
        if self._pool is None:
            self._m_skipped.labels("asr_off").inc()
            return
        if not methods:
            self._m_skipped.labels("assessment_disabled").inc()
            return
        self._m_shed.labels(reason).inc()  # a reason of ours, never a device's
        if self._store is not None:
            self._store.submit_step(
                st.StepRecord(
                    instance_id=instance_id, step_index=step_index, assessment_shed=reason
                )
            )
        # voice_overload: the gateway's loop; asr_saturated: ASR capacity, like the queue's sheds.
        alarm = self._alarm_overload if reason == SHED_VOICE_OVERLOAD else self._alarm_dropped
        alarm(device=device, instance_id=instance_id, step_index=step_index)

    def transcribe(
        self,
        key: AsrKey,
        pcm: bytes,
        hints: tuple[str, ...],
        on_text: OnTranscript,
        *,
        grammar: AnswerGrammar | None = None,
        max_wait_ms: float | None = None,
    ) -> bool:
        """ASR only, through the same bounded pool (CHAT's embedded engine): ``on_text`` gets
        the text or ``None``; nothing is assessed, stored or published. False: ASR is off.
        ``max_wait_ms``: a job still queued that long after now is withdrawn (``on_text(None)``)."""
        if self._pool is None:
            return False
        self._transcripts[key] = on_text
        while len(self._transcripts) > PENDING_KEPT:
            self._transcripts.popitem(last=False)
        self._pool.submit(AsrJob(key, pcm, hints, grammar, max_wait_ms))
        return True

    # -- catch-up (gateway/assessment/catchup.py) ----------------------------------------------

    @property
    def idle(self) -> bool:
        """ASR on, no live job queued and a worker free: a catch-up job submitted now delays no
        live one (:attr:`AsrPool.room_for_late`)."""
        return self._pool is not None and self._pool.room_for_late

    def transcribe_late(
        self, key: AsrKey, pcm: bytes, hints: tuple[str, ...], done: OnLate
    ) -> None:
        """An archived answer through the same bounded pool, submitted only while there is
        room for it (:attr:`idle`): ``done`` gets the ASR's result, or None at once if live work
        came first (or ASR is off), or later if a live answer needed its place. Nothing is
        stored or published here."""
        if self._pool is None or not self._pool.room_for_late:
            done(None)  # it waits for another round
            return
        self._late[key] = done
        while len(self._late) > PENDING_KEPT:
            self._late.popitem(last=False)
        self._pool.submit(AsrJob(key, pcm, hints, late=True))

    def publish_late(
        self,
        *,
        device: str,
        key: AsrKey,
        prompt_text: str | None,
        expected_text: str | None,
        text: str | None,
        metrics: list[MetricValue],
        assessed_at: int,
    ) -> None:
        """A step's late assessment on its device's assessment topic, like a live one."""
        context = _StepContext(device, prompt_text, expected_text, ())
        self._publish(context, key, text, metrics, assessed_at)

    # -- InlineAssessment (task DSL) -------------------------------------------------------------

    def transcribe_now(
        self,
        *,
        instance_id: str,
        step_index: int,
        utterance_id: str,
        pcm: bytes,
        hints: tuple[str, ...],
        on_text: OnTranscript,
        grammar: AnswerGrammar | None = None,
        max_wait_ms: float | None = None,
    ) -> bool:
        """Inline assessment's ASR: the same bounded pool; ``on_text`` gets the text or None."""
        key = AsrKey(instance_id, step_index, utterance_id)
        return self.transcribe(key, pcm, hints, on_text, grammar=grammar, max_wait_ms=max_wait_ms)

    def withdraw_inline(self, *, instance_id: str, step_index: int, utterance_id: str) -> None:
        """The task stopped: its job, if still queued, is never transcribed; nothing is
        delivered for it."""
        key = AsrKey(instance_id, step_index, utterance_id)
        if self._transcripts.pop(key, None) is not None and self._pool is not None:
            self._pool.withdraw(key)

    def record_inline(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        prompt_text: str | None,
        expected_text: str | None,
        asr_text: str | None,
        metrics: Mapping[str, float],
    ) -> None:
        """Store and publish an inline-assessed step: its transcript and numbers (the task's
        metrics ``task.*`` and the behaviour signals ``signal.*``)."""
        values = [MetricValue(name, float(value)) for name, value in sorted(metrics.items())]
        assessed_at = time.time_ns() // 1_000_000
        latency = metrics.get("signal.response_latency_ms")
        completed = metrics.get("signal.completed")
        if self._store is not None:
            self._store.submit_step(
                st.StepRecord(
                    instance_id=instance_id,
                    step_index=step_index,
                    prompt_text=prompt_text,
                    expected_text=expected_text,
                    asr_text=asr_text,
                    metrics=tuple(st.StoredMetric(m.method, m.value) for m in values),
                    assessed_at=assessed_at,
                    response_latency_ms=None if latency is None else round(latency),
                    step_completed=None if completed is None else round(completed),
                )
            )
        context = _StepContext(device, prompt_text, expected_text, ())
        key = AsrKey(instance_id, step_index, "")
        self._publish(context, key, asr_text, values, assessed_at)

    # -- pool callbacks (on the loop) ----------------------------------------------------------

    def _on_withdrawn(self, job: AsrJob) -> None:
        """Expired in the queue (the task gave up on it): the waiter hears None, no alarm."""
        transcript = self._transcripts.pop(job.key, None)
        if transcript is not None:
            transcript(None)

    def _on_drop(self, job: AsrJob) -> None:
        late = self._late.pop(job.key, None)
        if late is not None:  # a catch-up job made way: its step stays as it was
            late(None)
            return
        transcript = self._transcripts.pop(job.key, None)
        if transcript is not None:
            transcript(None)
            return
        pending = self._pending.pop(job.key, None)
        if pending is not None:
            self._m_shed.labels(SHED_QUEUE_FULL).inc()
            if self._store is not None:
                self._store.submit_step(
                    st.StepRecord(
                        instance_id=job.key.instance_id,
                        step_index=job.key.step_index,
                        assessment_shed=SHED_QUEUE_FULL,
                    )
                )
        self._alarm_dropped(
            device=pending.device if pending else None,
            instance_id=job.key.instance_id,
            step_index=job.key.step_index,
        )

    def _on_result(self, outcome: AsrOutcome) -> None:
        self._claims.completed(time.monotonic())
        key = outcome.key
        late = self._late.pop(key, None)
        if late is not None:
            late(outcome.result)
            return
        transcript = self._transcripts.pop(key, None)
        if transcript is not None:
            result = outcome.result
            transcript(None if isinstance(result, AsrFailure) else result.text)
            return
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        if self._latest.get((key.instance_id, key.step_index)) != key.utterance_id:
            self._m_stale.inc()
            return
        result = outcome.result
        text = None if isinstance(result, AsrFailure) else result.text
        if isinstance(result, AsrFailure):
            log.warning(
                "ASR failed for %s step %d: %s", key.instance_id, key.step_index, result.reason
            )
        metrics = assess(pending.expected_text, text, pending.methods)
        assessed_at = time.time_ns() // 1_000_000
        if self._store is not None:
            self._store.submit_step(
                st.StepRecord(
                    instance_id=key.instance_id,
                    step_index=key.step_index,
                    asr_text=text,
                    metrics=tuple(st.StoredMetric(m.method, m.value) for m in metrics),
                    assessed_at=assessed_at,
                )
            )
        self._publish(pending, key, text, metrics, assessed_at)
        if text:
            self._on_text(pending.device, key.instance_id, key.step_index, text)

    def _publish(
        self,
        pending: _StepContext,
        key: AsrKey,
        text: str | None,
        metrics: list[MetricValue],
        assessed_at: int,
    ) -> None:
        message = Assessment(
            instance_id=key.instance_id,
            step_index=key.step_index,
            device=pending.device,
            prompt_text=pending.prompt_text or "",
            expected_text=pending.expected_text,
            asr_text=text,
            metrics=[Metric(method=m.method, value=m.value) for m in metrics],
            assessed_at=assessed_at,
            clip=(pending.prompt_text or "").rsplit("/", 1)[-1] or None,
        )
        topic = build_topic(TopicKind.ASSESSMENT, dev=pending.device)
        self._mqtt.publish(topic, encode(message), qos=1)
        self._m_published.inc()
