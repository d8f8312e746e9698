"""Arbitrary bytes never raise out of the codec (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from codec.opus import OpusStreamDecoder, has_lbrr
from codec.packet import DropReason, peek_ssrc
from codec.udp import Accepted, Dropped, UplinkReceiver, UplinkSender
from codec.vad import VadSegmenter

KEY = bytes(range(16))
SSRC = 0x01020304

header = st.builds(
    lambda t, f, n, s, ts, q: bytes([t, f]) + n.to_bytes(2, "big") + s.to_bytes(4, "big")
    + ts.to_bytes(4, "big") + q.to_bytes(4, "big"),
    st.sampled_from([0, 1, 2, 255]), st.integers(0, 255), st.integers(0, 0xFFFF),
    st.sampled_from([SSRC, 0, SSRC + 1]), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
)  # fmt: skip
datagram = st.one_of(
    st.binary(max_size=1600),
    st.tuples(header, st.binary(max_size=1600)).map(lambda hb: hb[0] + hb[1]),
    # Well-framed: payload_len matches, so the crypto and sequence paths run.
    st.tuples(st.integers(1, 2000), st.binary(max_size=1500)).map(
        lambda sb: bytes([1, 0]) + len(sb[1]).to_bytes(2, "big") + SSRC.to_bytes(4, "big")
        + bytes(4) + sb[0].to_bytes(4, "big") + sb[1]
    ),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(datagram, max_size=30))
def test_receiver_never_raises_and_keeps_its_invariants(datagrams: list[bytes]) -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    previous = 0
    for d in datagrams:
        routed = peek_ssrc(d)
        assert isinstance(routed, int | DropReason)
        result = receiver.accept(d)
        if isinstance(result, Accepted):
            assert result.seq > previous
            assert result.seq - previous <= receiver.max_forward_jump
            assert len(result.opus_payload) == len(d) - 16
            previous = result.seq
        else:
            assert isinstance(result, Dropped)
            assert receiver.last_seq == previous
    assert receiver.accepted + sum(receiver.drops.values()) == len(datagrams)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1484), st.integers(0, 2**32 - 1), st.integers(0, 1600))
def test_round_trip_and_truncation(payload: bytes, timestamp: int, cut: int) -> None:
    sealed = UplinkSender(key=KEY, ssrc=SSRC).seal(payload, timestamp)
    assert UplinkReceiver(key=KEY, ssrc=SSRC).accept(sealed) == Accepted(payload, 1, timestamp, 0)
    truncated = sealed[:cut]
    result = UplinkReceiver(key=KEY, ssrc=SSRC).accept(truncated)
    if cut >= len(sealed):
        assert isinstance(result, Accepted)
    else:
        assert result in (Dropped(DropReason.TOO_SHORT), Dropped(DropReason.LENGTH_MISMATCH))


@settings(max_examples=200, deadline=None)
@given(st.lists(datagram, max_size=10))
def test_replayed_stream_is_rejected_entirely(datagrams: list[bytes]) -> None:
    sender = UplinkSender(key=KEY, ssrc=SSRC)
    sealed = [sender.seal(d[:1484]) for d in datagrams]
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    assert all(isinstance(receiver.accept(s), Accepted) for s in sealed)
    assert all(receiver.accept(s) == Dropped(DropReason.REPLAY) for s in sealed)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=400), st.integers(0, 8)), max_size=20))
def test_decoder_survives_random_packets(packets: list[tuple[bytes, int]]) -> None:
    decoder = OpusStreamDecoder(plc_limit=3)
    vad = VadSegmenter()
    for packet, lost in packets:
        has_lbrr(packet)
        pcm = decoder.decode(packet, lost)
        assert len(pcm) % 2 == 0
        vad.push(pcm)
    vad.flush()
    c = decoder.counters
    empties = sum(1 for p, _ in packets if not p)
    assert c.frames_decoded + c.decode_errors + empties == len(packets)
    lost = sum(n for _, n in packets)
    assert c.concealed + c.fec_recovered + c.gap_frames == lost + c.decode_errors + empties
    assert c.concealed <= 3 * len(packets) + c.decode_errors + empties  # never past plc_limit
    decoder.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=5000), max_size=10))
def test_segmenter_takes_any_chunking(chunks: list[bytes]) -> None:
    vad = VadSegmenter()
    for chunk in chunks:
        vad.push(chunk)
    vad.flush()
    assert vad.counters.subframes == sum(len(c) for c in chunks) // 960
