"""Keystream reuse between the two directions of a session (issue 10, item 6), on the real
broker and real UDP sockets. The proof that the counter spaces are disjoint is in
codec/counter_space.py; here an eavesdropper records a real session and tries to use it."""

from __future__ import annotations

import asyncio
import struct

import pytest

from codec.counter_space import counter_blocks
from gateway.simulators.xiaozhi import FRAME_MS, XiaozhiDeviceSim, encode_pcm
from tests.integration.xiaozhi_support import XiaozhiGateway, provisioned_device, running_gateway
from tests.support import speech
from tests.support.broker import Broker
from tests.support.udp_watch import DatagramWatch

pytestmark = pytest.mark.integration


async def talk_while_listening(
    gw: XiaozhiGateway, dev: str, sim: XiaozhiDeviceSim, utterances: list[list[bytes]]
) -> list[bytes]:
    """The device streams uplink (echoing the newest downlink timestamp, as firmware built with
    server AEC does) while the gateway speaks each utterance; returns the uplink datagrams."""
    assert sim.crypto is not None
    crypto = sim.crypto
    sent: list[bytes] = []
    silence = encode_pcm(bytes(2 * 16_000))
    done = asyncio.Event()

    def echoed_timestamp() -> int:
        raw = sim.raw_downlink or []
        return struct.unpack_from(">I", raw[-1], 8)[0] if raw else 0

    async def uplink() -> None:
        index = 0
        while not done.is_set():
            datagram = crypto.seal(silence[index % len(silence)], echoed_timestamp())
            sim.send_datagram(datagram)
            sent.append(datagram)
            index += 1
            await asyncio.sleep(FRAME_MS / 1000 / 2)

    async def downlink() -> None:
        try:
            for packets in utterances:
                await gw.channel.speak(dev, packets)
        finally:
            done.set()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(uplink(), name="test.uplink")
        tg.create_task(downlink(), name="test.downlink")
    return sent


async def test_eavesdropper_xoring_captured_directions_learns_nothing(broker: Broker) -> None:
    """Attack: an eavesdropper records a whole session (uplink echoing downlink timestamps, two
    utterances spoken) and XORs every captured ciphertext with every other to cancel keystream.
    Defence: no downlink datagram shares an AES-CTR counter block with any other datagram, so
    no XOR involving the gateway's speech yields P1 XOR P2, and the firmware-exact device still
    decrypts and plays every downlink frame."""
    said = [encode_pcm(speech.synthesize(t)) for t in ("Hello there.", "Hello there.")]
    async with running_gateway(broker) as gw, provisioned_device(gw) as (dev, sim):
        sim.raw_downlink = []
        await sim.open_audio_channel()
        await sim.listen_start()
        uplink = await talk_while_listening(gw, dev, sim, said)
        downlink = list(sim.raw_downlink)
        assert sim.downlink_audio == said[0] + said[1]  # played, in order, nothing dropped
        assert sim.crypto is not None
        assert sim.crypto.drops == {}
    # Same words twice: identical plaintexts, so a shared block would show as equal bytes.
    assert len(downlink) == len(said[0]) + len(said[1])
    silence = encode_pcm(bytes(2 * 16_000))
    plain = {("down", i): p for i, p in enumerate(said[0] + said[1])}
    plain |= {("up", i): silence[i % len(silence)] for i in range(len(uplink))}
    captured = {("up", i): d for i, d in enumerate(uplink)}
    captured |= {("down", i): d for i, d in enumerate(downlink)}
    leaks = eavesdrop(captured, plain)
    assert leaks["down"] == 0
    # The attack works on real captures: firmware's own uplink reuses keystream between
    # consecutive frames of equal size (a protocol limit no server can change; docs/security.md).
    assert leaks["up"] > 0


def eavesdrop(
    captured: dict[tuple[str, int], bytes], plain: dict[tuple[str, int], bytes]
) -> dict[str, int]:
    """The attacker reads every header, lists the counter block behind each 16-byte slice of
    ciphertext, and XORs slices encrypted under the same block: each such pair yields the
    XOR of the two plaintext slices (checked here). Returns the leaks, split by whether a
    downlink datagram is involved."""
    users: dict[int, list[tuple[tuple[str, int], int]]] = {}
    for name, datagram in captured.items():
        for offset, block in enumerate(counter_blocks(datagram[:16], len(datagram) - 16)):
            users.setdefault(block, []).append((name, offset))
    leaks = {"up": 0, "down": 0}
    for sharing in users.values():
        for i, (a, off_a) in enumerate(sharing):
            for b, off_b in sharing[i + 1 :]:
                ca = captured[a][16 + 16 * off_a : 32 + 16 * off_a]
                cb = captured[b][16 + 16 * off_b : 32 + 16 * off_b]
                pa = plain[a][16 * off_a : 16 * off_a + 16]
                pb = plain[b][16 * off_b : 16 * off_b + 16]
                n = min(len(ca), len(cb))
                assert xor(ca[:n], cb[:n]) == xor(pa[:n], pb[:n])  # a real leak
                leaks["down" if "down" in (a[0], b[0]) else "up"] += 1
    return leaks


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


async def test_reflected_downlink_is_not_taken_as_the_devices_speech(broker: Broker) -> None:
    """Attack: the eavesdropper sends captured downlink datagrams back to the gateway from the
    device's own address, hoping the gateway decrypts its own speech as the device's.
    Defence: downlink datagrams carry the downlink ssrc bit, so they route to no session and are
    counted as unknown_ssrc without any decryption or decoding."""
    said = [encode_pcm(speech.synthesize("Reflect me."))]
    async with running_gateway(broker) as gw, provisioned_device(gw) as (dev, sim):
        sim.raw_downlink = []
        await sim.open_audio_channel()
        await sim.listen_start()
        uplink = await talk_while_listening(gw, dev, sim, said)
        reflected = list(sim.raw_downlink)
        assert len(reflected) == len(said[0])
        watch = DatagramWatch(gw.channel)
        unknown = gw.metric("xiaozhi_udp_dropped_total", reason="unknown_ssrc")
        for datagram in reflected:
            sim.send_datagram(datagram)
        await watch.until(
            lambda: (
                gw.metric("xiaozhi_udp_dropped_total", reason="unknown_ssrc")
                >= unknown + len(reflected)
            )
        )
        assert gw.metric("xiaozhi_udp_dropped_total", reason="unknown_ssrc") == unknown + len(
            reflected
        )
        assert gw.metric("xiaozhi_udp_packets_in_total") == len(uplink) + len(reflected)
        assert gw.channel.session_id(dev) is not None
