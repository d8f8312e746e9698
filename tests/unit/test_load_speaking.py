"""The load harness's speaking boards (bench/load/speaking.py): the fast seal puts the same bytes
on the wire as the simulator's ``DeviceUdpCrypto``, and the ticker sends each answer's packets
in order, one per 60 ms of its own clock, with the session's sequence numbers."""

from __future__ import annotations

import os
import socket

import pytest

from bench.load.speaking import CtrSealer, OpusPacket, SpokenAnswerReader, _Reading
from gateway.simulators.xiaozhi import FRAME_MS, DeviceUdpCrypto


@pytest.mark.parametrize("size", [1, 15, 16, 17, 20, 59, 64, 99, 153, 400])
def test_the_fast_seal_is_the_simulators_seal_byte_for_byte(size: int) -> None:
    key, nonce = os.urandom(16), bytes([1, 0, 0, 0]) + os.urandom(12)
    reference, fast = DeviceUdpCrypto(key, nonce), CtrSealer(key, nonce)
    for i in range(5):  # the sequence moves on with each packet, in both
        opus = os.urandom(size)
        assert fast.seal(OpusPacket.of(opus, i * FRAME_MS)) == reference.seal(
            opus, timestamp=i * FRAME_MS
        )
    # and the device's own opener takes it back to the Opus bytes
    server = DeviceUdpCrypto(key, nonce)
    assert server.open(fast.seal(OpusPacket.of(b"abc", 0))) == b"abc"


def test_the_fast_seal_carries_the_counter_across_the_header_fields_as_ctr_does() -> None:
    # ssrc, timestamp and sequence all ones: the counter blocks carry into the length field.
    key, nonce = os.urandom(16), b"\xff" * 16
    reference, fast = DeviceUdpCrypto(key, nonce), CtrSealer(key, nonce)
    reference.local_sequence = fast.sequence = 0xFFFFFFFE
    opus = os.urandom(100)
    timestamp = 0xFFFFFFFF
    assert fast.seal(OpusPacket.of(opus, timestamp)) == reference.seal(opus, timestamp=timestamp)


def test_an_empty_or_oversized_packet_is_refused() -> None:
    with pytest.raises(ValueError, match="0 bytes"):
        OpusPacket.of(b"", 0)
    with pytest.raises(ValueError, match="4096 bytes"):
        OpusPacket.of(bytes(4096), 0)


def test_the_ticker_sends_due_packets_in_order_with_the_sessions_sequence() -> None:
    key, nonce = os.urandom(16), bytes([1, 0, 0, 0]) + os.urandom(12)
    server = DeviceUdpCrypto(key, nonce)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    reader = SpokenAnswerReader.__new__(SpokenAnswerReader)  # no espeak, no broker: the ticker
    reader._due, reader.reading = [], {}
    reader.packets_sent = reader.send_errors = 0
    opus = [bytes([0x78, i]) * (i + 1) for i in range(4)]
    packets = [OpusPacket.of(p, i * FRAME_MS) for i, p in enumerate(opus)]
    reading = _Reading("dev", CtrSealer(key, nonce), tx, packets, start=100.0)
    reader.reading["dev"] = reading
    reader._due.append((100.0, 0, reading))
    try:
        reader.tick(100.0)  # packet 0 due at the start
        reader.tick(100.059)  # packet 1 not yet (due at 100.060)
        assert reader.packets_sent == 1
        reader.tick(100.200)  # packets 1-3 (due at .060, .120, .180): all late ones at once
        assert reader.packets_sent == 4
        assert "dev" not in reader.reading  # read to its end
        reader.tick(101.0)
        assert reader.packets_sent == 4
        got = [server.open(rx.recv(2048)) for _ in range(4)]
        assert got == opus
        assert server.remote_sequence == 4
    finally:
        rx.close()
        tx.close()
