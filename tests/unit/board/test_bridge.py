"""BoardCommands / BoardToTasks: the board channel seen through the task shell's ports (fake
edges)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.board.bridge import BoardCommands, BoardToTasks
from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent
from tests.unit.board.fakes import DEV, make_rig


@dataclass
class FakeTasks:
    events: list[tuple[str, PlaybackEvent]] = field(default_factory=list)
    buttons: list[tuple[str, str, str | None]] = field(default_factory=list)
    presences: list[tuple[str, bool]] = field(default_factory=list)

    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.events.append((device, event))

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.buttons.append((device, kind, key))

    def presence(self, device: str, online: bool) -> None:
        self.presences.append((device, online))


async def test_commands_and_outcomes_through_the_port() -> None:
    rig = make_rig(max_resends=0)
    bridge = BoardCommands(rig.channel)
    rig.hb()
    outcomes: list[DeliveryResult] = []
    for i, cmd in enumerate(("PLAY_MEDIA", "STOP_MEDIA")):
        params = {"name": "a.mp3"} if cmd == "PLAY_MEDIA" else {}
        bridge.send_command(
            DEV, command_id=f"rt-{i}", cmd=cmd, params=params, prio=3, on_outcome=outcomes.append
        )
    rig.ack("rt-0", "duplicate")
    rig.advance(3.0)  # rt-1: no ack, no resends left
    bridge.send_command(
        DEV, command_id="rt-2", cmd="PLAY_MEDIA", params={}, prio=3, on_outcome=outcomes.append
    )
    cancelled: list[DeliveryResult] = []
    bridge.send_command(
        DEV, command_id="rt-3", cmd="STOP_MEDIA", params={}, prio=3, on_outcome=cancelled.append
    )
    rig.channel._devices[DEV].futures["rt-3"].cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert outcomes == [DeliveryResult.ACKED, DeliveryResult.FAILED, DeliveryResult.FAILED]
    assert cancelled == [DeliveryResult.FAILED]
    assert rig.commands()[0]["id"] == "rt-0"


async def test_events_buttons_and_presence_reach_the_task_shell() -> None:
    tasks = FakeTasks()
    rig = make_rig(also=BoardToTasks(tasks))
    rig.hb()
    rig.deliver(
        DEV,
        "evt",
        {
            "ref": "c1",
            "evt": "audio.completed",
            "data": {"name": "a.mp3", "duration_ms": 2140, "reason": "eof"},
        },
    )
    rig.deliver(DEV, "evt", {"evt": "button", "data": {"press": "long"}})
    rig.deliver(DEV, "evt", {"evt": "button", "data": {"press": "short", "key": "skip"}})
    rig.deliver(DEV, "evt", {"evt": "app_task.state", "data": {"state": "running"}})
    rig.deliver(DEV, "status", {"online": False})
    assert tasks.events == [
        (
            DEV,
            PlaybackEvent(
                AudioPhase.COMPLETED, ref="c1", name="a.mp3", duration_ms=2140, reason="eof"
            ),
        )
    ]
    assert tasks.buttons == [(DEV, "long", None), (DEV, "short", "skip")]
    assert tasks.presences == [(DEV, True), (DEV, False)]


async def test_first_play_leaves_right_behind_its_app_dirs() -> None:
    rig = make_rig()
    bridge = BoardCommands(rig.channel)
    rig.hb()
    outcomes: list[DeliveryResult] = []
    bridge.send_command(
        DEV,
        command_id="play-1",
        cmd="PLAY_MEDIA",
        params={"name": "/english/shadowing/lessons/u1/01.mp3"},
        prio=2,
        on_outcome=outcomes.append,
    )
    ensure, play = rig.commands()  # pipelined: no wait for ENSURE_APP_DIRS's ack
    assert (ensure["cmd"], ensure["params"]["app"]) == ("ENSURE_APP_DIRS", "english")
    assert play["id"] == "play-1"
    rig.ack("play-1")
    await asyncio.sleep(0)
    assert outcomes == [DeliveryResult.ACKED]
