"""The UDP audio endpoint: one datagram socket for every session, routed by ssrc.

Per datagram, cheapest check first, each refusal counted by reason and never raised:
framing (``peek_ssrc``, no crypto) → ssrc lookup → source address (:mod:`binding`) → flags and
sequence / replay (codec's ``UplinkReceiver.check``, no crypto, no state change) → rate
(:mod:`ratelimit`; a replay flood therefore never drains the session's budget) → decrypt →
bind/refresh the source → the session's bounded pipeline. A datagram from a foreign address
never touches the session's sequence state, so it can neither lock the session out nor learn
anything from it. A new address for a session whose source has been silent for
``xiaozhi.rebind_after_s`` is tried on a small budget of its own and adopted only if the
datagram decrypts to a frame of the session's stream (see :mod:`binding`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

from codec.opus import plausible_frame
from codec.packet import MAX_DATAGRAM, DropReason, peek_ssrc
from codec.udp import Accepted, Dropped
from gateway.xiaozhi.binding import Address, Admission
from gateway.xiaozhi.live import LiveSession
from gateway.xiaozhi.pipeline import Frame
from gateway.xiaozhi.stats import ChannelStats

log = logging.getLogger(__name__)

FOREIGN_SOURCE = "foreign_source"  # drop label beside codec's DropReason values
NO_ADDRESS = "no_address"  # a send before the device's address is known
RATE_LIMITED = "rate_limited"  # over the session's datagram rate (ratelimit.py)
REBIND_LIMITED = "rebind_limited"  # over the tries a silent session allows a new source
RECEIVE_BUFFER = 4 * 1024 * 1024
# Datagrams read per readiness event (the one asyncio delivers + up to this many more), so a
# busy socket costs one loop iteration per batch, not per datagram; bounded so the loop still
# turns (timers, MQTT) every few milliseconds under any load.
DRAIN_LIMIT = 256
_READ_SIZE = MAX_DATAGRAM + 1  # a longer datagram arrives truncated and is still TOO_LARGE


class UdpEndpoint(asyncio.DatagramProtocol):
    def __init__(
        self,
        *,
        lookup: Callable[[int], LiveSession | None],
        on_activity: Callable[[LiveSession, float], None],
        stats: ChannelStats,
        clock: Callable[[], float],
    ) -> None:
        self._lookup = lookup
        self._on_activity = on_activity
        self._stats = stats
        self._clock = clock
        self._transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None

    # -- asyncio.DatagramProtocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # CPython's selector datagram transport does not subclass DatagramTransport; it is one.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._sock = None

    def drain_from(self, sock: socket.socket) -> None:
        """Read the datagrams queued behind each one asyncio delivers straight from ``sock``
        (the non-blocking socket the transport was made with) until it would block."""
        self._sock = sock

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable from a device that went away: count, never stop serving.
        self._stats.udp_dropped.labels("socket_error").inc()
        log.debug("UDP socket error: %s", exc)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        packets, size = 1, len(data)
        try:
            self._one(data, addr)
            sock = self._sock
            if sock is None:
                return
            for _ in range(DRAIN_LIMIT):
                try:
                    data, addr = sock.recvfrom(_READ_SIZE)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:  # e.g. a queued ICMP error: the next event goes on
                    self.error_received(exc)
                    return
                packets, size = packets + 1, size + len(data)
                self._one(data, addr)
        finally:  # counted once per batch, not per datagram
            self._stats.udp_packets_in.inc(packets)
            self._stats.udp_bytes_in.inc(size)

    def _one(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        stats = self._stats
        ssrc = peek_ssrc(data)
        if isinstance(ssrc, DropReason):
            stats.udp_dropped.labels(ssrc.value).inc()
            return
        live = self._lookup(ssrc)
        if live is None:
            stats.udp_dropped.labels(DropReason.UNKNOWN_SSRC.value).inc()
            return
        source: Address = (str(addr[0]), int(addr[1]))
        now = self._clock()
        admission = live.binding.check(source, now)
        if admission is Admission.FOREIGN:
            stats.udp_dropped.labels(FOREIGN_SOURCE).inc()
            return
        result = self._accept(live, data, source, admission, now)
        if result is None:
            return
        live.binding.commit(source, now, admission, result.opus_payload)
        if admission is Admission.REBIND:
            stats.udp_rebinds.inc()
            log.info("session %s of %s moved to %s", live.session_id, live.dev, source)
        live.address_known.set()
        self._on_activity(live, now)
        live.pipeline.offer(Frame(result.opus_payload, result.seq, result.lost_before))

    def _accept(
        self, live: LiveSession, data: bytes, source: Address, admission: Admission, now: float
    ) -> Accepted | None:
        """Sequence checks, budget, decryption; ``None`` for a drop (counted)."""
        header = live.receiver.check(data)  # replays are refused before spending any budget
        if isinstance(header, Dropped):
            self._stats.udp_dropped.labels(header.reason.value).inc()
            return None
        binding = live.binding
        if admission is Admission.REBIND:
            # A new source for a silent session: a few tries a second on a budget of their
            # own, and only a frame of this session's stream (decrypted, checked) moves it.
            if not live.rebind_bucket.allow(now):
                self._stats.udp_dropped.labels(REBIND_LIMITED).inc()
                return None
            payload = live.receiver.decrypt(data)
            if not (binding.familiar(payload) and plausible_frame(payload)):
                binding.refuse()
                self._stats.udp_dropped.labels(DropReason.IMPLAUSIBLE.value).inc()
                return None
            if not binding.confirm(source):
                self._stats.udp_dropped.labels(DropReason.REBIND_PENDING.value).inc()
                return None
            result = live.receiver.take(data, header)
        else:
            if not live.bucket.allow(now):
                self._stats.udp_dropped.labels(RATE_LIMITED).inc()
                return None
            # Nobody listens (no window open): sequence and binding rules still run, the AES
            # not (except until the session's TOC byte is known, for rebinding).
            decrypt = live.pipeline.listening or not binding.tocs
            result = live.receiver.take(data, header, decrypt=decrypt)
        return result

    # -- sending ---------------------------------------------------------------------------

    def send(self, live: LiveSession, opus_packet: bytes) -> bool:
        """Seal and send one downlink packet; ``False`` (counted) if it could not go out."""
        address = live.binding.address
        if address is None or self._transport is None:
            self._stats.udp_dropped.labels(NO_ADDRESS).inc()
            return False
        datagram = live.sender.seal(opus_packet)
        if isinstance(datagram, DropReason):
            self._stats.udp_dropped.labels(f"out_{datagram.value}").inc()
            return False
        self._transport.sendto(datagram, address)
        self._stats.udp_packets_out.inc()
        self._stats.udp_bytes_out.inc(len(datagram))
        return True

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def local_port(self) -> int:
        if self._transport is None:
            raise RuntimeError("UDP endpoint not started")
        port: int = self._transport.get_extra_info("sockname")[1]
        return port


def open_socket(host: str, port: int) -> socket.socket:
    """The shared non-blocking UDP socket, bound, with a grown receive buffer."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    grow_receive_buffer(sock)
    return sock


def grow_receive_buffer(sock: socket.socket) -> None:
    """Ask for a 4 MiB socket receive buffer (best effort, capped by net.core.rmem_max): one
    shared UDP socket must absorb bursts from many devices while the loop is busy."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    except OSError as exc:
        log.warning("could not enlarge the UDP receive buffer: %s", exc)
