"""Voice-session v1 on the gateway side: a pure core (events and ``now`` in, effects out).

One :class:`VoiceSession` per device in CHAT mode (seed voice-session-v1 §1-§4):

* a ``listen start`` (or a wake word, ``listen detect``) opens a turn in PROMPT_LISTEN with a
  fresh turn id — with the embedded engine (``greeting``) the session's first one in GREETING
  (§1.2: the greeting, ending with the start cue; no uplink), PROMPT_LISTEN when it stopped; with a device that relies on server VAD (``auto``, ``realtime``) the gateway
  arms the silence timeout (default 5 s), reset by speech; expiry → standby (the shell says
  goodbye, the device goes idle);
* the segment ends by server VAD: the gateway's own VAD when the embedded engine answers
  (``local_segments``), the upstream's (its ``stt``) when bridged, or the device's
  ``listen stop`` (push-to-talk);
* one turn at a time: uplink flows only in PROMPT_LISTEN / HEARING (:attr:`uplink_open`), never
  while a reply is prepared or TTS plays (v1 has no barge-in); before the first listen of a
  bridged session the firmware's buffered wake-word audio (sent before its ``listen detect``) is
  relayed, up to ``wake_word_frames``; :meth:`take_uplink` says, per frame, which (and why not);
* cues (:class:`CueKind`): SEGMENT_END when a segment ends (§1.4), TIMEOUT before a silence
  standby (§4), FAILURE before any other standby — a reply that never came, the engine or the
  upstream failing (§3.3, at once: :class:`EngineFailed`); the START cue is the tail of the
  speech that leads into listening (:attr:`start_cue_after_tts`, the shell appends it before
  ``tts stop``);
* after TTS, ``auto``/``realtime`` devices listen again (a new turn, the timeout re-armed from
  the moment ``tts stop`` went out, i.e. the end of the cue); a ``manual`` device goes idle on
  its own and the gateway does not fight it (no timeout, no goodbye);
* a task (lesson) suspends the session; back in CHAT it waits for the device's next listen.

Events the world may send at any time (late, duplicate, out of turn) change nothing and return
no effects; only a broken shell contract raises :class:`VoiceSessionError` naming the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gateway.chat.voice_events import (
    BackToChat,
    BeginTurn,
    CloseUpstream,
    CueKind,
    EndSegment,
    EngineFailed,
    Greet,
    OpenUpstream,
    PlayCue,
    ServerStt,
    Standby,
    StopPlayback,
    TaskStarted,
    Tick,
    TtsStarted,
    TtsStopped,
    UpstreamLost,
    VoiceAbort,
    VoiceAlarm,
    VoiceClosed,
    VoiceEffect,
    VoiceEvent,
    VoiceListenDetect,
    VoiceListenStart,
    VoiceListenStop,
    VoiceOpened,
    VoiceSpeechStarted,
    VoiceSpeechStopped,
)

# The core's events and effects are re-exported: one import for the core's users.
__all__ = [
    "BackToChat",
    "BeginTurn",
    "ChatState",
    "CloseUpstream",
    "CueKind",
    "EndSegment",
    "EngineFailed",
    "Greet",
    "ListenMode",
    "OpenUpstream",
    "PlayCue",
    "ServerStt",
    "Standby",
    "StopPlayback",
    "TaskStarted",
    "Tick",
    "TtsStarted",
    "TtsStopped",
    "UplinkVerdict",
    "UpstreamLost",
    "VoiceAbort",
    "VoiceAlarm",
    "VoiceClosed",
    "VoiceConfig",
    "VoiceEffect",
    "VoiceEvent",
    "VoiceListenDetect",
    "VoiceListenStart",
    "VoiceListenStop",
    "VoiceOpened",
    "VoiceSession",
    "VoiceSessionError",
    "VoiceSpeechStarted",
    "VoiceSpeechStopped",
]


class ChatState(Enum):
    CLOSED = "closed"  # no device session
    IDLE = "idle"  # session open, device not listening
    GREETING = "greeting"  # the embedded engine greets (§1.2): no uplink, reply timeout armed
    PROMPT_LISTEN = "prompt_listen"  # waiting for the user's sentence (silence timeout armed)
    HEARING = "hearing"  # speech in progress
    THINKING = "thinking"  # segment ended, waiting for the reply (reply timeout armed)
    SPEAKING = "speaking"  # TTS playing: no uplink
    SUSPENDED = "suspended"  # a task owns the device


class ListenMode(Enum):
    AUTO = "auto"  # device relies on server VAD
    MANUAL = "manual"  # push-to-talk: the device runs its own state machine
    REALTIME = "realtime"  # continuous, server VAD

    @classmethod
    def parse(cls, mode: str | None, default: ListenMode) -> ListenMode:
        try:
            return cls(mode) if mode else default
        except ValueError:
            return default


class UplinkVerdict(Enum):
    """What becomes of one uplink frame (:meth:`VoiceSession.take_uplink`); every value but
    RELAY and SUSPENDED (the task's audio) is counted by the shell as its reason."""

    RELAY = "relay"  # listening: to the answering side
    WAKE_WORD = "wake_word"  # relayed: buffered wake-word audio before the device's listen
    BEFORE_LISTEN = "before_listen"  # dropped: no listen yet (embedded, or past the cap)
    GREETING = "greeting"  # dropped: the greeting plays (§2: not to be recognised)
    THINKING = "thinking"  # dropped: the segment ended, its reply is prepared
    SPEAKING = "speaking"  # dropped: TTS plays (v1: no barge-in)
    CLOSED = "closed"  # dropped: no session in CHAT
    SUSPENDED = "suspended"  # not CHAT's: a task owns the device


_DROPPED = {
    ChatState.IDLE: UplinkVerdict.BEFORE_LISTEN,
    ChatState.GREETING: UplinkVerdict.GREETING,
    ChatState.THINKING: UplinkVerdict.THINKING,
    ChatState.SPEAKING: UplinkVerdict.SPEAKING,
    ChatState.CLOSED: UplinkVerdict.CLOSED,
    ChatState.SUSPENDED: UplinkVerdict.SUSPENDED,
}


class VoiceSessionError(Exception):
    def __init__(self, state: ChatState, problem: str) -> None:
        self.state = state
        super().__init__(f"in {state.value}: {problem}")


@dataclass(frozen=True, slots=True)
class VoiceConfig:
    silence_timeout_ms: float = 5_000.0
    reply_timeout_ms: float = 20_000.0
    local_segments: bool = False  # True: the gateway's VAD ends segments (embedded engine)
    greeting: bool = False  # True: the session's first listen is greeted (embedded engine)
    relay_wake_word: bool = False  # True: audio before the first listen goes up (bridged)
    wake_word_frames: int = 40  # at most this much of it per idle stretch (2.4 s of 60 ms)


_LISTENING = (ChatState.PROMPT_LISTEN, ChatState.HEARING)
_ACTIVE = (*_LISTENING, ChatState.IDLE, ChatState.THINKING, ChatState.SPEAKING)
_ANSWERING = (ChatState.GREETING, ChatState.THINKING)  # the engine works on this turn
_REPLYING = (ChatState.THINKING, ChatState.SPEAKING)


class VoiceSession:
    def __init__(self, config: VoiceConfig | None = None, *, suspended: bool = False) -> None:
        self.config = config or VoiceConfig()
        self.state = ChatState.SUSPENDED if suspended else ChatState.CLOSED
        self.session_open = False
        self.mode = ListenMode.AUTO
        self.turn = 0
        self.deadline: float | None = None
        self._now = 0.0
        self._greeted = False  # this session's greeting was said
        self._early = 0  # frames relayed before the listen of this idle stretch

    @property
    def uplink_open(self) -> bool:
        """Whether the device's microphone frames go to the answering side now."""
        return self.state in _LISTENING

    @property
    def start_cue_after_tts(self) -> bool:
        """Whether the reply being prepared or played leads into listening (its ``tts stop``
        is followed by PROMPT_LISTEN): the shell ends its speech with the START cue."""
        return self.state in _REPLYING and self.mode is not ListenMode.MANUAL

    def take_uplink(self) -> UplinkVerdict:
        """One uplink frame arrived: where it goes (counts the wake-word budget)."""
        state = self.state
        if state in _LISTENING:
            return UplinkVerdict.RELAY
        if (
            state is ChatState.IDLE
            and self.config.relay_wake_word
            and self._early < self.config.wake_word_frames
        ):
            self._early += 1
            return UplinkVerdict.WAKE_WORD
        return _DROPPED[state]

    def next_deadline(self) -> float | None:
        return self.deadline

    def handle(self, event: VoiceEvent, now: float) -> list[VoiceEffect]:  # noqa: PLR0911, PLR0912 - the transition table
        if now < self._now:
            raise VoiceSessionError(self.state, f"time went backwards ({now} < {self._now})")
        self._now = now
        state = self.state
        match event:
            case VoiceOpened():
                self.session_open = True
                self._greeted = False
                if state is ChatState.SUSPENDED:
                    return []
                self._go(ChatState.IDLE)
                return [OpenUpstream()]
            case VoiceClosed(reason=reason):
                self.session_open = False
                if state is ChatState.SUSPENDED or state is ChatState.CLOSED:
                    return []
                self._go(ChatState.CLOSED)
                return [StopPlayback("closed"), CloseUpstream(reason)]
            case VoiceListenStart(mode=mode) if state in _ACTIVE:
                self.mode = ListenMode.parse(mode, self.mode)
                return self._listen(now)
            case VoiceListenDetect() if state in _ACTIVE:
                return self._listen(now)
            case VoiceListenStart(mode=mode) if state is ChatState.GREETING:
                self.mode = ListenMode.parse(mode, self.mode)  # the greeting goes on
                return []
            case TtsStopped() if state is ChatState.GREETING:
                self._go(ChatState.PROMPT_LISTEN, self._silence_deadline(now))
                return []
            case VoiceListenStop() if state in _LISTENING:
                return self._end_segment(now, "device")
            case VoiceSpeechStarted() if state is ChatState.PROMPT_LISTEN:
                self._go(ChatState.HEARING)
                return []
            case VoiceSpeechStopped() if state is ChatState.HEARING:
                if self.config.local_segments:
                    return self._end_segment(now, "vad")
                self._go(ChatState.PROMPT_LISTEN, self._silence_deadline(now))
                return []
            case ServerStt() if state in _LISTENING:
                self._go(ChatState.THINKING, now + self.config.reply_timeout_ms)
                return [PlayCue(CueKind.SEGMENT_END)]
            case TtsStarted() if state in _ACTIVE:
                self._go(ChatState.SPEAKING)
                return []
            case TtsStopped() if state is ChatState.SPEAKING:
                if self.mode is ListenMode.MANUAL:
                    self._go(ChatState.IDLE)
                    return []
                return self._listen(now)
            case VoiceAbort() if state in (*_ANSWERING, ChatState.SPEAKING):
                return [StopPlayback("abort")]
            case TaskStarted():
                if state is ChatState.SUSPENDED:
                    return []
                self._go(ChatState.SUSPENDED)
                return (
                    []
                    if state is ChatState.CLOSED
                    else [StopPlayback("task"), CloseUpstream("task")]
                )
            case BackToChat() if state is ChatState.SUSPENDED:
                if not self.session_open:
                    self._go(ChatState.CLOSED)
                    return []
                self._go(ChatState.IDLE)
                return [OpenUpstream()]
            case UpstreamLost(reason=reason) if state in (*_ACTIVE, ChatState.GREETING):
                self._go(ChatState.CLOSED)
                return [
                    StopPlayback("upstream"),
                    PlayCue(CueKind.FAILURE),
                    Standby("upstream_lost"),
                    VoiceAlarm("chat_upstream_lost", reason),
                ]
            case EngineFailed(turn=turn, reason=reason) if (
                state in _ANSWERING and turn == self.turn
            ):
                self._go(ChatState.CLOSED)
                return [StopPlayback(reason), PlayCue(CueKind.FAILURE), Standby(reason)]
            case Tick():
                return self._on_time(now)
            case (
                VoiceListenStart()
                | VoiceListenDetect()
                | VoiceListenStop()
                | VoiceSpeechStarted()
                | VoiceSpeechStopped()
                | ServerStt()
                | TtsStarted()
                | TtsStopped()
                | VoiceAbort()
                | BackToChat()
                | UpstreamLost()
                | EngineFailed()
            ):
                return []  # out of turn: changes nothing
            case _:
                raise VoiceSessionError(state, f"not a voice-session event: {event!r}")

    def _on_time(self, now: float) -> list[VoiceEffect]:
        if self.deadline is None or now < self.deadline:
            return []
        if self.state is ChatState.PROMPT_LISTEN:
            self._go(ChatState.CLOSED)
            return [StopPlayback("silence"), PlayCue(CueKind.TIMEOUT), Standby("silence")]
        reason = "no_greeting" if self.state is ChatState.GREETING else "no_reply"
        self._go(ChatState.CLOSED)
        return [StopPlayback(reason), PlayCue(CueKind.FAILURE), Standby(reason)]

    def _listen(self, now: float) -> list[VoiceEffect]:
        effects: list[VoiceEffect] = []
        if self.state not in _LISTENING:
            self.turn += 1
            effects.append(BeginTurn(self.turn))
        if self.config.greeting and not self._greeted and self.mode is not ListenMode.MANUAL:
            self._greeted = True
            self._go(ChatState.GREETING, now + self.config.reply_timeout_ms)
            return [*effects, Greet()]
        self._go(ChatState.PROMPT_LISTEN, self._silence_deadline(now))
        return effects

    def _end_segment(self, now: float, by: str) -> list[VoiceEffect]:
        self._go(ChatState.THINKING, now + self.config.reply_timeout_ms)
        return [PlayCue(CueKind.SEGMENT_END), EndSegment(self.turn, by)]

    def _silence_deadline(self, now: float) -> float | None:
        if self.mode is ListenMode.MANUAL:
            return None  # the device decides when the user is done
        return now + self.config.silence_timeout_ms

    def _go(self, state: ChatState, deadline: float | None = None) -> None:
        self.state = state
        self.deadline = deadline
        if state is ChatState.IDLE:
            self._early = 0  # a new idle stretch: a new wake word may come
