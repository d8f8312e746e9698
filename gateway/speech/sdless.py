"""Lessons on a device without an SD card: the asyncio shell of :mod:`gateway.speech.sdless_core`.

Two halves around one :class:`~gateway.speech.sdless_core.SdlessRoutes`, built one after the
other (no link made later; gateway/app.py)::

    events = SdlessEvents(tasks=inbox, max_boards=..., max_sessions=...)  # the core's owner
    board = BoardChannel(..., sink=BoardToTasks(events))       # board presence through it
    xiaozhi = XiaozhiChannel(..., events=SessionFanout(chat, events))
    speech = SpeechService(..., sink=events)                   # its clips' results through it
    commands = SdlessCommands(board=BoardCommands(board), speech=speech, events=events,
                              resource_dir=...)
    TaskService(..., commands=commands)                        # the runtime's CommandSender

Per command :class:`SdlessCommands` asks the core which way the device goes: a board's
commands go on to ``BoardCommands`` untouched; a voice-only device's are answered by the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gateway.board.bridge import TaskSinks
from gateway.speech.sdless_core import (
    AnswerCommand,
    CancelClip,
    MediaRoute,
    ReportPlayback,
    SdlessEffect,
    SdlessRoutes,
    StartClip,
    TellPresence,
)
from gateway.speech.service import SpeechSink
from gateway.tasks.core.events import DeliveryResult, PlaybackEvent
from gateway.tasks.ports import CommandSender
from gateway.xiaozhi.messages import DeviceHello
from gateway.xiaozhi.roster import HelloGate, SessionEvents, SessionLink

log = logging.getLogger(__name__)


class ClipPlayer(Protocol):
    """What the commands use of SPEAK (:class:`~gateway.speech.service.SpeechService`)."""

    def play_clip(self, dev: str, *, clip_id: str, path: Path, repeat: int = 1) -> None: ...

    def cancel(self, dev: str, speak_id: str) -> None: ...


class RouterTasks(TaskSinks, SpeechSink, Protocol):
    """The task inbox: board events, buttons, presence and SPEAK's results."""


def resource_file(resource_dir: Path, board_path: str) -> Path | None:
    """The file of a board path ``/{app}/{task}/lessons/{lesson}/{clip}`` under the resource
    directory (the layout ``gateway.content.media`` serves), or None: missing, or outside it."""
    base = resource_dir.resolve()
    target = (base / board_path.lstrip("/")).resolve()
    if not target.is_relative_to(base) or not target.is_file():
        return None
    return target


class SdlessEvents:
    """The event half: the board sink's ``TaskSinks``, SPEAK's ``SpeechSink`` and a listener of
    Xiaozhi sessions (through :class:`SessionFanout`); everything else passes to ``tasks``."""

    def __init__(self, *, tasks: RouterTasks, max_boards: int, max_sessions: int) -> None:
        self.tasks = tasks
        self.core = SdlessRoutes(max_boards=max_boards, max_sessions=max_sessions)

    # -- TaskSinks (the board channel's events) ------------------------------------------------
    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.tasks.board_event(device, event)

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.tasks.button(device, kind, key)

    def presence(self, device: str, online: bool) -> None:
        self.perform(self.core.board_presence(device, online))

    # -- SpeechSink (SPEAK's results: ours become audio.* events) ------------------------------
    def speak_started(self, dev: str, speak_id: str) -> None:
        if self.core.owns_clip(speak_id):
            self.perform(self.core.clip_started(dev, speak_id))
        else:
            self.tasks.speak_started(dev, speak_id)

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        if self.core.owns_clip(speak_id):
            self.perform(self.core.clip_completed(dev, speak_id, duration_ms))
        else:
            self.tasks.speak_completed(dev, speak_id, duration_ms)

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        if self.core.owns_clip(speak_id):
            self.perform(self.core.clip_interrupted(dev, speak_id, reason))
        else:
            self.tasks.speak_interrupted(dev, speak_id, reason)

    # -- Xiaozhi sessions ----------------------------------------------------------------------
    def session_opened(self, dev: str, session_id: str) -> None:
        self.perform(self.core.session_opened(dev))

    def session_closed(self, dev: str, session_id: str) -> None:
        self.perform(self.core.session_closed(dev))

    def perform(self, effects: list[SdlessEffect]) -> None:
        """The effects that reach the task inbox (the others are the commands' own)."""
        for effect in effects:
            match effect:
                case TellPresence(device=dev, online=online):
                    self.tasks.presence(dev, online)
                case ReportPlayback(device=dev, event=event):
                    self.tasks.board_event(dev, event)
                case _:
                    pass


class SdlessCommands:
    """The command half: the task runtime's ``CommandSender`` in front of ``board`` (the board
    channel's ``BoardCommands``), choosing per device (``speech`` None: every device's go on)."""

    def __init__(
        self,
        *,
        board: CommandSender,
        speech: ClipPlayer | None,
        events: SdlessEvents,
        resource_dir: Path,
    ) -> None:
        self.board = board
        self.speech = speech
        self.events = events
        self.resource_dir = Path(resource_dir)

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
        core, speech = self.events.core, self.speech
        if speech is None or core.route(device) is MediaRoute.BOARD:
            self.board.send_command(
                device,
                command_id=command_id,
                cmd=cmd,
                params=params,
                prio=prio,
                on_outcome=on_outcome,
            )
            return
        loop = asyncio.get_running_loop()
        for effect in core.command(device, command_id, cmd, dict(params)):
            match effect:
                case AnswerCommand(outcome=outcome):  # on the loop, as a board's ack comes
                    loop.call_soon(on_outcome, outcome)
                case StartClip(device=dev, clip_id=clip_id, name=name, repeat=repeat):
                    path = resource_file(self.resource_dir, name)
                    if path is None:
                        log.warning("%s: lesson clip %s has no file in the resources", dev, name)
                        loop.call_soon(self.events.speak_interrupted, dev, clip_id, "clip_missing")
                    else:
                        speech.play_clip(dev, clip_id=clip_id, path=path, repeat=repeat)
                case CancelClip(device=dev, clip_id=clip_id):
                    speech.cancel(dev, clip_id)
                case _:
                    self.events.perform([effect])


class SessionFanout:
    """The Xiaozhi channel's ``SessionEvents``: everything to ``primary`` (CHAT, or nobody),
    and sessions opening/closing also to :class:`SdlessEvents`. Keeps CHAT's hello gate."""

    def __init__(self, primary: SessionEvents | None, router: SdlessEvents) -> None:
        self.primary = primary
        self.router = router

    def holds_hello(self, dev: str, hello: DeviceHello) -> bool:
        primary = self.primary
        return isinstance(primary, HelloGate) and primary.holds_hello(dev, hello)

    def session_opened(self, dev: str, session_id: str, channel: SessionLink) -> None:
        self.router.session_opened(dev, session_id)
        if self.primary is not None:
            self.primary.session_opened(dev, session_id, channel)

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        self.router.session_closed(dev, session_id)
        if self.primary is not None:
            self.primary.session_closed(dev, session_id, reason)

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        if self.primary is not None:
            self.primary.listen(dev, session_id, state, mode, text)

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        if self.primary is not None:
            self.primary.abort(dev, session_id, reason)

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        if self.primary is not None:
            self.primary.mcp_message(dev, payload)
