"""The voice-session v1 core: every transition, the timeouts on a fake clock, turn ids."""

from __future__ import annotations

import pytest

from gateway.chat.voice import (
    BackToChat,
    BeginTurn,
    ChatState,
    CloseUpstream,
    EndSegment,
    ListenMode,
    OpenUpstream,
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
    VoiceConfig,
    VoiceEvent,
    VoiceListenDetect,
    VoiceListenStart,
    VoiceListenStop,
    VoiceOpened,
    VoiceSession,
    VoiceSessionError,
    VoiceSpeechStarted,
    VoiceSpeechStopped,
)

S = ChatState


def st(vs: VoiceSession) -> ChatState:
    """The state, read through a call (mypy would narrow ``vs.state`` across handle())."""
    return vs.state


def listening(*, local: bool = False, mode: str = "auto", at: float = 0.0) -> VoiceSession:
    vs = VoiceSession(VoiceConfig(local_segments=local))
    assert vs.handle(VoiceOpened(), at) == [OpenUpstream()]
    assert vs.handle(VoiceListenStart(mode), at) == [BeginTurn(1)]
    return vs


def test_hello_then_listen_opens_turn_and_uplink() -> None:
    vs = VoiceSession()
    assert st(vs) is S.CLOSED
    assert not vs.uplink_open
    assert vs.handle(VoiceOpened(), 0) == [OpenUpstream()]
    assert st(vs) is S.IDLE
    assert not vs.uplink_open
    assert vs.next_deadline() is None
    assert vs.handle(VoiceListenStart("auto"), 10) == [BeginTurn(1)]
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.uplink_open
    assert vs.next_deadline() == 5_010


def test_silence_timeout_goes_to_standby() -> None:
    vs = listening()
    assert vs.handle(Tick(), 4_999) == []
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.handle(Tick(), 5_000) == [StopPlayback("silence"), Standby("silence")]
    assert st(vs) is S.CLOSED
    assert vs.next_deadline() is None
    assert vs.handle(Tick(), 9_000) == []  # nothing armed


def test_speech_resets_silence_timeout_bridged() -> None:
    vs = listening()
    assert vs.handle(VoiceSpeechStarted(), 4_000) == []
    assert st(vs) is S.HEARING
    assert vs.next_deadline() is None
    assert vs.uplink_open
    assert vs.handle(Tick(), 6_000) == []  # no deadline while speaking
    # bridged: the upstream's VAD ends the segment, ours only restarts the timeout
    assert vs.handle(VoiceSpeechStopped(), 7_000) == []
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.next_deadline() == 12_000
    assert vs.handle(ServerStt(), 7_500) == []
    assert st(vs) is S.THINKING
    assert not vs.uplink_open
    assert vs.next_deadline() == 7_500 + VoiceConfig().reply_timeout_ms


def test_local_vad_ends_segment_for_embedded_engine() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 100)
    assert vs.handle(VoiceSpeechStopped(), 900) == [EndSegment(1, "vad")]
    assert st(vs) is S.THINKING
    assert not vs.uplink_open


def test_reply_timeout_goes_to_standby() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 0)
    vs.handle(VoiceSpeechStopped(), 1_000)
    assert vs.handle(Tick(), 1_000 + 20_000) == [StopPlayback("no_reply"), Standby("no_reply")]
    assert st(vs) is S.CLOSED


def test_turn_cycle_auto_listens_again_with_new_turn() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 0)
    vs.handle(VoiceSpeechStopped(), 1_000)
    assert vs.handle(TtsStarted(), 1_500) == []
    assert st(vs) is S.SPEAKING
    assert not vs.uplink_open
    assert vs.next_deadline() is None
    assert vs.handle(VoiceSpeechStarted(), 1_600) == []  # no barge-in: ignored while speaking
    assert st(vs) is S.SPEAKING
    assert vs.handle(TtsStopped(), 3_000) == [BeginTurn(2)]
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.next_deadline() == 8_000
    # the device's own listen start after tts stop keeps the turn and re-arms from now
    assert vs.handle(VoiceListenStart("auto"), 3_100) == []
    assert vs.turn == 2
    assert vs.next_deadline() == 8_100


def test_manual_mode_device_drives() -> None:
    vs = listening(mode="manual")
    assert vs.mode is ListenMode.MANUAL
    assert vs.next_deadline() is None
    assert vs.handle(Tick(), 60_000) == []  # no silence timeout for push-to-talk
    assert vs.handle(VoiceListenStop(), 61_000) == [EndSegment(1, "device")]
    vs.handle(TtsStarted(), 62_000)
    assert vs.handle(TtsStopped(), 63_000) == []
    assert st(vs) is S.IDLE
    assert vs.next_deadline() is None


