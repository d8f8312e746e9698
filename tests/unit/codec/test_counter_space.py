"""The downlink and uplink AES-CTR counter spaces are disjoint (codec/counter_space.py).

The proof is in the module docstring (Claims 1-3); here hypothesis searches for a
counterexample over ssrc, sequence, length and timestamp, boundary cases (every carry the
128-bit counter can make) are pinned with ``@example``, and the keystream itself is compared:
AES is a permutation, so two packets share keystream exactly when they share a counter block.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import example, given, settings
from hypothesis import strategies as st

from codec.counter_space import (
    DOWNLINK_FLAGS,
    MAX_BLOCKS,
    MAX_DOWNLINK_SEQ,
    UPLINK_SSRC_MASK,
    counter_blocks,
    downlink_header,
    downlink_timestamp,
)
from codec.packet import HEADER, MAX_PAYLOAD, U32
from codec.udp import DownlinkSender, UplinkReceiver
from codec.udp import UplinkSender as DeviceSender
from gateway.simulators.xiaozhi import DeviceUdpCrypto
from gateway.xiaozhi.sessions import session_nonce

KEY = bytes(range(16))
u32 = st.integers(0, U32)
session_ssrc = st.integers(1, UPLINK_SSRC_MASK)
downlink_seq = st.integers(1, MAX_DOWNLINK_SEQ)
downlink_len = st.integers(0, MAX_PAYLOAD)
uplink_len = st.integers(0, 0xFFFF)  # anything a device could put in payload_len


def uplink_header(ssrc: int, seq: int, length: int, ts: int, flags: int = 0) -> bytes:
    """What firmware sends: the nonce (flags 0, session ssrc) with len, ts and seq filled in."""
    return HEADER.pack(1, flags, length, ssrc, ts, seq)


def overlap(a: range, b: range) -> bool:
    return max(a.start, b.start) < min(a.stop, b.stop)


@settings(max_examples=1000, deadline=None)
@given(
    ssrc=session_ssrc,
    up=st.tuples(u32, u32, uplink_len, u32),
    down=st.tuples(downlink_seq, downlink_len),
)
@example(ssrc=UPLINK_SSRC_MASK, up=(U32, U32, 0xFFFF, U32), down=(MAX_DOWNLINK_SEQ, MAX_PAYLOAD))
@example(ssrc=0x1234, up=(1, 0, 1484, 0x1234), down=(1, 1484))  # upstream's layout collides
@example(ssrc=1, up=(U32, U32, 0xFFFF, 1), down=(1, 1))
def test_no_downlink_block_is_an_uplink_block(
    ssrc: int, up: tuple[int, int, int, int], down: tuple[int, int]
) -> None:
    """Claim 1, for the session's own uplink and for any uplink header at all (other ssrc)."""
    up_seq, up_ts, up_len, other_ssrc = up
    down_seq, down_len = down
    d = counter_blocks(downlink_header(ssrc, down_seq, down_len), down_len)
    for up_ssrc in (ssrc, other_ssrc):
        u = counter_blocks(uplink_header(up_ssrc, up_seq, up_len, up_ts), up_len)
        assert not overlap(u, d)
        assert {(b >> 112) & 0xFF for b in (u.start, u.stop - 1) if u} <= {0x00, 0x01}
    assert {(b >> 112) & 0xFF for b in (d.start, d.stop - 1) if d} <= {DOWNLINK_FLAGS}


@settings(max_examples=1000, deadline=None)
@given(
    session_ssrc,
    downlink_seq,
    st.one_of(st.integers(1, MAX_BLOCKS + 8), st.integers(1, MAX_DOWNLINK_SEQ)),
    downlink_len,
    downlink_len,
)
@example(5, 1, 1, MAX_PAYLOAD, MAX_PAYLOAD)  # consecutive full packets
@example(5, MAX_DOWNLINK_SEQ - 1, 1, MAX_PAYLOAD, MAX_PAYLOAD)  # at the end of the space
@example(5, 1, 2**30, MAX_PAYLOAD, MAX_PAYLOAD)  # timestamps repeat (prefixes equal)
def test_no_two_downlink_packets_share_a_block(
    ssrc: int, first: int, gap: int, len_a: int, len_b: int
) -> None:
    """Claim 2: timestamps separate packets whose sequence ranges could overlap."""
    second = first + gap
    if second > MAX_DOWNLINK_SEQ:
        second = MAX_DOWNLINK_SEQ if first < MAX_DOWNLINK_SEQ else first
        if second == first:
            return
    a = counter_blocks(downlink_header(ssrc, first, len_a), len_a)
    b = counter_blocks(downlink_header(ssrc, second, len_b), len_b)
    assert not overlap(a, b)


