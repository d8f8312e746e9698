"""Session and hello tables keyed by device input are bounded (issue 10, item 5)."""

from __future__ import annotations

import pytest

from gateway.simulators.xiaozhi import XiaozhiDeviceSim, hello_json
from tests.integration.xiaozhi_support import XiaozhiGateway, provisioned_device, running_gateway
from tests.support.broker import Broker

pytestmark = pytest.mark.integration

HELLO_BURST = 5


async def hellos_answered(sim: XiaozhiDeviceSim, count: int) -> int:
    """Publish ``count`` hellos, then a sentinel the gateway always answers (a listen for a
    session that does not exist gets a goodbye); the device's messages are handled in order,
    so once the goodbye is in, every hello reply that will come is in too."""
    seen = len(sim.inbox)
    for _ in range(count):
        await sim.publish(hello_json())
    await sim.publish(b'{"session_id":"sentinel","type":"listen","state":"stop"}')
    await sim.expect("goodbye", after=seen, session_id="sentinel")
    return sum(1 for m in sim.inbox[seen:] if m.get("type") == "hello")


def refused(gw: XiaozhiGateway, reason: str) -> float:
    return gw.metric("xiaozhi_control_dropped_total", reason=reason)


async def test_hello_flood_from_one_device_is_budgeted(broker: Broker) -> None:
    """Attack: a device sends 40 hellos back to back, each of which would mint a key, a session,
    an audio task and a reply.
    Defence: a device gets a burst of 5 hellos and then one per 5 s; the rest get no reply and
    are counted as hello_rate, and another device's hello is answered at once."""
    async with (
        running_gateway(broker) as gw,
        provisioned_device(gw) as (_, flooder),
        provisioned_device(gw) as (_, other),
    ):
        assert await hellos_answered(flooder, 40) == HELLO_BURST
        assert refused(gw, "hello_rate") == 40 - HELLO_BURST
        await other.open_audio_channel()
        assert gw.metric("xiaozhi_hellos_total") == HELLO_BURST + 1
        assert len(gw.channel.core.hellos) == 2


async def test_sessions_beyond_the_cap_are_refused_but_open_ones_renew(broker: Broker) -> None:
    """Attack: more devices than the gateway is sized for open voice sessions at once.
    Defence: hellos past xiaozhi.max_sessions get no reply and are counted as session_cap; a
    device that holds a session can still renew it, and a freed slot is usable at once."""
    async with (
        running_gateway(broker, max_sessions=2) as gw,
        provisioned_device(gw) as (first_dev, first),
        provisioned_device(gw) as (second_dev, second),
        provisioned_device(gw) as (_, third),
    ):
        await first.open_audio_channel()
        await second.open_audio_channel()
        assert await hellos_answered(third, 1) == 0
        assert refused(gw, "session_cap") == 1
        assert gw.metric("xiaozhi_sessions") == 2
        renewed = await first.open_audio_channel()  # replaces its own session
        assert gw.channel.session_id(first_dev) == renewed.session_id
        await second.goodbye()
        await gw.recorder.wait_for(
            lambda: any(e[:2] == ("closed", second_dev) for e in gw.recorder.events)
        )
        await third.open_audio_channel()  # the freed slot
        assert gw.metric("xiaozhi_sessions") == 2
