"""The voice-session v1 core: every transition, the timeouts on a fake clock, turn ids."""

from __future__ import annotations

import pytest

from gateway.chat.voice import (
    BackToChat,
    BeginTurn,
    ChatState,
    CloseUpstream,
    CueKind,
    EndSegment,
    EngineFailed,
    Greet,
    ListenMode,
    OpenUpstream,
    PlayCue,
    ServerStt,
    Standby,
    StopPlayback,
    TaskStarted,
    Tick,
    TtsStarted,
    TtsStopped,
    UplinkVerdict,
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
    assert vs.handle(Tick(), 5_000) == [
        StopPlayback("silence"),
        PlayCue(CueKind.TIMEOUT),
        Standby("silence"),
    ]
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
    assert vs.handle(ServerStt(), 7_500) == [PlayCue(CueKind.SEGMENT_END)]
    assert st(vs) is S.THINKING
    assert not vs.uplink_open
    assert vs.next_deadline() == 7_500 + VoiceConfig().reply_timeout_ms


def test_local_vad_ends_segment_for_embedded_engine() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 100)
    assert vs.handle(VoiceSpeechStopped(), 900) == [
        PlayCue(CueKind.SEGMENT_END),
        EndSegment(1, "vad"),
    ]
    assert st(vs) is S.THINKING
    assert not vs.uplink_open


def test_reply_timeout_goes_to_standby() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 0)
    vs.handle(VoiceSpeechStopped(), 1_000)
    assert vs.handle(Tick(), 1_000 + 20_000) == [
        StopPlayback("no_reply"),
        PlayCue(CueKind.FAILURE),
        Standby("no_reply"),
    ]
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
    assert vs.handle(VoiceListenStop(), 61_000) == [
        PlayCue(CueKind.SEGMENT_END),
        EndSegment(1, "device"),
    ]
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
        PlayCue(CueKind.FAILURE),
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


# -- voice-session v1 in CHAT: greeting, cues, failure, uplink outside a turn --------------------


def greeted(mode: str = "auto") -> VoiceSession:
    vs = VoiceSession(VoiceConfig(local_segments=True, greeting=True))
    vs.handle(VoiceOpened(), 0)
    assert vs.handle(VoiceListenDetect(), 10) == [BeginTurn(1), Greet()]
    return vs


def test_greeting_then_prompt_listen_from_the_end_of_its_cue() -> None:
    vs = greeted()
    assert st(vs) is S.GREETING
    assert not vs.uplink_open  # §2: the greeting is not recognised
    assert vs.next_deadline() == 10 + 20_000  # a greeting that never ends is bounded
    assert vs.handle(TtsStarted(), 20) == []  # its own tts start
    assert vs.handle(VoiceListenStart("realtime"), 30) == []  # the greeting goes on
    assert vs.mode is ListenMode.REALTIME
    assert vs.handle(VoiceListenStop(), 40) == []
    assert st(vs) is S.GREETING
    assert vs.handle(TtsStopped(), 2_000) == []  # the greeting and its start cue played
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.turn == 1  # the greeting belongs to the first turn
    assert vs.next_deadline() == 2_000 + 5_000  # §4: from the end of the start cue
    # only once per session: after a reply, listening again is not greeted
    vs.handle(VoiceSpeechStarted(), 2_100)
    vs.handle(VoiceSpeechStopped(), 2_900)
    vs.handle(TtsStarted(), 3_000)
    assert vs.handle(TtsStopped(), 4_000) == [BeginTurn(2)]
    vs.handle(VoiceClosed("goodbye"), 5_000)
    vs.handle(VoiceOpened(), 6_000)  # a new session is greeted again
    assert vs.handle(VoiceListenStart("auto"), 6_010) == [BeginTurn(3), Greet()]


def test_manual_device_is_not_greeted() -> None:
    vs = VoiceSession(VoiceConfig(greeting=True))
    vs.handle(VoiceOpened(), 0)
    assert vs.handle(VoiceListenStart("manual"), 1) == [BeginTurn(1)]
    assert st(vs) is S.PROMPT_LISTEN


def test_greeting_abort_and_timeout() -> None:
    vs = greeted()
    assert vs.handle(VoiceAbort(), 100) == [StopPlayback("abort")]
    vs = greeted()
    assert vs.handle(Tick(), 10 + 20_000) == [
        StopPlayback("no_greeting"),
        PlayCue(CueKind.FAILURE),
        Standby("no_greeting"),
    ]
    assert st(vs) is S.CLOSED


def test_engine_failure_plays_the_failure_cue_at_once() -> None:
    vs = listening(local=True)
    vs.handle(VoiceSpeechStarted(), 100)
    vs.handle(VoiceSpeechStopped(), 900)
    assert vs.handle(EngineFailed(1, "engine_error"), 950) == [
        StopPlayback("engine_error"),
        PlayCue(CueKind.FAILURE),
        Standby("engine_error"),
    ]
    assert st(vs) is S.CLOSED
    assert vs.next_deadline() is None  # not the reply timeout's 20 s


