"""The MQTT 5 client session, sans-I/O: bytes and calls in; bytes, events and deadlines out.

In the manner of h11 there is no socket, no asyncio and no clock here: every call that needs the
time takes ``now`` (monotonic seconds). The asyncio shell (:mod:`gateway.mqtt.client`) writes
what the calls return, feeds :meth:`MqttSession.receive` what it reads, writes
:meth:`MqttSession.take_output` after it, and wakes :meth:`MqttSession.on_deadline` at
:meth:`MqttSession.deadline`. One session lives across connections; :meth:`MqttSession.connect` starts
each one and :meth:`MqttSession.connection_lost` ends it.

What the session owns, and the rules it keeps (docs/mqtt.md):

* **Packet ids and the in-flight table.** A QoS 1 publish holds its id until its PUBACK. The
  table outlives the connection: after a reconnect its entries are sent again, in order, with
  their ids and DUP set (MQTT 5 §4.4), before anything new; nothing is put back in a queue.
* **Validation before an id is taken.** A topic name that is empty, holds a wildcard or U+0000,
  is not UTF-8 or is over 65,535 bytes, a QoS other than 0 or 1, and a packet over the broker's
  Maximum Packet Size raise :class:`InvalidPublish` and leave nothing behind.
* **What CONNACK announced is obeyed.** Receive Maximum caps what is in flight; Maximum Packet
  Size caps what is sent; Server Keep Alive replaces the asked keep-alive; a Maximum QoS of 0
  sends QoS 1 publishes at QoS 0 and Retain Available 0 sends retained publishes unretained
  (both fallbacks reported in :class:`Sent`), and a CONNECT refused for its will's retain flag
  (0x9A) or its will's QoS (0x9B) is made again without the retain flag or at QoS 0.
* **Reason codes are outcomes.** A PUBACK under 0x80 is :class:`Delivered`; at or over 0x80 the
  message is :class:`Failed` (dropped, never sent again). A SUBACK reports each filter's code.
* **No input causes a reconnect loop (the poison rule).** When the broker ends the connection
  (DISCONNECT, it closes the socket, it goes silent), what was in flight is sent again *one at
  a time* (:attr:`isolating`) until each is acknowledged; nothing new goes meanwhile. A publish
  alone in flight (while isolating: the suspect resent alone, whatever was published beside it
  without :meth:`room`) when the broker disconnects with a reason that blames a packet
  (:data:`BLAMING`) is dropped as :attr:`Failure.POISON`; one alone in flight when the broker
  ends the connection any other way twice is too, but for reasons about the server itself
  (:data:`NOT_ABOUT_A_PACKET`). A resend counts as sent once :meth:`take_output` hands it to the
  shell, so one still waiting when the DISCONNECT is read is never blamed. A connection this
  side ends (a protocol error, a close) blames nothing.
* **Order and Receive Maximum across reconnects.** What a previous connection left in flight
  goes first, at most the broker's Receive Maximum at a time; :meth:`room` and
  :attr:`settled` stay false until all of it was sent again.
* **Keep-alive.** A PINGREQ after half the keep-alive without a send or a receive; no packet
  from the broker within the keep-alive after a PINGREQ ends the connection
  (:class:`KeepAliveTimeout`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from gateway.mqtt import codec
from gateway.mqtt.options import ClientOptions

MAX_TOPIC_BYTES = 65_535

# DISCONNECT reason codes by which a broker blames a packet it received (MQTT 5 §3.14.2.1):
# the publish alone in flight when one arrives is what it blames.
BLAMING = frozenset({
    0x81,  # Malformed Packet
    0x82,  # Protocol Error
    0x83,  # Implementation specific error
    0x87,  # Not authorized
    0x90,  # Topic Name invalid
    0x93,  # Receive Maximum exceeded (a resend alone cannot exceed it: the broker is wrong)
    0x94,  # Topic Alias invalid
    0x95,  # Packet too large
    0x97,  # Quota exceeded
    0x99,  # Payload format invalid
    0x9A,  # Retain not supported
    0x9B,  # QoS not supported
})  # fmt: skip
# DISCONNECT reason codes that say nothing about what the client sent (MQTT 5 §3.14.2.1):
# Server shutting down, Session taken over, Use another server, Server moved.
NOT_ABOUT_A_PACKET = frozenset({0x8B, 0x8E, 0x9C, 0x9D})
# How often a publish may be alone in flight when the broker ends the connection otherwise
# (closes the socket, goes silent, disconnects for a reason that blames no packet) before it
# is taken for the cause (a broker restart closes it once).
CLOSES_BEFORE_POISON = 2
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
# Topic names checked and encoded once (a gateway publishes to a few per device); past this
# many the memo starts again (a flood of names costs the check, never memory).
TOPICS_KEPT = 16_384


class State(Enum):
    IDLE = "idle"  # no connection
    CONNECTING = "connecting"  # CONNECT written, CONNACK awaited
    CONNECTED = "connected"


class Invalid(Enum):
    """Why a publish or subscribe was refused before anything was sent."""

    EMPTY_TOPIC = "empty_topic"
    WILDCARD_TOPIC = "wildcard_topic"
    NUL_IN_TOPIC = "nul_in_topic"
    NOT_UTF8 = "not_utf8"
    TOPIC_TOO_LONG = "topic_too_long"
    BAD_FILTER = "bad_filter"
    QOS_UNSUPPORTED = "qos_unsupported"
    TOO_LARGE = "too_large"


class Failure(Enum):
    """Why a publish that was sent will never be delivered."""

    REFUSED = "refused"  # PUBACK reason code >= 0x80
    POISON = "poison"  # the broker disconnected us for it (see the module doc)


class SessionError(Exception):
    """A call the session's state does not allow (a bug in the shell, not the broker's)."""


class InvalidPublish(ValueError):
    def __init__(self, reason: Invalid, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


class KeepAliveTimeout(Exception):
    def __init__(self, waited_s: float) -> None:
        super().__init__(f"no packet from the broker in {waited_s:.1f}s after a PINGREQ")
        self.waited_s = waited_s


class Loss(Enum):
    """How a connection ended, as far as the poison rule cares."""

    BROKER_DISCONNECT = "broker_disconnect"  # the broker sent DISCONNECT (reason given)
    BROKER_CLOSED = "broker_closed"  # the socket closed or reset under us
    BROKER_SILENT = "broker_silent"  # no answer to a PINGREQ within the keep-alive
    LOCAL = "local"  # this side ended it: protocol error, close, connect failure


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What the broker's CONNACK announced, with MQTT 5's defaults where it said nothing."""

    receive_maximum: int = 65_535
    maximum_packet_size: int | None = None
    maximum_qos: int = 2
    retain_available: bool = True
    keepalive_s: int = 0
    session_present: bool = False


