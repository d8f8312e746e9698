"""Synchronous broker probes (no threads, no asyncio): used by ``snlpgw dev-run``, ``snlpgw
doctor``, ``snlpgw provision``, the OTA provisioner (on its worker threads) and the dev stack
(``devstack/``: demo, tests, benchmarks) — the one MQTT CONNECT probe, and
:func:`await_login`, the one loop that waits for a credentials change to take effect.

A :class:`Probe` is the gateway's own MQTT 5 session core
(:class:`~gateway.mqtt.session.MqttSession`, the rules the service's client keeps) driven over
one blocking socket: every wait is a ``recv`` under a socket timeout, so nothing runs in the
background — ``dev-run`` keeps its signals blocked for ``sigtimedwait`` and forks children,
which threads would complicate — and nothing happens between two calls.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.mqtt import session as core
from gateway.mqtt.options import ClientOptions
from gateway.mqtt.tls import client_context

KEEPALIVE_S = 10
POLL_S = 0.05  # the longest a pump waits on the socket before asking ``done()`` again
SEND_S = 2.0  # a write the kernel cannot take within this ends the connection
_READ = 65_536


@dataclass(frozen=True, slots=True)
class ProbeMessage:
    """A PUBLISH the probe received (acknowledged already when QoS 1)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


class Probe:
    """One MQTT 5 client driven by hand; ``connack`` is None until answered.

    After :meth:`connect`, :meth:`pump_until` reads and answers the broker until a condition
    holds; what arrived is in ``granted`` (SUBACK reason codes by packet id), ``acked`` (what
    became of each :meth:`publish`) and ``received`` (:class:`ProbeMessage`, oldest first)."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str | None,
        password: str | None,
        *,
        tls: bool = False,
        ca_file: Path | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.connack: int | None = None
        self.closed = False
        self.granted: dict[int, list[int]] = {}  # packet id -> SUBACK reason codes
        # publish number -> 0 (QoS 0 written, QoS 1 acknowledged under 0x80) or the reason code
        # it failed with (a PUBACK at or over 0x80, or the DISCONNECT that blamed it).
        self.acked: dict[int, int] = {}
        self.received: list[ProbeMessage] = []
        self.tls = tls or ca_file is not None  # ca_file: trust that CA instead of the system's
        self.ca_file = ca_file
        self.session = core.MqttSession(
            ClientOptions(
                client_id=f"snlpgw-probe-{secrets.token_hex(6)}",  # the broker refuses empty ids
                keepalive_s=KEEPALIVE_S,
                username=username,
                password=password,
            )
        )
        self._sock: socket.socket | None = None
        self._published = 0
        # TLS: ``context`` as given (the gateway's: gateway.mqtt.tls.broker_context), else one
        # trusting ca_file instead of the system's CAs.
        if context is None and self.tls:
            context = client_context(ca_file=ca_file)
        self.context = context

    def connect(self, timeout_s: float) -> int | None:
        """CONNACK reason code (0 = accepted); None when the broker never answered within
        ``timeout_s`` or closed the connection first. Raises :class:`OSError` when no
        connection is made in that time (nobody listening, a failed or slow TLS handshake)."""
        deadline = time.monotonic() + timeout_s
        self._sock = _open(self.host, self.port, context=self.context, by=deadline)
        self._send(self.session.connect(time.monotonic()))
        self.pump_until(lambda: self.connack is not None, deadline - time.monotonic())
        return self.connack

    def subscribe(self, topic_filter: str, qos: int = 0) -> int | None:
        """Send a SUBSCRIBE; its packet id (``granted`` gets its SUBACK's codes), None when not
        connected. Raises :class:`~gateway.mqtt.session.InvalidPublish` for a bad filter."""
        if self.closed or self.session.state is not core.State.CONNECTED:
            return None
        packet_id, packet = self.session.subscribe([(topic_filter, qos)], time.monotonic())
        self._send(packet)
        return packet_id

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int | None:
        """Send a PUBLISH; the number ``acked`` reports it under (at once for QoS 0, on its
        PUBACK for QoS 1), None when not connected. Raises
        :class:`~gateway.mqtt.session.InvalidPublish` for what MQTT forbids."""
        if self.closed or self.session.state is not core.State.CONNECTED:
            return None
        self._published += 1
        number = self._published
        sent = self.session.publish(
            topic, payload, time.monotonic(), qos=qos, retain=retain, ref=number
        )
        self._send(sent.packet)
        if not sent.packet_id and not self.closed:
            self.acked[number] = 0
        return number

    def pump_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Read and answer the broker until ``done()``, the connection ends or the timeout;
        returns ``done()``."""
        deadline = time.monotonic() + timeout_s
        while not done() and not self.closed and self._sock is not None:
            now = time.monotonic()
            if now >= deadline:
                break
            wait = min(deadline - now, POLL_S)
            due = self.session.deadline()
            if due is not None:
                wait = min(wait, due - now)
            self._read(self._sock, wait)
            self._keepalive()
        return done()

    def close(self) -> None:
        """DISCONNECT (when connected) and close the socket."""
        if self._sock is None or self.closed:
            return
        bye = self.session.disconnect()
        if bye:
            with contextlib.suppress(OSError):
                self._sock.settimeout(SEND_S)
                self._sock.sendall(bye)
        self._end(core.Loss.LOCAL)

    # -- the socket ------------------------------------------------------------------------

    def _read(self, sock: socket.socket, wait_s: float) -> None:
        try:
            sock.settimeout(max(wait_s, 0.001))  # 0 would make the socket non-blocking
            data = sock.recv(_READ)
        except TimeoutError:
            return
        except OSError:
            self._end(core.Loss.BROKER_CLOSED)
            return
        if not data:
            self._end(core.Loss.BROKER_CLOSED)
            return
        now = time.monotonic()
        for event in self.session.receive(data, now):
            self._on(event, now)
            if self.closed:
                return
        out = self.session.take_output()
        if out:
            self._send(out)

    def _on(self, event: core.MqttEvent, now: float) -> None:
        if isinstance(event, core.PublishIn):
            packet = event.packet
            self.received.append(
                ProbeMessage(packet.topic, packet.payload, packet.qos, packet.retain)
            )
            ack = self.session.acknowledge(packet, now)
            if ack and not self.closed:
                self._send(ack)
        elif isinstance(event, core.Connected):
            self.connack = 0
        elif isinstance(event, core.Refused):
            self.connack = event.reason
            self._end(core.Loss.LOCAL)
        elif isinstance(event, core.Subscribed):
            self.granted[event.packet_id] = [code for _, code in event.results]
        elif isinstance(event, core.Delivered):
            self._acked(event.ref, 0)
        elif isinstance(event, core.Failed):
            self._acked(event.ref, event.reason)
        elif isinstance(event, core.BrokerDisconnect):
            self._end(core.Loss.BROKER_DISCONNECT, event.reason)
        else:  # Violation: bytes MQTT forbids
            self._end(core.Loss.LOCAL)

    def _acked(self, ref: object, reason: int) -> None:
        if isinstance(ref, int):
            self.acked[ref] = reason

    def _keepalive(self) -> None:
        try:
            ping = self.session.on_deadline(time.monotonic())
        except core.KeepAliveTimeout:
            self._end(core.Loss.BROKER_SILENT)
            return
        if ping:
            self._send(ping)

    def _send(self, data: bytes) -> None:
        if self._sock is None or self.closed:
            return
        try:
            self._sock.settimeout(SEND_S)
            self._sock.sendall(data)
        except OSError:
            self._end(core.Loss.BROKER_CLOSED)

    def _end(self, how: core.Loss, reason: int = 0) -> None:
        """The connection is over: publishes it leaves unanswered are reported, the socket
        closed."""
        if self.closed:
            return
        self.closed = True
        for failed in self.session.connection_lost(how, reason):
            self._acked(failed.ref, failed.reason)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()


def _open(host: str, port: int, *, context: ssl.SSLContext | None, by: float) -> socket.socket:
    """A connected socket (TLS-wrapped with ``context`` when given: the broker's name checked
    against its certificate) or :class:`OSError`; connecting and the handshake end by ``by``."""
    sock = socket.create_connection((host, port), timeout=max(by - time.monotonic(), 0.001))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is None:
            return sock
        sock.settimeout(max(by - time.monotonic(), 0.001))
        return context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def connack(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    tls: bool = False,
    ca_file: Path | None = None,
    context: ssl.SSLContext | None = None,
    timeout_s: float = 5.0,
) -> int | None:
    """Connect once and disconnect: the CONNACK reason code (0 = accepted), None when nobody
    answered (refused socket, failed TLS handshake, closed without a CONNACK). TLS as
    :class:`Probe` takes it."""
    probe = Probe(host, port, username, password, tls=tls, ca_file=ca_file, context=context)
    try:
        return probe.connect(timeout_s)
    except OSError:
        return None
    finally:
        probe.close()


# Mosquitto clears its reload flag when a reload ends, so a SIGHUP that lands during another
# reload is lost. A reload takes milliseconds: still the old answer this long after a signal,
# the signal was lost and is sent again.
RESIGNAL_S = 0.5


def await_login(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    within_s: float,
    accepted: bool = True,
    tls: bool = False,
    ca_file: Path | None = None,
    context: ssl.SSLContext | None = None,
    reload: Callable[[], None] | None = None,
    alive: Callable[[], None] | None = None,
    gap_s: float = 0.02,
) -> int | None:
    """After a credentials change and its reload signal: connect as ``username`` until the
    broker answers as the reload makes it (CONNACK 0 when ``accepted``, a refusal otherwise)
    or ``within_s`` passed (plus one probe's connect); ``reload`` is signalled again each
    :data:`RESIGNAL_S` of the old answer (not while nobody answers: that is no lost reload),
    ``alive`` may raise to stop early (a broker that exited). The last answer (None: nobody
    answered)."""
    deadline = time.monotonic() + within_s
    signalled = time.monotonic()
    answer: int | None = None
    while True:
        if alive is not None:
            alive()
        remaining = deadline - time.monotonic()
        answer = connack(
            host, port, username, password, tls=tls, ca_file=ca_file, context=context,
            timeout_s=max(0.1, min(2.0, remaining)),
        )  # fmt: skip
        if answer is not None and (answer == 0) == accepted:
            return answer
        if time.monotonic() >= deadline:
            return answer
        if answer is not None and reload is not None and time.monotonic() - signalled >= RESIGNAL_S:
            reload()
            signalled = time.monotonic()
        time.sleep(gap_s)  # spaces attempts; a connect attempt is the wait itself
