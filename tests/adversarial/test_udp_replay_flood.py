"""Replay flood (issue 10, item 5): replays used to be charged to the session's rate bucket
before the replay check, so captured datagrams replayed from the device's address drained the
device's own budget and its live audio was dropped as rate_limited."""

from __future__ import annotations

import asyncio

import pytest

from gateway.simulators.xiaozhi import FRAME_MS, encode_pcm
from tests.adversarial.udp_support import live_of
from tests.integration.test_xiaozhi_audio import assert_boundaries
from tests.integration.xiaozhi_support import provisioned_device, running_gateway
from tests.support import speech
from tests.support.broker import Broker
from tests.support.udp_watch import DatagramWatch

pytestmark = pytest.mark.integration

PRODUCTION_PPS = 40.0  # the per-session budget devices get (burst 80)
REPLAYS_PER_FRAME = 12  # ~200 replays a second beside a real-time stream: 5x the budget


async def test_replay_flood_does_not_starve_the_device(broker: Broker) -> None:
    """Attack: from the device's own address, an injector replays every datagram the device
    sent so far, 12 copies per live frame (5x the session's datagram budget), while it talks.
    Defence: replays are refused by sequence before the rate bucket is charged, so none of the
    device's frames is rate limited and its utterances come out of the VAD exactly."""
    timeline = speech.compose([400, "Nobody can drown me out.", 900])
    packets = encode_pcm(timeline.pcm)
    async with (
        running_gateway(broker, udp_rate_pps=PRODUCTION_PPS) as gw,
        provisioned_device(gw) as (dev, sim),
    ):
        await sim.open_audio_channel()
        await sim.listen_start()
        assert sim.crypto is not None
        crypto = sim.crypto
        watch = DatagramWatch(gw.channel)
        captured: list[bytes] = []
        replays = 0
        loop_start = None
        for index, packet in enumerate(packets):
            datagram = crypto.seal(packet)
            sim.send_datagram(datagram)
            captured.append(datagram)
            for k in range(REPLAYS_PER_FRAME):
                sim.send_datagram(captured[(index * REPLAYS_PER_FRAME + k) % len(captured)])
                replays += 1
            # Real time: the device's own pace, so only the replays exceed the budget.
            loop_start = await pace(loop_start, index)
        live = live_of(gw.channel, sim)
        await watch.until(
            lambda: live.receiver.accepted + live.receiver.drops.total() == len(packets) + replays
        )
        await gw.recorder.wait_for(lambda: len(gw.recorder.utterances_of(dev)) >= 1)
        assert live.receiver.accepted == len(packets)
        assert gw.metric("xiaozhi_udp_dropped_total", reason="replay") == replays
        assert gw.metric("xiaozhi_udp_dropped_total", reason="rate_limited") == 0
        assert_boundaries(gw, dev, timeline)


async def pace(start: float | None, index: int) -> float:
    """Sleep until frame ``index + 1`` is due (60 ms a frame from the first); the start time."""
    loop = asyncio.get_running_loop()
    begun = loop.time() if start is None else start
    delay = begun + (index + 1) * FRAME_MS / 1000 - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    return begun
