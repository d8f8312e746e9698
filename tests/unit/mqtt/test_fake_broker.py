"""The gateway's broker connection against a byte-level, fault-injecting fake broker on a real
loopback socket: one test per MQTT 5 rule the client relies on (issue #26, 1-6). The fake
speaks bytes built by hand (tests/support/mqtt_bytes.py) and enforces each rule the way a
strict broker does: it disconnects a client that breaks it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from gateway.metrics import Metrics
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.edge import Inbound, presence_payload
from gateway.settings import MqttSettings
from tests.support import mqtt_bytes as b

PRESENCE = "snlpgw/v1/gw/t/status"


@dataclass
class FakeBroker:
    """Accepts connections; answers CONNECT with ``connack`` (a function of the CONNECT, so a
    test can refuse), SUBSCRIBE with ``suback_codes``, PUBLISH QoS 1 with ``puback_code(topic)``,
    PINGREQ with PINGRESP; ``fault(packet)`` returns a DISCONNECT reason to end a connection
    with, or None. It drops a client silent for 1.5x the keep-alive it granted."""

    connack: Callable[[b.ClientPacket], bytes] = lambda _: b.connack()
    suback_codes: Callable[[int], list[int]] = lambda n: [1] * n
    puback_code: Callable[[str], int] = lambda _: 0
    fault: Callable[[b.ClientPacket], int | None] = lambda _: None
    keepalive_s: float | None = None  # enforced when set
    connects: list[b.ClientPacket] = field(default_factory=list)
    packets: list[b.ClientPacket] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    by_client: list[tuple[str, b.ClientPacket]] = field(default_factory=list)  # (client id, packet)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        buf = bytearray()
        client_id = ""
        try:
            while True:
                wait = None if self.keepalive_s is None else 1.5 * self.keepalive_s
                try:
                    async with asyncio.timeout(wait):
                        data = await reader.read(65536)
                except TimeoutError:
                    writer.write(b.disconnect(0x8D))  # Keep Alive timeout
                    return
                if not data:
                    return
                buf += data
                for p in b.read_packets(buf):
                    if p.kind == 1:
                        client_id = b.connect_client_id(p)
                    self.by_client.append((client_id, p))
                    if not await self._handle(p, writer):
                        return
        finally:
            writer.close()

    async def _handle(self, p: b.ClientPacket, writer: asyncio.StreamWriter) -> bool:
        self.packets.append(p)
        self.changed.set()
        reason = self.fault(p)
        if reason is not None:
            writer.write(b.disconnect(reason))
            await writer.drain()
            return False
        if p.kind == 1:
            self.connects.append(p)
            answer = self.connack(p)
            writer.write(answer)
            return answer[3] == 0  # the reason code byte: a refusal ends the connection
        if p.kind == 8:
            n = _filters(p.body)
            writer.write(b.suback(p.packet_id, *self.suback_codes(n)))
        elif p.kind == 3 and p.qos:
            writer.write(b.puback(p.packet_id, self.puback_code(p.topic)))
        elif p.kind == 12:
            writer.write(b.PINGRESP)
        elif p.kind == 14:
            return False
        return True

    async def wait_for(self, check: Callable[[], bool], within_s: float = 10.0) -> None:
        async with asyncio.timeout(within_s):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    def published(self, topic: str) -> list[b.ClientPacket]:
        return [p for p in self.packets if p.kind == 3 and p.topic == topic]


def _filters(body: bytes) -> int:
    pos = 3  # packet id, then an empty property block
    n = 0
    while pos < len(body):
        pos += 2 + int.from_bytes(body[pos : pos + 2], "big") + 1
        n += 1
    return n


@contextlib.asynccontextmanager
async def running(
    fake: FakeBroker, alarms: list[tuple[str, dict[str, object]]] | None = None, **settings: object
) -> AsyncIterator[tuple[MqttConnection, Metrics]]:
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    metrics = Metrics()
    options: dict[str, object] = {
        "url": f"mqtt://127.0.0.1:{port}",
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.2,
        **settings,
    }
    conn = MqttConnection(
        settings=MqttSettings(**options),  # type: ignore[arg-type]
        password="pw",
        client_id="t",
        presence_topic=PRESENCE,
        presence_payload=presence_payload("t"),
        metrics=metrics,
        alarm=None if alarms is None else lambda a, **d: alarms.append((a, d)),
    )
    task = asyncio.create_task(conn.run(), name="test.mqtt")
    try:
        yield conn, metrics
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for w in fake.writers:
            w.close()
        server.close()
        await server.wait_closed()


async def eventually(check: Callable[[], bool], within_s: float = 10.0) -> None:
    """Wait for a condition the connection's own callbacks make true (checked each 10 ms:
    the connection has no event for it); bounded."""
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - no event to wait on; bounded by the timeout
            await asyncio.sleep(0.01)


async def connected(conn: MqttConnection) -> None:
    async with asyncio.timeout(10):
        await conn.wait_connected()


# -- 1: a poison publish cannot cause a reconnect loop ---------------------------------------


async def test_a_publish_the_broker_disconnects_for_is_dropped_not_resent_forever() -> None:
    fake = FakeBroker(fault=lambda p: 0x90 if p.kind == 3 and p.topic == "bad/topic" else None)
    alarms: list[tuple[str, dict[str, object]]] = []
    async with running(fake, alarms) as (conn, metrics):
        await connected(conn)
        assert conn.publish("bad/topic", b"poison", qos=1)
        assert conn.publish("good/topic", b"after", qos=1)
        await fake.wait_for(lambda: bool(fake.published("good/topic")))
        await connected(conn)
        await eventually(lambda: len(conn._outbox) == 0)
        snap = metrics.snapshot()
        assert snap['snlpgw_mqtt_publish_failed_total{reason="poison"}'] == 1.0
        assert len(fake.connects) <= 3  # before: 25 reconnections in 5 s, and nothing after
        assert len(fake.published("bad/topic")) <= 2
        assert [a for a, _ in alarms] == ["mqtt_publish_poison"]


# -- 2: Server Keep Alive ------------------------------------------------------------------


async def test_the_brokers_server_keep_alive_replaces_the_one_asked() -> None:
    fake = FakeBroker(connack=lambda _: b.connack(props={b.SERVER_KEEPALIVE: 1}), keepalive_s=1)
    async with running(fake, keepalive_s=60) as (conn, _):
        await connected(conn)
        assert b.connect_keepalive(fake.connects[0]) == 60
        # Three PINGREQs at ~0.5 s each: kept alive at the broker's 1 s, not the asked 60 s.
        await fake.wait_for(lambda: sum(p.kind == 12 for p in fake.packets) >= 3)
        assert len(fake.connects) == 1
        assert conn.connected


# -- 3: Maximum Packet Size both ways --------------------------------------------------------


async def test_maximum_packet_size_is_announced_and_the_brokers_is_obeyed() -> None:
    fake = FakeBroker(
        connack=lambda _: b.connack(props={b.MAXIMUM_PACKET_SIZE: 300}),
        fault=lambda p: 0x95 if len(p.raw) > 300 else None,
    )
    async with running(fake) as (conn, metrics):
        await connected(conn)
        assert fake.connects[0].props[0x27] == 1 << 20  # what the gateway accepts
        assert conn.max_packet_bytes == 300
        assert not conn.publish("t/big", b"x" * 400, qos=1)  # refused here, not by the broker
        assert conn.publish("t/small", b"x" * 100, qos=1)
        await fake.wait_for(lambda: bool(fake.published("t/small")))
        assert metrics.snapshot()['snlpgw_mqtt_publish_failed_total{reason="too_large"}'] == 1.0
        assert len(fake.connects) == 1


# -- 4: Maximum QoS and Retain Available -----------------------------------------------------


def _strict(p: b.ClientPacket) -> int | None:
    if p.kind == 3 and p.qos > 0:
        return 0x9B  # QoS not supported
    if p.kind == 3 and p.retain:
        return 0x9A  # Retain not supported
    return None


def _no_retained_will(p: b.ClientPacket) -> bytes:
    if b.connect_flags(p) & 0x20:
        return b.connack(0x9A)
    return b.connack(props={b.MAXIMUM_QOS: 0, b.RETAIN_AVAILABLE: 0})


async def test_a_broker_without_qos_1_or_retain_gets_neither_and_no_reconnect_loop() -> None:
    fake = FakeBroker(connack=_no_retained_will, fault=_strict)
    async with running(fake) as (conn, metrics):
        await connected(conn)
        assert [bool(b.connect_flags(p) & 0x20) for p in fake.connects] == [True, False]
        assert conn.publish("t/a", b"1", qos=1)
        await fake.wait_for(lambda: bool(fake.published("t/a")))
        presence = fake.published(PRESENCE)
        assert [(p.qos, p.retain) for p in presence] == [(0, False)]
        snap = metrics.snapshot()
        assert snap['snlpgw_mqtt_fallbacks_total{kind="qos_downgraded"}'] == 2.0  # presence, t/a
        assert snap['snlpgw_mqtt_fallbacks_total{kind="retain_dropped"}'] == 1.0
        assert len(fake.connects) == 2  # the refused will, then one connection that holds


# -- 5: validation before a packet id is taken -----------------------------------------------


@pytest.mark.parametrize("topic", ["a/#", "a/+/b", "", "a\x00b", "a\ud800"])
async def test_a_topic_mqtt_forbids_is_refused_locally_and_leaks_no_packet_id(topic: str) -> None:
    fake = FakeBroker()
    async with running(fake) as (conn, metrics):
        await connected(conn)
        assert not conn.publish(topic, b"x", qos=1)
        assert not conn.publish("ok/topic", b"x", qos=2)
        assert conn._session.in_flight == 0
        snap = metrics.snapshot()
        assert snap['snlpgw_mqtt_publish_failed_total{reason="invalid"}'] == 2.0
        assert conn.publish("ok/topic", b"x", qos=1)
        await fake.wait_for(lambda: bool(fake.published("ok/topic")))


# -- 6: refusals are not successes ------------------------------------------------------------


async def test_a_puback_refusal_is_counted_alarmed_and_not_resent() -> None:
    fake = FakeBroker(puback_code=lambda topic: 0x87 if topic == "t/denied" else 0)
    alarms: list[tuple[str, dict[str, object]]] = []
    async with running(fake, alarms) as (conn, metrics):
        await connected(conn)
        for _ in range(3):
            assert conn.publish("t/denied", b"x", qos=1)
        conn.publish("t/ok", b"y", qos=1)
        await fake.wait_for(lambda: bool(fake.published("t/ok")))
        await eventually(lambda: len(conn._outbox) == 0)
        snap = metrics.snapshot()
        key = 'snlpgw_mqtt_publish_failed_total{reason="refused_not_authorized"}'
        assert snap[key] == 3.0
        assert snap["snlpgw_mqtt_messages_out_total"] == 1.0  # t/ok
        assert len(fake.published("t/denied")) == 3  # each once: none put back
        assert alarms == [("mqtt_publish_refused", {"topic": "t/denied", "reason_code": 0x87})]


async def test_a_refused_subscription_makes_the_gateway_not_ready_and_names_it() -> None:
    fake = FakeBroker(suback_codes=lambda n: [1] + [0x87] * (n - 1))
    alarms: list[tuple[str, dict[str, object]]] = []
    heard: list[Inbound] = []
    async with running(fake, alarms) as (conn, metrics):
        conn.route("snlp/v1/+/evt", heard.append)
        conn.route("snlpgw/v1/ctl/+", heard.append)
        await connected(conn)
        assert conn.health() == {"ok": False, "refused_subscriptions": ["snlpgw/v1/ctl/+"]}
        assert conn.refused_subscriptions == (("snlpgw/v1/ctl/+", 0x87),)
        assert metrics.snapshot()["snlpgw_mqtt_subscriptions_refused"] == 1.0
        assert alarms[0][0] == "mqtt_subscribe_refused"
        fake.writers[-1].write(b.publish("snlp/v1/aa_bb_cc_dd_ee_ff/evt", b"{}"))
        await eventually(lambda: bool(heard))
        assert heard[0].topic == "snlp/v1/aa_bb_cc_dd_ee_ff/evt"  # the granted one still serves


async def test_a_refused_login_says_why_and_which_setting_once_per_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeBroker(connack=lambda _: b.connack(0x86))  # Bad User Name or Password
    caplog.set_level(logging.WARNING, logger="gateway.mqtt.connection")
    async with running(fake) as (conn, _):
        await fake.wait_for(lambda: len(fake.connects) >= 3)
        health = conn.health()
        assert health["ok"] is False
        assert "bad user name or password" in str(health["error"])
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.mqtt.connection"]
    assert len(lines) >= 2  # one line per refused attempt, each followed by its back-off
    for line in lines:
        assert "bad user name or password (reason code 134)" in line
        assert "mqtt.password_file" in line
        assert "reconnecting in" in line
    assert not conn.connected


# -- publish links: more windows, one topic on one connection -------------------------------


async def test_publish_links_spread_topics_keep_each_topics_order_and_reconnect() -> None:
    dropped: list[int] = []

    def drop_once(p: b.ClientPacket) -> int | None:
        # t/5 leaves on the first link (crc32 of the topic, modulo 3 connections).
        if p.kind == 3 and p.topic == "t/5" and p.body.endswith(b"#5") and not dropped:
            dropped.append(1)
            return 0x89  # server busy: about the broker, not the packet (resent, not poison)
        return None

    fake = FakeBroker(fault=drop_once)
    topics = [f"t/{i}" for i in range(24)]
    async with running(fake, publish_links=2) as (conn, metrics):
        await connected(conn)
        await eventually(lambda: conn.health()["ok"] is True)
        assert conn.health()["publish_links"] == "2/2 connected"
        assert metrics.snapshot()["snlpgw_mqtt_publish_links_connected"] == 2.0
        for n in range(20):
            for topic in topics:
                assert conn.publish(topic, f"{topic}#{n}".encode(), qos=1)
        await eventually(lambda: sum(len(o) for o in conn._outboxes) == 0)
        await eventually(lambda: conn.health()["ok"] is True)
    connects = {cid: p for cid, p in fake.by_client if p.kind == 1}
    assert sorted(connects) == ["t", "t.p1", "t.p2"]
    assert [c for c, p in fake.by_client if p.kind == 1].count("t.p1") == 2  # it came back
    for cid in ("t.p1", "t.p2"):  # publish-only: clean start, no will, nothing subscribed
        flags = b.connect_flags(connects[cid])
        assert flags & 0x02  # Clean Start
        assert not flags & 0x04  # no will
        assert not [p for c, p in fake.by_client if c == cid and p.kind == 8]
    carriers: dict[str, set[str]] = {}
    for topic in topics:
        sent = [(c, p.body) for c, p in fake.by_client if p.kind == 3 and p.topic == topic]
        carriers[topic] = {c for c, _ in sent}
        payloads: list[str] = []
        for _, body in sent:  # the payload repeats the topic; a resend may repeat one
            text = body.rsplit(topic.encode(), 1)[1].decode()
            if text not in payloads:
                payloads.append(text)
        assert payloads == [f"#{n}" for n in range(20)], topic  # all, in order
    assert all(len(c) == 1 for c in carriers.values())  # one topic, one connection
    assert {c for cs in carriers.values() for c in cs} == {"t", "t.p1", "t.p2"}
    assert dropped == [1]
    assert len(fake.connects) == 4
