"""Pause that keeps a repeater's loops (D14), volume and speed (D12, D1) and the board's key
(D9): the pure runtime's side."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tasks.core import (
    AudioPhase,
    ButtonPress,
    CommandOutcome,
    ControlAction,
    ControlRefusal,
    ControlReply,
    ControlRequest,
    DeliveryResult,
    Ignored,
    InstanceState,
    PlaybackEvent,
    Presence,
    PublishTaskEvent,
    ReturnToChat,
    RuntimeState,
    StoreInstance,
    TaskDef,
)
from gateway.tasks.core.rules import clamp_speed, loops_left

from .helpers import PATH, REPEATER, SHADOWING, Driver, catalog, commands, of, played

A = ControlAction
CLIP = "/english_learning/repeater/lessons/unit01/01.mp3"
# The repeater with a known clip length: 1000 ms a loop, 3 loops.
TIMED_REPEATER: dict[str, Any] = {
    **REPEATER,
    "lessons": [{"lesson_id": "unit01", "clips": ["01.mp3"], "durations_ms": {"01.mp3": 1000}}],
}


def req(
    action: ControlAction, task: str = "repeater", priority: int = 3, **kw: Any
) -> ControlRequest:
    kw.setdefault("app_id", "english_learning")
    kw.setdefault("task_id", task)
    return ControlRequest(action, f"r-{action}-{priority}", priority=priority, **kw)


def reply(effects: list[Any]) -> ControlReply:
    return of(ControlReply, effects)[0]


def events(effects: list[Any]) -> list[str]:
    return [e.event for e in of(PublishTaskEvent, effects)]


def repeater(**task: Any) -> Driver:
    return Driver(catalog=catalog({**TIMED_REPEATER, **task}, SHADOWING))


def test_loops_left_rule() -> None:
    assert loops_left(3, 0, 1000) == 3
    assert loops_left(3, 999, 1000) == 3
    assert loops_left(3, 1500, 1000) == 2
    assert loops_left(3, 2999, 1000) == 1
    assert loops_left(3, 5000, 1000) == 1  # never fewer than the one playing
    assert loops_left(3, 1500, None) == 3  # a loop's length unknown: all of them
    assert loops_left(3, 1500, 0) == 3


def test_speed_is_clamped() -> None:
    assert [clamp_speed(x) for x in (0.1, 0.5, 1.3, 2.0, 9.0)] == [0.5, 0.5, 1.3, 2.0, 2.0]


def test_pause_sends_audio_pause_and_resume_audio_resume_keeping_the_play() -> None:
    d = repeater()
    d.at(0, req(A.START))
    play = d.last_play()
    assert play.params["repeat"] == 3
    d.at(100, PlaybackEvent(AudioPhase.STARTED, play.command_id))
    out = d.at(1600, req(A.PAUSE))
    assert reply(out).accepted
    assert [c.cmd for c in commands(out)] == ["AUDIO_PAUSE"]
    assert of(StoreInstance, out)[0].record.state is InstanceState.PAUSED
    inst = d.rt.instance
    assert inst is not None
    assert inst.loops_left == 2  # 1500 ms of 3 x 1000 ms played
    assert d.at(1650, PlaybackEvent(AudioPhase.PAUSED, play.command_id)) == []
    assert d.at(1700, CommandOutcome(commands(out)[0].command_id, DeliveryResult.ACKED)) == []
    out = d.at(5000, req(A.RESUME))
    assert [c.cmd for c in commands(out)] == ["AUDIO_RESUME"]
    assert d.rt.state is RuntimeState.PLAYING
    assert d.rt.next_deadline() == 5000 + 2 * 1000 + 500  # the loops left + grace
    out = d.at(6600, PlaybackEvent(AudioPhase.COMPLETED, play.command_id, None, 3000))
    assert events(out)[-1] == "instance.completed"
    assert len(commands(d.log, "PLAY_MEDIA")) == 1  # never replayed


def test_a_board_rejecting_audio_pause_gets_stop_and_a_replay_of_the_loops_left() -> None:
    d = repeater()
    d.at(0, req(A.START))
    first = d.last_play()
    d.at(100, PlaybackEvent(AudioPhase.STARTED, first.command_id))
    pause = commands(d.at(1600, req(A.PAUSE)), "AUDIO_PAUSE")[0]
    out = d.at(1700, CommandOutcome(pause.command_id, DeliveryResult.REJECTED))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    assert d.rt.audio_pause is False
    stopped = PlaybackEvent(AudioPhase.STOPPED, first.command_id, CLIP, 1600)
    assert of(Ignored, d.at(1750, stopped))[0].reason == "stop requested by the gateway"
    out = d.at(3000, req(A.RESUME))
    assert [(c.cmd, c.params.get("repeat")) for c in commands(out)] == [("PLAY_MEDIA", 2)]
    # the next pause on this device: STOP_MEDIA at once, the count goes on shrinking
    second = d.last_play()
    d.at(3100, PlaybackEvent(AudioPhase.STARTED, second.command_id))
    out = d.at(4200, req(A.PAUSE))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    out = d.at(4300, req(A.RESUME))
    assert [c.params.get("repeat") for c in commands(out, "PLAY_MEDIA")] == [1]


def test_a_rejected_audio_resume_replays_the_loops_left() -> None:
    d = repeater()
    d.at(0, req(A.START))
    play = d.last_play()
    d.at(100, PlaybackEvent(AudioPhase.STARTED, play.command_id))
    d.at(1200, req(A.PAUSE))
    resume = commands(d.at(2000, req(A.RESUME)), "AUDIO_RESUME")[0]
    out = d.at(2100, CommandOutcome(resume.command_id, DeliveryResult.EXPIRED))
    assert [(c.cmd, c.params.get("repeat")) for c in commands(out)] == [
        ("STOP_MEDIA", None),
        ("PLAY_MEDIA", 2),
    ]
    assert d.rt.audio_pause is True  # not delivered is not "lacks it"


def test_the_play_ending_before_the_pause_took_steps_on_at_resume() -> None:
    d = Driver()
    d.at(0, req(A.START, task="shadowing"))
    play = d.last_play()
    d.at(500, req(A.PAUSE, task="shadowing"))
    assert d.at(510, PlaybackEvent(AudioPhase.COMPLETED, play.command_id, None, 2000)) == []
    assert d.rt.state is RuntimeState.PAUSED
    out = d.at(9000, req(A.RESUME, task="shadowing"))
    assert [c.cmd for c in commands(out)] == ["LISTEN_START"]  # its window, no replay
    assert d.rt.state is RuntimeState.LISTENING


def test_an_end_held_while_paused_survives_a_rejected_audio_pause() -> None:
    d = Driver()
    d.at(0, req(A.START, task="shadowing"))
    play = d.last_play()
    pause = commands(d.at(500, req(A.PAUSE, task="shadowing")), "AUDIO_PAUSE")[0]
    d.at(510, PlaybackEvent(AudioPhase.FAILED, play.command_id))  # ended before the pause
    d.at(520, CommandOutcome(pause.command_id, DeliveryResult.REJECTED))
    out = d.at(900, req(A.RESUME, task="shadowing"))
    assert events(out)[-2:] == ["step.failed", "step.played"]  # never stuck in PLAYING
    assert played(out) == [PATH + "02.mp3"]


def test_stop_while_the_board_holds_a_paused_play_stops_it() -> None:
    d = repeater()
    d.at(0, req(A.START))
    d.at(500, req(A.PAUSE))
    out = d.at(600, req(A.STOP))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    assert d.rt.state is RuntimeState.IDLE


def test_offline_while_paused_forgets_the_held_play_and_replays_the_loops_left() -> None:
    d = repeater()
    d.at(0, req(A.START))
    d.at(100, PlaybackEvent(AudioPhase.STARTED, d.last_play().command_id))
    d.at(1600, req(A.PAUSE))
    d.at(1700, Presence(online=False))
    d.at(1800, Presence(online=True))
    out = d.at(1900, req(A.RESUME))
    assert [(c.cmd, c.params.get("repeat")) for c in commands(out)] == [("PLAY_MEDIA", 2)]


def test_an_audio_pause_lost_with_the_board_sends_nothing_more() -> None:
    d = repeater()
    d.at(0, req(A.START))
    pause = commands(d.at(500, req(A.PAUSE)), "AUDIO_PAUSE")[0]
    d.at(600, Presence(online=False))
    assert commands(d.at(700, CommandOutcome(pause.command_id, DeliveryResult.EXPIRED))) == []
    d.at(800, Presence(online=True))
    assert [c.cmd for c in commands(d.at(900, req(A.RESUME)))] == ["PLAY_MEDIA"]


def test_offline_mid_loop_resumes_with_the_loops_left() -> None:
    d = repeater()
    d.at(0, req(A.START))
    d.at(100, PlaybackEvent(AudioPhase.STARTED, d.last_play().command_id))
    assert commands(d.at(2200, Presence(online=False))) == []
    out = d.at(3000, Presence(online=True))
    assert [c.params.get("repeat") for c in commands(out, "PLAY_MEDIA")] == [1]


def test_board_side_pause_does_not_count_as_played() -> None:
    d = repeater()
    d.at(0, req(A.START))
    ref = d.last_play().command_id
    d.at(100, PlaybackEvent(AudioPhase.STARTED, ref, None, 1000))
    d.at(600, PlaybackEvent(AudioPhase.PAUSED, ref))  # e.g. the board's own TTS
    d.at(9600, PlaybackEvent(AudioPhase.RESUMED, ref))
    d.at(10_200, req(A.PAUSE))  # 500 + 600 ms played
    inst = d.rt.instance
    assert inst is not None
    assert inst.loops_left == 2


def test_volume_and_speed_defaults_params_and_control() -> None:
    d = repeater(volume=40, speed=3.0)
    d.at(0, req(A.START))
    assert d.last_play().params == {"name": CLIP, "repeat": 3, "volume": 40, "speed": 2.0}
    assert d.rt.next_deadline() == 3 * 500 + 500  # a loop at speed 2 lasts 500 ms
    out = d.at(10, req(A.VOLUME, params={"volume": 70}))
    assert reply(out).accepted
    assert events(out) == ["volume.set"]
    assert reply(d.at(20, req(A.VOLUME, params={"volume": 101}))).reason is (ControlRefusal.INVALID)
    assert reply(d.at(20, req(A.VOLUME, params={}))).reason is ControlRefusal.INVALID
    d.rt.audio_pause = False
    d.at(30, req(A.PAUSE))
    d.at(50, req(A.RESUME))
    assert d.last_play().params["volume"] == 70


def test_start_params_volume_and_speed() -> None:
    d = repeater()
    out = d.at(0, req(A.START, params={"volume": 10, "speed": 0.1}))
    assert d.last_play().params == {"name": CLIP, "repeat": 3, "volume": 10, "speed": 0.5}
    assert of(StoreInstance, out)[0].record.params["speed"] == 0.5
    for bad in ({"volume": 101}, {"volume": 5.5}, {"speed": 0}, {"speed": True}):
        d = repeater()
        assert reply(d.at(0, req(A.START, params=bad))).reason is ControlRefusal.INVALID


def test_volume_needs_an_instance() -> None:
    d = repeater()
    out = d.at(0, req(A.VOLUME, params={"volume": 5}))
    assert reply(out).reason is ControlRefusal.NO_INSTANCE


@pytest.mark.parametrize("bad", [{"volume": 101}, {"volume": -1}, {"speed": 0}])
def test_catalog_refuses_bad_volume_and_speed(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"volume|speed"):
        TaskDef.model_validate({**TIMED_REPEATER, **bad})


# -- the key (D9) -----------------------------------------------------------------------------


def test_short_press_in_a_window_confirms_it() -> None:
    d = Driver()
    d.at(0, req(A.START, task="shadowing"))
    d.complete(1000)
    out = d.at(1500, ButtonPress("short"))
    assert events(out)[:2] == ["window.confirmed", "window.closed"]
    assert [c.cmd for c in commands(out)] == ["LISTEN_STOP", "PLAY_MEDIA"]
    assert played(out) == [PATH + "02.mp3"]


def test_double_press_pauses_and_resumes_short_resumes_too() -> None:
    d = repeater()
    d.at(0, req(A.START))
    out = d.at(100, ButtonPress("double"))
    assert [c.cmd for c in commands(out)] == ["AUDIO_PAUSE"]
    assert d.rt.state is RuntimeState.PAUSED
    out = d.at(200, ButtonPress("double"))
    assert [c.cmd for c in commands(out)] == ["AUDIO_RESUME"]
    d.at(300, ButtonPress("double"))
    out = d.at(400, ButtonPress("short"))
    assert [c.cmd for c in commands(out)] == ["AUDIO_RESUME"]


def test_keys_do_not_resume_an_offline_pause() -> None:
    d = repeater()
    d.at(0, req(A.START))
    d.at(100, Presence(online=False))
    assert of(Ignored, d.at(200, ButtonPress("double"))) != []
    assert d.rt.state is RuntimeState.PAUSED


@pytest.mark.parametrize(("setting", "listen"), [("chat", True), ("idle", False)])
def test_long_press_stops_back_to_chat_or_idle(setting: str, listen: bool) -> None:
    d = repeater(buttons={"long": setting})
    d.at(0, req(A.START))
    out = d.at(100, ButtonPress("long"))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    assert of(StoreInstance, out)[0].record.reason == "button"
    assert of(ReturnToChat, out)[0].listen is listen


def test_catalog_refuses_an_unknown_long_press_setting() -> None:
    with pytest.raises(ValueError, match="buttons"):
        TaskDef.model_validate({**TIMED_REPEATER, "buttons": {"long": "reboot"}})


def test_skip_key_skips_the_clip_and_the_window() -> None:
    d = Driver()
    d.at(0, req(A.START, task="shadowing"))
    out = d.at(100, ButtonPress("short", "skip"))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA", "PLAY_MEDIA"]
    assert "step.skipped" in events(out)
    assert played(out) == [PATH + "02.mp3"]
    d.complete(500)
    out = d.at(600, ButtonPress("short", "next"))
    assert events(out)[0] == "step.skipped"
    assert played(out) == [PATH + "03.mp3"]
    d.at(700, req(A.PAUSE, task="shadowing"))
    assert of(Ignored, d.at(800, ButtonPress("short", "skip"))) != []


def test_presses_without_a_task_or_with_nothing_to_do_are_ignored() -> None:
    d = Driver()
    assert of(Ignored, d.at(0, ButtonPress("short"))) != []
    d.at(0, req(A.START, task="shadowing"))
    assert of(Ignored, d.at(10, ButtonPress("short"))) != []  # playing: no window to confirm
    assert of(Ignored, d.at(20, ButtonPress("double", "skip"))) == []  # double: a pause
    assert d.rt.state is RuntimeState.PAUSED
