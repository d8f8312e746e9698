"""The gateway's MQTT client against a second, independent MQTT 5 broker (ejabberd's mod_mqtt,
tests/support/ejabberd.py): the core flows the gateway relies on, through the client's public
API only, so that nothing in them leans on a Mosquitto habit.

Connect (MQTT 5), subscribe + QoS 1 round trip, many publishes in flight (more than 65,535, so
packet ids come round again), a retained message reaching a later subscriber, and a broker
restart (``closed()`` raises, a new client connects)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions, MqttError
from tests.support.ejabberd import Ejabberd, remove, start_ejabberd

pytestmark = pytest.mark.integration

WINDOW = 20  # the gateway's mqtt.max_inflight
WAIT_S = 10.0


@pytest.fixture(scope="module")
def ejabberd() -> Iterator[Ejabberd]:
    broker = start_ejabberd()
    yield broker
    remove(broker)


@pytest.fixture
def own_ejabberd() -> Iterator[Ejabberd]:
    """One for a test that stops and starts it."""
    broker = start_ejabberd()
    yield broker
    remove(broker)


@pytest.fixture
def prefix() -> str:
    return f"t/{uuid.uuid4().hex[:12]}"


class Inbox:
    """What one client received, in order; ``wait_for(n)`` returns once there are ``n``."""

    def __init__(self) -> None:
        self.messages: list[codec.PublishPacket] = []
        self._changed = asyncio.Event()

    def __call__(self, message: codec.PublishPacket) -> None:
        self.messages.append(message)
        self._changed.set()

    async def wait_for(self, n: int) -> list[codec.PublishPacket]:
        async with asyncio.timeout(WAIT_S):
            while len(self.messages) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.messages


async def connected(broker: Ejabberd, name: str, inbox: Inbox) -> Client:
    client = Client(ClientOptions(client_id=name, username=name, password="any"), inbox)
    limits = await client.connect(broker.host, broker.port)  # a refusal raises ConnectRefused
    assert client.is_connected
    assert not limits.session_present  # a clean session: nothing kept from an earlier test
    return client


async def published(client: Client, topic: str, payload: bytes, *, retain: bool = False) -> None:
    """One QoS 1 publish, returning on its PUBACK."""
    acked = asyncio.Event()
    client.publish(topic, payload, qos=1, retain=retain, on_done=acked.set)
    async with asyncio.timeout(WAIT_S):
        await acked.wait()


async def test_connect_subscribe_and_a_qos1_round_trip(ejabberd: Ejabberd, prefix: str) -> None:
    inbox = Inbox()
    client = await connected(ejabberd, "gw-round-trip", inbox)
    try:
        assert client.options.version == codec.V5
        assert await client.subscribe([(f"{prefix}/#", 1)]) == (1,)  # granted QoS 1
        await published(client, f"{prefix}/status", b'{"v":1}')
        (message,) = await inbox.wait_for(1)
        assert (message.topic, message.payload, message.qos) == (f"{prefix}/status", b'{"v":1}', 1)
        assert client.unacknowledged == 0
    finally:
        await client.disconnect()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_many_publishes_in_flight_with_packet_ids_coming_round(
    ejabberd: Ejabberd, prefix: str
) -> None:
    """A window of 20: first 300 delivered back in order, then 65,535 + 300 more to a topic no
    one reads, so every packet id is used again; a round trip after the wrap still arrives.
    (ejabberd cuts off a subscriber it cannot deliver to as fast as the publishes come in,
    "Message queue is overloaded": bench/results/second_broker.md.)"""
    inbox = Inbox()
    client = await connected(ejabberd, "gw-window", inbox)
    try:
        await client.subscribe([(f"{prefix}/echo", 1)])
        window = asyncio.Semaphore(WINDOW)
        most = 0

        async def send(topic: str, count: int) -> None:
            nonlocal most
            for i in range(count):
                await window.acquire()
                client.publish(topic, b"%d" % i, qos=1, on_done=window.release)
                most = max(most, client.unacknowledged)
            async with asyncio.timeout(WAIT_S):
                for _ in range(WINDOW):  # every PUBACK is in
                    await window.acquire()
            for _ in range(WINDOW):
                window.release()

        await send(f"{prefix}/echo", 300)
        echoed = await inbox.wait_for(300)
        assert [m.payload for m in echoed] == [b"%d" % i for i in range(300)]
        await send(f"{prefix}/sink", 65_535 + 300)
        assert most == WINDOW
        assert client.unacknowledged == 0
        await published(client, f"{prefix}/echo", b"after the wrap")
        messages = await inbox.wait_for(301)
        assert messages[-1].payload == b"after the wrap"
    finally:
        await client.disconnect()


async def test_a_retained_message_reaches_a_later_subscriber(
    ejabberd: Ejabberd, prefix: str
) -> None:
    publisher = await connected(ejabberd, "gw-retain-pub", Inbox())
    try:
        await published(publisher, f"{prefix}/presence", b"online", retain=True)
    finally:
        await publisher.disconnect()
    inbox = Inbox()
    subscriber = await connected(ejabberd, "gw-retain-sub", inbox)
    try:
        await subscriber.subscribe([(f"{prefix}/#", 1)])
        (message,) = await inbox.wait_for(1)
        assert (message.topic, message.payload, message.retain) == (
            f"{prefix}/presence",
            b"online",
            True,
        )
    finally:
        await subscriber.disconnect()


async def test_a_broker_restart_ends_the_connection_and_a_new_client_reconnects(
    own_ejabberd: Ejabberd, prefix: str
) -> None:
    client = await connected(own_ejabberd, "gw-restart", Inbox())
    try:
        await asyncio.to_thread(own_ejabberd.stop)
        with pytest.raises(MqttError):
            async with asyncio.timeout(WAIT_S):
                await client.closed()
    finally:
        await client.disconnect()
    await asyncio.to_thread(own_ejabberd.start)
    inbox = Inbox()
    again = await connected(own_ejabberd, "gw-restart", inbox)
    try:
        await again.subscribe([(f"{prefix}/#", 1)])
        await published(again, f"{prefix}/status", b"back")
        (message,) = await inbox.wait_for(1)
        assert message.payload == b"back"
    finally:
        await again.disconnect()
