"""Test-side MQTT clients against the harness broker (real connections, MQTT 5).

* :func:`mqtt_client` — an aiomqtt client as an async context manager; messages are collected
  by one named task and awaited with bounded waits (:meth:`ClientSession.expect`).
* :func:`publish_reason_code` — the PUBACK reason code the broker gives one QoS 1 publish
  (0 success, 16 no matching subscribers, 135 not authorized); paho, blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiomqtt
from paho.mqtt.client import Client
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway.broker.credentials import Credentials

DEFAULT_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes
    retain: bool


@dataclass
class ClientSession:
    client: aiomqtt.Client
    username: str
    # Bounded: the collector blocks when full (tests read far fewer than this); never drops.
    queue: asyncio.Queue[Received] = field(default_factory=lambda: asyncio.Queue(maxsize=1000))
    received: list[Received] = field(default_factory=list)

    async def subscribe(self, topic_filter: str, qos: int = 1) -> list[int]:
        """Subscribe; returns the SUBACK reason codes (>= 128 means refused)."""
        codes: Any = await self.client.subscribe(topic_filter, qos=qos)
        return [int(getattr(c, "value", c)) for c in codes]

    async def publish(
        self, topic: str, payload: bytes | str, *, qos: int = 1, retain: bool = False
    ) -> None:
        await self.client.publish(topic, payload, qos=qos, retain=retain)

    async def expect(self, topic: str, *, wait_s: float = DEFAULT_WAIT_S) -> Received:
        """Wait for the next message on ``topic``; others read meanwhile stay in ``received``."""
        async with asyncio.timeout(wait_s):
            while True:
                message = await self.queue.get()
                if message.topic == topic:
                    return message

    def topics_seen(self) -> list[str]:
        return [m.topic for m in self.received]

    async def _collect(self) -> None:
        async for message in self.client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else b""
            item = Received(str(message.topic), payload, bool(message.retain))
            self.received.append(item)
            await self.queue.put(item)


class BrokerAddress(Protocol):
    """Where a broker listens: the harness :class:`~tests.support.broker.Broker`, or one the
    scale-out recipe started."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


class BrokerLogin(Protocol):
    @property
    def username(self) -> str: ...
    @property
    def password(self) -> str | None: ...


@contextlib.asynccontextmanager
async def mqtt_client(
    broker: BrokerAddress, creds: Credentials | BrokerLogin, *, client_id: str | None = None
) -> AsyncIterator[ClientSession]:
    """Connected MQTT 5 client for ``creds``; a refused CONNECT raises ``aiomqtt.MqttError``."""
    client = aiomqtt.Client(
        broker.host,
        broker.port,
        username=creds.username,
        password=creds.password,
        identifier=client_id or f"test-{creds.username}-{uuid.uuid4().hex[:8]}",
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=True,
        timeout=DEFAULT_WAIT_S,
    )
    async with client:
        session = ClientSession(client, creds.username)
        async with asyncio.TaskGroup() as group:
            collector = group.create_task(
                session._collect(), name=f"test-mqtt[{creds.username}].collect"
            )
            try:
                yield session
            finally:
                collector.cancel()


def publish_reason_code(
    broker: BrokerAddress,
    creds: Credentials,
    topic: str,
    payload: bytes = b"{}",
    *,
    timeout: float = 5.0,
) -> int:
    """Publish once at QoS 1 and return the broker's PUBACK reason code."""
    connected = threading.Event()
    acked = threading.Event()
    codes: list[int] = []

    def on_connect(client: Client, userdata: object, flags: object, rc: Any, props: object) -> None:
        connected.set()

    def on_publish(client: Client, userdata: object, mid: int, rc: Any, props: object) -> None:
        codes.append(int(rc.value))
        acked.set()

    client = Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"rc-{creds.username}-{uuid.uuid4().hex[:8]}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.username_pw_set(creds.username, creds.password)
    client.on_connect = on_connect
    client.on_publish = on_publish
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        if not connected.wait(timeout):
            raise TimeoutError(f"{creds.username} not connected within {timeout}s")
        client.publish(topic, payload, qos=1)
        if not acked.wait(timeout):
            raise TimeoutError(f"no PUBACK for {topic} within {timeout}s")
    finally:
        client.disconnect()
        client.loop_stop()
    return codes[0]
