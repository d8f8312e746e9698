"""The SD-less router's shell with hand-written fakes (board sender, SPEAK, task inbox, CHAT's
session events): which way commands go, what reaches the inbox, a clip file that is missing,
and the session fan-out keeping CHAT's hello gate."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.speech.sdless import SdlessCommands, SdlessEvents, SessionFanout, resource_file
from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent
from gateway.xiaozhi.messages import DeviceHello

DEV = "aa_bb"
CLIP = "/app/task/lessons/l1/01.mp3"


class SdlessFakeBoard:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send_command(
        self,
        device: str,
        *,
        command_id: str,
        cmd: str,
        params: Mapping[str, object],
        prio: int,
        on_outcome: Callable[[DeliveryResult], None],
    ) -> None:
        self.sent.append((device, cmd))


class FakeSpeech:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def play_clip(self, dev: str, *, clip_id: str, path: Path, repeat: int = 1) -> None:
        self.calls.append(("play", dev, clip_id, path, repeat))

    def cancel(self, dev: str, speak_id: str) -> None:
        self.calls.append(("cancel", dev, speak_id))


class FakeInbox:
    def __init__(self) -> None:
        self.got: list[tuple[Any, ...]] = []

    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.got.append(("board_event", device, event.kind, event.ref, event.reason))

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.got.append(("button", device, kind, key))

    def presence(self, device: str, online: bool) -> None:
        self.got.append(("presence", device, online))

    def speak_started(self, dev: str, speak_id: str) -> None:
        self.got.append(("speak_started", dev, speak_id))

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        self.got.append(("speak_completed", dev, speak_id, duration_ms))

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        self.got.append(("speak_interrupted", dev, speak_id, reason))


class FakeChat:
    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.calls: list[str] = []

    def holds_hello(self, dev: str, hello: DeviceHello) -> bool:
        return self.hold

    def session_opened(self, dev: str, session_id: str, channel: Any) -> None:
        self.calls.append("opened")

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        self.calls.append("closed")

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        self.calls.append("listen")

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        self.calls.append("abort")

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        self.calls.append("mcp")


class SdlessHalves:
    """Both halves, as gateway/app.py builds them."""

    def __init__(self, tmp_path: Path, board: SdlessFakeBoard, speech: FakeSpeech | None) -> None:
        self.inbox = FakeInbox()
        self.events = SdlessEvents(tasks=self.inbox, max_boards=8, max_sessions=8)
        self.commands = SdlessCommands(
            board=board, speech=speech, events=self.events, resource_dir=tmp_path
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)


def rig(
    tmp_path: Path, *, speech: bool = True
) -> tuple[SdlessHalves, SdlessFakeBoard, FakeSpeech, FakeInbox]:
    board, sp = SdlessFakeBoard(), FakeSpeech()
    router = SdlessHalves(tmp_path, board, sp if speech else None)
    return router, board, sp, router.inbox


def send(router: SdlessHalves, cmd: str, params: dict[str, object], got: list[Any]) -> None:
    router.commands.send_command(
        DEV, command_id="c1", cmd=cmd, params=params, prio=1, on_outcome=got.append
    )


def test_resource_file_stays_under_the_directory(tmp_path: Path) -> None:
    (tmp_path / "app/task/lessons/l1").mkdir(parents=True)
    (tmp_path / "app/task/lessons/l1/01.mp3").write_bytes(b"x")
    (tmp_path.parent / "outside.mp3").write_bytes(b"x")
    assert resource_file(tmp_path, CLIP) == (tmp_path / CLIP.lstrip("/")).resolve()
    assert resource_file(tmp_path, "/app/task/lessons/l1/02.mp3") is None
    assert resource_file(tmp_path, "/../outside.mp3") is None


async def test_a_board_device_goes_to_the_board(tmp_path: Path) -> None:
    router, board, sp, inbox = rig(tmp_path)
    router.presence(DEV, True)
    router.session_opened(DEV, "s1")  # a board was seen: it stays the board's
    send(router, "PLAY_MEDIA", {"name": CLIP}, [])
    assert board.sent == [(DEV, "PLAY_MEDIA")]
    assert sp.calls == []
    router.board_event(DEV, PlaybackEvent(AudioPhase.COMPLETED, ref="c1"))
    router.button(DEV, "short", None)
    assert inbox.got == [
        ("presence", DEV, True),
        ("board_event", DEV, AudioPhase.COMPLETED, "c1", None),
        ("button", DEV, "short", None),
    ]


async def test_without_speech_every_device_goes_to_the_board(tmp_path: Path) -> None:
    router, board, _sp, _inbox = rig(tmp_path, speech=False)
    router.session_opened(DEV, "s1")
    send(router, "PLAY_MEDIA", {"name": CLIP}, [])
    assert board.sent == [(DEV, "PLAY_MEDIA")]


async def test_a_voice_only_device_plays_clips_through_speech(tmp_path: Path) -> None:
    (tmp_path / "app/task/lessons/l1").mkdir(parents=True)
    (tmp_path / "app/task/lessons/l1/01.mp3").write_bytes(b"x")
    router, board, sp, inbox = rig(tmp_path)
    router.session_opened(DEV, "s1")
    outcomes: list[DeliveryResult] = []
    send(router, "PLAY_MEDIA", {"name": CLIP, "repeat": 2}, outcomes)
    assert outcomes == []  # answered on the loop, never inside the call
    await asyncio.sleep(0)
    assert outcomes == [DeliveryResult.ACKED]
    assert sp.calls == [("play", DEV, "sdless/c1", (tmp_path / CLIP.lstrip("/")).resolve(), 2)]
    router.speak_started(DEV, "sdless/c1")
    router.speak_completed(DEV, "sdless/c1", 2400)
    router.speak_started(DEV, "q1")  # a speak step's: to the inbox as it is
    router.speak_completed(DEV, "q1", 900)
    router.speak_interrupted(DEV, "q2", "cancelled")
    send(router, "STOP_MEDIA", {}, outcomes)
    router.session_closed(DEV, "s1")
    assert board.sent == []
    assert inbox.got == [
        ("presence", DEV, True),
        ("board_event", DEV, AudioPhase.STARTED, "c1", None),
        ("board_event", DEV, AudioPhase.COMPLETED, "c1", None),
        ("speak_started", DEV, "q1"),
        ("speak_completed", DEV, "q1", 900),
        ("speak_interrupted", DEV, "q2", "cancelled"),
        ("presence", DEV, False),
    ]


async def test_stop_cancels_and_a_missing_file_fails_the_play(tmp_path: Path) -> None:
    router, _board, sp, inbox = rig(tmp_path)
    router.session_opened(DEV, "s1")
    send(router, "PLAY_MEDIA", {"name": CLIP}, [])  # no such file
    assert sp.calls == []
    await asyncio.sleep(0)
    assert inbox.got[-1] == ("board_event", DEV, AudioPhase.FAILED, "c1", "clip_missing")
    (tmp_path / "app/task/lessons/l1").mkdir(parents=True)
    (tmp_path / "app/task/lessons/l1/01.mp3").write_bytes(b"x")
    send(router, "PLAY_MEDIA", {"name": CLIP}, [])
    send(router, "STOP_MEDIA", {}, [])
    assert sp.calls[-1] == ("cancel", DEV, "sdless/c1")
    assert inbox.got[-1] == ("board_event", DEV, AudioPhase.STOPPED, "c1", "stopped")


@pytest.mark.parametrize("hold", [True, False])
def test_the_fanout_tells_both_and_keeps_chats_hello_gate(tmp_path: Path, hold: bool) -> None:
    router, _board, _sp, inbox = rig(tmp_path)
    chat = FakeChat(hold)
    fan = SessionFanout(chat, router.events)
    hello = DeviceHello.model_construct()  # not looked at: only passed on
    assert fan.holds_hello(DEV, hello) is hold
    fan.session_opened(DEV, "s1", None)
    fan.listen(DEV, "s1", "start", "auto", None)
    fan.abort(DEV, "s1", None)
    fan.mcp_message(DEV, {})
    fan.session_closed(DEV, "s1", "goodbye")
    assert chat.calls == ["opened", "listen", "abort", "mcp", "closed"]
    assert inbox.got == [("presence", DEV, True), ("presence", DEV, False)]
    alone = SessionFanout(None, router.events)
    assert alone.holds_hello(DEV, hello) is False
    alone.session_opened(DEV, "s2", None)
    alone.listen(DEV, "s2", "start", None, None)
    alone.abort(DEV, "s2", None)
    alone.mcp_message(DEV, {})
    alone.session_closed(DEV, "s2", "goodbye")
    assert inbox.got[-2:] == [("presence", DEV, True), ("presence", DEV, False)]
