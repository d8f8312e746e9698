"""The blocking broker probe against a fake broker on a real loopback socket.

The fake broker is a script of packets, written here byte by byte from the MQTT 5 spec (not
with :mod:`gateway.mqtt.codec`, which the probe runs on); it serves on a thread of the test
because the probe blocks the test's own. Real-broker behaviour (Mosquitto's reason codes,
its reloads, its TLS listener) is the integration tests' (test_acl, test_provision, ...).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.mqtt import probe as probe_module
from gateway.mqtt.probe import RESIGNAL_S, Probe, ProbeMessage, await_login, connack
from tests.support.tls import make_server_certs

NOT_AUTHORIZED = 135
BAD_LOGIN = 134


# -- the fake broker -----------------------------------------------------------------------


class BrokerEnd:
    """One accepted connection, as the script sees it."""

    def __init__(self, sock: socket.socket, log: list[tuple[int, bytes]]) -> None:
        self.sock = sock
        self.log = log  # (first byte, body) of every packet read, for the test's asserts

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def read(self) -> tuple[int, bytes] | None:
        """The next packet (first byte, body); None when the probe closed the connection."""
        head = self._exactly(1)
        if head is None:
            return None
        length, shift = 0, 0
        while True:
            byte = self._exactly(1)
            assert byte is not None, "connection closed inside a packet header"
            length |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                break
        body = self._exactly(length) if length else b""
        assert body is not None, "connection closed inside a packet"
        self.log.append((head[0], body))
        return head[0], body

    def expect(self, kind: int) -> bytes:
        """The next packet's body, which must be of type ``kind`` (the first byte's high half)."""
        packet = self.read()
        assert packet is not None, f"expected packet type {kind}, got end of connection"
        assert packet[0] >> 4 == kind, f"expected packet type {kind}, got first byte {packet[0]:#x}"
        return packet[1]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)


BrokerScript = Callable[[BrokerEnd], None]


class ScriptedBroker:
    """Serves ``connections`` connections on 127.0.0.1 (None: until stopped), one after
    another, each by ``script``; over TLS when given a server context."""

    def __init__(
        self,
        script: BrokerScript,
        *,
        connections: int | None = 1,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(5.0)  # a test that never connects fails instead of hanging
        self.port: int = self.listener.getsockname()[1]
        self.log: list[tuple[int, bytes]] = []
        self.errors: list[BaseException] = []
        self._stopping = False
        self._script, self._connections, self._tls = script, connections, tls
        self.thread = threading.Thread(target=self._serve, name="fake-broker", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        served = 0
        try:
            while self._connections is None or served < self._connections:
                conn, _ = self.listener.accept()
                served += 1
                if self._stopping:
                    conn.close()
                    return
                conn.settimeout(5.0)
                sock = conn
                if self._tls is not None:
                    try:
                        sock = self._tls.wrap_socket(conn, server_side=True)
                    except OSError:
                        conn.close()
                        continue  # a failed handshake: the test says what the probe saw
                with sock:
                    self._script(BrokerEnd(sock, self.log))
        except BaseException as exc:  # reported by the fixture, in the test's thread
            self.errors.append(exc)

    def stop(self) -> None:
        """Wait for the script to finish (waking an idle ``accept``); raise what it raised."""
        if not self._stopping and self.thread.is_alive() and self._connections is None:
            self._stopping = True
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        self._stopping = True
        self.thread.join(timeout=10)
        self.listener.close()
        assert not self.thread.is_alive(), "the fake broker's script did not finish"
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def broker() -> Iterator[Callable[..., ScriptedBroker]]:
    started: list[ScriptedBroker] = []

    def start(
        script: BrokerScript, *, connections: int | None = 1, tls: ssl.SSLContext | None = None
    ) -> ScriptedBroker:
        fake = ScriptedBroker(script, connections=connections, tls=tls)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


# -- packets, from the spec (MQTT 5 §3) ---------------------------------------------------

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, DISCONNECT = 1, 2, 3, 4, 8, 9, 12, 14


def connack_packet(reason: int) -> bytes:
    return bytes((0x20, 3, 0, reason, 0))  # no session present, no properties


def suback_packet(packet_id: int, *codes: int) -> bytes:
    return bytes((0x90, 3 + len(codes))) + packet_id.to_bytes(2) + b"\x00" + bytes(codes)


def publish_packet(topic: str, payload: bytes, *, packet_id: int, retain: bool) -> bytes:
    body = len(topic).to_bytes(2) + topic.encode() + packet_id.to_bytes(2) + b"\x00" + payload
    return bytes((0x32 | retain, len(body))) + body


def puback_packet(packet_id: int, reason: int) -> bytes:
    return b"\x40\x04" + packet_id.to_bytes(2) + bytes((reason, 0))


def disconnect_packet(reason: int) -> bytes:
    return bytes((0xE0, 2, reason, 0))


def _string(body: bytes, pos: int) -> tuple[str, int]:
    n = int.from_bytes(body[pos : pos + 2])
    return body[pos + 2 : pos + 2 + n].decode(), pos + 2 + n


def parse_connect(body: bytes) -> dict[str, object]:
    name, pos = _string(body, 0)
    version, flags = body[pos], body[pos + 1]
    keepalive = int.from_bytes(body[pos + 2 : pos + 4])
    pos += 4
    props, shift = 0, 0  # property length: a variable byte integer
    while True:
        props |= (body[pos] & 0x7F) << shift
        shift += 7
        pos += 1
        if not body[pos - 1] & 0x80:
            break
    client_id, pos = _string(body, pos + props)
    username = password = None
    if flags & 0x80:
        username, pos = _string(body, pos)
    if flags & 0x40:
        password, pos = _string(body, pos)
    return {
        "protocol": (name, version),
        "clean_start": bool(flags & 0x02),
        "keepalive": keepalive,
        "client_id": client_id,
        "username": username,
        "password": password,
    }


def answer_connect(reason: int) -> BrokerScript:
    """Read the CONNECT, answer ``reason``; then read until the probe closes."""

    def script(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(connack_packet(reason))
        while peer.read() is not None:
            pass

    return script


# -- connack() -----------------------------------------------------------------------------


def test_an_accepted_login_is_0_and_the_probe_says_goodbye(
    broker: Callable[..., ScriptedBroker],
) -> None:
    fake = broker(answer_connect(0))
    assert connack("127.0.0.1", fake.port, "gw", "secret") == 0
    fake.stop()
    (first, body), (last, _) = fake.log
    assert first >> 4 == CONNECT
    connect = parse_connect(body)
    assert connect["protocol"] == ("MQTT", 5)
    assert connect["clean_start"] is True
    assert connect["keepalive"] == probe_module.KEEPALIVE_S
    assert (connect["username"], connect["password"]) == ("gw", "secret")
    assert str(connect["client_id"]).startswith("snlpgw-probe-")  # the broker refuses empty ids
    assert last >> 4 == DISCONNECT  # accepted: a clean goodbye, so the broker sends no will


def test_no_credentials_send_none(broker: Callable[..., ScriptedBroker]) -> None:
    fake = broker(answer_connect(NOT_AUTHORIZED))
    assert connack("127.0.0.1", fake.port, None, None) == NOT_AUTHORIZED
    fake.stop()
    connect = parse_connect(fake.log[0][1])
    assert (connect["username"], connect["password"]) == (None, None)


@pytest.mark.parametrize("reason", [BAD_LOGIN, NOT_AUTHORIZED, 0x88])
def test_a_refusal_is_its_reason_code(broker: Callable[..., ScriptedBroker], reason: int) -> None:
    fake = broker(answer_connect(reason))
    assert connack("127.0.0.1", fake.port, "dev", "wrong") == reason
    fake.stop()
    assert [first >> 4 for first, _ in fake.log] == [CONNECT]  # no DISCONNECT after a refusal


def test_nobody_listening_is_none_and_probe_connect_raises() -> None:
    with socket.socket() as bound:  # bound, never listening: the port refuses connections
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert connack("127.0.0.1", port, "gw", "secret", timeout_s=2) is None
        probe = Probe("127.0.0.1", port, "gw", "secret", tls=False)
        with pytest.raises(ConnectionRefusedError):
            probe.connect(2)
        probe.close()  # nothing to close: no error either


def test_no_connack_within_the_timeout_is_none(broker: Callable[..., ScriptedBroker]) -> None:
    def silent(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        assert peer.read() is None  # the probe gives up and closes; no DISCONNECT unconnected

    fake = broker(silent)
    started = time.monotonic()
    assert connack("127.0.0.1", fake.port, "gw", "secret", timeout_s=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2.0


def test_closed_without_a_connack_is_none_at_once(broker: Callable[..., ScriptedBroker]) -> None:
    def hang_up(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)

    fake = broker(hang_up)
    started = time.monotonic()
    assert connack("127.0.0.1", fake.port, "gw", "secret", timeout_s=5) is None
    assert time.monotonic() - started < 2.0


def test_bytes_mqtt_forbids_end_the_connection(broker: Callable[..., ScriptedBroker]) -> None:
    def garbage(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(b"\x36\x00")  # PUBLISH with QoS 3 (and before any CONNACK)
        assert peer.read() is None

    fake = broker(garbage)
    probe = Probe("127.0.0.1", fake.port, "gw", "secret", tls=False)
    assert probe.connect(5) is None
    assert probe.closed
    probe.close()


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    certs = make_server_certs(tmp_path / "certs")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    return context, certs.ca


def test_tls_with_the_brokers_ca(
    broker: Callable[..., ScriptedBroker], tls_server: tuple[ssl.SSLContext, Path]
) -> None:
    context, ca = tls_server
    fake = broker(answer_connect(0), tls=context)
    assert connack("127.0.0.1", fake.port, "gw", "secret", ca_file=ca) == 0
    fake.stop()
    assert [first >> 4 for first, _ in fake.log] == [CONNECT, DISCONNECT]


def test_tls_to_an_untrusted_certificate_is_none(
    broker: Callable[..., ScriptedBroker], tls_server: tuple[ssl.SSLContext, Path]
) -> None:
    context, _ = tls_server
    fake = broker(answer_connect(0), tls=context)
    assert connack("127.0.0.1", fake.port, "gw", "secret", tls=True, timeout_s=2) is None
    fake.stop()
    assert fake.log == []  # the handshake failed: no CONNECT was sent


def test_plain_mqtt_to_a_tls_listener_is_none(
    broker: Callable[..., ScriptedBroker], tls_server: tuple[ssl.SSLContext, Path]
) -> None:
    context, _ = tls_server
    fake = broker(answer_connect(0), tls=context)
    assert connack("127.0.0.1", fake.port, "gw", "secret", timeout_s=2) is None


# -- subscribe, publish, receive -----------------------------------------------------------


def test_suback_codes_messages_in_and_pubacks_out(broker: Callable[..., ScriptedBroker]) -> None:
    seen: dict[str, object] = {}

    def script(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(connack_packet(0))
        for code in (1, NOT_AUTHORIZED):  # the first filter granted at QoS 1, the second refused
            body = peer.expect(SUBSCRIBE)
            peer.send(suback_packet(int.from_bytes(body[:2]), code))
        peer.send(publish_packet("snlp/v1/me/cmd", b"yours", packet_id=7, retain=True))
        seen["acked"] = peer.expect(PUBACK)[:2]
        body = peer.expect(PUBLISH)  # QoS 1 from the probe: refused
        topic, pos = _string(body, 0)
        seen["topic"] = topic
        peer.send(puback_packet(int.from_bytes(body[pos : pos + 2]), NOT_AUTHORIZED))
        body = peer.expect(PUBLISH)  # QoS 0 from the probe
        seen["qos0"] = body.endswith(b"zero")
        peer.expect(DISCONNECT)
        assert peer.read() is None

    fake = broker(script)
    probe = Probe("127.0.0.1", fake.port, "dev", "pw", tls=False)
    try:
        assert probe.connect(5) == 0
        mine = probe.subscribe("snlp/v1/me/cmd", qos=1)
        theirs = probe.subscribe("snlp/v1/other/cmd", qos=1)
        assert mine is not None
        assert theirs is not None
        assert mine != theirs
        assert probe.pump_until(lambda: {mine, theirs} <= probe.granted.keys(), 5)
        assert probe.granted == {mine: [1], theirs: [NOT_AUTHORIZED]}
        assert probe.pump_until(lambda: bool(probe.received), 5)
        assert probe.received == [ProbeMessage("snlp/v1/me/cmd", b"yours", qos=1, retain=True)]
        refused = probe.publish("snlp/v1/other/evt", b"doctor", qos=1)
        assert refused is not None
        assert probe.pump_until(lambda: refused in probe.acked, 5)
        assert probe.acked[refused] == NOT_AUTHORIZED
        written = probe.publish("snlp/v1/me/evt", b"zero")
        assert written is not None
        assert probe.acked[written] == 0  # QoS 0: written is all there is
    finally:
        probe.close()
    fake.stop()
    assert seen == {"acked": (7).to_bytes(2), "topic": "snlp/v1/other/evt", "qos0": True}


def test_a_disconnect_that_blames_the_publish_answers_it(
    broker: Callable[..., ScriptedBroker],
) -> None:
    def script(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(connack_packet(0))
        peer.expect(PUBLISH)
        peer.send(disconnect_packet(NOT_AUTHORIZED))
        assert peer.read() is None  # the probe closes; no DISCONNECT after the broker's

    fake = broker(script)
    probe = Probe("127.0.0.1", fake.port, "dev", "pw", tls=False)
    assert probe.connect(5) == 0
    number = probe.publish("snlp/v1/other/evt", b"x", qos=1)
    assert probe.pump_until(lambda: number in probe.acked, 5)
    assert probe.acked == {number: NOT_AUTHORIZED}
    assert probe.closed
    assert probe.publish("snlp/v1/me/evt", b"x", qos=1) is None  # nothing sent: not connected
    assert probe.subscribe("snlp/v1/me/cmd") is None
    probe.close()


def test_a_broker_that_goes_away_ends_the_pump(broker: Callable[..., ScriptedBroker]) -> None:
    def script(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(connack_packet(0))

    fake = broker(script)
    probe = Probe("127.0.0.1", fake.port, "dev", "pw", tls=False)
    assert probe.connect(5) == 0
    started = time.monotonic()
    assert not probe.pump_until(lambda: bool(probe.received), 5)
    assert probe.closed
    assert time.monotonic() - started < 2.0
    probe.close()


# -- await_login ---------------------------------------------------------------------------


def test_await_login_signals_a_lost_reload_again_until_accepted(
    broker: Callable[..., ScriptedBroker],
) -> None:
    reloads: list[float] = []

    def until_reloaded(peer: BrokerEnd) -> None:
        peer.expect(CONNECT)
        peer.send(connack_packet(0 if reloads else NOT_AUTHORIZED))
        while peer.read() is not None:
            pass

    fake = broker(until_reloaded, connections=None)
    started = time.monotonic()
    answer = await_login(
        "127.0.0.1",
        fake.port,
        "dev",
        "new",
        within_s=5,
        reload=lambda: reloads.append(time.monotonic()),
    )
    assert answer == 0
    assert len(reloads) == 1
    assert reloads[0] - started >= RESIGNAL_S


def test_await_login_with_nobody_listening_signals_nothing() -> None:
    reloads: list[None] = []
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        answer = await_login(
            "127.0.0.1", port, "dev", "new", within_s=RESIGNAL_S * 2,
            reload=lambda: reloads.append(None),
        )  # fmt: skip
    assert answer is None
    assert reloads == []