@dataclass(frozen=True, slots=True)
class Connected:
    limits: Limits
    resent: int  # publishes of the previous connection sent again (or waiting to be)


@dataclass(frozen=True, slots=True)
class Refused:
    reason: int  # CONNACK reason code
    reason_string: str | None = None


@dataclass(slots=True)  # not frozen: built per message, frozen init costs twice
class PublishIn:
    packet: codec.PublishPacket


@dataclass(slots=True)  # not frozen: built per message, frozen init costs twice
class Delivered:
    ref: object


@dataclass(frozen=True, slots=True)
class Failed:
    ref: object
    failure: Failure
    reason: int  # the PUBACK's or DISCONNECT's reason code (0 for a close)
    topic: str


@dataclass(frozen=True, slots=True)
class Subscribed:
    packet_id: int
    results: tuple[tuple[str, int], ...]  # (filter, reason code); >= 0x80 refused

    @property
    def refused(self) -> tuple[tuple[str, int], ...]:
        return tuple(r for r in self.results if r[1] >= 0x80)


@dataclass(frozen=True, slots=True)
class Violation:
    """The broker sent bytes MQTT forbids: the connection must end (:data:`Loss.LOCAL`)."""

    message: str


@dataclass(frozen=True, slots=True)
class BrokerDisconnect:
    reason: int
    reason_string: str | None = None


MqttEvent = (
    Connected | Refused | PublishIn | Delivered | Failed | Subscribed | BrokerDisconnect | Violation
)


@dataclass(slots=True)  # not frozen: built per message, frozen init costs twice
class Sent:
    """A publish written: its packet id (0 for QoS 0) and the fallbacks applied to it."""

    packet: bytes
    packet_id: int
    qos_downgraded: bool = False
    retain_dropped: bool = False


