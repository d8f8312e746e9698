"""End to end on real speech: espeak-ng → Opus (real encoder) → UDP datagrams → receiver →
decoder (with loss concealment) → VAD. Every utterance is found with its boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from codec.opus import OpusStreamDecoder
from codec.udp import Accepted, UplinkReceiver
from codec.vad import SpeechStarted, SpeechStopped, VadConfig, VadEvent, VadSegmenter
from tests.support.opus_stream import datagrams, encode, encode_like_device, lossy
from tests.support.speech import Timeline, compose

KEY = bytes.fromhex("8f2c1a9e55d04b7c9a11e3f0b2c4d6e8")
SSRC = 0x5EED5EED
TOLERANCE_MS = 150

PARTS: list[str | int] = [
    700, "Good morning.", 1000, "How are you today?", 500,
    "I like to read books with my friends.", 2000, "The cat is sleeping on the chair.", 800,
    "Thank you very much.", 1500, "Can you open the window, please?", 600, "What time is it?",
    1200,
]  # fmt: skip


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return compose(PARTS)


def segment(packets: list[bytes | None], config: VadConfig | None = None) -> list[VadEvent]:
    """Run the gateway's uplink path over a lossy packet stream (``None`` = lost on the way)."""
    # The device numbers every packet it sends; the lost ones never reach the receiver.
    sealed = datagrams([p or b"" for p in packets], key=KEY, ssrc=SSRC)
    on_wire = [d for d, p in zip(sealed, packets, strict=True) if p is not None]
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    decoder = OpusStreamDecoder()
    vad = VadSegmenter(config)
    events: list[VadEvent] = []
    for datagram in on_wire:
        result = receiver.accept(datagram)
        assert isinstance(result, Accepted)
        events += vad.push(decoder.decode(result.opus_payload, result.lost_before))
    events += vad.flush()
    last = max(i for i, p in enumerate(packets) if p is not None)
    assert receiver.lost == decoder.counters.concealed == packets[:last].count(None)
    return events


def boundaries(events: list[VadEvent]) -> list[tuple[int, int]]:
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    starts = [e.at_ms for e in events if isinstance(e, SpeechStarted)]
    assert starts == [s.started_ms for s in stops]
    return [(s.started_ms, s.at_ms) for s in stops]


def assert_matches_truth(found: list[tuple[int, int]], timeline: Timeline) -> None:
    truth = [(u.start_ms, u.end_ms) for u in timeline.utterances]
    assert len(found) == len(truth), (found, truth)
    errors = [
        abs(f - t)
        for pair, ref in zip(found, truth, strict=True)
        for f, t in zip(pair, ref, strict=True)
    ]
    within = sum(e <= TOLERANCE_MS for e in errors)
    assert within >= 0.95 * len(errors), (errors, found, truth)


def test_every_utterance_found_without_loss(timeline: Timeline) -> None:
    events = segment(list(encode(timeline.pcm)))
    assert_matches_truth(boundaries(events), timeline)
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    for stop in stops:
        # PCM = pre-roll (300 ms, or less at stream start) + utterance + up to 300 ms after.
        assert stop.duration_ms * 32 <= len(stop.pcm) <= (stop.duration_ms + 600) * 32
        assert not stop.truncated


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_utterances_with_ten_percent_loss(timeline: Timeline, seed: int) -> None:
    packets = lossy(encode(timeline.pcm), 0.10, seed)
    assert 0.05 < packets.count(None) / len(packets) < 0.15
    assert_matches_truth(boundaries(segment(packets)), timeline)


@pytest.mark.parametrize("subframe_ms", [20, 30])
def test_subframe_sizes_agree(timeline: Timeline, subframe_ms: int) -> None:
    events = segment(list(encode(timeline.pcm)), VadConfig(subframe_ms=subframe_ms))
    assert_matches_truth(boundaries(events), timeline)


@pytest.mark.parametrize("loss", [0.0, 0.10])
def test_device_encoder_settings_with_dtx(timeline: Timeline, loss: float) -> None:
    packets = encode_like_device(timeline.pcm)
    assert sum(len(p) <= 2 for p in packets) > 10  # DTX frames in the pauses
    assert_matches_truth(boundaries(segment(lossy(packets, loss, 11))), timeline)


@pytest.mark.parametrize("noise_std", [100, 600])
def test_background_noise(timeline: Timeline, noise_std: int) -> None:
    """With a noise floor the overhang trim backs off; boundaries still hold."""
    rng = np.random.default_rng(5)
    clean = np.frombuffer(timeline.pcm, dtype="<i2").astype(np.float64)
    noisy = np.clip(clean + rng.normal(0, noise_std, clean.size), -32768, 32767)
    packets = lossy(encode(noisy.astype("<i2").tobytes()), 0.10, 4)
    assert_matches_truth(boundaries(segment(packets)), timeline)