@settings(max_examples=300, deadline=None)
@given(session_ssrc, st.integers(0, MAX_DOWNLINK_SEQ - 1), st.binary(max_size=MAX_PAYLOAD), u32)
def test_sender_uses_the_space_and_the_firmware_decrypts_it(
    ssrc: int, start: int, payload: bytes, up_ts: int
) -> None:
    """What the sender emits is ``downlink_header``; the firmware-like receiver (header bytes
    as the counter block, flags/ssrc/timestamp unchecked) decrypts it; its keystream shares no
    16-byte block with an uplink packet of the same sequence and length."""
    sender = DownlinkSender(key=KEY, ssrc=ssrc, last_seq=start)
    datagram = sender.seal(payload)
    assert isinstance(datagram, bytes)
    assert datagram[:16] == downlink_header(ssrc, start + 1, len(payload))
    device = DeviceUdpCrypto(key=KEY, nonce=session_nonce(ssrc), remote_sequence=start)
    assert device.open(datagram) == payload
    zeros = bytes(len(payload))
    up = DeviceUdpCrypto(key=KEY, nonce=session_nonce(ssrc), local_sequence=start)
    up_stream = _keystream(up.seal(zeros, up_ts)[:16], len(zeros))
    down_stream = _keystream(datagram[:16], len(zeros))
    full = len(zeros) // 16 * 16
    up_blocks = {up_stream[i : i + 16] for i in range(0, full, 16)}
    assert not any(down_stream[i : i + 16] in up_blocks for i in range(0, full, 16))


def test_detector_flags_the_upstream_downlink_layout() -> None:
    """The checks above can fail: upstream's downlink (flags 0, seq from 1, timestamp 0) shares
    every block with the device's uplink, and its consecutive packets share blocks too."""
    ssrc, size = 0x1234, 160
    device = DeviceSender(key=KEY, ssrc=ssrc)
    upstream_downlink = DeviceSender(key=KEY, ssrc=ssrc)  # same layout as a device
    up, down = device.seal(bytes(size)), upstream_downlink.seal(bytes(size))
    assert overlap(counter_blocks(up[:16], size), counter_blocks(down[:16], size))
    assert _keystream(up[:16], size) == _keystream(down[:16], size)
    second = upstream_downlink.seal(bytes(size))
    assert overlap(counter_blocks(down[:16], size), counter_blocks(second[:16], size))


def test_receiver_never_decrypts_in_the_downlink_space() -> None:
    """Claim 3: a downlink datagram reflected at the gateway is refused before any AES."""
    ssrc = 0x0BAD_CAFE
    reflected = DownlinkSender(key=KEY, ssrc=ssrc).seal(b"tts audio")
    assert isinstance(reflected, bytes)
    receiver = UplinkReceiver(key=KEY, ssrc=ssrc)
    assert type(receiver.accept(reflected)).__name__ == "Dropped"  # unknown (downlink) ssrc
    as_uplink_ssrc = reflected[:4] + ssrc.to_bytes(4, "big") + reflected[8:]
    assert type(receiver.accept(as_uplink_ssrc)).__name__ == "Dropped"  # flags 0x80
    assert receiver.accepted == 0


def test_timestamps_differ_wherever_sequence_ranges_could_overlap() -> None:
    for seq in (1, 2**16, 2**30 - 1, 2**31, MAX_DOWNLINK_SEQ - MAX_BLOCKS):
        stamps = {downlink_timestamp(seq + d) for d in range(MAX_BLOCKS)}
        assert len(stamps) == MAX_BLOCKS
    assert downlink_timestamp(1) == 60
    assert downlink_timestamp(1 + 2**30) == 60  # the period: far beyond any overlap


def _keystream(counter_block: bytes, size: int) -> bytes:
    cipher = Cipher(algorithms.AES(KEY), modes.CTR(counter_block)).encryptor()
    return cipher.update(bytes(size))


def test_downlink_header_refuses_values_outside_the_space() -> None:
    for seq, size in ((0, 1), (MAX_DOWNLINK_SEQ + 1, 1), (1, MAX_PAYLOAD + 1), (1, -1)):
        with pytest.raises(ValueError, match="out of range"):
            downlink_header(1, seq, size)
