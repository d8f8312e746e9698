"""The outbound lanes and their publish pipeline against a fake client that confirms on demand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest

from gateway.mqtt.client import Client
from gateway.mqtt.codec import PacketDecoder, PublishPacket, publish
from gateway.mqtt.options import MqttError
from gateway.mqtt.outbound import Lane, Outbound, OutboundCounters, OutboundQueue
from gateway.mqtt.session import Failed, Failure, Invalid, InvalidPublish, Sent


class FakeClient:
    """Records publish calls in call order; QoS 1 ones wait until the test confirms or fails
    them (the session's in-flight table: :meth:`room` counts them)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, int, bytes]] = []
        self.pending: dict[
            bytes, tuple[Callable[[], None] | None, Callable[[Failed], None] | None]
        ] = {}
        self.changed = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.broken = False
        self.broker_receive_maximum = 65_535  # the CONNACK's Receive Maximum (none: 65,535)
        self.invalid: set[str] = set()  # topics whose publish raises InvalidPublish
        self.downgrade = False  # the broker offers QoS 0 and no retain
        self.on_room: Callable[[], None] | None = None  # the queue's refill, as on a Client

    def room(self, window: int) -> bool:
        return not self.broken and len(self.pending) < min(window, self.broker_receive_maximum)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int,
        retain: bool,
        properties: bytes,
        on_done: Callable[[], None] | None,
        on_failed: Callable[[Failed], None] | None,
    ) -> Sent:
        if self.broken:
            raise MqttError("not connected")
        if topic in self.invalid:
            raise InvalidPublish(Invalid.TOO_LARGE, topic)
        self.calls.append((topic, payload, qos, properties))
        if self.downgrade:
            self.changed.set()
            if on_done is not None:
                on_done()
            return Sent(b"", 0, qos_downgraded=bool(qos), retain_dropped=retain)
        if qos:
            self.pending[payload] = (on_done, on_failed)
        elif on_done is not None:
            on_done()
        self.changed.set()
        return Sent(b"", len(self.calls) if qos else 0)

    async def wait_calls(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.calls) < n:
                self.changed.clear()
                await self.changed.wait()

    def confirm(self, payload: bytes) -> None:
        """A PUBACK read: its callback, then room, as ``Client.data_received`` does."""
        callback, _ = self.pending.pop(payload)
        assert callback is not None
        callback()
        if self.on_room is not None:
            self.on_room()

    def fail(self, payload: bytes, failure: Failure, reason: int) -> None:
        _, callback = self.pending.pop(payload)
        assert callback is not None
        callback(Failed(None, failure, reason, "t"))

    def payloads(self) -> list[bytes]:
        return [c[1] for c in self.calls]


class Counts:
    def __init__(self) -> None:
        self.dropped: list[bytes] = []
        self.refused: list[bytes] = []
        self.failed: list[tuple[bytes, Failure, int]] = []
        self.invalid: list[tuple[bytes, Invalid]] = []
        self.fallbacks: list[str] = []
        self.published = 0

    def counters(self) -> OutboundCounters:
        return OutboundCounters(
            dropped=lambda m: self.dropped.append(m.payload),
            refused=lambda m: self.refused.append(m.payload),
            published=self._published,
            failed=lambda m, e: self.failed.append((m.payload, e.failure, e.reason)),
            invalid=lambda m, e: self.invalid.append((m.payload, e.reason)),
            fallback=self.fallbacks.append,
        )

    def _published(self) -> None:
        self.published += 1


def rig(window: int, limit: int = 100) -> tuple[OutboundQueue, FakeClient, Counts]:
    counts = Counts()
    queue = OutboundQueue(
        control_limit=limit, events_limit=limit, window=window, counters=counts.counters()
    )
    return queue, FakeClient(), counts


def put(queue: OutboundQueue, *names: str, lane: Lane = Lane.CONTROL) -> None:
    for n in names:
        assert queue.put(Outbound(f"t/{n}", n.encode(), qos=1, lane=lane))


def pump(queue: OutboundQueue, client: FakeClient) -> asyncio.Task[None]:
    return asyncio.create_task(queue.pump(cast(Client, client)))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        OutboundQueue(control_limit=10, events_limit=10, window=0, counters=Counts().counters())


def test_events_overflow_drops_the_oldest() -> None:
    queue, _, counts = rig(window=2, limit=3)
    put(queue, "a", "b", "c", "d", lane=Lane.EVENTS)
    assert counts.dropped == [b"a"]
    assert [m.payload for m in queue.queued(Lane.EVENTS)] == [b"b", b"c", b"d"]
    assert len(queue) == 3


def test_control_overflow_refuses_the_newest_and_keeps_every_queued_one() -> None:
    queue, _, counts = rig(window=2, limit=3)
    put(queue, "a", "b", "c")
    assert not queue.put(Outbound("t/d", b"d", qos=1))
    assert counts.refused == [b"d"]
    assert counts.dropped == []
    assert [m.payload for m in queue.queued(Lane.CONTROL)] == [b"a", b"b", b"c"]


