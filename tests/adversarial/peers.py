"""Attacker and victim MQTT clients for adversarial tests (paho, one network thread each).

A :class:`Peer` records whether the broker dropped it, which is how a client-id takeover shows:
Mosquitto closes the older connection when another one arrives with the same client id.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from paho.mqtt.client import Client, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

WAIT_S = 10.0


async def wait_for(event: threading.Event, what: str, wait_s: float = WAIT_S) -> None:
    """Wait (off the loop) for a paho-thread event; fail naming ``what`` after ``wait_s``."""
    if not await asyncio.to_thread(event.wait, wait_s):
        raise AssertionError(f"not seen within {wait_s}s: {what}")


@dataclass
class Peer:
    host: str
    port: int
    username: str
    password: str | None
    client_id: str
    mqtt5: bool = False  # xiaozhi firmware speaks MQTT 3.1.1
    max_inflight: int = 20  # QoS 1 publishes awaiting PUBACK (raise it to flood fast)
    connack: int | None = None
    connected: threading.Event = field(default_factory=threading.Event)
    dropped: threading.Event = field(default_factory=threading.Event)
    messages: list[tuple[str, bytes]] = field(default_factory=list)
    got_message: threading.Event = field(default_factory=threading.Event)
    subscribed: threading.Event = field(default_factory=threading.Event)
    _client: Client | None = None

    def start(self) -> None:
        protocol = MQTTProtocolVersion.MQTTv5 if self.mqtt5 else MQTTProtocolVersion.MQTTv311
        client = Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=protocol)
        client.username_pw_set(self.username, self.password)
        client.reconnect_delay_set(60, 120)  # a dropped peer must stay dropped during the test
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda *_: self.subscribed.set()
        client.max_inflight_messages_set(self.max_inflight)
        client.connect(self.host, self.port, keepalive=30)
        sock = client.socket()
        if isinstance(sock, socket.socket):  # small publishes in bulk: no Nagle delays
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.loop_start()
        self._client = client

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    async def wait_connected(self) -> int:
        """Wait for the CONNACK; returns its reason code (0 accepted)."""
        if not await asyncio.to_thread(self.connected.wait, WAIT_S):
            raise AssertionError(f"{self.username}/{self.client_id}: no CONNACK in {WAIT_S}s")
        assert self.connack is not None
        return self.connack

    async def subscribe(self, topic: str) -> None:
        """Subscribe at QoS 1 and wait for the SUBACK."""
        assert self._client is not None
        self.subscribed.clear()
        self._client.subscribe(topic, qos=1)
        await wait_for(self.subscribed, f"SUBACK for {topic}")

    def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> Any:
        assert self._client is not None
        return self._client.publish(topic, payload, qos=qos, retain=retain)

    def _on_connect(self, c: Client, u: object, flags: object, rc: Any, props: object) -> None:
        self.connack = int(rc.value)
        self.connected.set()

    def _on_disconnect(self, c: Client, u: object, flags: object, rc: Any, props: object) -> None:
        if self._client is not None:  # not our own stop()
            self.dropped.set()

    def _on_message(self, c: Client, u: object, msg: MQTTMessage) -> None:
        self.messages.append((msg.topic, bytes(msg.payload)))
        self.got_message.set()
