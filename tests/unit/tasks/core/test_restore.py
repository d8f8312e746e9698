"""Resume after a gateway restart: continue at the step whose window had not closed, or cancel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.tasks.core import (
    ControlAction,
    ControlRequest,
    IllegalEvent,
    InstanceColumns,
    InstanceState,
    Presence,
    RuntimeConfig,
    RuntimeState,
    StepColumns,
    StoreInstance,
    restore_runtime,
)
from gateway.tasks.core.restore import last_activity_ms, resume_index

from .helpers import PATH, catalog, commands, of, played

CFG = RuntimeConfig(offline_grace_ms=60_000)
INST = InstanceColumns(
    "i7",
    "dev",
    "english_learning",
    "shadowing",
    "unit01",
    "SHADOWING",
    3,
    "mqtt",
    InstanceState.RUNNING,
    None,
    created_ms=1_000_000,
    params={"listen_ratio": 1.5, "repeat": 1, "start_step": 0},
)


def step(i: int, **kw: int | str) -> StepColumns:
    return replace(StepColumns("i7", i, f"{PATH}0{i + 1}.mp3", None), **kw)  # type: ignore[arg-type]


DONE0 = step(
    0,
    played_ms=1_000_000,
    completed_ms=1_002_000,
    window_opened_ms=1_002_000,
    window_closed_ms=1_005_000,
)
OPEN1 = step(1, played_ms=1_005_000, completed_ms=1_006_000, window_opened_ms=1_006_000)
FAILED1 = step(1, played_ms=1_005_000, failure="audio.failed")
PLAYING1 = step(1, played_ms=1_005_000)


@pytest.mark.parametrize(
    ("steps", "index"),
    [((), 0), ((DONE0,), 1), ((DONE0, OPEN1), 1), ((DONE0, PLAYING1), 1), ((DONE0, FAILED1), 2)],
)
def test_resume_index(steps: tuple[StepColumns, ...], index: int) -> None:
    assert resume_index(INST, steps) == index


def test_resume_index_from_start_step_and_repeater() -> None:
    assert resume_index(replace(INST, params={"start_step": 2}), ()) == 2
    assert resume_index(replace(INST, params={"start_step": "x"}), ()) == 0
    rep = replace(INST, mode="PLAY_AUDIO")
    assert resume_index(rep, (step(0, completed_ms=5),)) == 1


def test_last_activity() -> None:
    assert last_activity_ms(INST, ()) == 1_000_000
    assert last_activity_ms(INST, (DONE0, OPEN1)) == 1_006_000


def test_online_within_grace_replays_the_open_step() -> None:
    # now (monotonic 50_000) + offset = epoch 1_050_000: 44 s after the last activity
    rt, out = restore_runtime(
        INST,
        (DONE0, OPEN1),
        catalog(),
        online=True,
        now_ms=50_000,
        wall_offset_ms=1_000_000,
        config=CFG,
    )
    assert played(out) == [PATH + "02.mp3"]
    assert of(StoreInstance, out)[0].record.state is InstanceState.RUNNING
    assert rt.state is RuntimeState.PLAYING
    assert rt.instance is not None
    assert rt.instance.ratio == 1.5


@pytest.mark.parametrize(("online", "now"), [(False, 50_000), (True, 66_001)])
def test_offline_or_stale_is_cancelled_gateway_restart(online: bool, now: int) -> None:
    rt, out = restore_runtime(
        INST,
        (DONE0, OPEN1),
        catalog(),
        online=online,
        now_ms=now,
        wall_offset_ms=1_000_000,
        config=CFG,
    )
    (rec,) = of(StoreInstance, out)
    assert (rec.record.state, rec.record.reason, rec.record.ended_ms) == (
        InstanceState.CANCELLED,
        "gateway_restart",
        now + 1_000_000,
    )
    assert commands(out) == []
    assert rt.state is RuntimeState.IDLE


def test_task_gone_from_catalog_is_cancelled() -> None:
    gone = replace(INST, task_id="removed")
    _, out = restore_runtime(gone, (), catalog(), online=True, now_ms=0, wall_offset_ms=1_000_000)
    assert of(StoreInstance, out)[0].record.reason == "gateway_restart"


def test_all_steps_done_completes() -> None:
    last = step(3, window_closed_ms=1_005_000)
    rt, out = restore_runtime(
        INST, (last,), catalog(), online=True, now_ms=0, wall_offset_ms=1_005_000
    )
    assert [r.record.state for r in of(StoreInstance, out)] == [
        InstanceState.RUNNING,
        InstanceState.COMPLETED,
    ]
    assert rt.state is RuntimeState.IDLE


def test_offline_paused_instance_is_treated_as_running() -> None:
    paused = replace(
        INST,
        state=InstanceState.PAUSED,
        reason="offline",
        params={"listen_ratio": "bad", "repeat": "bad"},
    )
    rt, out = restore_runtime(
        paused, (), catalog(), online=True, now_ms=0, wall_offset_ms=1_000_000
    )
    assert played(out) == [PATH + "01.mp3"]
    assert rt.instance is not None
    assert (rt.instance.ratio, rt.instance.repeat) == (1.5, 1)  # task defaults


@pytest.mark.parametrize("online", [True, False])
def test_control_paused_instance_stays_paused(online: bool) -> None:
    paused = replace(INST, state=InstanceState.PAUSED, reason="paused")
    rt, out = restore_runtime(
        paused, (DONE0,), catalog(), online=online, now_ms=0, wall_offset_ms=9e9, config=CFG
    )
    assert commands(out) == []
    assert rt.state is RuntimeState.PAUSED
    assert rt.next_deadline() == (None if online else 60_000)
    if not online:
        rt.handle(Presence(online=True), 1)
    resumed = rt.handle(ControlRequest(ControlAction.RESUME, "r"), 2)
    assert played(resumed) == [PATH + "02.mp3"]


def test_control_paused_listen_task_reopens_its_whole_window() -> None:
    paused = replace(
        INST,
        task_id="listen",
        lesson_id="free",
        mode="LISTEN",
        state=InstanceState.PAUSED,
        reason="paused",
    )
    rt, _ = restore_runtime(paused, (), catalog(), online=True, now_ms=100, wall_offset_ms=0)
    out = rt.handle(ControlRequest(ControlAction.RESUME, "r"), 200)
    assert [c.cmd for c in commands(out)] == ["LISTEN_START"]
    assert rt.next_deadline() == 3200


@pytest.mark.parametrize("state", [InstanceState.COMPLETED, InstanceState.CANCELLED])
def test_finished_instances_are_not_restorable(state: InstanceState) -> None:
    with pytest.raises(ValueError, match="not resumable"):
        restore_runtime(replace(INST, state=state), (), catalog(), online=True, now_ms=0)


def test_adopt_needs_an_idle_runtime() -> None:
    rt, _ = restore_runtime(INST, (), catalog(), online=True, now_ms=0, wall_offset_ms=1_000_000)
    assert rt.instance is not None
    with pytest.raises(IllegalEvent, match="in state PLAYING"):
        rt.adopt(rt.instance, 1, paused=False)
