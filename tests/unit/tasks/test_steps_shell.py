"""A STEPS task through the task service and its actor (shell unit tests over fakes): SPEAK,
the board's commands, the microphone, inline ASR and the records, in the order the step
interpreter asks for them."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.assessment.jobs import AnswerGrammar
from gateway.metrics import Metrics
from gateway.tasks.dsl.interpreter import ASR_TIMEOUT_MS
from gateway.tasks.inbox import TaskInbox
from gateway.tasks.service import TaskService
from tests.support.fake_mqtt import FakePublisher
from tests.unit.tasks.fakes import (
    CATALOG,
    FakeAssessment,
    FakeBoard,
    FakeMic,
    FakeRecorder,
    running_tasks,
)

DEV = "aa_bb_cc_dd_ee_02"


@dataclass
class FakeSpeaker:
    """Test-only SpeakPort: 'says' a line in 1 ms per character, then reports completion."""

    svc: TaskService | None = None
    said: list[tuple[str, str, str]] = field(default_factory=list)  # (speak_id, text, voice)
    cancelled: list[str] = field(default_factory=list)
    inbox: TaskInbox | None = None

    def speak(self, dev: str, *, speak_id: str, text: str, voice: str) -> None:
        self.said.append((speak_id, text, voice))
        loop = asyncio.get_running_loop()
        assert self.svc is not None
        inbox = self.svc._inbox  # white box: the inbox SPEAK reports into
        loop.call_soon(inbox.speak_started, dev, speak_id)
        loop.call_later(len(text) / 1000, self._done, inbox, dev, speak_id, len(text))

    def _done(self, inbox: TaskInbox, dev: str, speak_id: str, ms: int) -> None:
        if speak_id not in self.cancelled:
            inbox.speak_completed(dev, speak_id, ms)

    def cancel(self, dev: str, speak_id: str) -> None:
        self.cancelled.append(speak_id)
        assert self.svc is not None
        self.svc._inbox.speak_interrupted(dev, speak_id, "cancelled")


HOLD = "<the engine is still busy: no transcript yet>"


@dataclass
class FakeInline:
    """Inline ASR answering with ``answer(question)`` on the next loop turn."""

    answer: Callable[[str], str | None]
    speaker: FakeSpeaker
    recorded: list[dict[str, Any]] = field(default_factory=list)
    pcm: list[bytes] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    withdrawn: list[dict[str, Any]] = field(default_factory=list)

    def transcribe_now(
        self, *, pcm: bytes, on_text: Callable[[str | None], None], **kw: Any
    ) -> bool:
        self.pcm.append(pcm)
        self.asked.append(kw)
        questions = [t for _, t, _ in self.speaker.said if t.startswith("What is")]
        text = self.answer(questions[-1])
        if text != HOLD:
            asyncio.get_running_loop().call_soon(on_text, text)
        return True

    def withdraw_inline(self, **key: Any) -> None:
        self.withdrawn.append(key)

    def record_inline(self, **record: Any) -> None:
        self.recorded.append(record)


@dataclass
class WindowBoard(FakeBoard):
    """The fake board, telling the test when a listen window opens."""

    opened: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    def send_command(self, device: str, **kw: Any) -> None:
        super().send_command(device, **kw)
        if kw["cmd"] == "LISTEN_START":
            self.opened.put_nowait(device)


def right(question: str) -> str:
    a, op, b = re.findall(r"What is (\d+) (plus|minus) (\d+)", question)[0]
    return str(int(a) + int(b) if op == "plus" else int(a) - int(b))


@dataclass
class StepsRig:
    svc: TaskService
    mqtt: FakePublisher
    board: WindowBoard
    mic: FakeMic
    speaker: FakeSpeaker
    inline: FakeInline


@pytest.fixture
def games(tmp_path: Path) -> Path:
    tasks = json.loads((CATALOG / "thinking_games.json").read_text(encoding="utf-8"))
    for task in tasks:
        for step in task["steps"]:
            if step["type"] == "generate":
                step["rounds"], step["window_ms"] = 3, 300
    (tmp_path / "games.json").write_text(json.dumps(tasks), encoding="utf-8")
    return tmp_path / "games.json"


@pytest.fixture
async def rig(games: Path, request: pytest.FixtureRequest) -> AsyncIterator[StepsRig]:
    answer = getattr(request, "param", right)
    speaker = FakeSpeaker()
    inline = FakeInline(answer, speaker)
    board, mic = WindowBoard(), FakeMic()
    mqtt = FakePublisher()
    async with running_tasks(
        games, mqtt, Metrics(), board, min_window_ms=100, mic=mic,
        recorder=FakeRecorder(), assessment=FakeAssessment(), speaker=speaker, inline=inline,
    ) as svc:  # fmt: skip
        speaker.svc = svc
        yield StepsRig(svc, mqtt, board, mic, speaker, inline)


def start(rig: StepsRig, task_id: str = "arithmetic_10") -> None:
    body = {"v": 1, "id": "r1", "action": "start", "app_id": "thinking_games",
            "task_id": task_id}  # fmt: skip
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", body)


def events(rig: StepsRig, name: str) -> list[dict[str, Any]]:
    return [e for e in rig.mqtt.bodies("/task/" + DEV) if e["event"] == name]


async def answer_each_window(rig: StepsRig, rounds: int) -> None:
    """The child answers in every window that opens (speech start, then its end)."""
    for n in range(rounds):
        async with asyncio.timeout(10):
            await rig.board.opened.get()
        rig.svc.on_speech_started(DEV, f"u{n}")
        rig.svc.on_speech_stopped(DEV, f"u{n}", b"\x01\x00" * 400, 25)


async def test_arithmetic_right_answers_get_feedback_then_the_next_question(rig: StepsRig) -> None:
    start(rig)
    await answer_each_window(rig, 3)
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.completed")))
    lines = [text for _, text, _ in rig.speaker.said]
    assert lines[0] == "Ten questions. Say the answer."
    assert [t for t in lines if t.startswith("What is")] == lines[1:7:2]
    assert lines[2:7:2] == ["Right!"] * 3  # feedback right after each answer
    assert [cmd for _, cmd, _, _ in rig.board.sent] == [
        "INDICATE",
        *["LISTEN_START", "LISTEN_STOP"] * 3,
        "SOUND",
        "INDICATE",
    ]
    assert (DEV, True) in rig.mic.calls
    assert rig.mic.calls[-1] == (DEV, False)
    assert len(rig.inline.recorded) == 3
    first = rig.inline.recorded[0]
    assert first["metrics"]["task.correct"] == 1.0
    assert first["metrics"]["signal.completed"] == 1.0
    assert first["metrics"]["signal.response_latency_ms"] >= 0
    assert first["expected_text"] == right(first["prompt_text"])
    assert rig.inline.pcm[0] == b"\x01\x00" * 400
    (summary,) = events(rig, "instance.signals")
    assert summary["data"]["steps"] == 3
    assert summary["data"]["completed"] == 3
    assert summary["data"]["totals"]["correct"] == 3.0
    assert len(events(rig, "step.signals")) == 3


@pytest.mark.parametrize("rig", [lambda _q: None], indirect=True)
async def test_asr_failure_gets_the_neutral_line_and_the_lesson_goes_on(rig: StepsRig) -> None:
    start(rig)
    await answer_each_window(rig, 3)
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.completed")))
    lines = [text for _, text, _ in rig.speaker.said]
    assert lines.count("Let's go on to the next one.") == 3
    assert len([t for t in lines if t.startswith("What is")]) == 3  # never asked again
    assert [r["metrics"]["signal.completed"] for r in rig.inline.recorded] == [0.0] * 3


async def test_silence_gets_the_answer_and_the_lesson_goes_on(rig: StepsRig) -> None:
    start(rig)
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.completed")))
    lines = [text for _, text, _ in rig.speaker.said]
    assert len([t for t in lines if t.startswith("It is ")]) == 3
    assert rig.inline.pcm == []
    assert all("signal.response_latency_ms" not in r["metrics"] for r in rig.inline.recorded)


async def test_a_stop_cancels_the_line_being_said(rig: StepsRig) -> None:
    start(rig)
    await rig.mqtt.wait_for(lambda: bool(rig.speaker.said))
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "r2", "action": "stop"})
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.cancelled")))
    assert rig.speaker.cancelled == [rig.speaker.said[0][0]]
    await asyncio.sleep(0.1)
    assert len(rig.speaker.said) == 1  # nothing said after the stop


async def test_the_job_says_its_grammar_and_how_long_it_is_waited_for(rig: StepsRig) -> None:
    start(rig)
    await answer_each_window(rig, 1)
    await rig.mqtt.wait_for(lambda: bool(rig.inline.asked))
    asked = rig.inline.asked[0]
    assert asked["grammar"] is AnswerGrammar.NUMBER
    assert asked["max_wait_ms"] == ASR_TIMEOUT_MS
    assert (asked["step_index"], asked["utterance_id"]) == (0, "u0")


@pytest.mark.parametrize("rig", [lambda _q: HOLD], indirect=True)
async def test_a_stop_while_transcribing_withdraws_the_job(rig: StepsRig) -> None:
    start(rig)
    await answer_each_window(rig, 1)
    await rig.mqtt.wait_for(lambda: bool(rig.inline.asked))
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "r2", "action": "stop"})
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.cancelled")))
    asked = rig.inline.asked[0]
    key = {k: asked[k] for k in ("instance_id", "step_index", "utterance_id")}
    assert rig.inline.withdrawn == [key]


async def test_a_stop_after_the_transcript_came_withdraws_nothing(rig: StepsRig) -> None:
    start(rig)
    await answer_each_window(rig, 1)
    await rig.mqtt.wait_for(lambda: "Right!" in [t for _, t, _ in rig.speaker.said])
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "r2", "action": "stop"})
    await rig.mqtt.wait_for(lambda: bool(events(rig, "instance.cancelled")))
    assert rig.inline.withdrawn == []
