"""The task DSL in the catalog (issue #27): a task with each step type loads; a bad one is
refused with its file, JSON path and field; clock-stepped tasks are untouched."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.tasks.core import (
    CatalogError,
    ControlAction,
    ControlRefusal,
    ControlReply,
    ControlRequest,
    Ignored,
    InstanceState,
    Presence,
    ReturnToChat,
    RunSteps,
    RuntimeState,
    SendCommand,
    StepsFinished,
    StoreInstance,
    catalog_check_main,
    load_catalog,
    restore_runtime,
)
from gateway.tasks.core.steps import GenerateStepDef, PlayAudioStepDef

from .helpers import SHADOWING, Driver, catalog, of

REPO = Path(__file__).parents[4]

EVERY_STEP: dict[str, Any] = {
    "app_id": "games",
    "task_id": "every_step",
    "interaction_mode": "STEPS",
    "assessment": {"timing": "inline", "methods": []},
    "generator": {"kind": "arithmetic_10"},
    "lessons": [{"lesson_id": "l1", "clips": ["intro.mp3"]}],
    "steps": [
        {"type": "indicate", "state": "TASK_RUNNING"},
        {"type": "speak", "text": "Hello", "voice": "en"},
        {"type": "play_audio", "clip": "intro.mp3"},
        {"type": "wait", "ms": 500},
        {"type": "listen", "window_ms": 3000},
        {"type": "sound", "name": "ding"},
        {"type": "generate", "rounds": 2},
        {"type": "stop"},
    ],
}


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def with_(**changes: Any) -> dict[str, Any]:
    return {**EVERY_STEP, **changes}


def test_a_task_with_each_step_type_loads(tmp_path: Path) -> None:
    task = load_catalog(write(tmp_path, EVERY_STEP)).catalog.get("games", "every_step")
    assert task is not None
    assert [s.type for s in task.steps] == [
        "indicate",
        "speak",
        "play_audio",
        "wait",
        "listen",
        "sound",
        "generate",
        "stop",
    ]
    assert isinstance(task.steps[2], PlayAudioStepDef)
    assert isinstance(task.steps[6], GenerateStepDef)
    assert task.steps[6].window_ms == 6000
    assert task.assessment.timing == "inline"


def test_catalog_check_lists_the_steps(tmp_path: Path) -> None:
    out = io.StringIO()
    assert catalog_check_main(write(tmp_path, EVERY_STEP), out=out) == 0
    assert (
        "assessment=inline steps: indicate, speak, play_audio, wait, listen, sound, "
        "generate(2 rounds), stop" in out.getvalue()
    )


def test_the_shipped_catalog_loads_the_three_tasks() -> None:
    cat = load_catalog(REPO / "catalog").catalog
    for task_id in ("reverse_digits", "arithmetic_10", "idiom_chain"):
        task = cat.get("thinking_games", task_id)
        assert task is not None
        assert task.interaction_mode == "STEPS"
        assert task.assessment.timing == "inline"
    shadowing = cat.get("english_learning", "shadowing")
    assert shadowing is not None
    assert shadowing.assessment.timing == "post"


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (
            with_(steps=[{"type": "speak", "text": "hi", "txt": "hi"}]),
            "$.steps[0].speak.txt",
            "Extra inputs",
        ),
        (with_(steps=[{"type": "dance"}]), "$.steps[0]", "'dance'"),
        (with_(steps=[{"type": "wait", "ms": 0}]), "$.steps[0].wait.ms", "greater than 0"),
        (
            with_(steps=[{"type": "speak", "text": "hi", "voice": "fr"}]),
            "$.steps[0].speak.voice",
            "'en' or 'zh'",
        ),
        (with_(steps=[{"type": "sound", "name": "boom"}]), "$.steps[0].sound.name", "ding"),
        (with_(assessment={"timing": "later"}), "$.assessment.timing", "'post' or 'inline'"),
        (with_(steps=[]), "$", "steps: a STEPS task needs at least one step"),
        (with_(generator=None), "$", "generator: a `generate` step needs"),
        (with_(assessment={"timing": "post"}), "$", "assessment.timing: generated"),
        (
            with_(generator={"kind": "reverse_digits", "start_length": 5, "max_length": 4}),
            "$",
            "generator.start_length",
        ),
        (
            with_(steps=[{"type": "play_audio", "clip": "nope.mp3"}]),
            "$",
            "steps[0].clip: 'nope.mp3' is not a clip of lesson l1",
        ),
        (with_(generator={"kind": "chess"}), "$.generator.kind", "reverse_digits"),
        ({**SHADOWING, "steps": [{"type": "stop"}]}, "$", "steps and generator need"),
        ({**SHADOWING, "assessment": {"timing": "inline"}}, "$", "timing inline needs"),
    ],
)
def test_a_bad_task_names_the_field(
    tmp_path: Path, data: dict[str, Any], path: str, fragment: str
) -> None:
    with pytest.raises(CatalogError) as info:
        load_catalog(write(tmp_path, data))
    (issue,) = info.value.issues
    assert issue.path == path
    assert fragment in issue.message


def start_steps(drv: Driver, now: float = 0) -> list[Any]:
    request = ControlRequest(ControlAction.START, "r1", app_id="games", task_id="every_step")
    return drv.at(now, request)


def test_the_runtime_hosts_a_steps_instance_for_its_interpreter() -> None:
    drv = Driver(catalog=catalog(SHADOWING, EVERY_STEP))
    out = start_steps(drv)
    (answer,) = of(ControlReply, out)
    assert answer.accepted
    assert out[-1] == RunSteps("i1")
    assert drv.rt.state is RuntimeState.SCRIPTED
    assert drv.rt.next_deadline() is None
    assert not of(SendCommand, out)  # the interpreter, not the clock, sends its commands
    for action in (ControlAction.PAUSE, ControlAction.RESUME):
        (refused,) = of(ControlReply, drv.at(1, ControlRequest(action, "p")))
        assert refused.reason is ControlRefusal.INVALID
    assert drv.at(2, Presence(online=False)) == []
    assert drv.at(3, Presence(online=True)) == []
    assert drv.tick(4) == []
    assert of(Ignored, drv.at(5, StepsFinished("other")))
    out = drv.at(6, StepsFinished("i1"))
    (ended,) = of(StoreInstance, out)
    assert ended.record.state is InstanceState.COMPLETED
    assert out[-1] == ReturnToChat("i1")
    assert drv.rt.state is RuntimeState.IDLE
    assert of(Ignored, drv.at(7, StepsFinished("i1")))


def test_a_steps_instance_stops_like_any_other() -> None:
    drv = Driver(catalog=catalog(SHADOWING, EVERY_STEP))
    start_steps(drv)
    out = drv.at(1, ControlRequest(ControlAction.STOP, "s"))
    assert not of(SendCommand, out)
    assert of(StoreInstance, out)[0].record.reason == "stopped"
    assert out[-1] == ReturnToChat("i1")


def test_a_stored_steps_instance_is_not_resumed_after_a_restart() -> None:
    drv = Driver(catalog=catalog(SHADOWING, EVERY_STEP))
    record = of(StoreInstance, start_steps(drv))[0].record
    runtime, effects = restore_runtime(
        record, [], catalog(SHADOWING, EVERY_STEP), online=True, now_ms=10
    )
    assert runtime.instance is None
    assert of(StoreInstance, effects)[0].record.reason == "gateway_restart"


def test_a_steps_start_keeps_its_seed_and_only_steps_tasks_take_one() -> None:
    drv = Driver(catalog=catalog(SHADOWING, EVERY_STEP))
    request = ControlRequest(
        ControlAction.START, "r1", app_id="games", task_id="every_step", params={"seed": 42}
    )
    record = of(StoreInstance, drv.at(0, request))[0].record
    assert record.params["seed"] == 42
    drv = Driver(catalog=catalog(SHADOWING, EVERY_STEP))
    bad = ControlRequest(
        ControlAction.START,
        "r2",
        app_id="english_learning",
        task_id="shadowing",
        params={"seed": 42},
    )
    (refused,) = of(ControlReply, drv.at(0, bad))
    assert refused.reason is ControlRefusal.INVALID
