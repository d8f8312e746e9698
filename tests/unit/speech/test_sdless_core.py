"""Lessons on a device without an SD card: routing, presence and plays (pure)."""

from __future__ import annotations

from gateway.speech.sdless_core import (
    AnswerCommand,
    CancelClip,
    MediaRoute,
    ReportPlayback,
    SdlessRoutes,
    StartClip,
    TellPresence,
)
from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent

DEV = "aa_bb"
CLIP = "/english_learning/shadowing/lessons/unit01/01.mp3"
ACKED = AnswerCommand(DeliveryResult.ACKED)
REJECTED = AnswerCommand(DeliveryResult.REJECTED)


def voice_only() -> SdlessRoutes:
    core = SdlessRoutes(max_boards=2, max_sessions=2)
    assert core.session_opened(DEV) == [TellPresence(DEV, True)]
    return core


def report(kind: AudioPhase, ref: str = "c1", **fields: object) -> ReportPlayback:
    return ReportPlayback(DEV, PlaybackEvent(kind, ref=ref, name=CLIP, **fields))  # type: ignore[arg-type]


def test_a_session_without_a_board_is_voice_only_and_online_while_open() -> None:
    core = SdlessRoutes(max_boards=2, max_sessions=2)
    assert core.route(DEV) is MediaRoute.BOARD  # no session
    assert core.session_opened(DEV) == [TellPresence(DEV, True)]
    assert core.route(DEV) is MediaRoute.VOICE
    assert core.session_closed(DEV) == [TellPresence(DEV, False)]
    assert core.route(DEV) is MediaRoute.BOARD
    assert core.session_closed(DEV) == []  # not open


def test_a_board_seen_once_keeps_the_device_on_the_board() -> None:
    core = SdlessRoutes(max_boards=2, max_sessions=2)
    assert core.board_presence(DEV, False) == [TellPresence(DEV, False)]  # retained offline
    assert core.session_opened(DEV) == []  # presence stays the board's
    assert core.route(DEV) is MediaRoute.BOARD
    assert core.session_closed(DEV) == []


def test_a_board_appearing_during_a_session_takes_the_device() -> None:
    core = voice_only()
    assert core.board_presence(DEV, True) == [TellPresence(DEV, True)]
    assert core.route(DEV) is MediaRoute.BOARD


def test_bounded_boards_and_sessions() -> None:
    core = SdlessRoutes(max_boards=1, max_sessions=1)
    core.board_presence("b1", True)
    core.board_presence("b2", True)  # b1 forgotten
    assert core.boards_forgotten == 1
    assert core.session_opened("b1") == [TellPresence("b1", True)]
    assert core.session_opened("b1") == [TellPresence("b1", True)]  # a new session of it
    assert core.session_opened("x") == []
    assert core.sessions_refused == 1
    assert core.route("x") is MediaRoute.BOARD


def test_play_media_streams_the_clip_and_completes_with_its_duration() -> None:
    core = voice_only()
    effects = core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP, "repeat": 1})
    assert effects == [ACKED, StartClip(DEV, "sdless/c1", CLIP, 1)]
    assert core.owns_clip("sdless/c1")
    assert not core.owns_clip("q1")
    assert core.clip_started(DEV, "sdless/c1") == [report(AudioPhase.STARTED)]
    assert core.clip_completed(DEV, "other", 5) == []  # not the current clip
    done = core.clip_completed(DEV, "sdless/c1", 1440)
    assert done == [report(AudioPhase.COMPLETED, duration_ms=1440)]
    assert core.clip_completed(DEV, "sdless/c1", 1440) == []  # already ended


def test_repeat_n_is_one_stream_of_n_plays() -> None:
    core = voice_only()
    assert core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP, "repeat": 3})[1:] == [
        StartClip(DEV, "sdless/c1", CLIP, 3)
    ]
    assert core.clip_completed(DEV, "sdless/c1", -5) == [
        report(AudioPhase.COMPLETED, duration_ms=0)
    ]


def test_stop_cancels_and_reports_stopped() -> None:
    core = voice_only()
    core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP})
    assert core.command(DEV, "s1", "STOP_MEDIA", {}) == [
        ACKED,
        CancelClip(DEV, "sdless/c1"),
        report(AudioPhase.STOPPED, reason="stopped"),
    ]
    assert core.clip_interrupted(DEV, "sdless/c1", "cancelled") == []  # ours, reported
    assert core.command(DEV, "s2", "STOP_MEDIA", {}) == [ACKED]  # nothing playing


def test_a_new_play_preempts_the_one_in_progress() -> None:
    core = voice_only()
    core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP})
    assert core.command(DEV, "c2", "PLAY_MEDIA", {"name": CLIP}) == [
        ACKED,
        report(AudioPhase.STOPPED, reason="preempted"),
        StartClip(DEV, "sdless/c2", CLIP, 1),
    ]


def test_speak_failures_become_audio_failed_and_a_replacement_stopped() -> None:
    core = voice_only()
    core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP})
    assert core.clip_interrupted(DEV, "sdless/c1", "clip_missing") == [
        report(AudioPhase.FAILED, reason="clip_missing")
    ]
    core.command(DEV, "c2", "PLAY_MEDIA", {"name": CLIP})
    assert core.clip_interrupted(DEV, "sdless/c2", "replaced") == [
        report(AudioPhase.STOPPED, ref="c2", reason="preempted")
    ]


def test_the_session_closing_fails_the_play_and_takes_presence() -> None:
    core = voice_only()
    core.command(DEV, "c1", "PLAY_MEDIA", {"name": CLIP})
    assert core.session_closed(DEV) == [
        report(AudioPhase.FAILED, reason="session_closed"),
        TellPresence(DEV, False),
    ]


def test_unsupported_commands_are_rejected_listen_is_skipped_bad_plays_refused() -> None:
    core = voice_only()
    for cmd in ("AUDIO_PAUSE", "AUDIO_RESUME", "SOUND", "INDICATE", "TASK_START"):
        assert core.command(DEV, "x", cmd, {}) == [REJECTED]
    for cmd in ("LISTEN_START", "LISTEN_STOP"):
        assert core.command(DEV, "x", cmd, {}) == [ACKED]
    for params in (
        {},
        {"name": "relative.mp3"},
        {"name": CLIP, "repeat": 0},
        {"name": CLIP, "repeat": True},
        {"name": CLIP, "repeat": "2"},
    ):
        assert core.command(DEV, "x", "PLAY_MEDIA", params) == [REJECTED]
    effects = core.command(DEV, "c9", "PLAY_MEDIA", {"name": CLIP, "repeat": 10_000})
    assert effects[-1] == StartClip(DEV, "sdless/c9", CLIP, 100)
