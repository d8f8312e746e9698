"""The asyncio shell of the MQTT client: one :class:`asyncio.Protocol` over one socket, driving a
:class:`~gateway.mqtt.session.MqttSession` (the rules: ids, in-flight table, limits, keep-alive,
poison). It only moves bytes, runs callbacks and sleeps until the session's deadline.

Why not paho + aiomqtt: at 1,000 lessons they took ~45 % of the gateway's CPU (objects, a lock,
a task and a ``wait_for`` per message, a socket read per packet), about 10x what the bytes need.
Here a read is one ``data_received`` that may carry many packets, decoded in place
(bench/results/mqtt_client.md compares it with paho-mqtt, aiomqtt and gmqtt).

* :meth:`Client.connect` opens the socket, sends CONNECT and waits for CONNACK (bounded); a
  refusal raises :class:`ConnectRefused`. Cancelled at any point, it leaves nothing open.
  Publishes a previous connection of the same session left unacknowledged are sent again first.
* Received PUBLISHes go to ``on_message`` on the loop, in order, as they are read (the handler
  must only parse and enqueue); a QoS 1 one is acknowledged after its handler returned.
* :meth:`Client.publish` writes at once and never waits. It raises
  :class:`~gateway.mqtt.session.InvalidPublish` for what MQTT forbids (nothing is sent, no id
  taken). ``on_done`` runs when a QoS 1 publish is acknowledged (at once for QoS 0),
  ``on_failed`` when the broker refuses it (PUBACK >= 0x80) or the poison rule drops it; the
  callbacks live in the session, so they run even when that happens on a later connection.
  Sends are batched per loop turn and paced ``FLUSH_GAP_S`` (2 ms) apart under load.
* :meth:`Client.closed` returns (raises :class:`MqttError`) when the connection is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.mqtt import codec
from gateway.mqtt import session as core
from gateway.mqtt.options import (
    ClientOptions,
    ClosedBeforeConnack,
    ConnectRefused,
    MqttError,
    PublishRefused,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


OnMessage = Callable[[codec.PublishPacket], None]
OnFailed = Callable[[core.Failed], None]

# Least time between two sends of one connection: the most a packet waits for company under load
# (an idle connection sends at once).
FLUSH_GAP_S = 0.002
_now = time.monotonic  # the send pacing's clock (a test moves it without moving the loop's)
# TCP keep-alive on the broker socket (Linux names; skipped elsewhere): a dead peer is found in
# about 60 s even when the broker announces Server Keep Alive 0 (no PINGREQ then).
TCP_KEEPALIVE = tuple(
    (getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
)


@dataclass(slots=True)
class _Callbacks:
    """A QoS 1 publish's callbacks, kept in the session's in-flight table as its ``ref``."""

    done: Callable[[], None] | None
    failed: OnFailed | None


class Client(asyncio.Protocol):
    def __init__(
        self,
        options: ClientOptions,
        on_message: OnMessage,
        *,
        session: core.MqttSession | None = None,
    ) -> None:
        self.options = options
        self.session = core.MqttSession(options) if session is None else session
        self._on_message = on_message
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # written this turn of the loop, flushed together
        self._out_since = 0.0  # when the oldest packet in _out was written
        self._loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._connack: asyncio.Future[core.Limits] = self._loop.create_future()
        self._subacks: dict[int, asyncio.Future[core.Subscribed]] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._last_write = _now() - FLUSH_GAP_S  # the CONNECT leaves at once
        self._timer: asyncio.TimerHandle | None = None
        # Run after a read that acknowledged publishes: room may have opened for new ones
        # (a publish of someone else's, or the end of isolating, frees it too).
        self.on_room: Callable[[], None] | None = None
        self._how = core.Loss.BROKER_CLOSED  # why the connection ends, unless said otherwise
        self._reason = 0
        # Resolved once the session is settled (nothing of a previous connection left to resend
        # or confirm): a plain future, so a waiter needs no task of its own.
        self._settled: asyncio.Future[None] = self._loop.create_future()

    # -- connection ----------------------------------------------------------------------

    async def connect(
        self, host: str, port: int, *, tls: ssl.SSLContext | None = None, wait_s: float = 10
    ) -> core.Limits:
        """Open the connection; returns what the broker's CONNACK announced."""
        try:
            async with asyncio.timeout(wait_s):
                await self._loop.create_connection(lambda: self, host, port, ssl=tls)
                self._write(self.session.connect(time.monotonic()))
                try:
                    limits = await self._connack
                except ConnectRefused:
                    raise
                except MqttError as exc:  # closed on us between the handshake and CONNACK
                    raise ClosedBeforeConnack(f"{exc} (before the broker's CONNACK)") from exc
        except TimeoutError:
            self.abort()
            raise MqttError("timed out connecting to the broker") from None
        except ssl.SSLCertVerificationError as exc:
            self.abort()
            raise MqttError(f"TLS: the broker's certificate was not accepted: {exc}") from exc
        except OSError as exc:
            self.abort()
            raise MqttError(f"cannot connect to the broker: {exc}") from exc
        except BaseException:
            self.abort()
            raise
        self._arm_timer()
        return limits

    async def settled(self) -> None:
        """Wait until publishes a broker-ended connection left in flight were each confirmed
        or dropped (:attr:`MqttSession.isolating`); raises :class:`MqttError` if the
        connection ends first. A publish sent meanwhile would be in flight beside a suspect,
        and the poison rule could no longer tell which one the broker refused."""
        waiters: list[asyncio.Future[Any]] = [self._settled, self._lost]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not self._settled.done():
            await self.closed()

    @property
    def is_connected(self) -> bool:
        return self._transport is not None and not self._lost.done()

    @property
    def limits(self) -> core.Limits:
        return self.session.limits

    @property
    def broker_receive_maximum(self) -> int:
        return self.session.limits.receive_maximum

    async def closed(self) -> None:
        """Wait until the connection is gone; raises :class:`MqttError` saying why."""
        await asyncio.shield(self._lost)

    async def disconnect(self, wait_s: float = 3.0) -> None:
        """Send DISCONNECT (no will) and close; bounded by ``wait_s``."""
        if self._transport is not None and self.is_connected:
            self._how = core.Loss.LOCAL
            bye = self.session.disconnect()
            if bye:
                self._write(bye)
            self._flush()  # now: close() drops nothing already written
            self._transport.close()
            with contextlib.suppress(MqttError, TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self.closed()
        self.abort()

    def abort(self) -> None:
        """Drop the socket at once, without DISCONNECT (the broker then sends the will)."""
        self._how = core.Loss.LOCAL
        if self._transport is not None:
            self._transport.abort()

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: bytes = b"",
        on_done: Callable[[], None] | None = None,
        on_failed: OnFailed | None = None,
    ) -> core.Sent:
        """Write one PUBLISH now; raises :class:`MqttError` when not connected and
        :class:`~gateway.mqtt.session.InvalidPublish` when MQTT forbids it."""
        if not self.is_connected:
            raise MqttError("not connected")
        ref = _Callbacks(on_done, on_failed) if qos else None
        sent = self.session.publish(
            topic,
            payload,
            time.monotonic(),
            qos=qos,
            retain=retain,
            properties=properties,
            ref=ref,
        )
        self._write(sent.packet)
        if not sent.packet_id and on_done is not None:
            on_done()
        return sent

    async def publish_wait(
        self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False
    ) -> core.Sent:
        """:meth:`publish` and wait for the PUBACK (QoS 1) or the write (QoS 0); raises
        :class:`MqttError` if the broker refuses it or the connection ends first."""
        done: asyncio.Future[None] = self._loop.create_future()

        def failed(event: core.Failed) -> None:
            if not done.done():
                done.set_exception(PublishRefused(topic, event))
                done.exception()  # retrieved: the waiter may be gone (its connection lost)

        sent = self.publish(
            topic,
            payload,
            qos=qos,
            retain=retain,
            on_done=lambda: _resolve(done, None),
            on_failed=failed,
        )
        await asyncio.wait([done, self._lost], return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            await self.closed()
            raise MqttError("connection lost")  # pragma: no cover - closed() raised
        done.result()
        return sent

    @property
    def unacknowledged(self) -> int:
        return self.session.in_flight

    @property
    def writable(self) -> asyncio.Event:
        """Set while the transport's buffer is below its high-water mark."""
        return self._writable

    def room(self, window: int) -> bool:
        """A new QoS 1 publish may go now (see :meth:`MqttSession.room`)."""
        return self.is_connected and self.session.room(window)

    async def subscribe(self, filters: list[tuple[str, int]]) -> tuple[int, ...]:
        """SUBSCRIBE and wait for the SUBACK's reason codes (one per filter, >= 0x80 refused)."""
        if not self.is_connected:
            raise MqttError("not connected")
        packet_id, packet = self.session.subscribe(filters, time.monotonic())
        future: asyncio.Future[core.Subscribed] = self._loop.create_future()
        self._subacks[packet_id] = future
        self._write(packet)
        waiters: list[asyncio.Future[Any]] = [future, self._lost]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._subacks.pop(packet_id, None)
        if not future.done():
            await self.closed()
        return tuple(code for _, code in future.result().results)

    def _write(self, data: bytes) -> None:
        """Queue a packet for the socket. Packets written in one turn of the loop leave in one
        ``send`` at its end; under load, sends are at least ``FLUSH_GAP_S`` apart, so one
        ``send`` carries every packet of that gap (a syscall per packet was a fifth of the
        gateway's CPU at 500 lessons). An idle connection sends at once; a turn that runs
        longer than the gap sends what waited that long at its next write."""
        if self._transport is None:
            raise MqttError("not connected")
        now = _now()
        if not self._out:
            self._out_since = now
            wait = self._last_write + FLUSH_GAP_S - now
            if wait > 0:
                self._loop.call_later(wait, self._flush)
            else:
                self._loop.call_soon(self._flush)
        elif now - self._out_since >= FLUSH_GAP_S:
            self._flush()  # a long turn (a thousand timers due, a big read): not at its end
            self._out_since = now
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        self._last_write = _now()
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # liveness even where the broker turns MQTT keep-alive off (0)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in TCP_KEEPALIVE:
                    sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def data_received(self, data: bytes) -> None:
        session = self.session
        now = time.monotonic()
        pinged = session.ping_outstanding
        events = session.receive(data, now)
        acknowledged = False
        for event in events:
            if type(event) is core.PublishIn:
                packet = event.packet
                try:
                    self._on_message(packet)
                except Exception:  # the handler's bug, not the connection's
                    log.exception("message handler failed on %s", packet.topic)
                if packet.qos and self.is_connected:
                    self._write(session.acknowledge(packet, now))
            elif type(event) is core.Delivered:
                acknowledged = True
                ref = event.ref
                if isinstance(ref, _Callbacks) and ref.done is not None:
                    ref.done()
            else:
                acknowledged = acknowledged or type(event) is core.Failed
                self._event(event)
        if self._lost.done():
            return
        out = session.take_output()
        if out:  # resends: written now, so a DISCONNECT read next blames what the broker got
            self._write(out)
            self._flush()
        if session.settled:
            _resolve(self._settled, None)
        if pinged and self._timer is not None:  # the answer moved the next deadline earlier
            self._timer.cancel()
            self._arm_timer()
        if acknowledged and self.on_room is not None:
            self.on_room()

    def _event(self, event: core.MqttEvent) -> None:
        if isinstance(event, core.Failed):
            _report_failed(event)
        elif isinstance(event, core.Connected):
            _resolve(self._connack, event.limits)
        elif isinstance(event, core.Refused):
            self._fail(ConnectRefused(event.reason, event.reason_string), core.Loss.LOCAL)
        elif isinstance(event, core.Subscribed):
            future = self._subacks.get(event.packet_id)
            if future is not None:
                _resolve(future, event)
        elif isinstance(event, core.Violation):
            self._fail(
                MqttError(f"protocol error from the broker: {event.message}"), core.Loss.LOCAL
            )
        elif isinstance(event, core.BrokerDisconnect):
            said = f": {event.reason_string[:200]}" if event.reason_string else ""
            self._reason = event.reason
            self._fail(
                MqttError(f"broker disconnected us (reason code {event.reason}){said}"),
                core.Loss.BROKER_DISCONNECT,
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(MqttError(f"connection lost: {exc}" if exc else "connection closed"), self._how)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _fail(self, error: MqttError, how: core.Loss) -> None:
        if self._lost.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        self._out.clear()
        for failed in self.session.connection_lost(how, self._reason):
            _report_failed(failed)
        self._lost.set_exception(error)
        self._lost.exception()  # retrieved: nobody may be waiting
        if not self._connack.done():
            self._connack.set_exception(error)
            self._connack.exception()  # retrieved: the connect may have been cancelled
        self._writable.set()  # writers wake up and find the connection gone
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    # -- keep-alive ------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        due = self.session.deadline()
        if due is not None and not self._lost.done():
            self._timer = self._loop.call_at(
                self._loop.time() + max(0.0, due - time.monotonic()), self._on_timer
            )

    def _on_timer(self) -> None:
        try:
            ping = self.session.on_deadline(time.monotonic())
        except core.KeepAliveTimeout as exc:
            self._fail(MqttError(str(exc)), core.Loss.BROKER_SILENT)
            return
        if ping:
            self._write(ping)
        self._arm_timer()


def _report_failed(event: core.Failed) -> None:
    ref = event.ref
    if isinstance(ref, _Callbacks) and ref.failed is not None:
        ref.failed(event)
    else:
        log.error(
            "publish on %s %s (reason code %d)", event.topic, event.failure.value, event.reason
        )


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)
