"""Pause that keeps a repeater's loops (spec D14), volume/speed on PLAY_MEDIA (D12, D1) and the
board's key (D9), end to end: a real broker, the composed gateway, the board simulator.

No timing assertions: waits are on the board's events and the task events. One test must let
the board play past its first loop before pausing (a sleep well inside the second loop).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.tasks.core import RuntimeState
from tests.support.broker import Broker
from tests.support.lesson_rig import REPO, LessonRig, lesson_rig

pytestmark = pytest.mark.integration

REPEATER_CLIP = "/english_learning/repeater/lessons/unit01/01.mp3"


def catalog(tmp: Path, *, loop_ms: int, window_ms: int = 300, **repeater: Any) -> Path:
    """The demo catalog: the repeater's clip ``loop_ms`` long (the gateway knows it too), its
    settings overridden by ``repeater``; the shadowing lesson's windows at least ``window_ms``."""
    entries = json.loads((REPO / "catalog/english_learning.json").read_text(encoding="utf-8"))
    for entry in entries:
        if entry["task_id"] == "repeater":
            entry["lessons"][0]["durations_ms"] = {"01.mp3": loop_ms}
            entry.update(repeater)
        else:
            entry["min_window_ms"] = window_ms
            entry["lessons"][0]["durations_ms"] = dict.fromkeys(entry["lessons"][0]["clips"], 300)
    path = tmp / "keys-catalog.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def sent(rig: LessonRig, evt: str) -> list[dict[str, Any]]:
    return [e for e in rig.board.sent_events if e["evt"] == evt]


async def board_sent(rig: LessonRig, evt: str, count: int = 1) -> list[dict[str, Any]]:
    return await rig.watch.until(
        lambda: found if len(found := sent(rig, evt)) >= count else None,
        f"{count}x {evt} from the board",
    )


def idle(rig: LessonRig) -> bool:
    runtime = rig.runtime()
    return runtime is not None and runtime.state is RuntimeState.IDLE


async def test_pause_and_resume_keep_the_boards_loop(broker: Broker, tmp_path: Path) -> None:
    loop_ms = 400
    path = catalog(tmp_path, loop_ms=loop_ms, volume=30, speed=5)
    async with lesson_rig(
        broker,
        tmp_path,
        board_durations={REPEATER_CLIP: loop_ms},
        runtime={"catalog_path": path},
    ) as rig:
        iid = (await rig.start(task="repeater"))["instance_id"]
        (play,) = await rig.wait_command("PLAY_MEDIA")
        # the task's volume, its speed clamped (not refused), the repeat N on the board
        assert play.body["params"] == {
            "name": REPEATER_CLIP,
            "repeat": 3,
            "volume": 30,
            "speed": 2.0,
            "power_off_after": False,
        }
        await board_sent(rig, "audio.started")
        assert (await rig.request("pause", priority=3))["status"] == "accepted"
        await rig.wait_command("AUDIO_PAUSE")
        await board_sent(rig, "audio.paused")
        assert (await rig.request("volume", params={"volume": 55}))["status"] == "accepted"
        await rig.wait_event("volume.set", instance_id=iid)
        assert (await rig.request("resume", priority=3))["status"] == "accepted"
        await rig.wait_command("AUDIO_RESUME")
        completed = await rig.wait_event("instance.completed", instance_id=iid)
        assert completed is not None
        assert len(rig.commands("PLAY_MEDIA")) == 1  # the board kept its loop: no replay
        assert rig.commands("STOP_MEDIA") == []
        (done,) = sent(rig, "audio.completed")
        assert done["data"]["duration_ms"] == 3 * loop_ms // 2  # all three loops at speed 2


