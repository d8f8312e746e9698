"""A lean asyncio MQTT client: one :class:`asyncio.Protocol` over :mod:`gateway.mqtt.codec`.

Why not paho + aiomqtt: at 1,000 lessons they took ~45 % of the gateway's CPU (objects, a lock,
a task and a ``wait_for`` per message, a socket read per packet), about 10x what the bytes need.
Here a read is one ``data_received`` that may carry many packets, decoded in place.

* :meth:`Client.connect` opens the socket, sends CONNECT and waits for CONNACK (bounded); a
  refusal raises :class:`ConnectRefused`. Cancelled at any point, it leaves nothing open.
* Received PUBLISHes go to ``on_message`` on the loop, in order, as they are read (the handler
  must only parse and enqueue); a QoS 1 one is acknowledged after its handler returned.
* :meth:`Client.publish` writes at once and never waits; ``on_done`` runs when a QoS 1 publish is
  acknowledged (at once for QoS 0). The caller bounds how many are unacknowledged. Sends are
  batched per loop turn and paced ``FLUSH_GAP_S`` (2 ms) apart under load (see ``_write``).
* Keep-alive: a PINGREQ after ``keepalive_s`` without a send; 1.5 x that without a read drops it.
* :meth:`Client.closed` returns (raises :class:`MqttError`) when the connection is gone;
  every pending future fails with that error, and callbacks of unacknowledged publishes never
  run (the caller puts those messages back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gateway.mqtt import codec
from gateway.mqtt.options import ClientOptions, ConnectRefused, MqttError

log = logging.getLogger(__name__)
T = TypeVar("T")


OnMessage = Callable[[codec.PublishPacket], None]

# Least time between two sends of one connection: the most a packet waits for company under load
# (an idle connection sends at once).
FLUSH_GAP_S = 0.002
_now = time.monotonic  # the send pacing's clock (a test moves it without moving the loop's)


class Client(asyncio.Protocol):
    def __init__(self, options: ClientOptions, on_message: OnMessage) -> None:
        self.options = options
        self._on_message = on_message
        self._decoder = codec.PacketDecoder(options.version)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # written this turn of the loop, flushed together
        self._out_since = 0.0  # when the oldest packet in _out was written
        self._loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._connack: asyncio.Future[codec.ConnAck] = self._loop.create_future()
        self._subacks: dict[int, asyncio.Future[tuple[int, ...]]] = {}
        self._acks: dict[int, Callable[[], None] | None] = {}  # unacknowledged QoS 1 publishes
        self._next_id = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._last_read = time.monotonic()
        self._last_write = self._last_read - FLUSH_GAP_S  # the CONNECT leaves at once
        self._timer: asyncio.TimerHandle | None = None
        self.broker_receive_maximum = 65_535
        self.broker_max_packet: int | None = None

    # -- connection ----------------------------------------------------------------------

    async def connect(
        self, host: str, port: int, *, tls: ssl.SSLContext | None = None, wait_s: float = 10
    ) -> codec.ConnAck:
        try:
            async with asyncio.timeout(wait_s):
                await self._loop.create_connection(lambda: self, host, port, ssl=tls)
                self._write(self.options.connect_packet())
                connack = await self._connack
        except TimeoutError:
            self.abort()
            raise MqttError("timed out connecting to the broker") from None
        except OSError as exc:
            self.abort()
            raise MqttError(f"cannot connect to the broker: {exc}") from exc
        except BaseException:
            self.abort()
            raise
        if connack.reason != 0:
            self.abort()
            raise ConnectRefused(connack.reason)
        if connack.receive_maximum is not None:
            self.broker_receive_maximum = connack.receive_maximum
        self.broker_max_packet = connack.maximum_packet_size
        self._arm_keepalive()
        return connack

    @property
    def is_connected(self) -> bool:
        return self._transport is not None and not self._lost.done()

    async def closed(self) -> None:
        """Wait until the connection is gone; raises :class:`MqttError` saying why."""
        await asyncio.shield(self._lost)

    async def disconnect(self, wait_s: float = 3.0) -> None:
        """Send DISCONNECT (no will) and close; bounded by ``wait_s``."""
        if self._transport is not None and self.is_connected:
            self._write(codec.DISCONNECT)
            self._flush()  # now: close() drops nothing already written
            self._transport.close()
            with contextlib.suppress(MqttError, TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self.closed()
        self.abort()

    def abort(self) -> None:
        """Drop the socket at once, without DISCONNECT (the broker then sends the will)."""
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
    ) -> None:
        """Write one PUBLISH now; raises :class:`MqttError` when not connected."""
        if not self.is_connected:
            raise MqttError("not connected")
        packet_id = 0
        if qos:
            packet_id = self._packet_id()
            self._acks[packet_id] = on_done
        packet = codec.publish(
            topic.encode(),
            payload,
            qos=qos,
            retain=retain,
            packet_id=packet_id,
            version=self.options.version,
            properties=properties,
        )
        self._write(packet)
        if not qos and on_done is not None:
            on_done()

    async def publish_wait(
        self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False
    ) -> None:
        """:meth:`publish` and wait for the PUBACK (QoS 1) or the write (QoS 0)."""
        done: asyncio.Future[None] = self._loop.create_future()
        self.publish(topic, payload, qos=qos, retain=retain, on_done=lambda: _resolve(done, None))
        await asyncio.wait([done, self._lost], return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            await self.closed()
            raise MqttError("connection lost")  # pragma: no cover - closed() raised

    @property
    def unacknowledged(self) -> int:
        return len(self._acks)

    @property
    def writable(self) -> asyncio.Event:
        """Set while the transport's buffer is below its high-water mark."""
        return self._writable

    async def subscribe(self, filters: list[tuple[str, int]]) -> tuple[int, ...]:
        """SUBSCRIBE and wait for the SUBACK's reason codes (one per filter)."""
        if not self.is_connected:
            raise MqttError("not connected")
        packet_id = self._packet_id()
        future: asyncio.Future[tuple[int, ...]] = self._loop.create_future()
        self._subacks[packet_id] = future
        self._write(codec.subscribe(packet_id, filters, version=self.options.version))
        try:
            waiters: list[asyncio.Future[Any]] = [future, self._lost]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._subacks.pop(packet_id, None)
        if not future.done():
            await self.closed()
        return future.result()

    def _packet_id(self) -> int:
        for _ in range(65_535):
            self._next_id = self._next_id % 65_535 + 1
            if self._next_id not in self._acks and self._next_id not in self._subacks:
                return self._next_id
        raise MqttError("no free packet id")  # pragma: no cover - callers bound the window

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

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        try:
            packets = self._decoder.feed(data)
        except codec.ProtocolError as exc:
            self._fail(MqttError(f"protocol error from the broker: {exc}"))
            return
        for packet in packets:
            if isinstance(packet, codec.PublishPacket):
                try:
                    self._on_message(packet)
                except Exception:  # the handler's bug, not the connection's
                    log.exception("message handler failed on %s", packet.topic)
                if packet.qos == 1 and packet.packet_id is not None and self.is_connected:
                    self._write(codec.puback(packet.packet_id))
            elif isinstance(packet, codec.PubAck):
                if packet.packet_id in self._acks:
                    callback = self._acks.pop(packet.packet_id)
                    if callback is not None:
                        callback()
            elif isinstance(packet, codec.ConnAck):
                _resolve(self._connack, packet)
            elif isinstance(packet, codec.SubAck):
                future = self._subacks.get(packet.packet_id)
                if future is not None:
                    _resolve(future, packet.reasons)
            elif isinstance(packet, codec.Disconnect):
                self._fail(MqttError(f"broker disconnected us (reason code {packet.reason})"))
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(MqttError(f"connection lost: {exc}" if exc else "connection closed"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _fail(self, error: MqttError) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._lost.done():
            self._lost.set_exception(error)
            self._lost.exception()  # retrieved: nobody may be waiting
        if not self._connack.done():
            self._connack.set_exception(error)
            self._connack.exception()  # retrieved: the connect may have been cancelled
        self._acks.clear()
        self._writable.set()  # writers wake up and find the connection gone
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    # -- keep-alive ------------------------------------------------------------------------

    def _arm_keepalive(self) -> None:
        keepalive = self.options.keepalive_s
        if keepalive and not self._lost.done():
            self._timer = self._loop.call_later(keepalive / 2, self._keepalive)

    def _keepalive(self) -> None:
        now, keepalive = time.monotonic(), self.options.keepalive_s
        if now - self._last_read > 1.5 * keepalive:
            self._fail(MqttError(f"no packet from the broker in {1.5 * keepalive:.0f}s"))
            return
        if now - self._last_write >= keepalive / 2 or now - self._last_read >= keepalive / 2:
            self._write(codec.PINGREQ)  # the PINGRESP proves the broker is still there
        self._arm_keepalive()


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)
