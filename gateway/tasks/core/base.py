"""Shared state of a device runtime: construction, ids, wall time, ending an instance."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from gateway.tasks.core.catalog import Catalog
from gateway.tasks.core.effects import (
    IndicateCue,
    InstanceColumns,
    InstanceState,
    PublishTaskEvent,
    ReturnToChat,
    RuntimeEffect,
    SendCommand,
    SoundCue,
    StoreInstance,
)
from gateway.tasks.core.expected import ReadText
from gateway.tasks.core.instance import ActiveInstance, RuntimeState
from gateway.tasks.core.rules import RuntimeConfig


class RuntimeBase:
    """State, the active instance, ids and the effects every transition shares."""

    def __init__(
        self,
        device_id: str,
        catalog: Catalog,
        *,
        config: RuntimeConfig | None = None,
        read_text: ReadText | None = None,
        new_id: Callable[[], str] | None = None,
        wall_offset_ms: float = 0.0,
        online: bool = True,
    ) -> None:
        self.device_id = device_id
        self.catalog = catalog
        self.config = config or RuntimeConfig()
        self._read_text = read_text
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        self._wall_offset = wall_offset_ms
        self._online = online
        self._now = float("-inf")
        self._state = RuntimeState.IDLE
        self._inst: ActiveInstance | None = None
        self._commands = 0
        # Command ids must never repeat for a board, whose dedup (by id) would skip the command:
        # a runtime rebuilt after a gateway restart counts from 1 again, so each runtime object
        # puts its own token between the instance id and the count.
        self._epoch = uuid.uuid4().hex[:6]
        # STOP_MEDIA we sent: (play ref, name); their audio.stopped is expected, not a failure.
        # AUDIO_PAUSE/RESUME: assumed until the board rejects one (then STOP_MEDIA + replay).
        self.audio_pause = True
        self._stopping: deque[tuple[str | None, str | None]] = deque(maxlen=8)  # oldest drops

    @property
    def state(self) -> RuntimeState:
        return self._state

    @property
    def instance(self) -> ActiveInstance | None:
        return self._inst

    def next_deadline(self) -> float | None:
        """The monotonic ms at which the shell must deliver ``TimerFired``, or None."""
        return self._inst.deadline if self._inst else None

    def _wall(self, now: float) -> int:
        return round(now + self._wall_offset)

    def _command(self, inst: ActiveInstance, cmd: str, params: dict[str, object]) -> SendCommand:
        return SendCommand(self._next_ref(inst), cmd, params, inst.record.priority, inst.id)

    def _next_ref(self, inst: ActiveInstance) -> str:
        self._commands += 1
        return f"{inst.id}.{self._epoch}.{self._commands}"

    def _cues(self, inst: ActiveInstance, sound: str | None, state: str) -> list[RuntimeEffect]:
        """The task's cues at a moment: its sound (when the task has one there) and, when the
        task indicates, the board's logical state. Nothing for an absent board, nor for a STEPS
        task (its own ``sound`` / ``indicate`` steps are its cues)."""
        if not self._online or inst.task.interaction_mode == "STEPS":
            return []
        prio = inst.record.priority
        out: list[RuntimeEffect] = []
        if sound is not None:
            out.append(SoundCue(self._next_ref(inst), sound, prio, inst.id))
        if inst.task.cues.indicate:
            out.append(IndicateCue(self._next_ref(inst), state, prio, inst.id))
        return out

    def _event(self, name: str, data: dict[str, object] | None = None) -> PublishTaskEvent:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        return PublishTaskEvent(
            name, inst.id, inst.step.step_index if inst.step else None, data or {}
        )

    def _stop_media(self, inst: ActiveInstance) -> list[RuntimeEffect]:
        self._stopping.append((inst.play_ref, inst.play_name))
        return [self._command(inst, "STOP_MEDIA", {})]

    def _end(
        self, state: InstanceState, reason: str | None, now: float, *, listen: bool = True
    ) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        record = with_state(inst, state, reason, ended_ms=self._wall(now))
        name = "instance.completed" if state is InstanceState.COMPLETED else "instance.cancelled"
        event = PublishTaskEvent(name, inst.id, None, {"reason": reason} if reason else {})
        if state is InstanceState.COMPLETED:
            cues = self._cues(inst, inst.task.cues.task_complete, "TASK_COMPLETE")
        else:
            cues = self._cues(inst, None, "IDLE")
        self._inst, self._state = None, RuntimeState.IDLE
        return [StoreInstance(record), event, *cues, ReturnToChat(inst.id, listen)]


def with_state(
    inst: ActiveInstance, state: InstanceState, reason: str | None, ended_ms: int | None = None
) -> InstanceColumns:
    return replace(inst.record, state=state, reason=reason, ended_ms=ended_ms)
