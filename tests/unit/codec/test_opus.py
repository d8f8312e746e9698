"""Opus decoding on real speech: normal decode, PLC, FEC, DTX, errors, counters."""

from __future__ import annotations

import numpy as np
import pytest

from codec.opus import OpusStreamDecoder, has_lbrr, plausible_frame
from tests.support.opus_stream import encode
from tests.support.speech import compose

SPEECH = compose([300, "Good morning. How are you today?", 400]).pcm


def pcm(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<i2").astype(np.float64)


def similarity(a: bytes, b: bytes) -> float:
    n = min(len(a), len(b)) // 2
    x, y = pcm(a)[:n], pcm(b)[:n]
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-9))


@pytest.fixture(scope="module")
def packets() -> list[bytes]:
    return encode(SPEECH)


def test_decodes_60ms_frames(packets: list[bytes]) -> None:
    dec = OpusStreamDecoder()
    out = [dec.decode(p) for p in packets]
    assert {len(o) for o in out} == {1920}
    assert dec.counters.frames_decoded == len(packets)
    assert (dec.counters.concealed, dec.counters.decode_errors) == (0, 0)
    # Decoded speech is the speech (Opus delay is a few ms; compare with a 6.5 ms shift).
    decoded = b"".join(out)
    assert similarity(decoded[208:], SPEECH) > 0.8
    dec.close()
    dec.close()  # idempotent


def test_lost_frames_are_concealed_in_front_of_the_next_packet(packets: list[bytes]) -> None:
    dec = OpusStreamDecoder()
    for p in packets[:10]:
        dec.decode(p)
    out = dec.decode(packets[16], lost_before=5)  # the limit: still concealed
    assert len(out) == 6 * 1920
    assert dec.counters.concealed == 5
    assert any(out[:1920])  # PLC continues the voice
    assert len(dec.conceal(3)) == 3 * 1920
    assert dec.counters.concealed == 8
    assert (dec.counters.fec_recovered, dec.counters.resets) == (0, 0)


def test_a_gap_over_the_limit_resets_instead_of_concealing(packets: list[bytes]) -> None:
    dec = OpusStreamDecoder(plc_limit=5)
    for p in packets[:10]:
        dec.decode(p)
    out = dec.decode(packets[20], lost_before=999)  # a forged jump: one frame of work
    assert len(out) == 1920
    assert (dec.counters.concealed, dec.counters.resets, dec.counters.gap_frames) == (0, 1, 999)
    assert dec.conceal(6) == b""
    assert (dec.counters.resets, dec.counters.gap_frames) == (2, 1005)
    # After a reset the stream decodes on as if it had just started.
    fresh = OpusStreamDecoder()
    assert dec.decode(packets[21]) == fresh.decode(packets[21])


@pytest.mark.parametrize(
    ("packet", "plausible"),
    [
        (b"", False),
        (bytes([11 << 3]), True),  # TOC only (DTX): one empty 60 ms SILK frame
        (bytes([11 << 3 | 4, 1]), False),  # the stereo bit
        (bytes([0x5B]) + b"\xff" * 3, False),  # code 3 with an invalid frame count byte
        (bytes([31 << 3 | 2, 50, 1, 2]), False),  # code 2: first frame longer than the data
    ],
)
def test_plausible_frame(packet: bytes, plausible: bool) -> None:
    assert plausible_frame(packet) is plausible


def test_real_frames_are_plausible(packets: list[bytes]) -> None:
    assert all(plausible_frame(p) for p in packets)


def test_in_band_fec_rebuilds_the_last_lost_frame() -> None:
    packets = encode(SPEECH, fec_loss_perc=20)
    assert sum(map(has_lbrr, packets)) > len(packets) // 2
    reference = OpusStreamDecoder()
    truth = [reference.decode(p) for p in packets]
    target = next(i for i in range(8, len(packets)) if has_lbrr(packets[i + 1]))

    def run(drop_next_fec: bool) -> bytes:
        dec = OpusStreamDecoder()
        for p in packets[:target]:
            dec.decode(p)
        nxt = packets[target + 1]
        if drop_next_fec:
            dec.decode(packets[target])  # keep state aligned, then conceal instead
            plc = OpusStreamDecoder()
            for p in packets[:target]:
                plc.decode(p)
            return plc.conceal(1)
        out = dec.decode(nxt, lost_before=1)
        assert dec.counters.fec_recovered == 1
        assert dec.counters.concealed == 0
        return out[:1920]

    with_fec, plc_only = run(False), run(True)
    assert similarity(with_fec, truth[target]) > similarity(plc_only, truth[target])
    assert similarity(with_fec, truth[target]) > 0.5


def test_fec_with_several_losses_conceals_the_earlier_ones() -> None:
    packets = encode(SPEECH, fec_loss_perc=20)
    i = next(i for i in range(8, len(packets)) if has_lbrr(packets[i]))
    dec = OpusStreamDecoder()
    for p in packets[: i - 3]:
        dec.decode(p)
    assert len(dec.decode(packets[i], lost_before=3)) == 4 * 1920
    assert (dec.counters.concealed, dec.counters.fec_recovered) == (2, 1)


def test_dtx_and_tiny_packets_decode_as_frames() -> None:
    packets = encode(compose([200, "Hello.", 1500]).pcm, dtx=True)
    tiny = [p for p in packets if len(p) <= 2]
    assert tiny, "DTX should produce 1-2 byte packets in silence"
    dec = OpusStreamDecoder()
    out = [dec.decode(p) for p in packets]
    assert all(len(o) == 1920 for o in out)
    assert dec.counters.decode_errors == 0


def test_corrupt_and_empty_packets_cost_one_concealed_frame_each(packets: list[bytes]) -> None:
    dec = OpusStreamDecoder()
    dec.decode(packets[5])
    bad = bytes([0x5B]) + b"\xff" * 3  # code 3 packet whose frame count byte is invalid
    assert len(dec.decode(bad)) == 1920
    assert len(dec.decode(b"")) == 1920
    assert dec.counters.decode_errors == 1
    assert dec.counters.concealed == 2
    assert dec.counters.frames_decoded == 1


def test_other_packet_durations_set_the_plc_length() -> None:
    packets = encode(SPEECH, frame_ms=20)
    dec = OpusStreamDecoder()
    assert len(dec.decode(packets[3])) == 640
    assert len(dec.conceal(1)) == 640


@pytest.mark.parametrize(
    ("packet", "expected"),
    [
        (b"", False),
        (bytes([16 << 3, 0xFF]), False),  # CELT-only config
        (bytes([11 << 3]), False),  # SILK with an empty frame (DTX)
        (bytes([11 << 3, 0b0001_0000]), True),  # 60 ms SILK: 3 VAD bits, then LBRR = 1
        (bytes([11 << 3, 0b1110_1111]), False),  # LBRR bit clear
        (bytes([9 << 3, 0b0100_0000]), True),  # 20 ms SILK: 1 VAD bit, then LBRR
        (bytes([13 << 3, 0b0100_0000]), True),  # hybrid 20 ms
        (bytes([12 << 3, 0b0100_0000]), True),  # hybrid 10 ms counts as one SILK frame
        (bytes([(11 << 3) | 4, 0b0000_0001]), True),  # stereo: side channel LBRR
        (bytes([(11 << 3) | 3]), False),  # code 3 without a frame count: unparsable
    ],
)
def test_lbrr_flag_detection(packet: bytes, expected: bool) -> None:
    assert has_lbrr(packet) is expected


def test_frame_duration_is_validated() -> None:
    with pytest.raises(ValueError, match="frame_ms"):
        OpusStreamDecoder(frame_ms=25)
