"""Repeater (PLAY_AUDIO) and LISTEN tasks."""

from __future__ import annotations

from gateway.tasks.core import (
    AudioPhase,
    ControlAction,
    ControlRequest,
    InstanceState,
    PlaybackEvent,
    PublishTaskEvent,
    ReturnToChat,
    RuntimeState,
    StoreInstance,
    SubmitUtterance,
    UtteranceStarted,
    UtteranceStopped,
)

from .helpers import Driver, commands, of


def start(task: str, **params: object) -> ControlRequest:
    return ControlRequest(
        ControlAction.START, "r", "english_learning", task, None, priority=1, params=params
    )


def test_repeater_is_one_play_with_repeat_and_one_completion() -> None:
    d = Driver()
    out = d.at(0, start("repeater"))
    (play,) = commands(out)
    assert (play.cmd, play.params["repeat"], play.prio) == ("PLAY_MEDIA", 3, 1)
    assert d.rt.next_deadline() == 120_000  # duration unknown: the maximum
    started = PlaybackEvent(AudioPhase.STARTED, play.command_id, None, 2000)
    d.at(10, started)
    assert d.rt.next_deadline() == 10 + 3 * 2000 + 500
    out = d.at(6000, PlaybackEvent(AudioPhase.COMPLETED, play.command_id, None, 2000))
    assert commands(out) == []  # no window, no second play
    assert of(StoreInstance, out)[0].record.state is InstanceState.COMPLETED
    assert of(ReturnToChat, out) == [ReturnToChat("i1")]
    assert len(commands(d.log, "PLAY_MEDIA")) == 1


def test_repeater_repeat_parameter() -> None:
    d = Driver()
    assert commands(d.at(0, start("repeater", repeat=5)))[0].params["repeat"] == 5


def test_listen_task_is_one_window() -> None:
    d = Driver()
    out = d.at(0, start("listen"))
    assert [c.cmd for c in commands(out)] == ["LISTEN_START"]
    assert d.rt.state is RuntimeState.LISTENING
    assert d.rt.next_deadline() == 3000
    d.at(100, UtteranceStarted("u1"))
    assert of(SubmitUtterance, d.at(900, UtteranceStopped("u1"))) == [
        SubmitUtterance("i1", 0, "u1")
    ]
    out = d.tick(3000)
    assert [c.cmd for c in commands(out)] == ["LISTEN_STOP"]
    assert [p.event for p in of(PublishTaskEvent, out)] == ["window.closed", "instance.completed"]
    assert d.rt.state is RuntimeState.IDLE
