"""snlp/v1 commands (gateway → board, `snlp/v1/{dev}/cmd`): params per command and envelopes.

The envelope union is discriminated on `cmd`; each command's `params` is its own model.
Build with `command(params, id=…, ts=…, prio=…, ttl_ms=…)`, which picks the envelope.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, JsonValue, TypeAdapter

from topics.wire import Id, OwnModel

__all__ = [
    "AnyCommand",
    "AudioPause",
    "AudioResume",
    "Command",
    "CommandParams",
    "Download",
    "EnsureAppDirs",
    "Indicate",
    "ListenStart",
    "ListenStop",
    "PlayMedia",
    "Sound",
    "StartAppTask",
    "StopMedia",
    "TaskControl",
    "Wait",
    "command",
]

BoardName = Annotated[str, Field(min_length=1, max_length=256)]
Args = dict[str, JsonValue]
Priority = Literal[1, 2, 3]  # 3 parent-instant, 2 scheduled, 1 voice


class CommandParams(OwnModel):
    """Base of every command's params."""


def _clamp_speed(value: object) -> object:
    """Device-capability spec D1: a speed outside 0.5-2.0 is clamped, not refused."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return min(2.0, max(0.5, float(value)))
    return value


class PlayMedia(CommandParams):
    name: BoardName
    speed: Annotated[float, Field(ge=0.5, le=2.0), BeforeValidator(_clamp_speed)] = 1.0
    repeat: Annotated[int, Field(ge=1, le=1000)] = 1
    volume: Annotated[int, Field(ge=0, le=100)] | None = None
    power_off_after: bool = False


class StopMedia(CommandParams):
    target_ref: Id | None = None


class AudioPause(CommandParams):
    pass


class AudioResume(CommandParams):
    pass


class Download(CommandParams):
    url: Annotated[str, Field(pattern=r"^https?://", max_length=2048)]
    path: BoardName
    size: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    overwrite: bool = False


class EnsureAppDirs(CommandParams):
    app: BoardName
    dirs: list[BoardName] = Field(default_factory=list, max_length=64)


class StartAppTask(CommandParams):
    app: BoardName
    task: BoardName
    args: Args = Field(default_factory=dict)


class TaskControl(CommandParams):
    """Params of TASK_START / TASK_PAUSE / TASK_RESUME / TASK_STOP / TASK_RESTART."""

    app: BoardName
    task: BoardName
    args: Args | None = None


class ListenStart(CommandParams):
    mode: Literal["auto", "manual", "realtime"] | None = None
    timeout_ms: Annotated[int, Field(ge=1)] | None = None


class ListenStop(CommandParams):
    pass


class Sound(CommandParams):
    type: BoardName


class Indicate(CommandParams):
    state: Literal[
        "IDLE", "LISTENING", "PROCESSING", "PLAYING", "ERROR", "TASK_RUNNING", "TASK_COMPLETE"
    ]


class Wait(CommandParams):
    ms: Annotated[int, Field(ge=0, le=3_600_000)]


class Command(OwnModel):
    """The command envelope; subclasses fix `cmd` and the params type."""

    v: Literal[1] = 1
    id: Id
    ts: Annotated[int, Field(ge=0)]
    cmd: str
    params: CommandParams
    prio: Priority
    ttl_ms: Annotated[int, Field(ge=1)]
    src: BoardName | None = None


class PlayMediaCmd(Command):
    cmd: Literal["PLAY_MEDIA"] = "PLAY_MEDIA"
    params: PlayMedia


class StopMediaCmd(Command):
    cmd: Literal["STOP_MEDIA"] = "STOP_MEDIA"
    params: StopMedia = StopMedia()


class AudioPauseCmd(Command):
    cmd: Literal["AUDIO_PAUSE"] = "AUDIO_PAUSE"
    params: AudioPause = AudioPause()


class AudioResumeCmd(Command):
    cmd: Literal["AUDIO_RESUME"] = "AUDIO_RESUME"
    params: AudioResume = AudioResume()


class DownloadCmd(Command):
    cmd: Literal["DOWNLOAD"] = "DOWNLOAD"
    params: Download


class EnsureAppDirsCmd(Command):
    cmd: Literal["ENSURE_APP_DIRS"] = "ENSURE_APP_DIRS"
    params: EnsureAppDirs


class StartAppTaskCmd(Command):
    cmd: Literal["START_APP_TASK"] = "START_APP_TASK"
    params: StartAppTask


class TaskControlCmd(Command):
    cmd: Literal["TASK_START", "TASK_PAUSE", "TASK_RESUME", "TASK_STOP", "TASK_RESTART"]
    params: TaskControl


class ListenStartCmd(Command):
    cmd: Literal["LISTEN_START"] = "LISTEN_START"
    params: ListenStart = ListenStart()


class ListenStopCmd(Command):
    cmd: Literal["LISTEN_STOP"] = "LISTEN_STOP"
    params: ListenStop = ListenStop()


class SoundCmd(Command):
    cmd: Literal["SOUND"] = "SOUND"
    params: Sound


class IndicateCmd(Command):
    cmd: Literal["INDICATE"] = "INDICATE"
    params: Indicate


class WaitCmd(Command):
    cmd: Literal["WAIT"] = "WAIT"
    params: Wait


AnyCommand = Annotated[
    PlayMediaCmd
    | StopMediaCmd
    | AudioPauseCmd
    | AudioResumeCmd
    | DownloadCmd
    | EnsureAppDirsCmd
    | StartAppTaskCmd
    | TaskControlCmd
    | ListenStartCmd
    | ListenStopCmd
    | SoundCmd
    | IndicateCmd
    | WaitCmd,
    Field(discriminator="cmd"),
]
COMMAND_ADAPTER: TypeAdapter[AnyCommand] = TypeAdapter(AnyCommand)

_ENVELOPES: dict[type[CommandParams], type[Command]] = {
    PlayMedia: PlayMediaCmd,
    StopMedia: StopMediaCmd,
    AudioPause: AudioPauseCmd,
    AudioResume: AudioResumeCmd,
    Download: DownloadCmd,
    EnsureAppDirs: EnsureAppDirsCmd,
    StartAppTask: StartAppTaskCmd,
    ListenStart: ListenStartCmd,
    ListenStop: ListenStopCmd,
    Sound: SoundCmd,
    Indicate: IndicateCmd,
    Wait: WaitCmd,
}
TaskVerb = Literal["TASK_START", "TASK_PAUSE", "TASK_RESUME", "TASK_STOP", "TASK_RESTART"]


def command(
    params: CommandParams,
    *,
    id: str,
    ts: int,
    prio: Priority,
    ttl_ms: int,
    src: str | None = None,
    task_verb: TaskVerb | None = None,
) -> Command:
    """The envelope for `params` (`TaskControl` needs `task_verb`, e.g. "TASK_STOP")."""
    if isinstance(params, TaskControl):
        if task_verb is None:
            raise ValueError("TaskControl params need task_verb")
        return TaskControlCmd(
            id=id, ts=ts, cmd=task_verb, params=params, prio=prio, ttl_ms=ttl_ms, src=src
        )
    if task_verb is not None:
        raise ValueError(f"task_verb is only for TaskControl, not {type(params).__name__}")
    fields = {"id": id, "ts": ts, "params": params, "prio": prio, "ttl_ms": ttl_ms, "src": src}
    return _ENVELOPES[type(params)].model_validate(fields)