def test_wake_word_opens_turn_in_last_mode() -> None:
    vs = VoiceSession()
    vs.handle(VoiceOpened(), 0)
    assert vs.handle(VoiceListenDetect(), 5) == [BeginTurn(1)]
    assert vs.mode is ListenMode.AUTO
    assert st(vs) is S.PROMPT_LISTEN


def test_unknown_mode_keeps_previous() -> None:
    assert ListenMode.parse("bogus", ListenMode.MANUAL) is ListenMode.MANUAL
    assert ListenMode.parse(None, ListenMode.REALTIME) is ListenMode.REALTIME
    assert ListenMode.parse("realtime", ListenMode.AUTO) is ListenMode.REALTIME


def test_greeting_tts_from_idle() -> None:
    vs = VoiceSession()
    vs.handle(VoiceOpened(), 0)
    vs.handle(TtsStarted(), 1)
    assert st(vs) is S.SPEAKING
    assert vs.handle(TtsStopped(), 2) == [BeginTurn(1)]


def test_abort_stops_playback_only_while_answering() -> None:
    vs = listening(local=True)
    assert vs.handle(VoiceAbort(), 1) == []  # listening: nothing to stop
    vs.handle(VoiceSpeechStarted(), 2)
    vs.handle(VoiceSpeechStopped(), 3)
    assert vs.handle(VoiceAbort(), 4) == [StopPlayback("abort")]
    vs.handle(TtsStarted(), 5)
    assert vs.handle(VoiceAbort(), 6) == [StopPlayback("abort")]
    assert st(vs) is S.SPEAKING  # until tts stop went out


def test_device_goodbye_closes_upstream() -> None:
    vs = listening()
    assert vs.handle(VoiceClosed("device_goodbye"), 1) == [
        StopPlayback("closed"),
        CloseUpstream("device_goodbye"),
    ]
    assert st(vs) is S.CLOSED
    assert not vs.session_open
    assert vs.handle(VoiceClosed("again"), 2) == []


def test_upstream_lost_goodbye_and_alarm() -> None:
    vs = listening()
    assert vs.handle(UpstreamLost("connection reset"), 1) == [
        StopPlayback("upstream"),
        Standby("upstream_lost"),
        VoiceAlarm("chat_upstream_lost", "connection reset"),
    ]
    assert st(vs) is S.CLOSED
    assert vs.handle(UpstreamLost("late"), 2) == []  # once


def test_task_suspends_and_back_to_chat_resumes() -> None:
    vs = listening()
    assert vs.handle(TaskStarted(), 1) == [StopPlayback("task"), CloseUpstream("task")]
    assert st(vs) is S.SUSPENDED
    assert not vs.uplink_open
    assert vs.next_deadline() is None
    assert vs.handle(TaskStarted(), 2) == []  # preemption: still suspended
    # device events while a task owns it change nothing
    for event in (
        VoiceListenStart("auto"),
        VoiceSpeechStarted(),
        TtsStarted(),
        UpstreamLost("x"),
        Tick(),
    ):
        assert vs.handle(event, 3) == []
    assert st(vs) is S.SUSPENDED
    assert vs.handle(VoiceOpened(), 4) == []  # a re-hello during the lesson: no chat yet
    assert vs.handle(BackToChat(), 5) == [OpenUpstream()]
    assert st(vs) is S.IDLE
    assert vs.handle(VoiceListenStart(None), 6) == [BeginTurn(2)]


def test_back_to_chat_without_session() -> None:
    vs = listening()
    vs.handle(TaskStarted(), 1)
    assert vs.handle(VoiceClosed("idle"), 2) == []
    assert vs.handle(BackToChat(), 3) == []
    assert st(vs) is S.CLOSED
    assert vs.handle(BackToChat(), 4) == []  # not suspended: nothing


def test_task_on_closed_session_and_suspended_start() -> None:
    vs = VoiceSession()
    assert vs.handle(TaskStarted(), 0) == []
    assert st(vs) is S.SUSPENDED
    assert VoiceSession(suspended=True).state is S.SUSPENDED


@pytest.mark.parametrize(
    "event",
    [
        VoiceListenStop(),
        VoiceSpeechStarted(),
        VoiceSpeechStopped(),
        ServerStt(),
        TtsStopped(),
        VoiceAbort(),
        VoiceListenDetect(),
        VoiceListenStart("auto"),
        TtsStarted(),
    ],
)
def test_out_of_turn_events_on_closed_change_nothing(event: VoiceEvent) -> None:
    vs = VoiceSession()
    assert vs.handle(event, 0) == []
    assert st(vs) is S.CLOSED


def test_contract_errors_name_the_state() -> None:
    vs = listening(at=10)
    with pytest.raises(VoiceSessionError, match="prompt_listen: time went backwards"):
        vs.handle(Tick(), 5)
    with pytest.raises(VoiceSessionError, match="not a voice-session event"):
        vs.handle("nonsense", 20)  # type: ignore[arg-type]
