"""Control requests, priorities, pause/resume, board presence and contract violations."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tasks.core import (
    AudioPhase,
    ControlAction,
    ControlRefusal,
    ControlReply,
    ControlRequest,
    IllegalEvent,
    InstanceState,
    PlaybackEvent,
    Presence,
    RuntimeState,
    StoreInstance,
    StoreStep,
    SubmitUtterance,
    TimerFired,
    UtteranceStarted,
)

from .helpers import PATH, Driver, commands, of, played

A = ControlAction


def req(action: ControlAction, priority: int = 3, **kw: Any) -> ControlRequest:
    kw.setdefault("app_id", "english_learning")
    kw.setdefault("task_id", "shadowing")
    return ControlRequest(action, f"r-{action}-{priority}", priority=priority, **kw)


def reply(effects: list[Any]) -> ControlReply:
    return of(ControlReply, effects)[0]


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (req(A.START, task_id="nope"), ControlRefusal.UNKNOWN_TASK),
        (req(A.START, lesson_id="unit99"), ControlRefusal.UNKNOWN_TASK),
        (ControlRequest(A.START, "r"), ControlRefusal.UNKNOWN_TASK),
        (req(A.START, priority=4), ControlRefusal.INVALID),
        (req(A.STOP, priority=0), ControlRefusal.INVALID),
        (req(A.START, params={"listen_ratio": 0}), ControlRefusal.INVALID),
        (req(A.START, params={"listen_ratio": True}), ControlRefusal.INVALID),
        (req(A.START, params={"repeat": 0}), ControlRefusal.INVALID),
        (req(A.START, params={"start_step": 4}), ControlRefusal.INVALID),
        (req(A.START, params={"colour": "red"}), ControlRefusal.INVALID),
        (req(A.PAUSE), ControlRefusal.NO_INSTANCE),
        (req(A.RESUME), ControlRefusal.NO_INSTANCE),
        (req(A.STOP), ControlRefusal.NO_INSTANCE),
        (req(A.RESTART), ControlRefusal.NO_INSTANCE),
    ],
)
def test_refusals_when_idle(request_: ControlRequest, reason: ControlRefusal) -> None:
    d = Driver()
    out = d.at(0, request_)
    assert out == [of(ControlReply, out)[0]]
    r = reply(out)
    assert (r.accepted, r.reason, r.running_priority) == (False, reason, None)
    assert d.rt.state is RuntimeState.IDLE


def test_start_params_are_applied() -> None:
    d = Driver()
    out = d.at(0, req(A.START, params={"listen_ratio": 9, "start_step": 2}))
    assert played(out) == [PATH + "03.mp3"]
    d.complete(100, duration_ms=1000)
    assert d.rt.next_deadline() == 100 + 1500  # ratio clamped to 1.5
    (rec,) = of(StoreInstance, out)
    assert rec.record.params == {"listen_ratio": 1.5, "repeat": 1, "start_step": 2}


def test_start_refused_while_offline() -> None:
    d = Driver(online=False)
    assert reply(d.at(0, req(A.START))).reason is ControlRefusal.DEVICE_OFFLINE
    d.at(1, Presence(online=True))
    assert reply(d.at(2, req(A.START))).accepted


@pytest.mark.parametrize(
    ("running", "requested", "wins"),
    [(1, 1, True), (1, 3, True), (2, 2, True), (3, 2, False), (2, 1, False)],
)
def test_priority_preemption(running: int, requested: int, wins: bool) -> None:
    d = Driver()
    d.at(0, req(A.START, priority=running, source="scheduler"))
    out = d.at(10, req(A.START, priority=requested, task_id="repeater"))
    r = reply(out)
    if wins:
        assert (r.accepted, r.instance_id) == (True, "i2")
        stored = [s.record for s in of(StoreInstance, out)]
        assert [(x.instance_id, x.state, x.reason) for x in stored] == [
            ("i1", InstanceState.CANCELLED, "preempted"),
            ("i2", InstanceState.RUNNING, None),
        ]
        assert [c.cmd for c in commands(out)] == ["STOP_MEDIA", "PLAY_MEDIA"]
    else:
        assert (r.accepted, r.reason, r.running_priority) == (False, ControlRefusal.BUSY, running)
        assert commands(out) == []
        assert d.rt.instance is not None
        assert d.rt.instance.id == "i1"


@pytest.mark.parametrize("action", [A.PAUSE, A.RESUME, A.STOP, A.RESTART])
def test_lower_priority_control_is_busy_and_wrong_instance_is_no_instance(action: A) -> None:
    d = Driver()
    d.at(0, req(A.START, priority=2))
    r = reply(d.at(1, req(action, priority=1)))
    assert (r.reason, r.running_priority) == (ControlRefusal.BUSY, 2)
    assert reply(d.at(2, req(action, instance_id="zzz"))).reason is ControlRefusal.NO_INSTANCE
    assert d.rt.state is RuntimeState.PLAYING


def test_stop_cancels_timer_and_media() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.complete(1000)
    out = d.at(1500, req(A.STOP, instance_id="i1"))
    assert reply(out).accepted
    assert [c.cmd for c in commands(out)] == ["LISTEN_STOP"]
    assert of(StoreInstance, out)[0].record.reason == "stopped"
    assert d.rt.next_deadline() is None


def test_restart_begins_a_new_instance_from_step_zero() -> None:
    d = Driver()
    d.at(0, req(A.START, params={"start_step": 1}))
    out = d.at(100, req(A.RESTART))
    r = reply(out)
    assert (r.accepted, r.action, r.instance_id) == (True, "restart", "i2")
    assert [(s.record.instance_id, s.record.reason) for s in of(StoreInstance, out)] == [
        ("i1", "restarted"),
        ("i2", None),
    ]
    assert played(out) == [PATH + "01.mp3"]
    # the board's stop of the old clip (same name, no ref) is not a failure of the new one
    d.at(150, PlaybackEvent(AudioPhase.STOPPED, None, PATH + "02.mp3"))
    assert d.rt.state is RuntimeState.PLAYING


def test_pause_mid_window_keeps_the_remaining_time() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.complete(1000)  # window 1000 .. 4000
    d.at(1500, UtteranceStarted("u1"))
    out = d.at(2500, req(A.PAUSE))
    assert reply(out).accepted
    assert [c.cmd for c in commands(out)] == ["LISTEN_STOP"]
    assert of(SubmitUtterance, out) == [SubmitUtterance("i1", 0, "u1", truncated=True)]
    assert of(StoreInstance, out)[0].record.state is InstanceState.PAUSED
    assert d.rt.state is RuntimeState.PAUSED
    assert d.rt.next_deadline() is None
    assert d.tick(4000) == []  # frozen
    assert reply(d.at(5000, req(A.PAUSE))).accepted  # idempotent
    out = d.at(60_000, req(A.RESUME))
    assert reply(out).accepted
    assert [c.cmd for c in commands(out)] == ["LISTEN_START"]
    assert d.rt.next_deadline() == 60_000 + 1500
    assert played(d.tick(61_500)) == [PATH + "02.mp3"]


def test_pause_while_playing_replays_the_clip_on_resume_on_a_board_without_audio_pause() -> None:
    d = Driver()
    d.rt.audio_pause = False  # learnt from an earlier rejected AUDIO_PAUSE
    d.at(0, req(A.START))
    old = d.last_play().command_id
    out = d.at(500, req(A.PAUSE))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    d.at(600, PlaybackEvent(AudioPhase.STOPPED, old))  # the stop we asked for
    assert reply(d.at(700, req(A.RESUME, priority=3))).accepted
    assert played(d.log[-10:]) == [PATH + "01.mp3"]
    assert d.last_play().command_id != old
    assert reply(d.at(800, req(A.RESUME))).reason is ControlRefusal.INVALID  # not paused


def test_offline_then_back_within_grace_replays_the_unopened_clip() -> None:
    d = Driver()
    d.at(0, req(A.START))
    out = d.at(500, Presence(online=False))
    assert commands(out) == []  # nothing to send to an absent board
    assert of(StoreInstance, out)[0].record.reason == "offline"
    assert d.rt.next_deadline() == 500 + 60_000
    assert reply(d.at(600, req(A.RESUME))).reason is ControlRefusal.DEVICE_OFFLINE
    out = d.at(30_000, Presence(online=True))
    assert played(out) == [PATH + "01.mp3"]
    assert of(StoreInstance, out)[0].record.state is InstanceState.RUNNING
    assert d.at(30_001, Presence(online=True)) == []  # repeated presence: nothing


def test_offline_mid_window_resumes_the_remaining_window() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.complete(1000)  # window closes at 4000
    d.at(3000, Presence(online=False))
    out = d.at(9000, Presence(online=True))
    assert [c.cmd for c in commands(out)] == ["LISTEN_START"]
    assert d.rt.next_deadline() == 10_000
    steps = [s.record for s in of(StoreStep, out)]
    assert steps[-1].window_opened_ms == 1000  # the window's first opening is kept


def test_offline_past_grace_cancels() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.at(500, Presence(online=False))
    assert d.tick(60_499) == []
    out = d.tick(60_500)
    assert of(StoreInstance, out)[0].record.reason == "offline"
    assert commands(out) == []
    assert d.rt.state is RuntimeState.IDLE


def test_offline_while_paused_by_control_starts_the_grace() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.at(100, req(A.PAUSE))
    assert d.at(200, Presence(online=False)) == []
    assert d.rt.next_deadline() == 60_200
    assert d.at(300, Presence(online=True)) == []  # still paused by control
    assert d.rt.state is RuntimeState.PAUSED
    assert d.rt.next_deadline() is None
    d.at(400, Presence(online=False))
    out = d.tick(60_400)
    assert of(StoreInstance, out)[0].record.reason == "offline"


def test_control_pause_of_an_offline_paused_instance_waits_for_resume() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.at(100, Presence(online=False))
    assert reply(d.at(200, req(A.PAUSE))).accepted
    assert d.at(300, Presence(online=True)) == []
    assert d.rt.state is RuntimeState.PAUSED
    assert played(d.at(400, req(A.RESUME))) == [PATH + "01.mp3"]


def test_restart_refused_while_offline_keeps_the_instance() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.at(100, Presence(online=False))
    assert reply(d.at(200, req(A.RESTART))).reason is ControlRefusal.DEVICE_OFFLINE
    assert d.rt.instance is not None


def test_stop_while_offline_sends_nothing() -> None:
    d = Driver()
    d.at(0, req(A.START))
    d.at(100, Presence(online=False))
    d.at(150, Presence(online=False))
    out = d.at(200, req(A.STOP))
    assert commands(out) == []
    assert of(StoreInstance, out)[0].record.reason == "stopped"


def test_presence_when_idle_is_remembered() -> None:
    d = Driver()
    assert d.at(0, Presence(online=False)) == []
    assert reply(d.at(1, req(A.START))).reason is ControlRefusal.DEVICE_OFFLINE


def test_time_going_backwards_names_the_state() -> None:
    d = Driver()
    d.at(100, req(A.START))
    with pytest.raises(IllegalEvent, match=r"time went backwards .* in state PLAYING"):
        d.at(99, TimerFired())


def test_a_non_event_names_the_state() -> None:
    d = Driver()
    with pytest.raises(IllegalEvent, match=r"not a runtime event: str in state IDLE") as info:
        d.rt.handle("audio.completed", 0)  # type: ignore[arg-type]
    assert info.value.state is RuntimeState.IDLE


def _in_state(state: str) -> Driver:
    """A runtime brought to ``state`` by events (the running instance is i1, priority 2)."""
    d = Driver(online=state != "idle-offline")
    if state.startswith("idle"):
        return d
    d.at(0, req(A.START, priority=2))
    if state in ("paused-by-control", "paused-both"):
        d.at(1, req(A.PAUSE, priority=2))
    if state in ("paused-offline", "paused-both"):
        d.at(2, Presence(online=False))
    return d


STATES = ["idle", "idle-offline", "playing", "paused-by-control", "paused-offline", "paused-both"]
ASKED = [
    req(A.START, priority=2),
    req(A.START, priority=1),
    req(A.START, priority=4),
    req(A.START, task_id="nope"),
    req(A.START, params={"repeat": 0}),
    req(A.RESTART, priority=2),
    req(A.RESTART, priority=1),
    req(A.RESTART, instance_id="zzz"),
    req(A.RESUME, priority=2),
    req(A.RESUME, priority=1),
    req(A.RESUME, priority=2, instance_id="i1"),
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("request_", ASKED, ids=lambda r: f"{r.action}-{r.priority}")
def test_would_refuse_says_what_handling_the_request_answers(
    state: str, request_: ControlRequest
) -> None:
    d = _in_state(state)
    predicted = d.rt.would_refuse(request_)
    assert predicted is not reply(d.at(10, request_)).accepted
