"""The task shell drives the pure runtime with real asyncio timers and performs its effects."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.metrics import Metrics
from gateway.tasks.actor import STEPS_KEPT
from gateway.tasks.core.admission import AdmissionConfig
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
from topics import CtlReply

DEV = "aa_bb_cc_dd_ee_01"


@dataclass
class TaskServiceRig:
    svc: TaskService
    mqtt: FakePublisher
    board: FakeBoard
    mic: FakeMic
    recorder: FakeRecorder
    assessment: FakeAssessment
    metrics: Metrics


@pytest.fixture
def fast_catalog(tmp_path: Path) -> Path:
    """The demo catalog with 100 ms minimum windows, so a whole lesson takes well under 1 s."""
    tasks = json.loads((CATALOG / "english_learning.json").read_text(encoding="utf-8"))
    for task in tasks if isinstance(tasks, list) else [tasks]:
        task["min_window_ms"] = 100
        if task["task_id"] == "shadowing":  # a lesson with no text anywhere (SPEC 2.5(d))
            task["lessons"].append({"lesson_id": "bare", "clips": ["a.mp3", "b.mp3"]})
    (tmp_path / "catalog.json").write_text(json.dumps(tasks), encoding="utf-8")
    return tmp_path / "catalog.json"


@pytest.fixture
async def rig(fast_catalog: Path) -> AsyncIterator[TaskServiceRig]:
    metrics = Metrics()
    mqtt = FakePublisher()
    board, mic, recorder, assessment = FakeBoard(), FakeMic(), FakeRecorder(), FakeAssessment()
    async with running_tasks(
        fast_catalog, mqtt, metrics, board, min_window_ms=100,
        mic=mic, recorder=recorder, assessment=assessment,
    ) as svc:  # fmt: skip
        yield TaskServiceRig(svc, mqtt, board, mic, recorder, assessment, metrics)


def _start(rig: TaskServiceRig, **extra: object) -> None:
    body = {"v": 1, "id": "r1", "action": "start", "app_id": "english_learning",
            "task_id": "shadowing", "lesson_id": "unit01", **extra}  # fmt: skip
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", body)


def _task_events(rig: TaskServiceRig, name: str | None = None) -> list[dict[str, object]]:
    events = rig.mqtt.bodies("/task/" + DEV)
    return [e for e in events if name is None or e["event"] == name]


async def test_lesson_steps_on_the_timer_and_completes(rig: TaskServiceRig) -> None:
    _start(rig)
    await rig.mqtt.wait_for(lambda: bool(rig.mqtt.bodies("/reply/" + DEV)))
    reply = rig.mqtt.bodies("/reply/" + DEV)[0]
    assert reply["status"] == "accepted"
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")))

    plays = rig.board.times_of("PLAY_MEDIA")
    stops = rig.board.times_of("LISTEN_STOP")
    assert len(plays) == 4
    assert len(stops) == 4
    # each next clip is sent right when its window closed, never before
    for stop, play in zip(stops[:3], plays[1:], strict=True):
        assert play >= stop
    closed = _task_events(rig, "window.closed")
    assert len(closed) == 4
    for e in closed:
        assert e["data"]["window_ms"] == 100  # type: ignore[index]  # max(min 100, 1.2 x 50 ms)
    assert rig.mic.calls[-1] == (DEV, False)
    snap = rig.metrics.snapshot()
    assert snap["snlpgw_windows_closed_total"] == 4.0
    assert snap['snlpgw_window_lateness_ms{stat="count"}'] == 4.0
    # the next clip follows three of the four closes; each gap is measured to its ack
    assert snap['snlpgw_next_clip_gap_ms{stat="count"}'] == 3.0
    assert snap['snlpgw_next_clip_gap_ms{stat="max"}'] >= 0.0
    assert snap['snlpgw_runtime_task_events_total{event="step.played"}'] == 4.0
    assert snap['snlpgw_runtime_instances{state="idle"}'] == 1.0
    assert snap['snlpgw_runtime_instances{state="listening"}'] == 0.0
    assert rig.recorder.instances[-1].state == "completed"


async def test_speech_in_window_is_submitted_with_expected_text(rig: TaskServiceRig) -> None:
    _start(rig)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "window.opened")))
    rig.svc.on_speech_started(DEV, "u1")
    rig.svc.on_speech_stopped(DEV, "u1", b"\x01\x00" * 800, 50)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "window.closed")))
    job = rig.assessment.submitted[0]
    assert job["expected_text"] == "Good morning."
    assert job["prompt_text"] == "/english_learning/shadowing/lessons/unit01/01.mp3"
    assert job["step_index"] == 0
    assert job["pcm"] == b"\x01\x00" * 800
    assert job["methods"] == ("text_similarity_v0",)
    assert "See you later, alligator." in job["hints"]  # from the lesson's 04.txt


async def test_a_device_keeps_two_steps_texts_which_the_gc_does_not_walk(
    rig: TaskServiceRig,
) -> None:
    """What an actor keeps to label utterances with their step's texts is bounded (the last
    two steps) and made of string tuples the garbage collector stops tracking: a full
    collection walks every tracked object of every device (64 kept step rows per device made
    the pause grow with lesson length)."""
    _start(rig)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")))
    assert len(_task_events(rig, "window.closed")) == 4
    texts = rig.svc._actors[DEV]._texts  # white box: the state this test is about
    gc.collect()
    assert len(texts) == STEPS_KEPT == 2
    assert [key[1] for key in texts] == [2, 3]  # the last two steps, oldest first
    assert not any(gc.is_tracked(k) or gc.is_tracked(v) for k, v in texts.items())


async def test_invalid_control_is_refused_with_reason(rig: TaskServiceRig) -> None:
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "x", "action": "start"})
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "y", "action": "start",
                                             "app_id": "nope", "task_id": "nope"})  # fmt: skip
    await rig.mqtt.wait_for(lambda: len(rig.mqtt.bodies("/reply/" + DEV)) == 2)
    first, second = rig.mqtt.bodies("/reply/" + DEV)
    assert first["status"] == "refused"
    assert first["reason"] == "invalid"
    assert second["reason"] == "unknown_task"


async def test_a_start_past_the_admission_line_is_refused_overloaded_on_the_wire(
    fast_catalog: Path,
) -> None:
    metrics, mqtt, board = Metrics(), FakePublisher(), FakeBoard()
    tight = AdmissionConfig(rate_per_s=1, burst=1, max_wait_ms=0)  # one start now, none waits
    async with running_tasks(
        fast_catalog, mqtt, metrics, board, min_window_ms=100,
        mic=FakeMic(), recorder=FakeRecorder(), assessment=FakeAssessment(), admission=tight,
    ):  # fmt: skip
        for rid in ("first", "second"):
            body = {"v": 1, "id": rid, "action": "start", "app_id": "english_learning",
                    "task_id": "shadowing", "lesson_id": "unit01"}  # fmt: skip
            mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", body)
        await mqtt.wait_for(lambda: len(mqtt.bodies("/reply/" + DEV)) == 2)
        replies = {r["ref"]: CtlReply.model_validate(r) for r in mqtt.bodies("/reply/" + DEV)}
        assert replies["first"].status == "accepted"
        refused = replies["second"]
        assert (refused.status, refused.reason, refused.action) == (
            "refused",
            "overloaded",
            "start",
        )
        assert metrics.snapshot()["snlpgw_runtime_admission_refused_total"] == 1


async def test_failed_clip_advances_without_hanging(rig: TaskServiceRig) -> None:
    rig.board.fail_names = {"/english_learning/shadowing/lessons/unit01/02.mp3"}
    _start(rig)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")))
    failed = _task_events(rig, "step.failed")
    assert [e["step_index"] for e in failed] == [1]
    snap = rig.metrics.snapshot()
    assert snap['snlpgw_runtime_step_failures_total{reason="audio.failed"}'] == 1.0
    assert len(rig.board.times_of("PLAY_MEDIA")) == 4


async def test_a_clip_without_any_text_plays_and_submits_no_expected_text(
    rig: TaskServiceRig, fast_catalog: Path
) -> None:
    """SPEC 2.5(d): no transcript, no .txt, no sentence → expected_text None; playback as usual."""
    rig.mqtt.deliver(
        f"snlpgw/v1/ctl/{DEV}",
        {"v": 1, "id": "r2", "action": "start", "app_id": "english_learning",
         "task_id": "shadowing", "lesson_id": "bare"},
    )  # fmt: skip
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "window.opened")))
    rig.svc.on_speech_started(DEV, "u1")
    rig.svc.on_speech_stopped(DEV, "u1", b"\x01\x00" * 800, 50)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")))
    assert rig.assessment.submitted[0]["expected_text"] is None
    assert len(rig.board.times_of("PLAY_MEDIA")) == 2
    assert all(s.expected_text is None for s in rig.recorder.steps)


async def test_an_utterance_cut_by_the_window_close_keeps_its_step(rig: TaskServiceRig) -> None:
    _start(rig)
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "window.opened")))
    rig.svc.on_speech_started(DEV, "u1")
    await rig.mqtt.wait_for(lambda: len(_task_events(rig, "step.played")) == 2)
    rig.svc.on_speech_stopped(DEV, "u1", b"\x01\x00" * 800, 50)  # flushed after the close
    started = _task_events(rig, "speech.started")
    stopped = _task_events(rig, "speech.stopped")
    assert [e["step_index"] for e in started] == [0]
    assert [e["step_index"] for e in stopped] == [0]
    assert stopped[0]["instance_id"] == started[0]["instance_id"]


@dataclass
class KeptAnswers:
    """The learning record's archive: what it was handed."""

    kept: list[tuple[str, int, tuple[bytes, ...]]] = field(default_factory=list)

    def submit(
        self, *, device: str, instance_id: str, step_index: int, packets: Sequence[bytes]
    ) -> None:
        self.kept.append((instance_id, step_index, tuple(packets)))


