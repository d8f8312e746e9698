"""Session hijack by source address (issue 10, item 5): a second socket tries to take over a
device's UDP session, while the device talks and after it went silent."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.simulators.xiaozhi import FRAME_MS, XiaozhiDeviceSim, encode_pcm
from gateway.xiaozhi.binding import REBIND_CONFIRM
from tests.adversarial.udp_support import (
    attacker_socket,
    forged,
    live_of,
    ssrc_of,
    target_of,
)
from tests.integration.xiaozhi_support import XiaozhiGateway, provisioned_device, running_gateway
from tests.support import speech
from tests.support.broker import Broker
from tests.support.udp_watch import DatagramWatch

pytestmark = pytest.mark.integration

REBIND_AFTER_S = 0.5  # the production default is 30 s; the rules are the same
TRIES = 40
KEYLESS = ("implausible", "rebind_limited", "rebind_pending")


async def bound_device(
    gw: XiaozhiGateway, sim: XiaozhiDeviceSim, frames: list[bytes]
) -> tuple[DatagramWatch, list[bytes]]:
    """Open the device's audio channel and send ``frames``; returns once all were accepted,
    with the datagrams (an eavesdropper's capture)."""
    await sim.open_audio_channel()
    await sim.listen_start()
    watch = DatagramWatch(gw.channel)
    assert sim.crypto is not None
    sent = [sim.crypto.seal(frame) for frame in frames]
    for datagram in sent:
        sim.send_datagram(datagram)
    await watch.until(lambda: live_of(gw.channel, sim).receiver.accepted == len(frames))
    return watch, sent


def dropped(gw: XiaozhiGateway, reason: str) -> float:
    return gw.metric("xiaozhi_udp_dropped_total", reason=reason)


async def test_second_socket_cannot_take_a_talking_session(broker: Broker) -> None:
    """Attack: while the device streams, a second socket sends the device's own captured
    datagrams and freshly sealed frames (even with the stolen key) for its ssrc.
    Defence: a live session only accepts its bound address: every one is counted as
    foreign_source before any sequence state is touched, and the device streams on."""
    frames = encode_pcm(speech.synthesize("Still mine."))
    async with running_gateway(broker) as gw, provisioned_device(gw) as (_, sim):
        watch, _ = await bound_device(gw, sim, frames[:3])
        live = live_of(gw.channel, sim)
        home = live.binding.address
        assert sim.crypto is not None
        crypto = sim.crypto
        with attacker_socket() as evil:
            target = target_of(sim)
            for frame in frames[3:]:
                genuine = crypto.seal(frame)
                evil.sendto(genuine, target)  # a copy, arriving first
                evil.sendto(forged(ssrc_of(sim), crypto.local_sequence + 1), target)
                sim.send_datagram(genuine)
            await watch.until(lambda: live.receiver.accepted == len(frames))
        assert dropped(gw, "foreign_source") == 2 * (len(frames) - 3)
        assert live.binding.address == home
        assert live.binding.rebinds == 0


async def test_second_socket_cannot_take_a_silent_session_without_the_stream(
    broker: Broker,
) -> None:
    """Attack: after the device has been silent past rebind_after_s, a second socket sends
    replays of its captured datagrams and well-framed datagrams sealed without the key.
    Defence: replays are refused by sequence, keyless datagrams decrypt to no frame of the
    session's stream (implausible) or exceed the few tries a second a new source gets, so the
    session stays bound to the device; the device's own NAT move (three frames of its stream
    in a row from the new port) is then followed."""
    frames = encode_pcm(speech.synthesize("Are you still there?"))
    async with (
        running_gateway(broker, rebind_after_s=REBIND_AFTER_S) as gw,
        provisioned_device(gw) as (dev, sim),
    ):
        watch, captured = await bound_device(gw, sim, frames[:3])
        assert sim.crypto is not None
        crypto = sim.crypto
        live = live_of(gw.channel, sim)
        home = live.binding.address
        await asyncio.sleep(REBIND_AFTER_S * 1.5)  # the device is silent (the precondition)
        before = sum(dropped(gw, r) for r in ("replay", *KEYLESS))
        with attacker_socket() as evil:
            target = target_of(sim)
            for datagram in captured:
                evil.sendto(datagram, target)
            for i in range(TRIES):
                evil.sendto(forged(ssrc_of(sim), crypto.local_sequence + 1 + i), target)
            await watch.until(
                lambda: (
                    sum(dropped(gw, r) for r in ("replay", *KEYLESS))
                    == before + len(captured) + TRIES
                )
            )
        assert dropped(gw, "replay") == len(captured)
        # Mostly implausible or over budget; a keyless payload starting with the session's TOC
        # byte (~1/256) is plausible but still needs two more in a row.
        assert sum(dropped(gw, r) for r in KEYLESS) == TRIES
        assert live.binding.address == home
        assert live.receiver.last_seq == crypto.local_sequence  # nothing moved the window
        # The device's NAT mapping changes: it streams on from a new port, and after three
        # frames of its stream in a row the session moves and the downlink follows it there
        # (the new-source budget the attacker spent refills at 4 a second: an attacker can
        # delay a NAT move this way, not take the session).
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as moved:
            moved.bind(("127.0.0.1", 0))
            moved.settimeout(10)
            for frame in frames[3:]:
                handled = gw.metric("xiaozhi_udp_packets_in_total") + 1
                moved.sendto(crypto.seal(frame), target)
                await watch.until(lambda h=handled: gw.metric("xiaozhi_udp_packets_in_total") >= h)
                if live.binding.address == moved.getsockname():
                    break
                await asyncio.sleep(FRAME_MS / 1000)  # the device's pace
            assert live.binding.address == moved.getsockname()
            assert gw.metric("xiaozhi_udp_rebinds_total") == 1
            assert dropped(gw, "rebind_pending") >= REBIND_CONFIRM - 1
            assert gw.channel.send_audio(dev, live.session_id, frames[4])
            datagram, _ = await asyncio.to_thread(moved.recvfrom, 2048)
        assert datagram[12:16] == (1).to_bytes(4, "big")  # downlink sequence 1, to the new port
