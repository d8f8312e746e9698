"""What a Xiaozhi device's own task executor is told (client-architecture plan §11, §14):
the runtime's task events mapped to the task/mode JSON (``mode.set``, ``task.start|stop|pause|
resume``, ``step.start``), each carrying the session, the instance and the step. Pure.

``step.start`` with ``action: "listen"`` opens the device's microphone for the window
(``timeout_ms``); ``action: "play"`` (the next clip) or any task message closes it. So a device
told its mode streams its microphone in the windows, without a board-side mapping.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

from gateway.tasks.core import InstanceColumns, PublishTaskEvent
from topics.xiaozhi import ModeSet, ServerStep, ServerTask, TaskMode, encode_xiaozhi

__all__ = ["XiaozhiTaskTeller", "step_id", "task_messages"]


class _Downlink(Protocol):
    """What the teller uses of the Xiaozhi channel."""

    def session_id(self, dev: str) -> str | None: ...

    def publish(self, dev: str, payload: bytes) -> None: ...


class XiaozhiTaskTeller:
    """The task shell's ``DeviceTasks`` port on the Xiaozhi channel: a device with an open
    session is told its task and mode; one without (a board-only device) is told nothing."""

    def __init__(self, channel: _Downlink) -> None:
        self._channel = channel

    def task_event(
        self, device: str, event: PublishTaskEvent, record: InstanceColumns | None
    ) -> None:
        session_id = self._channel.session_id(device)
        if session_id is None:
            return
        for message in task_messages(session_id, event, record):
            self._channel.publish(device, encode_xiaozhi(message))


_MODES: frozenset[str] = frozenset(get_args(TaskMode))
_VERBS: dict[str, Literal["task.pause", "task.resume", "task.stop"]] = {
    "instance.paused": "task.pause",
    "instance.resumed": "task.resume",
    "instance.completed": "task.stop",
    "instance.cancelled": "task.stop",
}


def step_id(instance_id: str, step_index: int | None) -> str | None:
    return None if step_index is None else f"{instance_id}:{step_index}"


def _mode(record: InstanceColumns | None) -> TaskMode | None:
    mode = record.mode if record is not None else None
    return mode if mode in _MODES else None  # type: ignore[return-value]  # checked: a TaskMode


def task_messages(
    session_id: str, event: PublishTaskEvent, record: InstanceColumns | None
) -> list[ModeSet | ServerTask | ServerStep]:
    """The messages for one runtime event (most events: none)."""
    iid = event.instance_id
    step = step_id(iid, event.step_index)
    name = event.event
    if name in ("instance.started", "instance.restored"):
        mode = _mode(record)
        if record is None or mode is None:
            return []
        start = ServerTask(
            type="task.start",
            session_id=session_id,
            task_instance_id=iid,
            step_id=step,
            app_id=record.app_id,
            task_id=record.task_id,
            lesson_id=record.lesson_id,
        )
        return [ModeSet(mode=mode, session_id=session_id, task_instance_id=iid), start]
    if name in ("step.played", "window.opened") and step is not None:
        listen = name == "window.opened"
        window = event.data.get("window_ms") if listen else None
        return [
            ServerStep(
                action="listen" if listen else "play",
                timeout_ms=window if isinstance(window, int) and window >= 0 else None,
                session_id=session_id,
                task_instance_id=iid,
                step_id=step,
            )
        ]
    verb = _VERBS.get(name)
    if verb is None:
        return []
    reason = event.data.get("reason")
    told = ServerTask(
        type=verb,
        session_id=session_id,
        task_instance_id=iid,
        step_id=step,
        reason=reason if isinstance(reason, str) and verb == "task.stop" else None,
    )
    if verb != "task.stop":
        return [told]
    return [told, ModeSet(mode="CHAT", session_id=session_id)]
