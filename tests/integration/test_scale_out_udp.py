"""Scale-out, Xiaozhi side: two gateways on one broker; a device's hello is answered by its
owner alone, and the reply names the owner's UDP endpoint (each gateway announces its own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from devstack.gateway import gateway_settings, start_service
from gateway.cluster import Cluster, Ownership, owner_of
from gateway.service import Context, Service
from tests.integration.xiaozhi_support import XiaozhiGateway, provisioned_device, recorded_channel
from tests.support.broker import Broker

pytestmark = pytest.mark.integration


class Asked:
    """The channel's ownership question, answered by the cluster and remembered, so the test
    can wait until a gateway has seen a device's control message."""

    def __init__(self, owns: Callable[[str], bool]) -> None:
        self._owns = owns
        self.asked: list[str] = []
        self.changed = asyncio.Event()

    def __call__(self, dev: str) -> bool:
        self.asked.append(dev)
        self.changed.set()
        return self._owns(dev)

    async def until_asked(self, dev: str) -> None:
        async with asyncio.timeout(20):
            while dev not in self.asked:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def clustered(
    broker: Broker, count: int
) -> AsyncIterator[list[tuple[XiaozhiGateway, Cluster, Asked]]]:
    """``count`` gateways with the Xiaozhi channel and the cluster component, all settled on
    the same live set."""
    changed = asyncio.Event()
    members: list[tuple[XiaozhiGateway, Cluster, Asked]] = []
    for _ in range(count):
        settings = gateway_settings(broker)
        ctx = Context.create(settings)
        ownership = Ownership(settings.gateway_id, enabled=True)
        asked = Asked(ownership.owns)
        channel, recorder = recorded_channel(broker, ctx, owns=asked)
        cluster = Cluster(ctx=ctx, ownership=ownership, udp=channel, listeners=(changed.set,))
        service = Service(ctx, [cluster, channel])
        members.append((XiaozhiGateway(service, channel, recorder, settings), cluster, asked))
    ids = {gw.settings.gateway_id for gw, _, _ in members}
    async with asyncio.TaskGroup() as tg:
        runs = [
            await start_service(gw.service, tg, ready=(gw.channel.wait_ready,))
            for gw, _, _ in members
        ]
        try:
            async with asyncio.timeout(20):
                while not all(c.membership.live == ids for _, c, _ in members):
                    changed.clear()
                    await changed.wait()
            yield members
        finally:
            for run in runs:
                await run.stop()


async def test_the_owner_alone_answers_the_hello_with_its_own_udp_endpoint(
    fresh_broker: Broker,
) -> None:
    # A broker of its own: in-process gateways of other tests that were cancelled (not shut
    # down) left their retained status online, and would count as members here.
    async with clustered(fresh_broker, 2) as members:
        ports = {gw.settings.gateway_id: gw.channel.udp_port for gw, _, _ in members}
        assert len(set(ports.values())) == 2  # each gateway its own endpoint
        first = members[0][0]
        async with provisioned_device(first) as (dev, sim):  # OTA: any gateway serves it
            owner = owner_of(dev, ports)
            hello = await sim.open_audio_channel()
            assert hello.port == ports[owner]
            for gw, _, asked in members:
                await asked.until_asked(dev)  # the hello reached every gateway
                refused = gw.metric("xiaozhi_control_dropped_total", reason="not_owner")
                opened = [e for e in gw.recorder.events if e[0] == "opened"]
                if gw.settings.gateway_id == owner:
                    assert (refused, len(opened)) == (0, 1)
                else:
                    assert (refused, opened) == (1, [])  # left to the owner
