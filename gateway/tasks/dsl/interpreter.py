"""The task DSL's step interpreter: a pure state machine (no I/O, no asyncio).

``start(now)``, ``handle(event, now)`` and ``cancel(now)`` return typed effects
(:mod:`gateway.tasks.dsl.commands`); the shell performs them in order and delivers
``DeadlinePassed()`` at ``next_deadline()`` (monotonic ms).

Steps run one after the other (:mod:`gateway.tasks.core.steps`). A ``generate`` step runs
``rounds`` questions of the task's exercise, each with inline assessment::

    SPEAKING(question) --completed/interrupted/watchdog--> LISTENING(window)
    LISTENING --voice ended--> TRANSCRIBING --transcript--> SPEAKING(feedback) --> next round
    LISTENING --window timeout, nothing said--> SPEAKING(feedback for silence)
    LISTENING --window timeout while speaking--> TRANSCRIBING (the shell flushes the utterance)
    TRANSCRIBING --ASR failed or asr_timeout_ms--> SPEAKING(neutral line) --> next round

Nothing waits for ever: every state but IDLE/DONE has a deadline, and a round is never asked
twice (no replay loop). Speech while the gateway speaks ("talking over the question") is not
an answer: it is ignored, and the window opens when the question has been said.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum

from gateway.tasks.core.catalog import LessonDef, TaskDef
from gateway.tasks.core.steps import (
    GenerateStepDef,
    IndicateStepDef,
    ListenStepDef,
    PlayAudioStepDef,
    SoundStepDef,
    SpeakStepDef,
    StopStepDef,
    Voice,
    WaitStepDef,
)
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
    SpeakCut,
    SpeakFinished,
    StepSignals,
    TaskEnded,
    TranscribeCommand,
    TranscriptReady,
    VoiceBegan,
    VoiceEnded,
)
from gateway.tasks.dsl.exercises import Exercise, Question

ASR_TIMEOUT_MS = 4_000
CLIP_WATCHDOG_MS = 120_000


def speak_watchdog_ms(text: str) -> float:
    """Longest a phrase may take before the interpreter moves on (generous: slow voices)."""
    return 5_000.0 + 250.0 * len(text)


class StepPhase(Enum):
    IDLE = "idle"
    SPEAKING = "speaking"
    PLAYING = "playing"
    WAITING = "waiting"
    LISTENING = "listening"
    TRANSCRIBING = "transcribing"
    DONE = "done"


class StepInterpreter:
    """Runs one instance of a STEPS task."""

    def __init__(
        self,
        task: TaskDef,
        lesson: LessonDef,
        *,
        instance_id: str,
        exercise: Exercise | None = None,
        asr_timeout_ms: float = ASR_TIMEOUT_MS,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.task, self.lesson = task, lesson
        self.instance_id = instance_id
        self.exercise = exercise
        self.asr_timeout_ms = asr_timeout_ms
        self._ids = 0
        self._new_id = new_id or self._counter
        self.phase = StepPhase.IDLE
        self.deadline: float | None = None
        self._pc = -1  # index into task.steps
        self._round = 0  # rounds done of the current generate step
        self._step_index = -1  # the record's step index (one per listen or round)
        self._after_speak: Callable[[float], list[DslEffect]] = self._next_step
        self._speak_id: str | None = None
        self._question: Question | None = None
        self._generated = False
        self._window_ms = 0
        self._opened: float = 0.0
        self._utterance: str | None = None
        self._voice_at: float | None = None
        self._voice_ended = False
        self._signals: list[StepSignals] = []
        self._pending: list[DslEffect] = []

    def _counter(self) -> str:
        self._ids += 1
        return f"{self.instance_id}.s{self._ids}"

    def next_deadline(self) -> float | None:
        return self.deadline

    @property
    def finished(self) -> bool:
        return self.phase is StepPhase.DONE

    # -- entry points ---------------------------------------------------------------------
    def start(self, now: float) -> list[DslEffect]:
        return self._flush(self._next_step(now))

    def handle(self, event: DslEvent, now: float) -> list[DslEffect]:
        return self._flush(self._dispatch(event, now))

    def _dispatch(self, event: DslEvent, now: float) -> list[DslEffect]:  # noqa: PLR0911 - table
        match event:
            case DeadlinePassed():
                if self.deadline is None or now < self.deadline:
                    return []
                return self._on_deadline(now)
            case SpeakFinished() | SpeakCut() if (
                self.phase is StepPhase.SPEAKING and event.speak_id == self._speak_id
            ):
                self._speak_id = None
                return self._after_speak(now)
            case ClipFinished() if self.phase is StepPhase.PLAYING:
                return self._next_step(now)
            case VoiceBegan() if self.phase is StepPhase.LISTENING and self._utterance is None:
                self._utterance, self._voice_at = event.utterance_id, now
                return []
            case VoiceEnded() if (
                self.phase in (StepPhase.LISTENING, StepPhase.TRANSCRIBING)
                and event.utterance_id == self._utterance
                and not self._voice_ended
            ):
                return self._voice_done(event.utterance_id, now)
            case TranscriptReady() if (
                self.phase is StepPhase.TRANSCRIBING and event.utterance_id == self._utterance
            ):
                return self._transcribed(event.text, now)
            case _:
                return []  # late, duplicate or out of turn (SpeakBegan, talking over a question)

    def cancel(self, now: float) -> list[DslEffect]:
        """End the instance at once (stop, preemption, long press)."""
        if self.phase is StepPhase.DONE:
            return []
        effects: list[DslEffect] = []
        self._pending.clear()
        if self.phase is StepPhase.SPEAKING and self._speak_id is not None:
            effects.append(CancelSpeakCommand(self._speak_id))
        elif self.phase is StepPhase.LISTENING:
            effects.append(ListenCloseCommand())
        return effects + self._finish("cancelled")

    # -- steps ---------------------------------------------------------------------------
    def _next_step(self, now: float) -> list[DslEffect]:
        step = self.task.steps[self._pc] if 0 <= self._pc < len(self.task.steps) else None
        if isinstance(step, GenerateStepDef) and self._round < step.rounds:
            return self._ask(step, now)
        self._pc += 1
        self._round = 0
        if self._pc >= len(self.task.steps):
            return self._finish("completed")
        return self._run(self.task.steps[self._pc], now)

    def _run(self, step: object, now: float) -> list[DslEffect]:  # noqa: PLR0911 - step table
        self.deadline = None
        match step:
            case SpeakStepDef(text=text, voice=voice):
                return self._speak(text, voice, now, self._next_step)
            case PlayAudioStepDef(clip=clip):
                self.phase = StepPhase.PLAYING
                self.deadline = now + CLIP_WATCHDOG_MS
                name = self.task.board_path(self.lesson, clip)
                return [PlayClipCommand(name)]
            case WaitStepDef(ms=ms):
                self.phase = StepPhase.WAITING
                self.deadline = now + ms
                return []
            case ListenStepDef(window_ms=window_ms):
                self._step_index += 1
                self._question, self._generated = None, False
                return self._open(window_ms, now)
            case SoundStepDef(name=name):
                return [SoundCommand(name), *self._next_step(now)]
            case IndicateStepDef(state=state):
                return [IndicateCommand(state), *self._next_step(now)]
            case GenerateStepDef():
                return self._next_step(now)
            case _:
                assert isinstance(step, StopStepDef)  # noqa: S101 - the union is closed
                return self._finish("stop_step")

    def _speak(
        self, text: str, voice: Voice, now: float, then: Callable[[float], list[DslEffect]]
    ) -> list[DslEffect]:
        self.phase = StepPhase.SPEAKING
        self._speak_id = self._new_id()
        self._after_speak = then
        self.deadline = now + speak_watchdog_ms(text)
        return [SpeakCommand(self._speak_id, text, voice)]

    def _ask(self, step: GenerateStepDef, now: float) -> list[DslEffect]:
        assert self.exercise is not None  # noqa: S101 - the catalog requires a generator
        self._round += 1
        self._step_index += 1
        self._question, self._generated = self.exercise.question(), True
        window = step.window_ms
        return self._speak(
            self._question.text,
            self.exercise.voice,
            now,
            lambda at: self._open(window, at),
        )

    def _open(self, window_ms: int, now: float) -> list[DslEffect]:
        self.phase = StepPhase.LISTENING
        self._window_ms, self._opened = window_ms, now
        self.deadline = now + window_ms
        self._utterance, self._voice_at, self._voice_ended = None, None, False
        return [ListenOpenCommand(window_ms, self._step_index)]

    def _voice_done(self, utterance: str, now: float) -> list[DslEffect]:
        self._voice_ended = True
        effects: list[DslEffect] = []
        if self.phase is StepPhase.LISTENING:
            effects.append(ListenCloseCommand())
        if not self._inline:
            effects.append(DeferAssessmentCommand(utterance, self._step_index))
            self._record(None, {}, completed=1)
            return effects + self._next_step(now)
        self.phase = StepPhase.TRANSCRIBING
        self.deadline = now + self.asr_timeout_ms
        expected = self._question.expected if self._question else None
        return [*effects, TranscribeCommand(utterance, self._step_index, expected)]

    @property
    def _inline(self) -> bool:
        return self._generated or self.task.assessment.timing == "inline"

    def _transcribed(self, text: str | None, now: float) -> list[DslEffect]:
        if text is None:
            return self._neutral(now)
        if self.exercise is None or self._question is None:  # an inline plain listen step
            self._record(text, {}, completed=1)
            return self._next_step(now)
        reply = self.exercise.reply(self._question, text)
        self._record(text, reply.metrics, completed=1)
        return self._speak(reply.feedback, self.exercise.voice, now, self._next_step)

    def _neutral(self, now: float) -> list[DslEffect]:
        """ASR slow or failed: no numbers for the answer; a neutral line, then go on."""
        self._record(None, {}, completed=0)
        if self.exercise is None or self._question is None:
            return self._next_step(now)
        return self._speak(self.exercise.neutral(), self.exercise.voice, now, self._next_step)

    def _on_deadline(self, now: float) -> list[DslEffect]:
        self.deadline = None
        match self.phase:
            case StepPhase.SPEAKING:  # no completion came: never hang on a lost phrase
                assert self._speak_id is not None  # noqa: S101 - set with the phase
                cancel = CancelSpeakCommand(self._speak_id)
                self._speak_id = None
                return [cancel, *self._after_speak(now)]
            case StepPhase.LISTENING if self._utterance is not None:
                # Still talking at the close: the mic's flush ends the utterance (VoiceEnded).
                self.phase = StepPhase.TRANSCRIBING
                self.deadline = now + self.asr_timeout_ms
                return [ListenCloseCommand()]
            case StepPhase.LISTENING:
                return [ListenCloseCommand(), *self._silence(now)]
            case StepPhase.TRANSCRIBING:
                return self._neutral(now)
            case _:  # PLAYING (watchdog) or WAITING (elapsed)
                return self._next_step(now)

    def _silence(self, now: float) -> list[DslEffect]:
        if self.exercise is None or self._question is None:
            self._record(None, {}, completed=0)
            return self._next_step(now)
        reply = self.exercise.reply(self._question, None)
        self._record(None, reply.metrics, completed=0)
        return self._speak(reply.feedback, self.exercise.voice, now, self._next_step)

    # -- records -------------------------------------------------------------------------
    def _record(self, text: str | None, metrics: Mapping[str, float], *, completed: int) -> None:
        latency = None if self._voice_at is None else round(self._voice_at - self._opened)
        question = self._question
        record = StepSignals(
            step_index=self._step_index,
            prompt_text=question.text if question else None,
            expected_text=question.expected if question else None,
            asr_text=text,
            latency_ms=latency,
            completed=completed,
            metrics=dict(metrics),
        )
        self._signals.append(record)
        self._pending.append(record)

    def _finish(self, reason: str) -> list[DslEffect]:
        self.phase, self.deadline = StepPhase.DONE, None
        signals = self._signals
        latencies = [s.latency_ms for s in signals if s.latency_ms is not None]
        totals: dict[str, float] = {}
        for s in signals:
            for key, value in s.metrics.items():
                totals[key] = totals.get(key, 0.0) + value
        summary = InstanceSignals(
            steps=len(signals),
            responded=len(latencies),
            completed=sum(s.completed for s in signals),
            mean_latency_ms=round(sum(latencies) / len(latencies)) if latencies else None,
            totals=totals,
        )
        pending, self._pending = self._pending, []
        return [*pending, summary, TaskEnded(reason)]

    def _flush(self, effects: list[DslEffect]) -> list[DslEffect]:
        """Step records made in this turn go out after its commands (feedback first)."""
        pending, self._pending = self._pending, []
        return effects + pending
