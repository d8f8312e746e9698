"""Chunking PCM into frames and the pacing schedule (pure)."""

from __future__ import annotations

import pytest

from gateway.speech.frames import chunk, duration_ms, frame_bytes, schedule
from gateway.xiaozhi.downlink import Pacing


def test_frame_bytes_per_rate_and_duration() -> None:
    assert frame_bytes(16_000, 60) == 1920
    assert frame_bytes(24_000, 60) == 2880
    assert frame_bytes(48_000, 20) == 1920


@pytest.mark.parametrize(("rate", "frame_ms"), [(22_050, 60), (16_000, 80), (16_000, 15)])
def test_what_opus_cannot_encode_is_refused(rate: int, frame_ms: int) -> None:
    with pytest.raises(ValueError, match="Opus"):
        frame_bytes(rate, frame_ms)


def test_chunk_pads_the_last_frame_with_silence() -> None:
    pcm = b"\x01\x02" * 1000  # 2000 bytes: one whole 1920-byte frame and 80 more
    frames = chunk(pcm, 16_000, 60)
    assert [len(f) for f in frames] == [1920, 1920]
    assert frames[0] == pcm[:1920]
    assert frames[1] == pcm[1920:] + bytes(1840)


def test_chunk_exact_frames_are_not_padded_and_empty_gives_none() -> None:
    assert chunk(bytes(3840), 16_000, 60) == [bytes(1920), bytes(1920)]
    assert chunk(b"", 16_000, 60) == []


def test_chunk_drops_an_odd_trailing_byte() -> None:
    assert chunk(bytes(1921), 16_000, 60) == [bytes(1920)]


def test_duration_is_frames_times_frame_duration() -> None:
    assert duration_ms(0, 60) == 0
    assert duration_ms(17, 60) == 1020


def test_schedule_sends_the_prebuffer_at_once_then_one_frame_per_duration() -> None:
    sends, stop = schedule(8, Pacing(frame_ms=60, prebuffer=5), start=10.0)
    assert sends == pytest.approx([10.0] * 5 + [10.06, 10.12, 10.18])
    assert stop == pytest.approx(10.18 + 7 * 0.06)  # the device plays what it holds first


def test_schedule_of_nothing_stops_at_once() -> None:
    assert schedule(0, Pacing(), start=3.0) == ([], 3.0)
