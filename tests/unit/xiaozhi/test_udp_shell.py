"""UDP endpoint with a fake datagram transport: routing, binding, replay, hijack attempts."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest

from codec.udp import UplinkSender
from gateway.simulators.xiaozhi import DeviceUdpCrypto
from gateway.xiaozhi.live import LiveSession
from gateway.xiaozhi.ratelimit import TokenBucket
from tests.unit.xiaozhi.fakes import (
    DEV,
    HELLO,
    OTHER,
    FakeClock,
    FakeDatagramTransport,
    inbound,
    make_channel,
    sample,
)

HOME = ("10.0.0.5", 40000)
NAT = ("10.0.0.5", 40001)
EVIL = ("192.0.2.66", 5555)


class UdpRig:
    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.channel, self.pub, self.metrics = make_channel(self.clock, ready=False)
        self.transport = FakeDatagramTransport()
        self.endpoint = self.channel.udp_endpoint
        self.endpoint.connection_made(self.transport)
        self.channel.bound()

    def open(self, dev: str) -> tuple[LiveSession, UplinkSender]:
        self.channel.control.handle(inbound(dev, HELLO))
        session = self.channel.core.by_dev(dev)
        assert session is not None
        live = self.channel.route(session.ssrc)
        assert live is not None
        return live, UplinkSender(key=live.session.key, ssrc=live.session.ssrc)

    def feed(self, data: bytes, addr: tuple[str, int]) -> None:
        self.endpoint.datagram_received(data, addr)

    def dropped(self, reason: str) -> float:
        return sample(self.metrics, "xiaozhi_udp_dropped_total", reason=reason)


def seal(device: UplinkSender, opus: bytes = b"\xf8\xff\xfe") -> bytes:
    return device.seal(opus)


def test_first_valid_datagram_binds_and_reaches_pipeline() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.feed(seal(device, b"opus-1"), HOME)
    assert live.binding.address == HOME
    assert live.address_known
    assert live.pipeline.queued == 1
    assert sample(rig.metrics, "xiaozhi_udp_packets_in_total") == 1


async def test_a_speaker_waits_for_the_first_datagram_then_never_again() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    waiter = asyncio.create_task(live.wait_address(), name="test.wait-address")
    await asyncio.sleep(0)
    assert not waiter.done()  # no datagram yet: the downlink has no target
    rig.feed(seal(device, b"opus-1"), HOME)
    async with asyncio.timeout(5):
        await waiter
    async with asyncio.timeout(5):
        await live.wait_address()  # known: at once


def test_replay_and_duplicate_are_dropped() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    first = seal(device)
    rig.feed(first, HOME)
    rig.feed(first, HOME)
    assert rig.dropped("replay") == 1
    assert live.pipeline.queued == 1


def test_foreign_source_is_dropped_without_touching_sequence_state() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.feed(seal(device), HOME)
    # The attacker knows the ssrc and forges a huge sequence from its own address.
    forged = struct.pack(">BBHIII", 1, 0, 4, live.session.ssrc, 0, 999) + b"evil"
    rig.feed(forged, EVIL)
    rig.feed(seal(device), EVIL)  # even a genuine packet relayed from elsewhere
    assert rig.dropped("foreign_source") == 2
    assert live.receiver.last_seq == 1
    rig.feed(seal(device), HOME)  # seq 3 from home still flows
    assert live.pipeline.queued == 2
    assert live.binding.address == HOME


def test_nat_rebinding_after_silence_but_not_for_replays() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    captured = seal(device)
    rig.feed(captured, HOME)
    rig.clock.now = 29.9  # not silent long enough (rebind_after_s: 30 s)
    rig.feed(seal(device), NAT)
    assert rig.dropped("foreign_source") == 1
    rig.clock.now = 40.0  # bound source silent for longer than rebind_after_s
    rig.feed(captured, NAT)  # a replay from a new address never rebinds
    assert rig.dropped("replay") == 1
    assert live.binding.address == HOME
    # A frame whose TOC the session never saw (what a datagram sealed without the key decrypts
    # to, 255 times in 256: sealed with the key here so the test does not depend on that luck).
    wrong_key = UplinkSender(key=live.session.key, ssrc=live.session.ssrc, last_seq=device.last_seq)
    rig.feed(wrong_key.seal(b"\x00\xff\xfe"), NAT)
    rig.feed(seal(device, b"\x58\xff\xfe"), NAT)  # a real frame with a TOC never seen
    assert rig.dropped("implausible") == 2
    rig.clock.now = 45.0  # the new-source budget refills
    assert live.binding.address == HOME
    assert live.receiver.last_seq == 1  # refused candidates left no trace
    rig.feed(seal(device), NAT)
    rig.feed(wrong_key.seal(b"\x00\xff\xfe"), NAT)  # an implausible frame breaks the run
    rig.feed(seal(device), NAT)
    rig.feed(seal(device), NAT)
    assert rig.dropped("rebind_pending") == 3
    assert live.binding.address == HOME
    rig.clock.now = 46.0  # the new-source budget refills (4 a second)
    rig.feed(seal(device), NAT)  # third plausible frame in a row: moved
    assert live.binding.address == NAT
    assert live.receiver.last_seq == device.last_seq
    assert sample(rig.metrics, "xiaozhi_udp_rebinds_total") == 1
    rig.feed(seal(device), HOME)  # the old address is now the foreign one
    assert rig.dropped("foreign_source") == 2


def test_rebind_candidates_have_their_own_small_budget() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.feed(seal(device), HOME)
    rig.clock.now = 100.0
    # Implausible frames (a TOC the session never saw; see the test above for why not random).
    garbage = UplinkSender(key=live.session.key, ssrc=live.session.ssrc, last_seq=1)
    for _ in range(50):
        rig.feed(garbage.seal(b"\x00\xff\xfe"), EVIL)
    assert rig.dropped("implausible") == 4  # REBIND_TRIES_PER_S
    assert rig.dropped("rebind_limited") == 46
    # The session's own budget was not touched: the device streams on at full rate.
    assert live.bucket.tokens == live.bucket.burst - 1  # only the first datagram
    rig.feed(seal(device), HOME)
    assert live.receiver.accepted == 2


def test_replays_are_refused_before_they_spend_the_sessions_budget() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    captured = seal(device)
    rig.feed(captured, HOME)
    for _ in range(500):  # far past the burst (80)
        rig.feed(captured, HOME)
    assert rig.dropped("replay") == 500
    assert rig.dropped("rate_limited") == 0
    rig.feed(seal(device), HOME)
    assert live.receiver.accepted == 2


def test_the_session_toc_is_learned_even_while_nobody_listens() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    live.pipeline.listening = False
    rig.feed(seal(device), HOME)
    rig.feed(seal(device, b"\x58"), HOME)
    assert live.binding.tocs == {0xF8}  # the first frame was decrypted for it, not the second


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"\x01\x00", "too_short"),
        (b"\x02" + bytes(15) + b"x", "bad_type"),
        (struct.pack(">BBHIII", 1, 0, 9, 1, 0, 1) + b"x", "length_mismatch"),
        (bytes(1501), "too_large"),
    ],
)
def test_malformed_datagrams_are_counted(datagram: bytes, reason: str) -> None:
    rig = UdpRig()
    rig.open(DEV)
    rig.feed(datagram, HOME)
    assert rig.dropped(reason) == 1


def test_unknown_and_other_sessions_ssrc() -> None:
    rig = UdpRig()
    a, device_a = rig.open(DEV)
    b, _ = rig.open(OTHER)
    for _ in range(50):
        ssrc = int.from_bytes(os.urandom(4), "big")
        if ssrc in (a.session.ssrc, b.session.ssrc):
            continue
        rig.feed(struct.pack(">BBHIII", 1, 0, 1, ssrc, 0, 1) + b"x", EVIL)
    assert rig.dropped("unknown_ssrc") >= 48
    assert a.pipeline.queued == b.pipeline.queued == 0
    assert a.binding.address is None
    assert b.binding.address is None
    rig.feed(seal(device_a), HOME)
    assert (a.pipeline.queued, b.pipeline.queued) == (1, 0)


def test_downlink_needs_address_then_seals_from_sequence_one() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    assert rig.endpoint.send(live, b"tts-1") is False
    assert rig.dropped("no_address") == 1
    rig.feed(seal(device), HOME)
    assert rig.endpoint.send(live, b"tts-1") is True
    assert rig.endpoint.send(live, b"tts-2") is True
    assert rig.endpoint.send(live, bytes(1485)) is False
    assert rig.dropped("out_too_large") == 1
    datagrams = [d for d, addr in rig.transport.sent if addr == HOME]
    device_rx = DeviceUdpCrypto(key=live.session.key, nonce=live.session.nonce)
    assert [struct.unpack_from(">I", d, 12)[0] for d in datagrams] == [1, 2]
    assert [device_rx.open(d) for d in datagrams] == [b"tts-1", b"tts-2"]
    assert all(len(d) == 16 + struct.unpack_from(">H", d, 2)[0] for d in datagrams)
    assert sample(rig.metrics, "xiaozhi_udp_packets_out_total") == 2


def test_socket_errors_are_counted_not_raised() -> None:
    rig = UdpRig()
    rig.endpoint.error_received(ConnectionRefusedError())
    assert rig.dropped("socket_error") == 1
    rig.endpoint.connection_lost(None)
    live, _ = rig.open(DEV)
    assert rig.endpoint.send(live, b"x") is False


def test_closed_session_stops_routing() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.channel.close_session(DEV)
    rig.feed(seal(device), HOME)
    assert rig.dropped("unknown_ssrc") == 1
    assert live.pipeline.queued == 0


def test_rate_limit_applies_before_crypto_and_after_the_address_check() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    live.bucket = TokenBucket(rate=1.0, burst=2)
    rig.feed(seal(device), HOME)
    # A foreign sender cannot spend the session's budget.
    for _ in range(5):
        rig.feed(seal(device), EVIL)
    rig.feed(seal(device), HOME)
    rig.feed(seal(device), HOME)  # over budget: dropped before the receiver sees it
    assert rig.dropped("rate_limited") == 1
    assert rig.dropped("foreign_source") == 5
    assert live.pipeline.queued == 2
    rig.clock.now = 1.0
    rig.feed(seal(device), HOME)  # one token back; the sequence gap is just loss
    assert live.pipeline.queued == 3


def test_one_readiness_event_drains_every_queued_datagram_from_the_socket() -> None:
    """Batch reads: asyncio delivers one datagram, the endpoint reads the rest itself."""
    rig = UdpRig()
    live, device = rig.open(DEV)
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.bind(("127.0.0.1", 0))
        for i in range(5):
            tx.sendto(seal(device, f"opus-{i}".encode()), rx.getsockname())
        rx.settimeout(5)
        first, addr = rx.recvfrom(2048)  # what asyncio's readiness callback would read
        rx.setblocking(False)
        rig.endpoint.drain_from(rx)
        rig.feed(first, addr)
        assert live.pipeline.queued == 5
        assert sample(rig.metrics, "xiaozhi_udp_packets_in_total") == 5
        tx.sendto(seal(device), rx.getsockname())
        rig.endpoint.connection_lost(None)  # closed: no more draining
        rig.feed(seal(device), tx.getsockname())
        assert live.pipeline.queued == 6


def test_nobody_listening_means_no_decryption_but_sequence_rules_still_apply() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.channel.set_listening(DEV, False)
    first = seal(device, b"secret")
    rig.feed(first, HOME)
    rig.feed(first, HOME)
    assert live.receiver.last_seq == 1
    assert rig.dropped("replay") == 1
    assert live.binding.address == HOME
    assert live.pipeline.queued == 0
