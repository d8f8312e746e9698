"""The shell of a STEPS task's step interpreter, owned by its device actor.

The device's :class:`~gateway.tasks.core.DeviceRuntime` owns the instance (start, stop,
preemption, priorities, records); when it starts a STEPS task it asks for ``RunSteps`` and this
runner drives a :class:`~gateway.tasks.dsl.interpreter.StepInterpreter`: it maps the actor's
events to the interpreter's (speech, board audio, SPEAK results, transcripts, the timer) and
performs the interpreter's typed commands through the ports: SPEAK, board commands (PLAY_MEDIA,
SOUND, INDICATE, LISTEN_START/STOP), the microphone, inline ASR, the store and the task topic.
The instance ends in the runtime (``StepsFinished``), never here.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping

from gateway.assessment.jobs import AnswerGrammar
from gateway.tasks.actor_parts import Ports
from gateway.tasks.core import (
    AudioPhase,
    DeliveryResult,
    PlaybackEvent,
    PublishTaskEvent,
    RuntimeEvent,
    StepsFinished,
    TimerFired,
    UtteranceStarted,
    UtteranceStopped,
    outcome_matters,
)
from gateway.tasks.core.catalog import LessonDef, TaskDef
from gateway.tasks.dsl.commands import (
    CancelSpeakCommand,
    ClipFinished,
    DeadlinePassed,
    DeferAssessmentCommand,
    DslEffect,
    DslEvent,
    IndicateCommand,
    InstanceSignals,
    ListenCloseCommand,
    ListenOpenCommand,
    PlayClipCommand,
    SoundCommand,
    SpeakCommand,
    StepSignals,
    TaskEnded,
    TranscribeCommand,
    TranscriptReady,
    VoiceBegan,
    VoiceEnded,
)
from gateway.tasks.dsl.exercises import exercise_grammar, exercise_hints, make_exercise
from gateway.tasks.dsl.interpreter import StepInterpreter

log = logging.getLogger(__name__)

_CLIP_ENDS = (AudioPhase.COMPLETED, AudioPhase.FAILED, AudioPhase.STOPPED)

StepsSend = Callable[[str, dict[str, object], Callable[[DeliveryResult], None] | None], None]


class StepsRunner:
    """One STEPS instance's interpreter and the effects it asks for."""

    def __init__(
        self,
        device: str,
        task: TaskDef,
        lesson: LessonDef,
        instance_id: str,
        priority: int,
        *,
        ports: Ports,
        send: StepsSend,
        post: Callable[[RuntimeEvent | DslEvent], bool],
        take_utterance: Callable[[str, int], bytes],
        methods: tuple[str, ...] = (),
        hints: tuple[str, ...] = (),
        params: Mapping[str, object] | None = None,
    ) -> None:
        params = params or {}
        self.device = device
        self.instance_id = instance_id
        self.priority = priority
        self._ports = ports
        self._send = send
        self._post = post
        self._take = take_utterance
        self._methods = methods  # post assessment of plain listen steps
        self._hints = hints
        self._window: tuple[int, float, int] = (0, 0.0, 0)  # step index, opened (epoch ms), ms
        self._grammar: AnswerGrammar | None = None  # the generator's kind of answer, if any
        self._asking: tuple[int, str] | None = None  # (step index, utterance) at the inline ASR
        exercise = None
        if task.generator is not None:  # the same instance always asks the same questions
            seed = params.get("seed")
            if not isinstance(seed, int):
                seed = zlib.crc32(instance_id.encode())
            exercise = make_exercise(task.generator, seed)
            self._hints = exercise_hints(task.generator) or hints
            self._grammar = exercise_grammar(task.generator)
        self.interpreter = StepInterpreter(task, lesson, instance_id=instance_id, exercise=exercise)

    @property
    def finished(self) -> bool:
        return self.interpreter.finished

    def next_deadline(self) -> float | None:
        return self.interpreter.next_deadline()

    def start(self, now: float) -> None:
        self._perform(self.interpreter.start(now))

    def cancel(self, now: float) -> None:
        self._perform(self.interpreter.cancel(now))
        self._withdraw()

    def _withdraw(self) -> None:
        """The task stopped: its inline ASR job, if still queued, is never transcribed."""
        asking, self._asking = self._asking, None
        inline = self._ports.inline
        if asking is not None and inline is not None:
            index, uid = asking
            inline.withdraw_inline(instance_id=self.instance_id, step_index=index, utterance_id=uid)

    @staticmethod
    def takes(event: RuntimeEvent) -> DslEvent | None:
        """The interpreter's event for a runtime event while it runs, or None (the runtime's)."""
        match event:
            case UtteranceStarted(utterance_id=uid):
                return VoiceBegan(uid)
            case UtteranceStopped(utterance_id=uid):
                return VoiceEnded(uid)
            case PlaybackEvent(kind=kind) if kind in _CLIP_ENDS:
                return ClipFinished(failed=kind is not AudioPhase.COMPLETED)
            case TimerFired():
                return DeadlinePassed()
            case _:
                return None

    def handle(self, event: DslEvent, now: float) -> None:
        self._perform(self.interpreter.handle(event, now))

    # -- effects ---------------------------------------------------------------------------
    def _perform(self, effects: list[DslEffect]) -> None:
        for effect in effects:
            self._one(effect)

    def _one(self, effect: DslEffect) -> None:  # noqa: PLR0912 - the effect table
        p = self._ports
        dev = self.device
        match effect:
            case SpeakCommand(speak_id=sid, text=text, voice=voice):
                if p.speaker is None:
                    log.error("%s: no SPEAK port; a STEPS task cannot speak", dev)
                    return
                p.speaker.speak(dev, speak_id=sid, text=text, voice=voice)
            case CancelSpeakCommand(speak_id=sid):
                if p.speaker is not None:
                    p.speaker.cancel(dev, sid)
            case PlayClipCommand(name=name):
                self._send("PLAY_MEDIA", {"name": name, "repeat": 1}, self._clip_outcome)
            case SoundCommand(name=name):
                self._send("SOUND", {"type": name}, None)
            case IndicateCommand(state=state):
                self._send("INDICATE", {"state": state}, None)
            case ListenOpenCommand(window_ms=window_ms, step_index=index):
                p.mic.set_listening(dev, True)
                self._send("LISTEN_START", {}, None)
                self._window = (index, time.time() * 1000.0, window_ms)
                opened = {"window_ms": window_ms, "planned_close_ms": self._planned_close()}
                self._publish("window.opened", index, dict[str, object](opened))
            case ListenCloseCommand():
                self._send("LISTEN_STOP", {}, None)
                p.mic.set_listening(dev, False)
                self._window_closed()
            case TranscribeCommand():
                self._transcribe(effect)
            case DeferAssessmentCommand(utterance_id=uid, step_index=index):
                self._defer(uid, index)
            case StepSignals():
                self._signals(effect)
            case InstanceSignals():
                data: dict[str, object] = {
                    "steps": effect.steps,
                    "responded": effect.responded,
                    "completed": effect.completed,
                    "mean_latency_ms": effect.mean_latency_ms,
                    "totals": dict(effect.totals),
                }
                self._publish("instance.signals", None, data)
            case TaskEnded(reason=reason) if reason != "cancelled":
                self._post(StepsFinished(self.instance_id))
            case TaskEnded():
                pass

    def _planned_close(self) -> int:
        _, opened, window_ms = self._window
        return round(opened + window_ms)

    def _window_closed(self) -> None:
        index, _opened, window_ms = self._window
        now, planned = time.time() * 1000.0, self._planned_close()
        data: dict[str, object] = {
            "planned_close_ms": planned,
            "actual_close_ms": round(now),
            "lateness_ms": round(now) - planned,
            "window_ms": window_ms,
        }
        self._publish("window.closed", index, data)

    def _clip_outcome(self, outcome: DeliveryResult) -> None:
        if outcome_matters(outcome):
            self._post(ClipFinished(failed=True))

    def _transcribe(self, effect: TranscribeCommand) -> None:
        uid = effect.utterance_id
        pcm = self._take(uid, effect.step_index)
        inline = self._ports.inline

        def on_text(text: str | None) -> None:
            if self._asking == (effect.step_index, uid):
                self._asking = None
            self._post(TranscriptReady(uid, text))

        self._asking = (effect.step_index, uid)
        if (
            not pcm
            or inline is None
            or not inline.transcribe_now(
                instance_id=self.instance_id,
                step_index=effect.step_index,
                utterance_id=uid,
                pcm=pcm,
                hints=self._hints,
                on_text=on_text,
                grammar=self._grammar,
                # the interpreter gives up then (neutral line): a job still queued is withdrawn
                max_wait_ms=self.interpreter.asr_timeout_ms,
            )
        ):
            on_text(None)  # no audio or no ASR: the neutral line, at once

    def _defer(self, utterance_id: str, step_index: int) -> None:
        pcm = self._take(utterance_id, step_index)
        if pcm:
            self._ports.assessment.submit_utterance(
                device=self.device,
                instance_id=self.instance_id,
                step_index=step_index,
                utterance_id=utterance_id,
                pcm=pcm,
                prompt_text=None,
                expected_text=None,
                methods=self._methods,
                hints=self._hints,
            )

    def _signals(self, effect: StepSignals) -> None:
        numbers: dict[str, float] = {f"task.{k}": v for k, v in effect.metrics.items()}
        numbers["signal.completed"] = float(effect.completed)
        if effect.latency_ms is not None:
            numbers["signal.response_latency_ms"] = float(effect.latency_ms)
        inline = self._ports.inline
        if inline is not None:
            inline.record_inline(
                device=self.device,
                instance_id=self.instance_id,
                step_index=effect.step_index,
                prompt_text=effect.prompt_text,
                expected_text=effect.expected_text,
                asr_text=effect.asr_text,
                metrics=numbers,
            )
        data: dict[str, object] = {
            "response_latency_ms": effect.latency_ms,
            "completed": effect.completed,
        }
        self._publish("step.signals", effect.step_index, data)

    def _publish(self, name: str, step_index: int | None, data: dict[str, object]) -> None:
        event = PublishTaskEvent(name, self.instance_id, step_index, data)
        self._ports.publish_task_event(self.device, event)
