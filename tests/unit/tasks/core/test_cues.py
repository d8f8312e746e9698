"""The task's cues (spec D5 SOUND, D10 INDICATE) at its moments, configured per task."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tasks.core import (
    AudioPhase,
    ControlAction,
    ControlRequest,
    IndicateCue,
    PlaybackEvent,
    Presence,
    RuntimeEffect,
    SendCommand,
    SoundCue,
    TaskDef,
)

from .helpers import REPEATER, SHADOWING, Driver, catalog

A = ControlAction


def req(action: ControlAction, task: str = "shadowing", **kw: Any) -> ControlRequest:
    return ControlRequest(
        action, f"r-{action}", app_id="english_learning", task_id=task, priority=3, **kw
    )


def wire(effects: list[RuntimeEffect]) -> list[str]:
    """What goes to the board, in order: command names, ``SOUND:x`` and ``INDICATE:x``."""
    out = []
    for e in effects:
        if isinstance(e, SendCommand):
            out.append(e.cmd)
        elif isinstance(e, SoundCue):
            out.append(f"SOUND:{e.sound}")
        elif isinstance(e, IndicateCue):
            out.append(f"INDICATE:{e.state}")
    return out


def test_default_cues_at_each_moment_of_a_shadowing_lesson() -> None:
    d = Driver(catalog=catalog(SHADOWING))
    assert wire(d.at(0, req(A.START))) == [
        "INDICATE:TASK_RUNNING",
        "PLAY_MEDIA",
        "INDICATE:PLAYING",
    ]
    assert wire(d.complete(1000)) == ["LISTEN_START", "SOUND:ding", "INDICATE:LISTENING"]
    assert wire(d.tick(4000)) == [
        "LISTEN_STOP",
        "INDICATE:PROCESSING",
        "PLAY_MEDIA",
        "INDICATE:PLAYING",
    ]
    out = d.at(4100, PlaybackEvent(AudioPhase.FAILED, d.last_play().command_id))
    assert wire(out) == ["SOUND:error", "INDICATE:ERROR", "PLAY_MEDIA", "INDICATE:PLAYING"]
    d.complete(5000)
    d.tick(9000)
    d.complete(10_000)
    out = d.tick(20_000)
    assert wire(out) == [
        "LISTEN_STOP",
        "INDICATE:PROCESSING",
        "SOUND:success",
        "INDICATE:TASK_COMPLETE",
    ]
    cue = next(e for e in d.log if isinstance(e, SoundCue))
    assert (cue.prio, cue.instance_id) == (3, "i1")
    refs = [e.command_id for e in d.log if isinstance(e, SendCommand | SoundCue | IndicateCue)]
    assert len(refs) == len(set(refs))  # every command id is new (boards dedup by id)


def test_cues_configured_per_task() -> None:
    cues = {"task_start": "beep", "window_open": None, "window_close": "beep", "indicate": False}
    d = Driver(catalog=catalog({**SHADOWING, "cues": cues}))
    assert wire(d.at(0, req(A.START))) == ["SOUND:beep", "PLAY_MEDIA"]
    assert wire(d.complete(1000)) == ["LISTEN_START"]
    assert wire(d.tick(4000))[:2] == ["LISTEN_STOP", "SOUND:beep"]


def test_a_stopped_task_indicates_idle_and_an_absent_board_gets_no_cues() -> None:
    d = Driver(catalog=catalog(REPEATER))
    d.at(0, req(A.START, task="repeater"))
    assert wire(d.at(10, req(A.STOP, task="repeater"))) == ["STOP_MEDIA", "INDICATE:IDLE"]
    d.at(20, req(A.START, task="repeater"))
    d.at(30, Presence(online=False))
    assert wire(d.at(40, req(A.STOP, task="repeater"))) == []


@pytest.mark.parametrize(
    ("cues", "field"),
    [
        ({"window_open": "trumpet"}, "cues.window_open"),
        ({"indicate": "yes please"}, "cues.indicate"),
        ({"window_opens": "ding"}, "cues.window_opens"),
    ],
)
def test_a_bad_cue_is_a_catalog_error_naming_the_field(cues: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        TaskDef.model_validate({**REPEATER, "cues": cues})