async def test_publishes_leave_together_in_order_up_to_the_window() -> None:
    queue, client, counts = rig(window=3)
    put(queue, "stop", "play", "event", "later")
    task = pump(queue, client)
    await client.wait_calls(3)
    await settle()
    assert client.payloads() == [b"stop", b"play", b"event"]  # none confirmed yet
    client.confirm(b"play")  # confirmations may come in any order
    await client.wait_calls(4)
    assert client.calls[3][1] == b"later"
    for p in (b"stop", b"event", b"later"):
        client.confirm(p)
    await settle()
    assert counts.published == 4
    assert len(queue) == 0
    put(queue, "next")  # an idle pump wakes for new work
    await client.wait_calls(5)
    await stop(task)


async def test_control_goes_before_events_and_each_lane_keeps_its_order() -> None:
    queue, client, _ = rig(window=10)
    put(queue, "e1", "e2", lane=Lane.EVENTS)
    put(queue, "c1", "c2")
    task = pump(queue, client)
    await client.wait_calls(4)
    assert client.payloads() == [b"c1", b"c2", b"e1", b"e2"]
    await stop(task)


async def test_events_leave_a_quarter_of_the_window_to_board_commands() -> None:
    queue, client, _ = rig(window=4)  # events may take 3 slots
    put(queue, "e1", "e2", "e3", "e4", "e5", lane=Lane.EVENTS)
    task = pump(queue, client)
    await client.wait_calls(3)
    await settle()
    assert client.payloads() == [b"e1", b"e2", b"e3"]  # e4 waits: one slot kept free
    put(queue, "play")  # a board command goes at once, in the caller's turn
    assert client.payloads()[-1] == b"play"
    put(queue, "stop")  # the window is full now: it waits, ahead of the events
    await settle()
    assert len(client.calls) == 4
    client.confirm(b"e1")
    await client.wait_calls(5)
    assert client.calls[4][1] == b"stop"
    client.confirm(b"play")  # the slot freed is the kept one: no event takes it
    await settle()
    assert len(client.calls) == 5
    client.confirm(b"e2")
    await client.wait_calls(6)
    assert client.calls[5][1] == b"e4"
    await stop(task)


async def test_qos0_takes_no_window_slot_and_counts_when_written() -> None:
    queue, client, counts = rig(window=1)
    queue.put(Outbound("t/m", b"m0", qos=0, lane=Lane.EVENTS))
    put(queue, "a", "b")
    queue.put(Outbound("t/m", b"m1", qos=0, lane=Lane.EVENTS))
    task = pump(queue, client)
    await client.wait_calls(1)
    await settle()
    assert client.payloads() == [b"a"]  # the window of one is taken by a
    client.confirm(b"a")
    await client.wait_calls(2)
    client.confirm(b"b")
    await client.wait_calls(4)
    assert client.payloads() == [b"a", b"b", b"m0", b"m1"]
    assert counts.published == 4
    await stop(task)


async def test_on_sent_runs_when_written_not_when_queued() -> None:
    queue, client, _ = rig(window=1)
    written: list[str] = []
    put(queue, "first")
    queue.put(Outbound("t/cmd", b"cmd", qos=1, on_sent=lambda: written.append("cmd")))
    task = pump(queue, client)
    await client.wait_calls(1)
    await settle()
    assert written == []  # still queued behind "first"
    client.confirm(b"first")
    await client.wait_calls(2)
    assert written == ["cmd"]
    await stop(task)


@pytest.mark.parametrize("put_first", [True, False], ids=["queued-before", "put-while-full"])
async def test_a_full_socket_buffer_holds_publishes_until_it_drains(put_first: bool) -> None:
    queue, client, _ = rig(window=10)
    client.writable.clear()
    if put_first:  # the pump finds it queued
        put(queue, "a")
    task = pump(queue, client)
    await settle()
    if not put_first:  # the put path finds the buffer full
        put(queue, "a")
        await settle()
    assert client.calls == []
    client.writable.set()
    await client.wait_calls(1)
    await stop(task)


async def test_a_lost_connection_leaves_in_flight_with_the_session_and_the_rest_queued() -> None:
    queue, client, counts = rig(window=3)
    put(queue, "e1", lane=Lane.EVENTS)
    put(queue, "a", "b", "c", "d")
    task = pump(queue, client)
    await client.wait_calls(3)
    client.confirm(b"b")
    await client.wait_calls(4)  # d took b's place
    client.broken = True
    client.confirm(b"c")  # frees a slot, but the connection is gone: nothing more is sent
    await settle()
    await stop(task)
    assert counts.published == 2
    # a and d are in flight: the session sends them again after the reconnect, not the lanes.
    assert [m.payload for m in queue.queued()] == [b"e1"]
    assert len(queue) == 3
    client.broken = False
    task = pump(queue, client)
    await client.wait_calls(5)  # the next connection: the queued one goes
    client.confirm(b"a")  # a resent one confirmed on the new connection still counts
    await settle()
    assert counts.published == 3
    await stop(task)