async def test_a_board_without_audio_pause_replays_only_the_loops_left(
    broker: Broker, tmp_path: Path
) -> None:
    loop_ms = 1500
    path = catalog(tmp_path, loop_ms=loop_ms)
    async with lesson_rig(
        broker,
        tmp_path,
        board_durations={REPEATER_CLIP: loop_ms},
        board_lacks=frozenset({"AUDIO_PAUSE", "AUDIO_RESUME"}),
        runtime={"catalog_path": path},
    ) as rig:
        iid = (await rig.start(task="repeater"))["instance_id"]
        await rig.wait_command("PLAY_MEDIA")
        await board_sent(rig, "audio.started")
        await asyncio.sleep(loop_ms * 1.5 / 1000)  # into the second loop of three
        assert (await rig.request("pause", priority=3))["status"] == "accepted"
        await rig.wait_command("AUDIO_PAUSE")  # rejected: the board lacks it
        await rig.wait_command("STOP_MEDIA")  # today's way instead
        await board_sent(rig, "audio.stopped")
        await rig.wait_event("instance.paused", instance_id=iid)
        assert (await rig.request("volume", params={"volume": 55}))["status"] == "accepted"
        assert (await rig.request("resume", priority=3))["status"] == "accepted"
        plays = await rig.wait_command("PLAY_MEDIA", 2)
        assert [p.body["params"]["repeat"] for p in plays] == [3, 2]  # the loops left, not N
        assert plays[1].body["params"]["volume"] == 55  # the volume set while paused
        # the device is known now: the next pause is a STOP_MEDIA at once
        await board_sent(rig, "audio.started", 2)
        assert (await rig.request("pause", priority=3))["status"] == "accepted"
        await rig.wait_command("STOP_MEDIA", 2)
        assert len(rig.commands("AUDIO_PAUSE")) == 1
        assert (await rig.request("stop", priority=3))["status"] == "accepted"
        await rig.wait_event("instance.cancelled", instance_id=iid)
        assert rig.board.stats["ack_rejected"] == 1


async def test_double_press_pauses_and_resumes(broker: Broker, tmp_path: Path) -> None:
    loop_ms = 600
    path = catalog(tmp_path, loop_ms=loop_ms)
    async with lesson_rig(
        broker, tmp_path, board_durations={REPEATER_CLIP: loop_ms}, runtime={"catalog_path": path}
    ) as rig:
        iid = (await rig.start(task="repeater"))["instance_id"]
        await board_sent(rig, "audio.started")
        rig.board.press_button("double")
        await rig.wait_event("instance.paused", instance_id=iid)
        await board_sent(rig, "audio.paused")
        rig.board.press_button("double")
        await rig.wait_event("instance.resumed", instance_id=iid)
        await board_sent(rig, "audio.resumed")
        await rig.wait_event("instance.completed", instance_id=iid)
        assert len(rig.commands("PLAY_MEDIA")) == 1


async def test_short_press_confirms_the_open_window(broker: Broker, tmp_path: Path) -> None:
    path = catalog(tmp_path, loop_ms=300, window_ms=60_000)  # only a press closes it
    async with lesson_rig(broker, tmp_path, runtime={"catalog_path": path}) as rig:
        iid = (await rig.start())["instance_id"]
        await rig.wait_event("window.opened", 0, instance_id=iid)
        rig.board.press_button("short")
        await rig.wait_event("window.confirmed", 0, instance_id=iid)
        closed = await rig.wait_event("window.closed", 0, instance_id=iid)
        assert closed.data["actual_close_ms"] < closed.data["planned_close_ms"]
        await rig.wait_event("step.played", 1, instance_id=iid)
        plays = await rig.wait_command("PLAY_MEDIA", 2)
        assert plays[1].body["params"]["name"].endswith("/02.mp3")
        await rig.request("stop")


async def test_skip_key_skips_the_playing_clip(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=(60_000, 300, 300, 300)) as rig:
        iid = (await rig.start())["instance_id"]
        await board_sent(rig, "audio.started")
        rig.board.press_button("short", key="skip")
        await rig.wait_event("step.skipped", 0, instance_id=iid)
        await rig.wait_command("STOP_MEDIA")
        await rig.wait_event("step.played", 1, instance_id=iid)
        assert rig.find_event("window.opened", 0, instance_id=iid) is None
        await rig.wait_event("instance.completed", instance_id=iid)


async def test_long_press_set_to_idle_stops_the_task(broker: Broker, tmp_path: Path) -> None:
    loop_ms = 60_000
    path = catalog(tmp_path, loop_ms=loop_ms, buttons={"long": "idle"})
    async with lesson_rig(
        broker, tmp_path, board_durations={REPEATER_CLIP: loop_ms}, runtime={"catalog_path": path}
    ) as rig:
        iid = (await rig.start(task="repeater"))["instance_id"]
        await board_sent(rig, "audio.started")
        rig.board.press_button("long")
        cancelled = await rig.wait_event("instance.cancelled", instance_id=iid)
        assert cancelled.data == {"reason": "button"}
        await rig.wait_command("STOP_MEDIA")
        await board_sent(rig, "audio.stopped")
        assert idle(rig)
