"""A shadowing lesson driven event by event on a fake clock: the timer alone steps."""

from __future__ import annotations

import pytest

from gateway.tasks.core import (
    AsrText,
    AudioPhase,
    ButtonPress,
    CommandOutcome,
    ControlAction,
    ControlReply,
    ControlRequest,
    DeliveryResult,
    Ignored,
    InstanceState,
    PlaybackEvent,
    PublishTaskEvent,
    ReturnToChat,
    RuntimeConfig,
    RuntimeState,
    StoreInstance,
    StoreStep,
    SubmitUtterance,
    UtteranceStarted,
    UtteranceStopped,
    WindowLateness,
)

from .helpers import PATH, SHADOWING, Driver, catalog, commands, of, played

START = ControlRequest(ControlAction.START, "r1", "english_learning", "shadowing", "unit01")


def files(path: str) -> str | None:
    return {"english_learning/shadowing/lessons/unit01/03.txt": "I am fine, thanks."}.get(path)


def test_full_lesson_steps_only_when_the_window_timer_fires() -> None:
    d = Driver(read_text=files)
    out = d.at(0, START)
    assert of(ControlReply, out)[0].accepted
    assert played(out) == [PATH + "01.mp3"]
    assert d.rt.state is RuntimeState.PLAYING
    t = 0.0
    for i, clip in enumerate(["01.mp3", "02.mp3", "03.mp3", "04.mp3"]):
        play = d.last_play()
        assert play.params == {"name": PATH + clip, "repeat": 1}
        # ack, the board's completion opens the window T = 1.5 x 2000 = 3000
        assert d.at(t + 50, CommandOutcome(play.command_id, DeliveryResult.ACKED)) == []
        out = d.complete(t + 2000, duration_ms=2000)
        assert [c.cmd for c in commands(out)] == ["LISTEN_START"]
        assert d.rt.state is RuntimeState.LISTENING
        close = t + 2000 + 3000
        assert d.rt.next_deadline() == close
        # the child says the right sentence early, ASR matches: nothing steps
        early = [
            d.at(t + 2100, UtteranceStarted(f"u{i}a")),
            d.at(t + 2900, UtteranceStopped(f"u{i}a", 800)),
            d.at(t + 3000, AsrText("i1", i, "good morning how are you")),
            d.at(t + 3100, UtteranceStarted(f"u{i}b")),
            d.at(t + 3600, UtteranceStopped(f"u{i}b", 500)),
            d.tick(close - 1),
        ]
        assert all(commands(e) == [] for e in early)
        submitted = [u.utterance_id for e in early for u in of(SubmitUtterance, e)]
        assert submitted == [f"u{i}a", f"u{i}b"]  # the side path upserts: the last one wins
        out = d.tick(close)
        (closed,) = of(WindowLateness, out)
        assert (closed.step_index, closed.planned_ms, closed.actual_ms) == (i, close, close)
        assert commands(out)[0].cmd == "LISTEN_STOP"
        t = close
        if i < 3:
            assert played(out) == [PATH + f"0{i + 2}.mp3"]
    # the last window closed: completed, back to chat
    assert of(ReturnToChat, out) == [ReturnToChat("i1")]
    (done,) = of(StoreInstance, out)
    assert (done.record.state, done.record.reason, done.record.ended_ms) == (
        InstanceState.COMPLETED,
        None,
        t,
    )
    assert d.rt.state is RuntimeState.IDLE
    assert d.rt.next_deadline() is None
    steps = {s.record.step_index: s.record for s in of(StoreStep, d.log)}
    assert [steps[i].expected_text for i in range(4)] == [
        "Good morning.",  # transcripts
        "How are you?",  # sentences[1]
        "I am fine, thanks.",  # 03.txt beats sentences[2]
        "See you.",
    ]
    assert steps[0].window_planned_close_ms == steps[0].window_closed_ms == 5000
    assert [p.event for p in of(PublishTaskEvent, d.log)].count("window.closed") == 4


@pytest.mark.parametrize(("duration", "window"), [(100, 800), (None, 1500), (0, 1500)])
def test_short_or_unknown_durations(duration: int | None, window: float) -> None:
    # None or 0 (board could not tell): the catalog's duration (02.mp3: 1000 ms x 1.5);
    # 100 ms: the 800 ms minimum
    d = Driver()
    d.at(0, START)
    d.complete(10, duration_ms=2000)
    d.tick(3010)
    assert d.last_play().params["name"] == PATH + "02.mp3"
    d.complete(4000, duration_ms=duration)
    assert d.rt.next_deadline() == 4000 + window