@dataclass(slots=True, eq=False)  # identity: `entry in self._queued` compares no fields
class _InFlight:
    packet: bytes  # as first written (DUP clear)
    topic: str
    ref: object
    sent: bool = True  # written on the current connection
    suspect: bool = False  # in flight when the broker ended a connection: resent alone
    closes: int = 0  # broker closes while it was alone in flight


class MqttSession:
    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.state = State.IDLE
        self.limits = Limits()
        self._decoder = codec.PacketDecoder(options.version, max_packet=options.maximum_packet_size)
        self._in_flight: dict[int, _InFlight] = {}  # insertion order = send order
        self._subscribing: dict[int, tuple[str, ...]] = {}
        self._next_id = 0
        self._out: list[bytes] = []  # written by receive(): resends, taken by take_output()
        self._queued: list[_InFlight] = []  # entries whose resend waits in _out (not sent yet)
        self._unsent = 0  # entries of a previous connection not sent again yet
        self._last_sent = 0.0
        self._last_received = 0.0
        self._ping_sent: float | None = None
        self._will_retain = True  # False while a broker refuses the will's retain flag
        self._will_qos0 = False  # True while a broker refuses the will's QoS (Maximum QoS 0)
        self._suspects = 0  # entries marked suspect (see isolating)
        self._topics: dict[str, bytes] = {}  # topic names checked, UTF-8 (bounded: TOPICS_KEPT)

    # -- connection lifecycle ------------------------------------------------------------

    def connect(self, now: float) -> bytes:
        """Start a connection: the CONNECT to write. Clean start unless a session is kept."""
        if self.state is not State.IDLE:
            raise SessionError(f"connect in state {self.state.value}")
        o = self.options
        will = o.will
        if will is not None and (
            (will.retain and not self._will_retain) or (will.qos and self._will_qos0)
        ):
            qos = 0 if self._will_qos0 else will.qos
            will = codec.Will(
                will.topic, will.payload, qos, retain=will.retain and self._will_retain
            )
        self.state = State.CONNECTING
        self._decoder = codec.PacketDecoder(o.version, max_packet=o.maximum_packet_size)
        self._last_sent = self._last_received = now
        self._ping_sent = None
        return codec.connect(
            client_id=o.client_id,
            keepalive_s=o.keepalive_s,
            username=o.username,
            password=o.password,
            will=will,
            version=o.version,
            receive_maximum=o.receive_maximum,
            clean_start=o.session_expiry_s == 0,
            session_expiry_s=o.session_expiry_s,
            maximum_packet_size=o.maximum_packet_size,
        )

    def connection_lost(self, how: Loss, reason: int = 0) -> list[Failed]:
        """End the connection; returns the publishes the poison rule drops (see module doc)."""
        if self.state is State.IDLE:
            return []
        was_connected = self.state is State.CONNECTED
        self.state = State.IDLE
        self._unqueue()
        self._subscribing.clear()
        self._ping_sent = None
        sent = [(pid, e) for pid, e in self._in_flight.items() if e.sent]
        for _, entry in sent:
            entry.sent = False
        self._unsent += len(sent)
        if not was_connected or how is Loss.LOCAL or not sent:
            return []
        dropped: list[Failed] = []
        # While isolating, the suspect resent alone is the one to blame: a publish made meanwhile
        # without room() (the connect's presence) was written after it.
        blamable = [(pid, e) for pid, e in sent if e.suspect] or sent
        if len(blamable) == 1 and reason not in NOT_ABOUT_A_PACKET:
            packet_id, entry = blamable[0]
            blamed = how is Loss.BROKER_DISCONNECT and reason in BLAMING
            entry.closes += 1
            if blamed or entry.closes >= CLOSES_BEFORE_POISON:
                self._remove(packet_id, entry)
                dropped.append(Failed(entry.ref, Failure.POISON, reason, entry.topic))
        for packet_id, entry in sent:
            if not entry.suspect and packet_id in self._in_flight:
                entry.suspect = True
                self._suspects += 1
        return dropped

    def _unqueue(self) -> None:
        """Resends still in ``_out`` were never written: they stay unsent."""
        for entry in self._queued:
            entry.sent = False
        self._unsent += len(self._queued)
        self._queued.clear()
        self._out.clear()

    @property
    def isolating(self) -> bool:
        """Publishes of a connection the broker ended are being resent one at a time."""
        return self._suspects > 0

    def _remove(self, packet_id: int, entry: _InFlight) -> None:
        del self._in_flight[packet_id]
        self._suspects -= entry.suspect
        self._unsent -= not entry.sent

    # -- receiving -------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list[MqttEvent]:
        """Feed bytes read from the socket. Bytes MQTT forbids end the events with a
        :class:`Violation` (the shell then closes the connection: :data:`Loss.LOCAL`); the
        events before it stand."""
        self._last_received = now
        self._ping_sent = None
        events: list[MqttEvent] = []
        error: codec.ProtocolError | None = None
        try:
            packets = self._decoder.feed(data)
        except codec.ProtocolError as exc:
            packets, error = exc.packets, exc
        for packet in packets:
            try:
                if self._handle(packet, events, now):
                    return events  # a DISCONNECT: nothing after it counts
            except codec.ProtocolError as exc:
                error = exc
                break
        if error is not None:
            events.append(Violation(str(error)))
        return events

    def _handle(self, packet: codec.Packet, events: list[MqttEvent], now: float) -> bool:
        """One packet from the broker; True when it ended the connection (DISCONNECT)."""
        if isinstance(packet, codec.PublishPacket):
            if self.state is not State.CONNECTED:
                raise codec.ProtocolError("PUBLISH before CONNACK")
            events.append(PublishIn(packet))
        elif isinstance(packet, codec.PubAck):
            self._puback(packet, events, now)
        elif isinstance(packet, codec.ConnAck):
            self._connack(packet, events, now)
        elif isinstance(packet, codec.SubAck):
            filters = self._subscribing.pop(packet.packet_id, None)
            if filters is not None:
                results = tuple(zip(filters, packet.reasons, strict=False))
                events.append(Subscribed(packet.packet_id, results))
        elif isinstance(packet, codec.Disconnect):
            self._unqueue()  # resends not written yet were never sent
            events.append(BrokerDisconnect(packet.reason, packet.reason_string))
            return True
        return False

    def _connack(self, packet: codec.ConnAck, events: list[MqttEvent], now: float) -> None:
        if self.state is not State.CONNECTING:
            raise codec.ProtocolError("CONNACK on an open connection")
        if packet.reason != 0:
            if packet.reason == RETAIN_NOT_SUPPORTED and self.options.will is not None:
                self._will_retain = False  # next CONNECT: the will unretained (fallback)
            if packet.reason == QOS_NOT_SUPPORTED and self.options.will is not None:
                self._will_qos0 = True  # next CONNECT: the will at QoS 0 (fallback)
            self.state = State.IDLE
            events.append(Refused(packet.reason, packet.reason_string))
            return
        retain = packet.retain_available is not False  # absent: available (MQTT 5)
        maximum_qos = 2 if packet.maximum_qos is None else packet.maximum_qos
        self._will_retain = self._will_retain or retain  # a broker that offers it again
        self._will_qos0 = self._will_qos0 and maximum_qos < 1
        self.limits = Limits(
            receive_maximum=packet.receive_maximum or 65_535,
            maximum_packet_size=packet.maximum_packet_size,
            maximum_qos=maximum_qos,
            retain_available=retain,
            keepalive_s=(
                self.options.keepalive_s
                if packet.server_keepalive_s is None
                else packet.server_keepalive_s
            ),
            session_present=packet.session_present,
        )
        self.state = State.CONNECTED
        events.append(Connected(self.limits, len(self._in_flight)))
        self._resend(now)

    def _puback(self, packet: codec.PubAck, events: list[MqttEvent], now: float) -> None:
        entry = self._in_flight.get(packet.packet_id)
        if entry is None or not entry.sent:
            return  # not ours, or not sent on this connection: the broker is confused
        self._remove(packet.packet_id, entry)
        if packet.reason >= 0x80:
            events.append(Failed(entry.ref, Failure.REFUSED, packet.reason, entry.topic))
        else:
            events.append(Delivered(entry.ref))
        if self._unsent:  # a resend may have waited for this one's slot
            self._resend(now)

    def _resend(self, now: float) -> None:
        """Send again what a previous connection left in flight, in order, before anything
        new: as many as the broker's Receive Maximum lets be in flight, or, while isolating,
        the next suspect once nothing else of the previous connection is in flight."""
        sent = sum(e.sent for e in self._in_flight.values()) + len(self._queued)
        if self.isolating:
            if any(e.suspect and (e.sent or e in self._queued) for e in self._in_flight.values()):
                return
            budget = 1
        else:
            budget = self.limits.receive_maximum - sent
        for entry in self._in_flight.values():
            if budget <= 0:
                break
            if entry.sent or entry in self._queued:
                continue
            budget -= 1
            self._queued.append(entry)
            packet = entry.packet
            self._out.append(bytes((packet[0] | 0x08,)) + packet[1:])  # DUP: a redelivery
        self._last_sent = now

    def take_output(self) -> bytes:
        """Bytes :meth:`receive` produced (resends after a CONNACK or a PUBACK); from now on
        they count as sent (the shell writes them at once)."""
        if not self._out:
            return b""
        for entry in self._queued:
            entry.sent = True
        self._unsent -= len(self._queued)
        self._queued.clear()
        out = b"".join(self._out)
        self._out.clear()
        return out

    @property
    def settled(self) -> bool:
        """Connected, the previous connection's publishes all sent again and confirmed or
        dropped, and room for one more: a publish made now cannot blur the poison rule nor
        exceed the broker's Receive Maximum."""
        return (
            self.state is State.CONNECTED
            and not self._suspects
            and not self._unsent
            and len(self._in_flight) < self.limits.receive_maximum
        )

    @property
    def ping_outstanding(self) -> bool:
        return self._ping_sent is not None

    # -- sending ---------------------------------------------------------------------------

    def room(self, window: int) -> bool:
        """Whether a new QoS 1 publish may go now: connected, not isolating, everything of the
        previous connection sent again, and fewer than ``window`` (capped by the broker's
        Receive Maximum) in flight."""
        if self.state is not State.CONNECTED:
            return False
        limit = min(window, self.limits.receive_maximum)
        return len(self._in_flight) < limit and not self._suspects and not self._unsent

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def publish(
        self,
        topic: str,
        payload: bytes,
        now: float,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: bytes = b"",
        ref: object = None,
    ) -> Sent:
        """A PUBLISH to write now. Validated before a packet id is taken (raises
        :class:`InvalidPublish`); QoS 1 ones are tracked until their PUBACK, with ``ref``
        reported in :class:`Delivered` or :class:`Failed`."""
        if self.state is not State.CONNECTED:
            raise SessionError(f"publish in state {self.state.value}")
        encoded = self.topic_bytes(topic)
        limits = self.limits
        downgraded = unretained = False
        if qos:
            if qos != 1:
                raise InvalidPublish(
                    Invalid.QOS_UNSUPPORTED, f"QoS {qos} (this client sends 0 or 1)"
                )
            if limits.maximum_qos < 1:
                qos, downgraded = 0, True
        if retain and not limits.retain_available:
            retain, unretained = False, True
        # The id is only held once the packet is in the table: one refused below is not.
        packet_id = self._packet_id() if qos else 0
        packet = codec.publish(
            encoded,
            payload,
            qos=qos,
            retain=retain,
            packet_id=packet_id,
            version=self.options.version,
            properties=properties,
        )
        limit = limits.maximum_packet_size
        if limit is not None and len(packet) > limit:
            raise InvalidPublish(
                Invalid.TOO_LARGE, f"{len(packet)}-byte packet over the broker's {limit}"
            )
        if qos:
            self._in_flight[packet_id] = _InFlight(packet, topic, ref)
        self._last_sent = now
        if downgraded or unretained:
            return Sent(packet, packet_id, downgraded, unretained)
        return Sent(packet, packet_id)

    def topic_bytes(self, topic: str) -> bytes:
        """``topic`` checked as a topic name (:func:`topic_name`) and UTF-8 encoded, remembered
        (bounded: ``TOPICS_KEPT``; an invalid name is never remembered)."""
        encoded = self._topics.get(topic)
        if encoded is None:
            encoded = topic_name(topic)
            if len(self._topics) >= TOPICS_KEPT:
                self._topics.clear()
            self._topics[topic] = encoded
        return encoded

    def acknowledge(self, message: codec.PublishPacket, now: float) -> bytes:
        """The PUBACK of a received QoS 1 message (write it once its handler returned)."""
        if message.qos != 1 or message.packet_id is None or self.state is not State.CONNECTED:
            return b""
        self._last_sent = now
        return codec.puback(message.packet_id)

    def subscribe(self, filters: Iterable[tuple[str, int]], now: float) -> tuple[int, bytes]:
        """A SUBSCRIBE to write; its result comes as :class:`Subscribed`. Every filter is
        checked first (raises :class:`InvalidPublish`); QoS is capped at the broker's maximum."""
        if self.state is not State.CONNECTED:
            raise SessionError(f"subscribe in state {self.state.value}")
        checked: list[tuple[str, int]] = []
        for topic_filter, qos in filters:
            topic_filter_check(topic_filter)
            if qos not in (0, 1):
                raise InvalidPublish(Invalid.QOS_UNSUPPORTED, f"QoS {qos} on {topic_filter!r}")
            checked.append((topic_filter, min(qos, self.limits.maximum_qos)))
        if not checked:
            raise InvalidPublish(Invalid.BAD_FILTER, "no topic filter")
        packet_id = self._packet_id()
        self._subscribing[packet_id] = tuple(f for f, _ in checked)
        self._last_sent = now
        return packet_id, codec.subscribe(packet_id, checked, version=self.options.version)

    def disconnect(self) -> bytes:
        """The DISCONNECT to write before closing (the broker then sends no will)."""
        return codec.DISCONNECT if self.state is State.CONNECTED else b""

    def _packet_id(self) -> int:
        for _ in range(65_535):
            self._next_id = self._next_id % 65_535 + 1
            if self._next_id not in self._in_flight and self._next_id not in self._subscribing:
                return self._next_id
        raise SessionError("no free packet id")  # pragma: no cover - room() bounds the table

    # -- keep-alive ------------------------------------------------------------------------

    def deadline(self) -> float | None:
        """When :meth:`on_deadline` must run next (None: no keep-alive to keep)."""
        keepalive = self.limits.keepalive_s
        if self.state is not State.CONNECTED or not keepalive:
            return None
        if self._ping_sent is not None:
            return self._ping_sent + keepalive
        return min(self._last_sent, self._last_received) + keepalive / 2

    def on_deadline(self, now: float) -> bytes:
        """A PINGREQ to write when half the keep-alive passed without a send or a receive;
        raises :class:`KeepAliveTimeout` when the broker did not answer one in time."""
        due = self.deadline()
        if due is None or now < due:
            return b""
        if self._ping_sent is not None:
            raise KeepAliveTimeout(now - self._ping_sent)
        self._ping_sent = self._last_sent = now
        return codec.PINGREQ


