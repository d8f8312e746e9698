"""Effects out of a :class:`~gateway.tasks.core.device.DeviceRuntime`, and the stored records.

The shell performs effects in list order. Times in records are epoch ms (monotonic now + the
runtime's ``wall_offset_ms``); times in :class:`WindowLateness` are monotonic ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class InstanceState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class ControlRefusal(StrEnum):
    BUSY = "busy"
    UNKNOWN_TASK = "unknown_task"
    DEVICE_OFFLINE = "device_offline"
    INVALID = "invalid"
    NO_INSTANCE = "no_instance"
    OVERLOADED = "overloaded"  # too many lesson starts waiting for admission (retry later)


@dataclass(frozen=True, slots=True)
class InstanceColumns:
    instance_id: str
    device_id: str
    app_id: str
    task_id: str
    lesson_id: str
    mode: str
    priority: int
    source: str
    state: InstanceState
    reason: (
        str | None
    )  # cancelled: stopped|preempted|restarted|exit_phrase|button|offline|gateway_restart
    created_ms: int
    ended_ms: int | None = None
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepColumns:
    """The runtime's columns of a step row; the store upserts (asr_text/metrics come from the side path)."""

    instance_id: str
    step_index: int
    prompt_text: str | None  # the board path of the clip (None for a LISTEN window)
    expected_text: str | None
    played_ms: int | None = None
    completed_ms: int | None = None
    duration_ms: int | None = None
    window_opened_ms: int | None = None
    window_planned_close_ms: int | None = None
    window_closed_ms: int | None = None
    failure: str | None = (
        None  # playback problem: audio.failed|audio.stopped|watchdog|play_<outcome>
    )


@dataclass(frozen=True, slots=True)
class SendCommand:
    """Send an snlp/v1 command; ``command_id`` is the envelope ``id`` (outcomes/events ``ref`` it)."""

    command_id: str
    cmd: str  # PLAY_MEDIA | STOP_MEDIA | LISTEN_START | LISTEN_STOP
    params: Mapping[str, object]
    prio: int
    instance_id: str


@dataclass(frozen=True, slots=True)
class SoundCue:
    """SOUND ``{type}`` for the board (spec D5): fire and forget, its outcome changes nothing."""

    command_id: str
    sound: str  # ding | beep | success | error
    prio: int
    instance_id: str


@dataclass(frozen=True, slots=True)
class IndicateCue:
    """INDICATE ``{state}`` for the board (spec D10): fire and forget, like a sound."""

    command_id: str
    state: str  # IDLE | LISTENING | PROCESSING | PLAYING | ERROR | TASK_RUNNING | TASK_COMPLETE
    prio: int
    instance_id: str


@dataclass(frozen=True, slots=True)
class PublishTaskEvent:
    """A lifecycle event for ``snlpgw/v1/task/{dev}``."""

    event: str
    instance_id: str
    step_index: int | None
    data: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoreInstance:
    record: InstanceColumns


@dataclass(frozen=True, slots=True)
class StoreStep:
    record: StepColumns


@dataclass(frozen=True, slots=True)
class SubmitUtterance:
    """Hand this utterance to the assessment side path; it replaces earlier ones of the step.

    ``truncated``: the window closed while it was still open; the audio ends at the window close.
    """

    instance_id: str
    step_index: int
    utterance_id: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class WindowLateness:
    """The window timer fired: for the timer-lateness metric (monotonic ms)."""

    instance_id: str
    step_index: int
    planned_ms: float
    actual_ms: float

    @property
    def lateness_ms(self) -> float:
        return self.actual_ms - self.planned_ms


@dataclass(frozen=True, slots=True)
class RunSteps:
    """A STEPS task's instance started: the shell runs its step interpreter until it reports
    :class:`~gateway.tasks.core.events.StepsFinished`; the instance's end (any reason) comes
    as :class:`ReturnToChat` as for every task."""

    instance_id: str


@dataclass(frozen=True, slots=True)
class ReturnToChat:
    """The instance ended: CHAT has the device again; ``listen``: CHAT opens the microphone
    (False: the device stays quiet until the child wakes it, a long press set to ``idle``)."""

    instance_id: str
    listen: bool = True


@dataclass(frozen=True, slots=True)
class ControlReply:
    request_id: str
    action: str
    accepted: bool
    instance_id: str | None = None
    reason: ControlRefusal | None = None
    running_priority: int | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """An event the outside world may legitimately send but that changes nothing (log + count)."""

    state: str
    event: str
    reason: str


RuntimeEffect = (
    SendCommand
    | SoundCue
    | IndicateCue
    | PublishTaskEvent
    | StoreInstance
    | StoreStep
    | SubmitUtterance
    | WindowLateness
    | ReturnToChat
    | RunSteps
    | ControlReply
    | Ignored
)