async def test_a_window_captured_under_voice_overload_is_archived_and_stored_shed(
    fast_catalog: Path,
) -> None:
    mqtt, board, assessment = FakePublisher(), FakeBoard(), FakeAssessment()
    mic, archive = FakeMic(capture=(b"o1", b"o2")), KeptAnswers()
    async with running_tasks(
        fast_catalog, mqtt, Metrics(), board, min_window_ms=100,
        mic=mic, recorder=FakeRecorder(), assessment=assessment, archive=archive,
    ):  # fmt: skip
        mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "r1", "action": "start",
                     "app_id": "english_learning", "task_id": "shadowing",
                     "lesson_id": "unit01"})  # fmt: skip
        await mqtt.wait_for(lambda: any(e["event"] == "instance.completed"
                                        for e in mqtt.bodies("/task/" + DEV)))  # fmt: skip
        instance_id = str(mqtt.bodies("/task/" + DEV)[0]["instance_id"])
    assert (DEV, True) in mic.calls
    assert all(shed for (_, on), shed in zip(mic.calls, mic.sheddable, strict=True) if on)
    # Every window was captured: its packets kept for its own step, the step shed, the
    # clips still played on the timer (four steps, four windows).
    assert archive.kept == [(instance_id, i, (b"o1", b"o2")) for i in range(4)]
    assert [(j["instance_id"], j["step_index"], j["reason"]) for j in assessment.shed] == [
        (instance_id, i, "voice_overload") for i in range(4)
    ]
    assert assessment.shed[0]["methods"] == ("text_similarity_v0",)
    assert assessment.submitted == []
    assert len(board.times_of("PLAY_MEDIA")) == 4