def test_engine_failure_of_an_old_turn_or_out_of_turn_changes_nothing() -> None:
    vs = listening(local=True)
    assert vs.handle(EngineFailed(1, "engine_error"), 10) == []  # not thinking
    vs.handle(VoiceSpeechStarted(), 100)
    vs.handle(VoiceSpeechStopped(), 900)
    assert vs.handle(EngineFailed(0, "engine_error"), 950) == []  # an earlier turn's
    assert st(vs) is S.THINKING
    vs = greeted()
    assert vs.handle(EngineFailed(1, "tts_error"), 20)[1:] == [
        PlayCue(CueKind.FAILURE),
        Standby("tts_error"),
    ]


def test_start_cue_leads_into_listening_only() -> None:
    vs = listening(local=True)
    assert not vs.start_cue_after_tts  # listening: no speech to end
    vs.handle(VoiceSpeechStarted(), 100)
    vs.handle(VoiceSpeechStopped(), 900)
    assert vs.start_cue_after_tts  # the embedded reply is queued while thinking
    vs.handle(TtsStarted(), 1_000)
    assert vs.start_cue_after_tts  # a bridged reply's tts stop comes while speaking
    manual = listening(mode="manual")
    manual.handle(VoiceListenStop(), 100)
    manual.handle(TtsStarted(), 200)
    assert not manual.start_cue_after_tts  # the device goes idle after the speech


def test_realtime_mode_listens_again_after_each_reply() -> None:
    vs = listening(mode="realtime")
    assert vs.mode is ListenMode.REALTIME
    vs.handle(VoiceSpeechStarted(), 100)
    assert vs.handle(ServerStt(), 900) == [PlayCue(CueKind.SEGMENT_END)]
    vs.handle(TtsStarted(), 1_000)
    assert vs.take_uplink() is UplinkVerdict.SPEAKING  # v1: no uplink while speaking, even realtime
    assert vs.handle(TtsStopped(), 3_000) == [BeginTurn(2)]
    assert st(vs) is S.PROMPT_LISTEN
    assert vs.next_deadline() == 8_000


def test_barge_in_abort_during_tts_stops_playback_and_listens_after_tts_stop() -> None:
    vs = listening(mode="realtime")
    vs.handle(ServerStt(), 900)
    vs.handle(TtsStarted(), 1_000)
    assert vs.handle(VoiceAbort(), 1_200) == [StopPlayback("abort")]
    assert st(vs) is S.SPEAKING  # until the shell's tts stop went out
    assert vs.handle(TtsStopped(), 1_210) == [BeginTurn(2)]
    assert vs.handle(VoiceAbort(), 1_300) == []  # listening: nothing to abort


def test_uplink_verdicts_and_the_wake_word_budget() -> None:
    vs = VoiceSession(VoiceConfig(relay_wake_word=True, wake_word_frames=3))
    assert vs.take_uplink() is UplinkVerdict.CLOSED
    vs.handle(VoiceOpened(), 0)
    assert [vs.take_uplink() for _ in range(4)] == [UplinkVerdict.WAKE_WORD] * 3 + [
        UplinkVerdict.BEFORE_LISTEN
    ]
    vs.handle(VoiceListenDetect(), 10)
    assert vs.take_uplink() is UplinkVerdict.RELAY
    vs.handle(VoiceListenStop(), 20)
    assert vs.take_uplink() is UplinkVerdict.THINKING
    vs.handle(TtsStarted(), 30)
    assert vs.take_uplink() is UplinkVerdict.SPEAKING
    vs.mode = ListenMode.MANUAL
    vs.handle(TtsStopped(), 40)  # manual: idle again, a fresh wake-word budget
    assert st(vs) is S.IDLE
    assert vs.take_uplink() is UplinkVerdict.WAKE_WORD
    vs.handle(TaskStarted(), 50)
    assert vs.take_uplink() is UplinkVerdict.SUSPENDED
    embedded = VoiceSession(VoiceConfig(greeting=True))
    embedded.handle(VoiceOpened(), 0)
    assert embedded.take_uplink() is UplinkVerdict.BEFORE_LISTEN  # not relayed: nowhere to go
    embedded.handle(VoiceListenStart("auto"), 1)
    assert embedded.take_uplink() is UplinkVerdict.GREETING


def test_upstream_lost_while_greeting() -> None:
    vs = greeted()
    assert vs.handle(UpstreamLost("closed"), 20)[:3] == [
        StopPlayback("upstream"),
        PlayCue(CueKind.FAILURE),
        Standby("upstream_lost"),
    ]
