"""The active instance's bookkeeping and the states of a device's task runtime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from operator import attrgetter

from gateway.tasks.core.catalog import LessonDef, TaskDef
from gateway.tasks.core.effects import InstanceColumns, StepColumns
from gateway.tasks.core.events import ControlRequest, PlaybackEvent
from gateway.tasks.core.rules import clamp_ratio, clamp_speed


class RuntimeState(Enum):
    """What the device's task runtime is doing (the instance's mode says what happens next)."""

    IDLE = "idle"  # CHAT: no task
    PLAYING = "playing"  # PLAY_MEDIA sent, waiting for audio.completed (watchdog armed)
    LISTENING = "listening"  # listen window open (close timer armed)
    PAUSED = "paused"  # by control and/or board offline (grace timer armed when offline)
    SCRIPTED = "scripted"  # a STEPS task: its step interpreter (the shell's) runs it


# ``dataclasses.replace`` walks and checks every field per call (four times a clip step); the
# step's columns are copied by one C-level getter instead.
_STEP_FIELDS = tuple(f.name for f in fields(StepColumns))
_step_values = attrgetter(*_STEP_FIELDS)


class IllegalEvent(Exception):
    """The shell broke the runtime's contract (unknown event, time going backwards)."""

    def __init__(self, state: RuntimeState, event: object, problem: str) -> None:
        self.state = state
        self.event = event
        super().__init__(f"{problem}: {type(event).__name__} in state {state.name}")


@dataclass
class ActiveInstance:
    """Mutable bookkeeping of the one running/paused instance (never leaves the core)."""

    task: TaskDef
    lesson: LessonDef
    record: InstanceColumns
    ratio: float
    repeat: int
    index: int = 0
    step: StepColumns | None = None
    play_ref: str | None = None  # command id of the PLAY_MEDIA that is current
    play_name: str | None = None
    deadline: float | None = None  # monotonic ms: watchdog, window close, or offline grace
    watchdog_left: float | None = None  # while the board reports audio.paused
    open_utterance: str | None = None
    paused_phase: RuntimeState | None = None  # PLAYING or LISTENING when PAUSED
    remaining_ms: float | None = None  # window time left when paused mid-window
    by_control: bool = False
    offline: bool = False
    volume: int | None = None  # PLAY_MEDIA volume (start param, task default, control action)
    speed: float = 1.0  # PLAY_MEDIA speed, clamped into [0.5, 2.0]
    # The current play's loops (D14: a pause keeps the loops still to play).
    loops: int = 1  # loops the current PLAY_MEDIA asked for
    loop_ms: float | None = None  # one loop's length at the play's speed, when known
    play_since: float | None = None  # monotonic ms the board (last) started or resumed it
    played_ms: float = 0.0  # played before ``play_since``
    loops_left: int | None = None  # set by a pause: loops a replay must play
    board_paused: bool = False  # AUDIO_PAUSE accepted: the board holds the play
    pause_ref: str | None = None  # AUDIO_PAUSE / AUDIO_RESUME in flight (its outcome matters)
    held: PlaybackEvent | None = None  # the paused play's end, reported while paused

    @property
    def id(self) -> str:
        return self.record.instance_id

    @property
    def mode(self) -> str:
        return self.task.interaction_mode

    @property
    def step_count(self) -> int:
        return 1 if self.mode == "LISTEN" else len(self.lesson.clips)

    def set_step(self, **changes: object) -> StepColumns:
        assert self.step is not None  # noqa: S101 - invariant: only called with a current step
        values = dict(zip(_STEP_FIELDS, _step_values(self.step), strict=True), **changes)
        self.step = StepColumns(**values)
        return self.step


@dataclass(frozen=True, slots=True)
class StartParams:
    """A start request's parameters after the task's defaults."""

    ratio: float
    repeat: int
    start: int
    volume: int | None = None
    speed: float = 1.0


def _number(value: object) -> float | None:
    """A JSON number (not a bool) as float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_params(req: ControlRequest, task: TaskDef, lesson: LessonDef) -> StartParams | str:
    """The start parameters of a request, or the problem as text (``speed`` is clamped)."""
    ratio, repeat, start = task.listen_ratio, task.repeat, 0
    volume, speed = task.volume, clamp_speed(task.speed)
    count = {"LISTEN": 1, "STEPS": 1}.get(task.interaction_mode, len(lesson.clips))
    for key, value in req.params.items():
        number = _number(value)
        if key == "listen_ratio" and number is not None:
            if number <= 0:
                return "listen_ratio must be > 0"
            ratio = clamp_ratio(number)
        elif key == "repeat" and type(value) is int and 1 <= value <= 1000:
            repeat = value
        elif key == "start_step" and type(value) is int and 0 <= value < count:
            start = value
        elif key == "volume" and type(value) is int and 0 <= value <= 100:
            volume = value
        elif key == "speed" and number is not None and number > 0:
            speed = clamp_speed(number)
        elif key == "seed" and task.interaction_mode == "STEPS" and type(value) is int:
            pass  # a STEPS task's question generator seed (a lesson replayed as it was)
        else:
            return f"bad parameter {key}={value!r}"
    return StartParams(ratio, repeat, start, volume, speed)


def params_of(p: StartParams) -> Mapping[str, object]:
    out: dict[str, object] = {"listen_ratio": p.ratio, "repeat": p.repeat, "start_step": p.start}
    if p.volume is not None:
        out["volume"] = p.volume
    if p.speed != 1.0:
        out["speed"] = p.speed
    return out