def test_silence_and_wrong_speech_still_step_on_time() -> None:
    d = Driver()
    d.at(0, START)
    d.complete(1000)
    d.at(2000, AsrText("i1", 0, "banana"))  # wrong text
    assert played(d.tick(4000)) == [PATH + "02.mp3"]  # 1000 + 3000: silence did not delay


def test_mic_while_playing_is_ignored() -> None:
    d = Driver()
    assert d.at(0, UtteranceStarted("chat")) == []  # CHAT: not the runtime's business
    d.at(0, START)
    out = d.at(10, UtteranceStarted("u1")) + d.at(20, UtteranceStopped("u1"))
    assert [i.reason for i in of(Ignored, out)] == ["no listen window open"] * 2
    assert of(SubmitUtterance, out) == []


def test_utterance_open_at_window_close_is_submitted_truncated() -> None:
    d = Driver()
    d.at(0, START)
    d.complete(1000)
    d.at(3900, UtteranceStarted("u9"))
    out = d.tick(4000)
    assert of(SubmitUtterance, out) == [SubmitUtterance("i1", 0, "u9", truncated=True)]
    assert of(Ignored, d.at(4100, UtteranceStopped("u9"))) != []


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (PlaybackEvent(AudioPhase.FAILED, None, PATH + "01.mp3"), "audio.failed"),
        (PlaybackEvent(AudioPhase.STOPPED, None, PATH + "01.mp3"), "audio.stopped"),
    ],
)
def test_failed_or_unsolicited_stop_advances_with_a_failed_step(
    event: PlaybackEvent, reason: str
) -> None:
    d = Driver()
    d.at(0, START)
    out = d.at(500, event)
    assert played(out) == [PATH + "02.mp3"]
    assert "STOP_MEDIA" not in [c.cmd for c in commands(out)]
    failed = [s.record for s in of(StoreStep, out) if s.record.step_index == 0]
    assert failed[-1].failure == reason
    assert failed[-1].window_opened_ms is None


@pytest.mark.parametrize(
    "outcome", [DeliveryResult.EXPIRED, DeliveryResult.FAILED, DeliveryResult.REJECTED]
)
def test_play_not_delivered_advances(outcome: DeliveryResult) -> None:
    d = Driver()
    d.at(0, START)
    out = d.at(3000, CommandOutcome(d.last_play().command_id, outcome))
    assert played(out) == [PATH + "02.mp3"]
    assert of(StoreStep, out)[0].record.failure == f"play_{outcome}"


def test_watchdog_with_unknown_duration_uses_the_maximum() -> None:
    d = Driver()
    d.at(0, START)
    assert d.rt.next_deadline() == 120_000
    assert d.tick(119_999) == []
    out = d.tick(120_000)
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA", "PLAY_MEDIA"]
    assert of(StoreStep, out)[0].record.failure == "watchdog"
    # the board's audio.stopped for the stop we asked for is not a failure of clip 02
    stop = PlaybackEvent(AudioPhase.STOPPED, None, PATH + "01.mp3")
    assert of(Ignored, d.at(120_010, stop))[0].reason == "stop requested by the gateway"
    assert d.rt.instance is not None
    assert d.rt.instance.index == 1
    # with another requested stop still pending, an unsolicited stop of clip 03 is a failure
    d.tick(240_000)
    out = d.at(240_010, PlaybackEvent(AudioPhase.STOPPED, None, PATH + "03.mp3"))
    assert of(StoreStep, out)[0].record.failure == "audio.stopped"


def test_watchdog_from_known_and_started_durations() -> None:
    d = Driver()
    d.at(0, START)
    d.complete(1000)
    d.tick(4000)  # 02.mp3 has a catalog duration of 1000 ms: watchdog 1000 + 500 grace
    assert d.rt.next_deadline() == 5500
    ref = d.last_play().command_id
    assert d.at(4100, PlaybackEvent(AudioPhase.STARTED, ref, None, 4000)) == []
    assert d.rt.next_deadline() == 8600  # re-armed from the board's duration
    assert d.at(4200, PlaybackEvent(AudioPhase.STARTED, ref)) == []  # no duration: unchanged
    assert d.rt.next_deadline() == 8600