async def test_a_window_the_asr_cannot_take_is_captured_archived_and_stored_asr_saturated(
    fast_catalog: Path,
) -> None:
    """Decode on demand: each window claims the ASR's room as it opens; refused, it is only
    captured, archived and stored shed ``asr_saturated``; a kept claim is released at close."""
    mqtt, board = FakePublisher(), FakeBoard()
    mic, archive = FakeMic(unclaimed=(b"c1",)), KeptAnswers()
    assessment = FakeAssessment(refuse_first=2)  # then the ASR has room again
    async with running_tasks(
        fast_catalog, mqtt, Metrics(), board, min_window_ms=100,
        mic=mic, recorder=FakeRecorder(), assessment=assessment, archive=archive,
    ):  # fmt: skip
        mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", {"v": 1, "id": "r1", "action": "start",
                     "app_id": "english_learning", "task_id": "shadowing",
                     "lesson_id": "unit01"})  # fmt: skip
        await mqtt.wait_for(lambda: bool(_events_of(mqtt, "instance.completed")))
        instance_id = str(mqtt.bodies("/task/" + DEV)[0]["instance_id"])
    assert assessment.claims == [DEV] * 4
    assert archive.kept == [(instance_id, i, (b"c1",)) for i in range(2)]
    assert [(j["step_index"], j["reason"]) for j in assessment.shed] == [
        (0, "asr_saturated"), (1, "asr_saturated")
    ]  # fmt: skip
    assert assessment.released == [DEV] * 2  # the two kept claims, none of the refused
    assert len(board.times_of("PLAY_MEDIA")) == 4