async def test_a_publish_that_raises_is_put_back_at_the_head_of_its_lane() -> None:
    queue, client, _ = rig(window=2)
    put(queue, "a", "b")
    task = pump(queue, client)
    await client.wait_calls(2)
    await stop(task)
    assert [m.payload for m in queue.queued()] == []
    assert len(queue) == 2  # in flight, with the session
    client.broken = True
    put(queue, "c")
    client.broken = False
    client.writable.clear()
    task = pump(queue, client)
    await settle()
    await stop(task)
    assert [m.payload for m in queue.queued()] == [b"c"]


async def test_refused_poison_and_invalid_publishes_are_counted_and_never_queued_again() -> None:
    queue, client, counts = rig(window=5)
    client.invalid.add("t/huge")
    task = pump(queue, client)
    await settle()
    put(queue, "a", "b", "huge", "c")
    client.fail(b"a", Failure.REFUSED, 0x87)
    client.fail(b"b", Failure.POISON, 0x90)
    client.confirm(b"c")
    await settle()
    assert counts.failed == [(b"a", Failure.REFUSED, 0x87), (b"b", Failure.POISON, 0x90)]
    assert counts.invalid == [(b"huge", Invalid.TOO_LARGE)]
    assert counts.published == 1
    assert len(queue) == 0
    await stop(task)


async def test_fallbacks_the_broker_imposes_are_counted() -> None:
    queue, client, counts = rig(window=5)
    client.downgrade = True
    task = pump(queue, client)
    await settle()
    queue.put(Outbound("t/p", b"p", qos=1, retain=True))
    await settle()
    assert counts.fallbacks == ["qos_downgraded", "retain_dropped"]
    assert counts.published == 1
    await stop(task)


async def test_properties_carry_correlation_data_and_expiry() -> None:
    queue, client, _ = rig(window=3)
    queue.put(Outbound("t/r", b"r", qos=1, correlation_data=b"cid", expiry_s=30))
    queue.put(Outbound("t/c", b"c", qos=1, correlation_data=b"cid2"))
    queue.put(Outbound("t/e", b"e", qos=0, expiry_s=5))
    task = pump(queue, client)
    await client.wait_calls(3)
    await stop(task)
    decoded = []
    for topic, payload, qos, props in client.calls:
        packet = publish(topic.encode(), payload, qos=qos, packet_id=1, properties=props)
        (p,) = PacketDecoder().feed(packet)
        assert isinstance(p, PublishPacket)
        decoded.append((p.topic, p.payload, p.correlation_data))
    assert decoded == [("t/r", b"r", b"cid"), ("t/c", b"c", b"cid2"), ("t/e", b"e", None)]
    assert client.calls[0][3] == b"\x02\x00\x00\x00\x1e\x09\x00\x03cid"  # expiry 30, then cid
    assert client.calls[2][3] == b"\x02\x00\x00\x00\x05"


async def test_a_put_with_room_is_written_at_once_without_waking_the_pump() -> None:
    queue, client, counts = rig(window=2)
    task = pump(queue, client)
    await settle()
    put(queue, "now")
    assert client.payloads() == [b"now"]  # in the caller's turn, before any await
    put(queue, "also", "later")
    assert client.payloads() == [b"now", b"also"]  # the window of 2 is full
    client.confirm(b"now")
    await client.wait_calls(3)
    assert client.payloads() == [b"now", b"also", b"later"]
    assert counts.published == 1
    await stop(task)


async def test_a_puback_refills_the_window_in_the_callback_that_read_it() -> None:
    queue, client, counts = rig(window=2)
    task = pump(queue, client)
    await settle()
    put(queue, "a", "b")
    put(queue, "c", "d", lane=Lane.EVENTS)
    assert client.payloads() == [b"a", b"b"]
    client.confirm(b"a")  # no loop turn between the PUBACK and the next publish
    assert client.payloads() == [b"a", b"b", b"c"]
    client.confirm(b"b")
    client.confirm(b"c")
    assert client.payloads() == [b"a", b"b", b"c", b"d"]
    assert counts.published == 3
    await stop(task)
    assert client.on_room is None  # the pump's refill leaves with the pump


async def test_the_window_never_exceeds_the_brokers_receive_maximum() -> None:
    queue, client, _ = rig(window=10)
    client.broker_receive_maximum = 2
    task = pump(queue, client)
    await settle()
    put(queue, "a", "b", "c")
    await settle()
    assert client.payloads() == [b"a", b"b"]
    client.confirm(b"a")
    await client.wait_calls(3)
    await stop(task)


async def test_a_put_that_finds_the_connection_gone_stays_queued() -> None:
    queue, client, _ = rig(window=5)
    task = pump(queue, client)
    await settle()
    client.broken = True
    put(queue, "a")  # the publish raises; the message is kept for the next connection
    await stop(task)
    assert [m.payload for m in queue.queued()] == [b"a"]
