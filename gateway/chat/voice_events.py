"""Events into and effects out of the voice-session core (:mod:`gateway.chat.voice`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CueKind(Enum):
    """The short tones of voice-session v1 (the gateway plays them down the UDP channel)."""

    START = "start"  # §1.3 / §1.6: "滴", listening begins (the tail of the speech before it)
    SEGMENT_END = "segment_end"  # §1.4 / §5: the sentence was cut, an answer is coming
    TIMEOUT = "timeout"  # §1.7 / §4: no speech after the start cue, standby follows
    FAILURE = "failure"  # §3.3: the engine failed (ASR, TTS, upstream), standby follows


# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoiceOpened:
    """The device said hello (a new Xiaozhi session)."""


@dataclass(frozen=True, slots=True)
class VoiceClosed:
    reason: str


@dataclass(frozen=True, slots=True)
class VoiceListenStart:
    mode: str | None


@dataclass(frozen=True, slots=True)
class VoiceListenDetect:
    """A local wake word: a turn begins in the mode the device used last."""


@dataclass(frozen=True, slots=True)
class VoiceListenStop:
    """Push-to-talk release: the device ends the segment."""


@dataclass(frozen=True, slots=True)
class VoiceSpeechStarted:
    """The gateway's VAD heard speech begin."""


@dataclass(frozen=True, slots=True)
class VoiceSpeechStopped:
    """The gateway's VAD closed an utterance."""


@dataclass(frozen=True, slots=True)
class ServerStt:
    """The upstream recognised the segment (its VAD ended it)."""


@dataclass(frozen=True, slots=True)
class TtsStarted:
    """``tts start`` went to the device."""


@dataclass(frozen=True, slots=True)
class TtsStopped:
    """``tts stop`` went to the device (its audio had time to play)."""


@dataclass(frozen=True, slots=True)
class VoiceAbort:
    """The device asked to stop speaking."""


@dataclass(frozen=True, slots=True)
class TaskStarted:
    pass


@dataclass(frozen=True, slots=True)
class BackToChat:
    pass


@dataclass(frozen=True, slots=True)
class UpstreamLost:
    reason: str


@dataclass(frozen=True, slots=True)
class EngineFailed:
    """The answering side failed on ``turn`` (ASR, TTS, the embedded engine raised)."""

    turn: int
    reason: str


@dataclass(frozen=True, slots=True)
class Tick:
    """A deadline may have passed."""


VoiceEvent = (
    VoiceOpened
    | VoiceClosed
    | VoiceListenStart
    | VoiceListenDetect
    | VoiceListenStop
    | VoiceSpeechStarted
    | VoiceSpeechStopped
    | ServerStt
    | TtsStarted
    | TtsStopped
    | VoiceAbort
    | TaskStarted
    | BackToChat
    | UpstreamLost
    | EngineFailed
    | Tick
)

# -- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenUpstream:
    """Start answering this session (bridge: open the upstream WebSocket)."""


@dataclass(frozen=True, slots=True)
class CloseUpstream:
    reason: str


@dataclass(frozen=True, slots=True)
class BeginTurn:
    turn: int


@dataclass(frozen=True, slots=True)
class EndSegment:
    """The turn's audio is complete (``by``: vad, device); the embedded engine answers it."""

    turn: int
    by: str


@dataclass(frozen=True, slots=True)
class StopPlayback:
    reason: str


@dataclass(frozen=True, slots=True)
class Standby:
    """Send the device to standby: goodbye with its session id, close the upstream."""

    reason: str


@dataclass(frozen=True, slots=True)
class Greet:
    """Say the greeting (its speech ends with the start cue); ``TtsStopped`` ends GREETING."""


@dataclass(frozen=True, slots=True)
class PlayCue:
    """A cue down to the device: SEGMENT_END opens a speech bracket the reply continues;
    TIMEOUT and FAILURE close theirs (the ``Standby`` after them waits until they played)."""

    kind: CueKind


@dataclass(frozen=True, slots=True)
class VoiceAlarm:
    alarm: str
    reason: str


VoiceEffect = (
    OpenUpstream
    | CloseUpstream
    | BeginTurn
    | EndSegment
    | StopPlayback
    | Standby
    | Greet
    | PlayCue
    | VoiceAlarm
)
