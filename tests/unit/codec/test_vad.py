"""VAD segmenter state machine on controlled input (tone = voiced, zeros = silence)."""

from __future__ import annotations

import numpy as np
import pytest

from codec.vad import SpeechStarted, SpeechStopped, VadConfig, VadSegmenter, VadState
from tests.support.speech import compose


def tone(ms: int, freq: float = 220.0) -> bytes:
    """A voiced-looking signal: a harmonic-rich buzz webrtcvad classifies as speech."""
    t = np.arange(16 * ms) / 16000
    wave = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 12))
    return (wave / np.max(np.abs(wave)) * 12000).astype("<i2").tobytes()


def quiet(ms: int) -> bytes:
    return bytes(32 * ms)


def run(seg: VadSegmenter, pcm: bytes, chunk: int = 1920) -> list[object]:
    events: list[object] = []
    for i in range(0, len(pcm), chunk):
        events += seg.push(pcm[i : i + chunk])
    return events


def test_tone_is_voiced_and_zeros_are_not() -> None:
    seg = VadSegmenter()
    seg.push(tone(600))
    assert seg.counters.voiced == seg.counters.subframes == 20
    seg.push(quiet(600))
    assert 20 < seg.counters.voiced <= 25  # webrtcvad's built-in overhang, about 120 ms


def test_one_utterance_with_stream_time_boundaries() -> None:
    cfg = VadConfig(pre_roll_ms=90)
    seg = VadSegmenter(cfg)
    events = run(seg, quiet(600) + tone(900) + quiet(900))
    assert events[0] == SpeechStarted(600)
    stop = events[1]
    assert isinstance(stop, SpeechStopped)
    assert (stop.started_ms, stop.at_ms, stop.truncated) == (600, stop.at_ms, False)
    assert 1500 <= stop.at_ms <= 1650  # webrtcvad's own overhang may add a few sub-frames
    assert stop.duration_ms == stop.at_ms - 600
    # PCM: 90 ms pre-roll + the utterance + up to 90 ms after its end.
    assert len(stop.pcm) == 32 * (90 + stop.duration_ms + 90)
    assert stop.pcm[: 32 * 90] == quiet(90)
    assert seg.state is VadState.SILENCE
    assert seg.counters.segments == 1
    assert len(events) == 2


def test_short_blips_do_not_start_speech() -> None:
    seg = VadSegmenter(VadConfig(start_window_ms=300, start_ratio=0.6))
    events = run(seg, (tone(60) + quiet(540)) * 5)
    assert events == []
    assert seg.state is VadState.SILENCE


def test_pauses_shorter_than_the_hangover_do_not_end_speech() -> None:
    seg = VadSegmenter(VadConfig(end_silence_ms=450))
    events = run(seg, quiet(300) + tone(600) + quiet(240) + tone(600) + quiet(900))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]


def test_long_speech_is_split_and_counted() -> None:
    seg = VadSegmenter(VadConfig(max_utterance_ms=900, pre_roll_ms=0))
    events = run(seg, tone(2100) + quiet(900))
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    assert [s.at_ms for s in starts] == [0, 900, 1800]
    assert [s.truncated for s in stops] == [True, True, False]
    assert [len(s.pcm) for s in stops[:2]] == [32 * 900, 32 * 900]
    assert stops[0].duration_ms == 900
    assert seg.counters.splits == 2
    assert seg.counters.segments == 3


def test_split_right_before_silence_gives_an_empty_tail_segment() -> None:
    # 600 ms of tone + webrtcvad's 120 ms overhang = 24 voiced sub-frames, all used by the
    # first piece; the second piece starts at 720 ms and never hears a voiced sub-frame.
    seg = VadSegmenter(VadConfig(max_utterance_ms=720, pre_roll_ms=0))
    events = run(seg, tone(600) + quiet(1200))
    stops = [(e.started_ms, e.at_ms, e.duration_ms, e.truncated, len(e.pcm))
             for e in events if isinstance(e, SpeechStopped)]  # fmt: skip
    assert stops == [(0, 720, 720, True, 32 * 720), (720, 720, 0, False, 0)]
    assert seg.state is VadState.SILENCE


def test_flush_closes_an_open_utterance_and_drops_partial_input() -> None:
    seg = VadSegmenter()
    events = run(seg, quiet(120) + tone(600))
    assert [type(e) for e in events] == [SpeechStarted]
    assert seg.push(b"\x00" * 100) == []  # incomplete sub-frame is carried, not lost
    stop = seg.flush()
    assert len(stop) == 1
    assert isinstance(stop[0], SpeechStopped)
    assert stop[0].started_ms == 120
    assert seg.flush() == []
    assert seg.state is VadState.SILENCE


def test_any_chunking_gives_the_same_events() -> None:
    pcm = quiet(300) + tone(700) + quiet(700) + tone(500) + quiet(800)
    whole = run(VadSegmenter(), pcm)
    assert run(VadSegmenter(), pcm, chunk=777) == whole
    assert run(VadSegmenter(), pcm, chunk=1920) == whole
    assert len(whole) == 4


def test_real_speech_in_20ms_subframes() -> None:
    tl = compose([500, "Good morning.", 800])
    seg = VadSegmenter(VadConfig(subframe_ms=20))
    events = run(seg, tl.pcm) + seg.flush()
    assert len(events) == 2
    assert abs(events[0].at_ms - tl.utterances[0].start_ms) <= 150  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_rate": 22050}, "sample_rate"),
        ({"aggressiveness": 4}, "aggressiveness"),
        ({"subframe_ms": 25}, "subframe_ms"),
        ({"start_ratio": 0.0}, "start_ratio"),
        ({"start_ratio": 1.5}, "start_ratio"),
        ({"end_silence_ms": 0}, "end_silence_ms"),
        ({"pre_roll_ms": -1}, "pre_roll_ms"),
    ],
)
def test_config_is_validated(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VadConfig(**kwargs)  # type: ignore[arg-type]
