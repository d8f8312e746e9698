"""The step interpreter: events and ``now`` in, typed effects and deadlines out."""

from __future__ import annotations

import random
from typing import Any, TypeVar

import pytest

from gateway.tasks.core import TaskDef
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
    SpeakBegan,
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
from gateway.tasks.dsl.exercises import ArithmeticWithinTen
from gateway.tasks.dsl.interpreter import StepInterpreter, StepPhase, speak_watchdog_ms
from tests.support.verdicts import verdict_keys

E = TypeVar("E")


def task(steps: list[dict[str, Any]], **kw: Any) -> TaskDef:
    return TaskDef.model_validate(
        {
            "app_id": "games",
            "task_id": "t",
            "interaction_mode": "STEPS",
            "assessment": {"timing": kw.pop("timing", "inline"), "methods": []},
            "generator": {"kind": "arithmetic_10"},
            "lessons": [{"lesson_id": "l1", "clips": ["a.mp3"]}],
            "steps": steps,
            **kw,
        }
    )


class Run:
    def __init__(self, steps: list[dict[str, Any]], **kw: Any) -> None:
        self.task = task(steps, **{k: v for k, v in kw.items() if k == "timing"})
        exercise = ArithmeticWithinTen("en", random.Random(1))
        self.it = StepInterpreter(
            self.task, self.task.lessons[0], instance_id="i1", exercise=exercise
        )
        self.log: list[DslEffect] = []

    def start(self, now: float = 0) -> list[DslEffect]:
        out = self.it.start(now)
        self.log += out
        return out

    def at(self, now: float, event: DslEvent) -> list[DslEffect]:
        out = self.it.handle(event, now)
        self.log += out
        return out

    def tick(self, now: float) -> list[DslEffect]:
        return self.at(now, DeadlinePassed())

    def speak_done(self, now: float) -> list[DslEffect]:
        speak = of(SpeakCommand, self.log)[-1]
        return self.at(now, SpeakFinished(speak.speak_id, 900))