def _events_of(mqtt: FakePublisher, event: str) -> list[dict[str, object]]:
    return [e for e in mqtt.bodies("/task/" + DEV) if e["event"] == event]


async def test_full_actor_table_evicts_idle_then_refuses(rig: TaskServiceRig) -> None:
    rig.svc._table._max_devices = 3
    _start(rig)  # DEV runs a lesson: never evicted
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.started")))
    fakes = [f"aa_bb_cc_dd_ff_{i:02x}" for i in range(4)]
    for fake in fakes[:2]:
        rig.svc.on_button(fake, "short")  # handled at once: an idle actor each
    rig.svc.on_button(fakes[2], "short")  # full: the least recently used idle one goes
    assert list(rig.svc._actors) == [DEV, fakes[1], fakes[2]]
    rig.svc.on_button(fakes[3], "short")
    assert list(rig.svc._actors) == [DEV, fakes[2], fakes[3]]
    for fake in fakes[2:]:  # busy now: a lesson each
        body = {"v": 1, "id": f"r-{fake}", "action": "start", "app_id": "english_learning",
                "task_id": "shadowing", "lesson_id": "unit01"}  # fmt: skip
        rig.mqtt.deliver(f"snlpgw/v1/ctl/{fake}", body)
    await rig.mqtt.wait_for(
        lambda: all(rig.svc._actors[f].runtime.instance is not None for f in fakes[2:])
    )
    rig.svc.on_button("aa_bb_cc_dd_ff_99", "short")  # nobody idle now: refused, counted
    assert "aa_bb_cc_dd_ff_99" not in rig.svc._actors
    snap = rig.metrics.snapshot()
    assert snap["snlpgw_runtime_devices_evicted_total"] == 2.0
    assert snap["snlpgw_runtime_devices_refused_total"] == 1.0
    await rig.mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")))


async def test_presence_memory_is_bounded(rig: TaskServiceRig) -> None:
    rig.svc._table._max_devices = 3
    for i in range(10):
        rig.svc.on_presence(f"aa_bb_cc_dd_ff_{i:02x}", online=False)
    assert list(rig.svc._table.online) == [f"aa_bb_cc_dd_ff_{i:02x}" for i in (7, 8, 9)]


@pytest.mark.parametrize(
    ("response_topic", "answered_there"),
    [
        ("snlpgw/v1/reply/app-42", True),
        ("snlpgw/v1/reply/#", False),  # a wildcard: the broker would disconnect the gateway
        ("snlpgw/v1/reply/+", False),
        ("snlp/v1/aa_bb_cc_dd_ee_02/cmd", False),  # another tree: a board's command topic
        ("snlpgw/v1/reply/a/b", False),
        ("snlpgw/v1/reply/", False),
    ],
)
async def test_a_response_topic_is_answered_only_inside_the_reply_tree(
    rig: TaskServiceRig, response_topic: str, answered_there: bool
) -> None:
    body = {"v": 1, "id": "rt1", "action": "stop"}  # nothing runs: refused, answered
    rig.mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", body, response_topic=response_topic)
    await rig.mqtt.wait_for(lambda: bool(rig.mqtt.bodies("/reply/" + DEV)))
    there = [p for p in rig.mqtt.sent if p.topic == response_topic]
    assert bool(there) is answered_there
    invalid = rig.metrics.snapshot().get('snlpgw_ctl_invalid_total{reason="response_topic"}', 0)
    assert invalid == (0.0 if answered_there else 1.0)
