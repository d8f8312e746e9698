"""Lessons on a device without an SD card (client-architecture plan §8.2): the pure decisions.

A device is **voice-only** while it has an open Xiaozhi session and no snlp/v1 board presence
(retained status, heartbeat, online/offline) was ever seen for it since this gateway started.
For such a device the task runtime's board commands are answered here instead of by a board:

- ``PLAY_MEDIA {name, repeat}`` → the clip streamed over the voice channel ``repeat`` times
  back to back (acked at once); its end is the ``audio.*`` event a board would send:
  ``audio.started`` at ``tts start``, ``audio.completed{duration_ms}`` (all plays) at
  ``tts stop``, ``audio.failed{reason}`` when it could not be made or the session went;
- ``STOP_MEDIA`` → the clip cancelled (the device gets ``tts stop``) and ``audio.stopped``;
- ``LISTEN_START`` / ``LISTEN_STOP`` → acked and skipped (the microphone is the voice
  channel's, opened by the runtime's ``MicControl``);
- anything else (``AUDIO_PAUSE`` / ``AUDIO_RESUME``, ``SOUND``, ``INDICATE``, …) → rejected
  (unsupported): the runtime falls back (STOP_MEDIA + replay of the loops left for a pause).

Presence: board presence passes through unchanged; a voice-only device is online while its
session is open. Events here carry no time: the decisions need none. The methods split into
the event side (presence, sessions, SPEAK's results: only ``TellPresence`` / ``ReportPlayback``
come out) and the command side (``command``), so their shells can be built one after another.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum

from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent

CLIP_PREFIX = "sdless/"  # clip ids this core made (SPEAK's other ids are the task DSL's)
MAX_REPEAT = 100  # a board loops at most this often too; the runtime's repeat is far lower


class MediaRoute(StrEnum):
    BOARD = "board"
    VOICE = "voice"


@dataclass(frozen=True, slots=True)
class TellPresence:
    device: str
    online: bool


@dataclass(frozen=True, slots=True)
class StartClip:
    """Stream the clip at board path ``name`` ``repeat`` times under ``clip_id``."""

    device: str
    clip_id: str
    name: str
    repeat: int


@dataclass(frozen=True, slots=True)
class CancelClip:
    device: str
    clip_id: str


@dataclass(frozen=True, slots=True)
class ReportPlayback:
    device: str
    event: PlaybackEvent


@dataclass(frozen=True, slots=True)
class AnswerCommand:
    """The command's delivery outcome (the runtime's ``on_outcome``)."""

    outcome: DeliveryResult


SdlessEffect = TellPresence | StartClip | CancelClip | ReportPlayback | AnswerCommand


@dataclass(frozen=True, slots=True)
class _Play:
    command_id: str
    name: str

    @property
    def clip_id(self) -> str:
        return CLIP_PREFIX + self.command_id


class SdlessRoutes:
    """Which devices take lesson audio over the voice channel, and their plays.

    Bounded: at most ``max_boards`` devices remembered as having a board (least recently heard
    forgotten first, counted in ``boards_forgotten``) and ``max_sessions`` open sessions (more
    are not made voice-only, counted in ``sessions_refused``); one play per open session.
    """

    def __init__(self, *, max_boards: int, max_sessions: int) -> None:
        self._max_boards = max_boards
        self._max_sessions = max_sessions
        self._boards: OrderedDict[str, None] = OrderedDict()
        self._sessions: set[str] = set()
        self._plays: dict[str, _Play] = {}
        self.boards_forgotten = 0
        self.sessions_refused = 0

    # -- routing -------------------------------------------------------------------------------
    def route(self, device: str) -> MediaRoute:
        if device in self._sessions and device not in self._boards:
            return MediaRoute.VOICE
        return MediaRoute.BOARD

    @staticmethod
    def owns_clip(clip_id: str) -> bool:
        return clip_id.startswith(CLIP_PREFIX)

    # -- presence ------------------------------------------------------------------------------
    def board_presence(self, device: str, online: bool) -> list[SdlessEffect]:
        """The board channel's presence of ``device``: it has a board from now on."""
        self._boards[device] = None
        self._boards.move_to_end(device)
        if len(self._boards) > self._max_boards:
            self._boards.popitem(last=False)
            self.boards_forgotten += 1
        return [TellPresence(device, online)]

    def session_opened(self, device: str) -> list[SdlessEffect]:
        if device not in self._sessions and len(self._sessions) >= self._max_sessions:
            self.sessions_refused += 1
            return []
        self._sessions.add(device)
        if device in self._boards:
            return []
        return [TellPresence(device, True)]

    def session_closed(self, device: str) -> list[SdlessEffect]:
        if device not in self._sessions:
            return []
        self._sessions.discard(device)
        play = self._plays.pop(device, None)
        effects: list[SdlessEffect] = []
        if play is not None:  # SPEAK reports session_closed too; this play ends here
            effects.append(self._report(device, play, AudioPhase.FAILED, reason="session_closed"))
        if device not in self._boards:
            effects.append(TellPresence(device, False))
        return effects

    # -- commands ------------------------------------------------------------------------------
    def command(
        self, device: str, command_id: str, cmd: str, params: dict[str, object]
    ) -> list[SdlessEffect]:
        """A board command for a voice-only device (``route`` said VOICE)."""
        match cmd:
            case "PLAY_MEDIA":
                return self._play_media(device, command_id, params)
            case "STOP_MEDIA":
                effects = self._stop(device, "stopped")
                return [AnswerCommand(DeliveryResult.ACKED), *effects]
            case "LISTEN_START" | "LISTEN_STOP":
                return [AnswerCommand(DeliveryResult.ACKED)]
            case _:
                return [AnswerCommand(DeliveryResult.REJECTED)]

    def _play_media(
        self, device: str, command_id: str, params: dict[str, object]
    ) -> list[SdlessEffect]:
        name, repeat = params.get("name"), params.get("repeat", 1)
        if not isinstance(name, str) or not name.startswith("/"):
            return [AnswerCommand(DeliveryResult.REJECTED)]
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            return [AnswerCommand(DeliveryResult.REJECTED)]
        effects: list[SdlessEffect] = [AnswerCommand(DeliveryResult.ACKED)]
        effects += self._stop(device, "preempted", cancel=False)  # the new play replaces it
        play = self._plays[device] = _Play(command_id, name)
        return [*effects, StartClip(device, play.clip_id, name, min(repeat, MAX_REPEAT))]

    def _stop(self, device: str, reason: str, *, cancel: bool = True) -> list[SdlessEffect]:
        play = self._plays.pop(device, None)
        if play is None:
            return []
        stopped = self._report(device, play, AudioPhase.STOPPED, reason=reason)
        return [CancelClip(device, play.clip_id), stopped] if cancel else [stopped]

    # -- SPEAK's results for our clips ---------------------------------------------------------
    def _current(self, device: str, clip_id: str) -> _Play | None:
        play = self._plays.get(device)
        return play if play is not None and play.clip_id == clip_id else None

    def clip_started(self, device: str, clip_id: str) -> list[SdlessEffect]:
        play = self._current(device, clip_id)
        return [] if play is None else [self._report(device, play, AudioPhase.STARTED)]

    def clip_completed(self, device: str, clip_id: str, duration_ms: int) -> list[SdlessEffect]:
        play = self._current(device, clip_id)
        if play is None:
            return []
        del self._plays[device]
        duration = max(0, duration_ms)
        return [self._report(device, play, AudioPhase.COMPLETED, duration_ms=duration)]

    def clip_interrupted(self, device: str, clip_id: str, reason: str) -> list[SdlessEffect]:
        """Not ours to end (a cancel or replacement of ours already reported): SPEAK could not
        make or finish the play (a missing file, the session gone, a speak step replacing it)."""
        play = self._current(device, clip_id)
        if play is None:
            return []
        del self._plays[device]
        if reason == "replaced":
            return [self._report(device, play, AudioPhase.STOPPED, reason="preempted")]
        return [self._report(device, play, AudioPhase.FAILED, reason=reason)]

    @staticmethod
    def _report(
        device: str,
        play: _Play,
        kind: AudioPhase,
        *,
        duration_ms: int | None = None,
        reason: str | None = None,
    ) -> ReportPlayback:
        event = PlaybackEvent(
            kind, ref=play.command_id, name=play.name, duration_ms=duration_ms, reason=reason
        )
        return ReportPlayback(device, event)
