"""Events into a :class:`~gateway.tasks.core.device.DeviceRuntime` (frozen; parsed by the shells).

Time is not in the events: ``handle(event, now_ms)`` takes the monotonic time of delivery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.tasks.core.rules import PriorityLevel


class ControlAction(StrEnum):
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    RESTART = "restart"
    VOLUME = "volume"  # params {"volume": 0-100}: the running instance's PLAY_MEDIA volume


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """A task control request (backend MQTT, scheduler or voice).

    ``instance_id`` (optional) targets pause/resume/stop/restart at one instance: a different
    current instance answers ``no_instance``. ``params`` for start: ``listen_ratio`` (number,
    clamped), ``repeat`` (int ≥ 1, PLAY_AUDIO), ``start_step`` (int ≥ 0), ``seed`` (int, STEPS tasks: the question generator's seed).
    """

    action: ControlAction
    request_id: str = ""
    app_id: str | None = None
    task_id: str | None = None
    lesson_id: str | None = None
    priority: int = PriorityLevel.PARENT
    source: str = "mqtt"
    params: Mapping[str, object] = field(default_factory=dict)
    instance_id: str | None = None


class AudioPhase(StrEnum):
    STARTED = "audio.started"
    COMPLETED = "audio.completed"
    STOPPED = "audio.stopped"
    FAILED = "audio.failed"
    PAUSED = "audio.paused"
    RESUMED = "audio.resumed"


@dataclass(frozen=True, slots=True)
class PlaybackEvent:
    """An ``audio.*`` event; ``ref`` is the command id it belongs to (or None), ``name`` the path."""

    kind: AudioPhase
    ref: str | None = None
    name: str | None = None
    duration_ms: int | None = None
    reason: str | None = None


class DeliveryResult(StrEnum):
    ACKED = "acked"
    EXPIRED = "expired"
    FAILED = "failed"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """DeliveryResult outcome of a command the runtime asked for; ``ref`` is its ``command_id``."""

    ref: str
    outcome: DeliveryResult


def outcome_matters(outcome: DeliveryResult) -> bool:
    """Whether a command's outcome can change anything in the runtime: an acked command
    changes nothing (stepping follows board events and timers); one not delivered fails the
    step whose clip it played, or is ignored. A shell need not hand over the others (three
    per clip step)."""
    return outcome is not DeliveryResult.ACKED


@dataclass(frozen=True, slots=True)
class ButtonPress:
    """The board's key (device-capability spec D9; see ``DeviceRuntime._on_button``).

    ``kind``: short | double | long; ``key``: which key, when the board has several
    (``skip``/``next`` skips the step).
    """

    kind: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Presence:
    online: bool


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    utterance_id: str


@dataclass(frozen=True, slots=True)
class UtteranceStopped:
    utterance_id: str
    duration_ms: int = 0


@dataclass(frozen=True, slots=True)
class AsrText:
    """An ASR result of an utterance submitted for ``(instance_id, step_index)``; exit phrases only."""

    instance_id: str
    step_index: int
    text: str


@dataclass(frozen=True, slots=True)
class StepsFinished:
    """The step interpreter of ``instance_id`` ran its last step (or a ``stop`` step)."""

    instance_id: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    """The shell's timer woke up; early or spurious firings are harmless."""


RuntimeEvent = (
    ControlRequest
    | PlaybackEvent
    | CommandOutcome
    | ButtonPress
    | Presence
    | UtteranceStarted
    | UtteranceStopped
    | AsrText
    | StepsFinished
    | TimerFired
)
