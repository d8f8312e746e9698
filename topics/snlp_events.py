"""snlp/v1 events (board → gateway, `snlp/v1/{dev}/evt`), structured and legacy text.

The union is discriminated on `evt` by family: `audio.*`, `button`, `app_task.*`,
`sound.completed` (a SOUND played, spec D5), `wait.elapsed` / `wait.cancelled` (a WAIT, D11); any other
name parses into `UnknownEvent` so it can be counted instead of crashing. The board's legacy
strings `[skill_event]completed|2140` become the same `AudioEvent` with `ref` null.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Field, JsonValue, Tag, TypeAdapter

from topics.errors import PayloadError, PayloadReason
from topics.wire import DeviceModel

__all__ = [
    "AUDIO_EVENTS",
    "CUE_EVENTS",
    "AnyEvent",
    "AppTaskData",
    "AppTaskEvent",
    "AudioData",
    "AudioEvent",
    "ButtonData",
    "ButtonEvent",
    "CueData",
    "CueEvent",
    "Event",
    "UnknownEvent",
    "is_legacy_text",
    "parse_legacy_event",
]

AudioEvt = Literal[
    "audio.started",
    "audio.completed",
    "audio.stopped",
    "audio.paused",
    "audio.resumed",
    "audio.failed",
]
AUDIO_EVENTS: frozenset[str] = frozenset(get_args(AudioEvt))
CueEvt = Literal["sound.completed", "wait.elapsed", "wait.cancelled"]
CUE_EVENTS: frozenset[str] = frozenset(get_args(CueEvt))
AudioReason = Literal["eof", "stopped", "preempted", "error"]
Ms = Annotated[int, Field(ge=0)]


class AudioData(DeviceModel):
    name: str | None = None  # absent only in legacy text events
    duration_ms: Ms | None = None
    reason: AudioReason | None = None
    position_ms: Ms | None = None
    code: int | str | None = None
    by: str | None = None  # id of the command that preempted this playback


class ButtonData(DeviceModel):
    press: Literal["short", "long", "double"]
    key: str | None = None


class CueData(DeviceModel):
    """``sound.completed``: the sound's ``type``; ``wait.*``: the ``ms`` waited (all optional)."""

    type: Annotated[str, Field(max_length=64)] | None = None
    ms: Ms | None = None


class AppTaskData(DeviceModel):
    state: str
    detail: dict[str, JsonValue] = Field(default_factory=dict)


_NOT_KNOWN: dict[str, JsonValue] = {
    "not": {
        "anyOf": [
            {"enum": ["button", *sorted(AUDIO_EVENTS), *sorted(CUE_EVENTS)]},
            {"pattern": "^app_task\\."},
        ]
    }
}


class Event(DeviceModel):
    """The event envelope; `ref` is the command id it belongs to, or null."""

    _keep_null = frozenset({"ref"})
    v: Literal[1] = 1
    id: str | None = None
    ts: int | None = None
    ref: str | None = None
    evt: str
    data: DeviceModel | dict[str, JsonValue]


class AudioEvent(Event):
    evt: AudioEvt
    data: AudioData = AudioData()


class ButtonEvent(Event):
    evt: Literal["button"]
    data: ButtonData


class CueEvent(Event):
    """A SOUND or WAIT the board finished (`ref`: its command id)."""

    evt: CueEvt
    data: CueData = CueData()


class AppTaskEvent(Event):
    evt: Annotated[str, Field(pattern=r"^app_task\.[A-Za-z0-9_.-]+$")]
    data: AppTaskData


class UnknownEvent(Event):
    """An event name this contract does not know; kept so it can be counted and logged."""

    evt: Annotated[str, Field(json_schema_extra=_NOT_KNOWN)]
    data: dict[str, JsonValue] = Field(default_factory=dict)


def _family(value: Any) -> str | None:
    evt = value.get("evt") if isinstance(value, dict) else getattr(value, "evt", None)
    if not isinstance(evt, str):
        return None
    if evt in AUDIO_EVENTS:
        return "audio"
    if evt == "button":
        return "button"
    if evt in CUE_EVENTS:
        return "cue"
    return "app_task" if evt.startswith("app_task.") else "unknown"


AnyEvent = Annotated[
    Annotated[AudioEvent, Tag("audio")]
    | Annotated[ButtonEvent, Tag("button")]
    | Annotated[CueEvent, Tag("cue")]
    | Annotated[AppTaskEvent, Tag("app_task")]
    | Annotated[UnknownEvent, Tag("unknown")],
    Discriminator(_family),
]
EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)

_LEGACY_PREFIX = b"[skill_event]"
_LEGACY = re.compile(r"\s*\[skill_event\]\s*([a-z]+)\s*(?:\|\s*([^|\s]*)\s*)?")
_LEGACY_REASON: dict[str, AudioReason] = {
    "completed": "eof",
    "stopped": "stopped",
    "failed": "error",
}


def is_legacy_text(payload: bytes) -> bool:
    return payload.lstrip().startswith(_LEGACY_PREFIX)


def parse_legacy_event(payload: bytes) -> AudioEvent:
    """`[skill_event]<verb>|<value>` → `AudioEvent`; value is `duration_ms` (for `failed`: `code`)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(PayloadReason.INVALID, f"legacy text: {exc}") from None
    match = _LEGACY.fullmatch(text)
    if match is None:
        raise PayloadError(PayloadReason.INVALID, f"legacy text: {text}")
    verb, value = match.group(1), match.group(2) or None
    evt = f"audio.{verb}"
    if evt not in AUDIO_EVENTS:
        raise PayloadError(PayloadReason.UNKNOWN_TYPE, f"legacy event {verb!r}")
    digits = value is not None and re.fullmatch(r"[0-9]{1,12}", value) is not None
    number = int(value) if digits and value is not None else None
    if verb == "failed":
        data = AudioData(reason="error", code=number if number is not None else value)
    elif value is not None and number is None:
        raise PayloadError(PayloadReason.INVALID, f"legacy duration_ms: {value}")
    else:
        data = AudioData(duration_ms=number, reason=_LEGACY_REASON.get(verb))
    return AudioEvent.model_validate({"ref": None, "evt": evt, "data": data})
