"""Adapters between the board channel and the task shell (``gateway.tasks``), translating the
channel's types into the runtime's. Wiring (in ``gateway.app``), each built once::

    inbox = TaskInbox(...)                                    # before its producers
    channel = BoardChannel(..., sink=BoardToTasks(inbox))     # boards → task inbox
    tasks = TaskService(..., commands=BoardCommands(channel)) # task shell → boards
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.board.channel import BoardChannel
from gateway.board.model import (
    BoardAudio,
    BoardButton,
    BoardEvent,
    Outcome,
    OutcomeKind,
    PresenceChange,
)
from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent
from topics.errors import WireError

log = logging.getLogger(__name__)

OUTCOMES = {
    OutcomeKind.ACCEPTED: DeliveryResult.ACKED,
    OutcomeKind.DUPLICATE: DeliveryResult.ACKED,
    OutcomeKind.REJECTED: DeliveryResult.REJECTED,
    OutcomeKind.BUSY: DeliveryResult.REJECTED,
    OutcomeKind.EXPIRED: DeliveryResult.EXPIRED,
    OutcomeKind.FAILED: DeliveryResult.FAILED,
    OutcomeKind.OVERFLOW: DeliveryResult.FAILED,
    OutcomeKind.CANCELLED: DeliveryResult.FAILED,
}


def _app_of(params: Mapping[str, object]) -> str | None:
    """The app of a board path ``/{app_id}/{task_id}/lessons/{lesson_id}/{clip}`` (SPEC §5)."""
    name = params.get("name")
    if not isinstance(name, str) or not name.startswith("/"):
        return None
    return name.split("/")[1] or None


class TaskSinks(Protocol):
    """The task shell's inbound side (``gateway.tasks.inbox.TaskInbox``)."""

    def board_event(self, device: str, event: PlaybackEvent) -> None: ...

    def button(self, device: str, kind: str, key: str | None = None) -> None: ...

    def presence(self, device: str, online: bool) -> None: ...


class BoardCommands:
    """The task shell's ``CommandSender`` on top of :meth:`BoardChannel.submit`."""

    def __init__(self, channel: BoardChannel) -> None:
        self.channel = channel

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
        """Queue the command; ``on_outcome`` is called once, on the loop, with its outcome.

        A command the contract refuses (a runtime bug) is logged and reported ``failed``.
        """
        try:
            app = _app_of(params) if cmd == "PLAY_MEDIA" else None
            if app is not None:  # once per board session and app, queued ahead of the play
                self.channel.request_app_dirs(device, app, prio=2)
            future = self.channel.submit(device, cmd, params, command_id=command_id, prio=prio)
        except (WireError, ValueError):
            log.exception("board %s: command %s %s refused", device, cmd, command_id)
            asyncio.get_running_loop().call_soon(on_outcome, DeliveryResult.FAILED)
            return

        def done(f: asyncio.Future[Outcome]) -> None:
            on_outcome(DeliveryResult.FAILED if f.cancelled() else OUTCOMES[f.result().kind])

        future.add_done_callback(done)


class BoardToTasks:
    """The board channel's ``BoardEventSink`` feeding the task shell's inbox."""

    def __init__(self, tasks: TaskSinks) -> None:
        self.tasks = tasks

    def board_event(self, event: BoardEvent) -> None:
        tasks = self.tasks
        body = event.body
        if isinstance(body, BoardAudio):
            tasks.board_event(
                event.dev,
                PlaybackEvent(
                    AudioPhase(body.kind.value),
                    ref=event.ref,
                    name=body.name,
                    duration_ms=body.duration_ms,
                    reason=body.reason,
                ),
            )
        elif isinstance(body, BoardButton):
            tasks.button(event.dev, body.press.value, body.key)
        # AppTaskEvent: the board's own app tasks; BoardCueDone: a SOUND/WAIT finished (the
        # runtime steps on its own clock): counted by the channel, not used by the runtime.

    def presence_changed(self, change: PresenceChange) -> None:
        self.tasks.presence(change.dev, change.online)