def test_board_paused_audio_freezes_the_watchdog() -> None:
    d = Driver()
    d.at(0, START)
    d.complete(1000)
    d.tick(4000)
    ref = d.last_play().command_id  # watchdog 5500
    d.at(4500, PlaybackEvent(AudioPhase.PAUSED, ref))
    d.at(4600, PlaybackEvent(AudioPhase.PAUSED, ref))  # duplicate: still frozen from the first
    assert d.rt.next_deadline() == 4500 + 120_000
    d.at(10_000, PlaybackEvent(AudioPhase.RESUMED, ref))
    assert d.rt.next_deadline() == 11_000
    assert d.at(10_100, PlaybackEvent(AudioPhase.RESUMED, ref)) == []  # not paused: nothing
    assert d.rt.next_deadline() == 11_000


def test_late_events_of_a_superseded_play_are_ignored() -> None:
    d = Driver()
    d.at(0, START)
    old = d.last_play().command_id
    d.complete(1000)
    d.tick(4000)
    for kind in (AudioPhase.COMPLETED, AudioPhase.FAILED, AudioPhase.STOPPED):
        out = d.at(4100, PlaybackEvent(kind, old, PATH + "01.mp3", 2000))
        assert of(Ignored, out)[0].reason == "not the current play"
    out = d.at(4200, PlaybackEvent(AudioPhase.COMPLETED, None, PATH + "01.mp3"))
    assert of(Ignored, out)[0].reason == "not the current play"
    out = d.at(4300, CommandOutcome(old, DeliveryResult.EXPIRED))
    assert of(Ignored, out)[0].event == "CommandOutcome"
    assert d.at(4400, CommandOutcome(old, DeliveryResult.ACKED)) == []
    assert d.rt.state is RuntimeState.PLAYING
    # a completion matched by name alone (legacy events carry no ref) is accepted
    out = d.at(5000, PlaybackEvent(AudioPhase.COMPLETED, None, PATH + "02.mp3", 1000))
    assert d.rt.state is RuntimeState.LISTENING


def test_audio_events_while_listening_are_ignored() -> None:
    d = Driver()
    d.at(0, START)
    ref = d.last_play().command_id
    d.complete(1000)
    out = d.at(1100, PlaybackEvent(AudioPhase.COMPLETED, ref, None, 2000))
    assert of(Ignored, out) == [Ignored("LISTENING", "audio.completed", "not the current play")]
    assert d.rt.next_deadline() == 4000


def test_exit_phrase_from_a_window_utterance_stops_at_once() -> None:
    d = Driver()
    d.at(0, START)
    d.complete(1000)
    assert d.at(1500, AsrText("other", 0, "stop the lesson")) == []  # another instance
    out = d.at(1600, AsrText("i1", 0, "Stop the lesson, please!"))
    assert [c.cmd for c in commands(out)] == ["LISTEN_STOP"]
    (rec,) = of(StoreInstance, out)
    assert (rec.record.state, rec.record.reason) == (InstanceState.CANCELLED, "exit_phrase")
    assert of(ReturnToChat, out) == [ReturnToChat("i1")]
    assert d.rt.next_deadline() is None
    assert d.tick(4000) == []  # the window timer is gone


def test_long_button_press_stops_media() -> None:
    d = Driver()
    assert of(Ignored, d.at(0, ButtonPress("long"))) != []  # no task: ignored
    d.at(0, START)
    assert of(Ignored, d.at(5, ButtonPress("short"))) != []  # playing: nothing to confirm
    out = d.at(10, ButtonPress("long"))
    assert [c.cmd for c in commands(out)] == ["STOP_MEDIA"]
    assert of(StoreInstance, out)[0].record.reason == "button"
    assert d.rt.state is RuntimeState.IDLE


@pytest.mark.parametrize(
    ("task_min", "config_min", "window"),
    [(None, 800, 800), (None, 2000, 2000), (1000, 2000, 1000), (0, 800, 150)],
)
def test_min_window_from_the_task_else_the_setting(
    task_min: int | None, config_min: int, window: float
) -> None:
    task = {**SHADOWING, "min_window_ms": task_min}
    d = Driver(catalog=catalog(task), config=RuntimeConfig(min_window_ms=config_min))
    d.at(0, START)
    d.complete(1000, duration_ms=100)
    assert d.rt.next_deadline() == 1000 + window