def of(kind: type[E], effects: list[DslEffect]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


ROUND = [{"type": "generate", "rounds": 2, "window_ms": 5000}]


def test_plain_steps_run_in_order() -> None:
    r = Run(
        [
            {"type": "indicate", "state": "TASK_RUNNING"},
            {"type": "speak", "text": "Hello", "voice": "en"},
            {"type": "play_audio", "clip": "a.mp3"},
            {"type": "wait", "ms": 500},
            {"type": "sound", "name": "ding"},
        ]
    )
    out = r.start(0)
    assert out[0] == IndicateCommand("TASK_RUNNING")
    assert out[1] == SpeakCommand("i1.s1", "Hello", "en")
    assert r.it.next_deadline() == speak_watchdog_ms("Hello")
    assert r.at(10, SpeakBegan("i1.s1")) == []
    assert r.at(20, SpeakFinished("i1.s1", 800)) == [PlayClipCommand("/games/t/lessons/l1/a.mp3")]
    assert r.it.phase is StepPhase.PLAYING
    assert r.at(30, ClipFinished()) == []
    assert r.it.phase is StepPhase.WAITING
    assert r.it.next_deadline() == 530
    assert r.tick(100) == []  # early firing is harmless
    out = r.tick(530)
    assert out[0] == SoundCommand("ding")
    assert out[-1] == TaskEnded("completed")
    assert of(InstanceSignals, out) == [InstanceSignals(0, 0, 0, None, {})]
    assert r.it.finished
    assert r.it.next_deadline() is None
    assert r.it.cancel(600) == []


def test_a_stop_step_ends_the_task_there() -> None:
    r = Run([{"type": "stop"}, {"type": "speak", "text": "never"}])
    assert r.start(0)[-1] == TaskEnded("stop_step")
    assert not of(SpeakCommand, r.log)


def test_a_lost_clip_or_phrase_never_hangs() -> None:
    r = Run([{"type": "play_audio", "clip": "a.mp3"}, {"type": "speak", "text": "Hi"}])
    r.start(0)
    deadline = r.it.next_deadline()
    assert deadline is not None
    out = r.tick(deadline)  # clip watchdog
    assert of(SpeakCommand, out)
    speak_deadline = r.it.next_deadline()
    assert speak_deadline is not None
    out = r.tick(speak_deadline)  # no speak.completed ever came
    assert out[0] == CancelSpeakCommand("i1.s1")
    assert out[-1] == TaskEnded("completed")


def test_a_right_answer_gets_feedback_at_once_then_the_next_round() -> None:
    r = Run(ROUND)
    (question,) = r.start(0)
    assert isinstance(question, SpeakCommand)
    assert question.text.startswith("What is")
    assert r.speak_done(1000) == [ListenOpenCommand(5000, 0)]
    assert r.at(1400, VoiceBegan("u1")) == []
    out = r.at(2000, VoiceEnded("u1"))
    expected = r.it._question.expected if r.it._question else ""
    assert out == [ListenCloseCommand(), TranscribeCommand("u1", 0, expected)]
    assert r.it.next_deadline() == 2000 + 4000
    out = r.at(2300, TranscriptReady("u1", f"it is {expected}"))
    feedback, signals = out
    assert feedback == SpeakCommand("i1.s2", "Right!", "en")
    assert signals == StepSignals(
        step_index=0,
        prompt_text=question.text,
        expected_text=expected,
        asr_text=f"it is {expected}",
        latency_ms=400,
        completed=1,
        metrics={"correct": 1.0, "answered": 1.0},
    )
    out = r.at(2900, SpeakCut("i1.s2", "barge_in"))  # interrupted feedback: go on too
    (nxt,) = out
    assert isinstance(nxt, SpeakCommand)
    assert nxt.text.startswith("What is")


def test_silence_gets_the_answer_and_the_step_advances() -> None:
    r = Run(ROUND)
    r.start(0)
    r.speak_done(1000)
    out = r.tick(6000)
    assert out[0] == ListenCloseCommand()
    assert isinstance(out[1], SpeakCommand)
    assert out[1].text.startswith("It is ")
    (signals,) = of(StepSignals, out)
    assert signals.latency_ms is None
    assert signals.completed == 0
    assert signals.metrics == {"correct": 0.0, "answered": 0.0}


@pytest.mark.parametrize("failure", ["asr_failed", "asr_slow"])
def test_asr_failed_or_slow_gets_a_neutral_line_never_a_replay(failure: str) -> None:
    r = Run(ROUND)
    (q1,) = r.start(0)
    r.speak_done(1000)
    r.at(1500, VoiceBegan("u1"))
    r.at(2500, VoiceEnded("u1"))
    if failure == "asr_failed":
        out = r.at(2600, TranscriptReady("u1", None))
    else:
        out = r.tick(2500 + 4000)
    neutral = of(SpeakCommand, out)[0]
    assert neutral.text == "Let's go on to the next one."
    (signals,) = of(StepSignals, out)
    assert (signals.completed, signals.latency_ms, signals.metrics) == (0, 500, {})
    assert r.at(7000, TranscriptReady("u1", "seven")) == []  # too late: ignored
    (q2,) = r.speak_done(7000)
    assert isinstance(q2, SpeakCommand)
    assert q2.text != q1.text  # the next question, not the same one again


def test_talking_over_the_question_is_not_an_answer() -> None:
    r = Run(ROUND)
    r.start(0)
    assert r.at(100, VoiceBegan("u0")) == []
    assert r.at(200, VoiceEnded("u0")) == []
    r.speak_done(1000)
    assert r.it.phase is StepPhase.LISTENING
    r.at(1300, VoiceBegan("u1"))
    assert r.at(1350, VoiceBegan("u2")) == []  # one answer per window
    out = r.at(1900, VoiceEnded("u1"))
    assert of(TranscribeCommand, out)[0].utterance_id == "u1"
    assert r.at(1950, VoiceEnded("u1")) == []  # duplicate


def test_still_talking_at_the_window_close_waits_for_the_flushed_utterance() -> None:
    r = Run(ROUND)
    r.start(0)
    r.speak_done(1000)
    r.at(5000, VoiceBegan("u1"))
    assert r.tick(6000) == [ListenCloseCommand()]
    assert r.it.phase is StepPhase.TRANSCRIBING
    out = r.at(6010, VoiceEnded("u1"))
    assert [type(e) for e in out] == [TranscribeCommand]
    out = r.at(6300, TranscriptReady("u1", "banana"))
    assert of(StepSignals, out)[0].latency_ms == 4000


def test_two_rounds_then_the_instance_signals() -> None:
    r = Run([*ROUND, {"type": "speak", "text": "Bye"}])
    r.start(0)
    for round_ in range(2):
        base = 10_000 * round_
        r.speak_done(base + 1000)
        r.at(base + 1200 + 100 * round_, VoiceBegan(f"u{round_}"))
        r.at(base + 2000, VoiceEnded(f"u{round_}"))
        expected = r.it._question.expected if r.it._question else ""
        r.at(base + 2100, TranscriptReady(f"u{round_}", expected if round_ == 0 else "zero"))
        r.speak_done(base + 3000)
    assert of(SpeakCommand, r.log)[-1].text == "Bye"
    out = r.speak_done(30_000)
    summary = of(InstanceSignals, out)[0]
    assert summary.steps == 2
    assert summary.responded == 2
    assert summary.completed == 2
    assert summary.mean_latency_ms == 250
    assert summary.totals["answered"] == 2.0
    assert summary.totals["correct"] >= 1.0
    assert out[-1] == TaskEnded("completed")
    assert not verdict_keys({"totals": dict(summary.totals)})


def test_a_plain_listen_step_post_hands_the_utterance_over_and_goes_on() -> None:
    r = Run(
        [{"type": "listen", "window_ms": 3000}, {"type": "sound", "name": "beep"}], timing="post"
    )
    assert r.start(0) == [ListenOpenCommand(3000, 0)]
    r.at(500, VoiceBegan("u1"))
    out = r.at(1500, VoiceEnded("u1"))
    assert out[:3] == [ListenCloseCommand(), DeferAssessmentCommand("u1", 0), SoundCommand("beep")]
    assert of(StepSignals, out)[0].completed == 1


def test_a_plain_listen_step_inline_stores_the_transcript() -> None:
    r = Run([{"type": "listen", "window_ms": 3000}, {"type": "listen", "window_ms": 3000}])
    r.start(0)
    r.at(500, VoiceBegan("u1"))
    r.at(1500, VoiceEnded("u1"))
    out = r.at(1600, TranscriptReady("u1", "hello"))
    assert out[0] == ListenOpenCommand(3000, 1)
    assert of(StepSignals, out)[0].asr_text == "hello"
    r.at(2000, VoiceBegan("u2"))
    r.at(2500, VoiceEnded("u2"))
    out = r.at(2600, TranscriptReady("u2", None))  # failed: no feedback to say, go on
    assert out[0] == StepSignals(1, None, None, None, 400, 0, {})
    assert out[1:] == [InstanceSignals(2, 2, 1, 450, {}), TaskEnded("completed")]


def test_a_plain_listen_step_in_silence_goes_on() -> None:
    r = Run([{"type": "listen", "window_ms": 3000}])
    r.start(0)
    out = r.tick(3000)
    assert out[0] == ListenCloseCommand()
    assert of(StepSignals, out)[0].completed == 0
    assert out[-1] == TaskEnded("completed")


@pytest.mark.parametrize(
    ("phase_events", "first"),
    [
        ([], CancelSpeakCommand("i1.s1")),
        ([SpeakFinished("i1.s1", 1)], ListenCloseCommand()),
    ],
)
def test_cancel_stops_what_is_under_way(phase_events: list[DslEvent], first: DslEffect) -> None:
    r = Run(ROUND)
    r.start(0)
    for event in phase_events:
        r.at(100, event)
    out = r.it.cancel(200)
    assert out[0] == first
    assert out[-1] == TaskEnded("cancelled")
    assert r.it.phase is StepPhase.DONE


def test_cancel_while_transcribing_sends_nothing_to_the_device() -> None:
    r = Run(ROUND)
    r.start(0)
    r.speak_done(100)
    r.at(200, VoiceBegan("u1"))
    r.at(300, VoiceEnded("u1"))
    out = r.it.cancel(400)
    assert [type(e) for e in out] == [InstanceSignals, TaskEnded]
