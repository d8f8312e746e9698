"""Lessons on a device without an SD card: the asyncio shell of :mod:`gateway.speech.sdless_core`.

:class:`SdlessRouter` sits between the task runtime and the board channel, and between SPEAK
and the task inbox. Wiring (``gateway.app``), built once::

    router = SdlessRouter(tasks=inbox, resource_dir=..., max_boards=..., max_sessions=...)
    board = BoardChannel(..., sink=BoardToTasks(router))      # board presence through it
    xiaozhi = XiaozhiChannel(..., events=SessionFanout(chat, router))
    speech = SpeechService(..., sink=router)                  # its clips' results through it
    router.connect(board=BoardCommands(board), speech=speech)
    TaskService(..., commands=router)                         # the runtime's CommandSender

Per command it asks the core which way the device goes: a board's commands go on to
``BoardCommands`` untouched; a voice-only device's are answered by the core's effects.
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
    """What the router uses of SPEAK (:class:`~gateway.speech.service.SpeechService`)."""

    def play_clip(self, dev: str, *, clip_id: str, path: Path) -> None: ...

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


class SdlessRouter:
    """The runtime's ``CommandSender``, the board sink's ``TaskSinks``, SPEAK's ``SpeechSink``
    and a listener of Xiaozhi sessions (through :class:`SessionFanout`)."""

    def __init__(
        self, *, tasks: RouterTasks, resource_dir: Path, max_boards: int, max_sessions: int
    ) -> None:
        self.tasks = tasks
        self.resource_dir = Path(resource_dir)
        self.core = SdlessRoutes(max_boards=max_boards, max_sessions=max_sessions)
        self._board: CommandSender | None = None
        self._speech: ClipPlayer | None = None

    def connect(self, *, board: CommandSender, speech: ClipPlayer | None) -> None:
        """The board channel's sender and SPEAK (None: disabled, every device has a board)."""
        self._board, self._speech = board, speech

    # -- CommandSender -------------------------------------------------------------------------
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
        board = self._board
        if board is None:
            raise RuntimeError("SdlessRouter.connect was not called")
        if self._speech is None or self.core.route(device) is MediaRoute.BOARD:
            board.send_command(
                device,
                command_id=command_id,
                cmd=cmd,
                params=params,
                prio=prio,
                on_outcome=on_outcome,
            )
            return
        self._perform(self.core.command(device, command_id, cmd, dict(params)), on_outcome)

    # -- TaskSinks (the board channel's events) ------------------------------------------------
    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.tasks.board_event(device, event)

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.tasks.button(device, kind, key)

    def presence(self, device: str, online: bool) -> None:
        self._perform(self.core.board_presence(device, online))

    # -- SpeechSink (SPEAK's results: ours become audio.* events) ------------------------------
    def speak_started(self, dev: str, speak_id: str) -> None:
        if self.core.owns_clip(speak_id):
            self._perform(self.core.clip_started(dev, speak_id))
        else:
            self.tasks.speak_started(dev, speak_id)

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        if self.core.owns_clip(speak_id):
            self._perform(self.core.clip_completed(dev, speak_id, duration_ms))
        else:
            self.tasks.speak_completed(dev, speak_id, duration_ms)

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        if self.core.owns_clip(speak_id):
            self._perform(self.core.clip_interrupted(dev, speak_id, reason))
        else:
            self.tasks.speak_interrupted(dev, speak_id, reason)

    # -- Xiaozhi sessions ----------------------------------------------------------------------
    def session_opened(self, dev: str, session_id: str) -> None:
        self._perform(self.core.session_opened(dev))

    def session_closed(self, dev: str, session_id: str) -> None:
        self._perform(self.core.session_closed(dev))

    # -- effects -------------------------------------------------------------------------------
    def _perform(
        self,
        effects: list[SdlessEffect],
        on_outcome: Callable[[DeliveryResult], None] | None = None,
    ) -> None:
        for effect in effects:
            match effect:
                case TellPresence(device=dev, online=online):
                    self.tasks.presence(dev, online)
                case ReportPlayback(device=dev, event=event):
                    self.tasks.board_event(dev, event)
                case AnswerCommand(outcome=outcome) if on_outcome is not None:
                    asyncio.get_running_loop().call_soon(on_outcome, outcome)
                case StartClip(device=dev, clip_id=clip_id, name=name):
                    self._start(dev, clip_id, name)
                case CancelClip(device=dev, clip_id=clip_id) if self._speech is not None:
                    self._speech.cancel(dev, clip_id)
                case _:
                    pass

    def _start(self, dev: str, clip_id: str, name: str) -> None:
        path = resource_file(self.resource_dir, name)
        if path is None or self._speech is None:
            log.warning("%s: no file for lesson clip %s under the resource directory", dev, name)
            loop = asyncio.get_running_loop()  # like SPEAK's own results: never inside the call
            loop.call_soon(self.speak_interrupted, dev, clip_id, "clip_missing")
            return
        self._speech.play_clip(dev, clip_id=clip_id, path=path)


class SessionFanout:
    """The Xiaozhi channel's ``SessionEvents``: everything to ``primary`` (CHAT, or nobody),
    and sessions opening/closing also to the :class:`SdlessRouter`. Keeps CHAT's hello gate."""

    def __init__(self, primary: SessionEvents | None, router: SdlessRouter) -> None:
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
