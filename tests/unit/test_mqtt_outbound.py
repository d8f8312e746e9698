"""The outbound queue's publish pipeline against a fake client that confirms on demand."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import aiomqtt
import pytest

from gateway.mqtt_outbound import Outbound, OutboundCounters, OutboundQueue


class FakeClient:
    """Records publish calls in call order; each waits until the test confirms or fails it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, int, Any]] = []
        self.pending: dict[bytes, asyncio.Future[None]] = {}
        self.changed = asyncio.Event()

    async def publish(
        self, topic: str, payload: bytes, *, qos: int, retain: bool, properties: Any
    ) -> None:
        self.calls.append((topic, payload, qos, properties))
        future = self.pending[payload] = asyncio.get_running_loop().create_future()
        self.changed.set()
        await future

    async def wait_calls(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.calls) < n:
                self.changed.clear()
                await self.changed.wait()

    def confirm(self, payload: bytes) -> None:
        self.pending[payload].set_result(None)

    def fail(self, payload: bytes) -> None:
        self.pending[payload].set_exception(aiomqtt.MqttError("connection lost"))


class Counts:
    def __init__(self) -> None:
        self.dropped: list[bytes] = []
        self.published = 0
        self.depth = 0

    def counters(self) -> OutboundCounters:
        return OutboundCounters(
            dropped=lambda m: self.dropped.append(m.payload),
            published=self._published,
            depth=self._depth,
        )

    def _published(self) -> None:
        self.published += 1

    def _depth(self, n: int) -> None:
        self.depth = n


def rig(window: int, limit: int = 100) -> tuple[OutboundQueue, FakeClient, Counts]:
    counts = Counts()
    return (
        OutboundQueue(limit=limit, window=window, counters=counts.counters()),
        FakeClient(),
        counts,
    )


def put(queue: OutboundQueue, *names: str) -> None:
    for n in names:
        queue.put(Outbound(f"t/{n}", n.encode(), qos=1))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        OutboundQueue(limit=10, window=0, counters=Counts().counters())


def test_overflow_drops_the_oldest() -> None:
    queue, _, counts = rig(window=2, limit=3)
    put(queue, "a", "b", "c", "d")
    assert counts.dropped == [b"a"]
    assert [m.payload for m in queue.queued()] == [b"b", b"c", b"d"]
    assert counts.depth == 3


async def test_publishes_leave_together_in_order_up_to_the_window() -> None:
    queue, client, counts = rig(window=3)
    put(queue, "stop", "play", "event", "later")
    async with asyncio.TaskGroup() as tg:
        pump = tg.create_task(queue.pump(cast(aiomqtt.Client, client)))
        await client.wait_calls(3)
        await settle()
        assert [c[1] for c in client.calls] == [b"stop", b"play", b"event"]  # none confirmed yet
        client.confirm(b"play")  # confirmations may come in any order
        await client.wait_calls(4)
        assert client.calls[3][1] == b"later"
        for p in (b"stop", b"event", b"later"):
            client.confirm(p)
        await settle()
        assert counts.published == 4
        assert len(queue) == 0
        assert counts.depth == 0
        put(queue, "next")  # an idle pump wakes for new work
        await client.wait_calls(5)
        pump.cancel()


async def test_a_failed_publish_puts_back_everything_unconfirmed_in_order() -> None:
    queue, client, counts = rig(window=3)
    put(queue, "a", "b", "c", "d", "e")
    pump = asyncio.create_task(queue.pump(cast(aiomqtt.Client, client)))
    await client.wait_calls(3)
    client.confirm(b"b")
    await client.wait_calls(4)  # d took b's place
    client.fail(b"c")
    with pytest.raises(aiomqtt.MqttError):
        await pump
    assert counts.published == 1
    assert [m.payload for m in queue.queued()] == [b"a", b"c", b"d", b"e"]
    assert counts.depth == 4


async def test_cancelled_pump_puts_back_what_was_in_flight() -> None:
    queue, client, _ = rig(window=2)
    put(queue, "a", "b", "c")
    pump = asyncio.create_task(queue.pump(cast(aiomqtt.Client, client)))
    await client.wait_calls(2)
    pump.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pump
    assert [m.payload for m in queue.queued()] == [b"a", b"b", b"c"]


async def test_properties_carry_correlation_data_and_expiry() -> None:
    queue, client, _ = rig(window=1)
    queue.put(Outbound("t/r", b"r", qos=1, correlation_data=b"cid", expiry_s=30))
    queue.put(Outbound("t/c", b"c", qos=1, correlation_data=b"cid2"))
    queue.put(Outbound("t/e", b"e", qos=0, expiry_s=5))
    pump = asyncio.create_task(queue.pump(cast(aiomqtt.Client, client)))
    for i, payload in enumerate((b"r", b"c", b"e"), 1):
        await client.wait_calls(i)
        client.confirm(payload)
    props = [c[3] for c in client.calls]
    assert (props[0].CorrelationData, props[0].MessageExpiryInterval) == (b"cid", 30)
    assert props[1].CorrelationData == b"cid2"
    assert not hasattr(props[1], "MessageExpiryInterval")
    assert props[2].MessageExpiryInterval == 5
    pump.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pump