def topic_name(topic: str) -> bytes:
    """``topic`` as a PUBLISH carries it (UTF-8), or :class:`InvalidPublish` saying why not."""
    if not topic:
        raise InvalidPublish(Invalid.EMPTY_TOPIC, "empty topic name")
    if "+" in topic or "#" in topic:
        raise InvalidPublish(Invalid.WILDCARD_TOPIC, f"wildcard in topic name {topic[:80]!r}")
    if "\x00" in topic:
        raise InvalidPublish(Invalid.NUL_IN_TOPIC, f"U+0000 in topic name {topic[:80]!r}")
    try:
        encoded = topic.encode()
    except UnicodeEncodeError:
        raise InvalidPublish(Invalid.NOT_UTF8, f"topic name {topic[:80]!r} is not UTF-8") from None
    if len(encoded) > MAX_TOPIC_BYTES:
        raise InvalidPublish(Invalid.TOPIC_TOO_LONG, f"{len(encoded)}-byte topic name")
    return encoded


def topic_filter_check(topic_filter: str) -> None:
    """Raise :class:`InvalidPublish` unless ``topic_filter`` is a valid MQTT filter (§4.7)."""
    if not topic_filter:
        raise InvalidPublish(Invalid.EMPTY_TOPIC, "empty topic filter")
    if "\x00" in topic_filter:
        raise InvalidPublish(Invalid.NUL_IN_TOPIC, f"U+0000 in filter {topic_filter[:80]!r}")
    try:
        size = len(topic_filter.encode())
    except UnicodeEncodeError:
        raise InvalidPublish(Invalid.NOT_UTF8, f"filter {topic_filter[:80]!r} not UTF-8") from None
    if size > MAX_TOPIC_BYTES:
        raise InvalidPublish(Invalid.TOPIC_TOO_LONG, f"{size}-byte topic filter")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if ("#" in level and (level != "#" or i != len(levels) - 1)) or (
            "+" in level and level != "+"
        ):
            raise InvalidPublish(Invalid.BAD_FILTER, f"invalid topic filter {topic_filter[:80]!r}")
