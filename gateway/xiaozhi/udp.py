"""The UDP audio endpoint: one datagram socket for every session, routed by ssrc.

Per datagram, cheapest check first, each refusal counted by reason and never raised:
framing (``unpack_header``, no crypto) → ssrc lookup → source address (:mod:`binding`) → flags and
sequence / replay (codec's ``UplinkReceiver.check``, no crypto, no state change) → rate
(:mod:`ratelimit`; a replay flood therefore never drains the session's budget) → decrypt →
bind/refresh the source → the session's bounded pipeline. A datagram from a foreign address
never touches the session's sequence state, so it can neither lock the session out nor learn
anything from it. A new address for a session whose source has been silent for
``xiaozhi.rebind_after_s`` is tried on a small budget of its own and adopted only if the
datagram decrypts to a frame of the session's stream (see :mod:`binding`).

The common case (a datagram from the bound source) runs as one straight function on the header's
raw fields: no header, result or frame objects built, drop counters resolved once per reason,
the socket's traffic counters moved once per batch of reads.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

from prometheus_client import Counter

from codec.opus import plausible_frame
from codec.packet import MAX_DATAGRAM, DropReason, unpack_header
from gateway.xiaozhi.binding import Address, Admission
from gateway.xiaozhi.live import LiveSession
from gateway.xiaozhi.sessions import Session
from gateway.xiaozhi.stats import ChannelStats

log = logging.getLogger(__name__)

FOREIGN_SOURCE = "foreign_source"  # drop label beside codec's DropReason values
NO_ADDRESS = "no_address"  # a send before the device's address is known
RATE_LIMITED = "rate_limited"  # over the session's datagram rate (ratelimit.py)
REBIND_LIMITED = "rebind_limited"  # over the tries a silent session allows a new source
# Datagrams read per readiness event beyond the first: one loop turn per batch, not per
# datagram, and bounded so timers and MQTT still run every few milliseconds under any load.
DRAIN_LIMIT = 256
# While datagrams flow, the socket is read every COALESCE_S, not on each readiness event: at 100
# sessions one arrives every 0.6 ms, and a loop wake-up costs more than its work. A frame waits
# at most this long; the first quiet read goes back to readiness events (``_readable``).
COALESCE_S = 0.004
_READ_SIZE = MAX_DATAGRAM + 1  # a longer datagram arrives truncated and is still TOO_LARGE


class UdpEndpoint(asyncio.DatagramProtocol):
    def __init__(
        self,
        *,
        lookup: Callable[[int], LiveSession | None],
        on_activity: Callable[[Session, float], None],  # the session core's touch
        stats: ChannelStats,
        clock: Callable[[], float],
        after_reads: Callable[[], None] | None = None,
        coalesce_s: float = COALESCE_S,
    ) -> None:
        self._lookup = lookup
        self._on_activity = on_activity
        self._stats = stats
        self._clock = clock
        self._transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None
        self._reader: tuple[asyncio.AbstractEventLoop, socket.socket] | None = None  # drain_from
        self._drop_counters: dict[str, Counter] = {}  # udp_dropped's child per reason
        # The channel's AudioPump.serve: decode what a batch of reads queued in the same
        # callback, so a datagram costs one loop wake-up, not one to read and one to decode.
        self._after_reads = after_reads
        self._coalesce_s = coalesce_s  # 0: every readiness event is read at once
        self._poll: asyncio.TimerHandle | asyncio.Handle | None = None  # the next timed read
        self._batch = 0  # datagrams the last datagram_received read

    # -- asyncio.DatagramProtocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # CPython's selector datagram transport does not subclass DatagramTransport; it is one.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading()
        self._transport = None
        self._sock = None

    def drain_from(self, sock: socket.socket) -> None:
        """Read the datagrams queued behind each one asyncio delivers straight from ``sock``
        (the non-blocking socket the transport was made with) until it would block.

        Called in a running loop, the endpoint also takes the socket's readiness callback over
        from the transport: asyncio's reader reads each wake-up's first datagram into a fresh
        256 KiB buffer, ours reads ``MAX_DATAGRAM + 1`` bytes like the rest of the batch. The
        transport's reading is paused and ours watches a duplicate of the socket's descriptor
        (asyncio refuses a reader on a transport's own); the transport still sends."""
        self._sock = sock
        transport = self._transport
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a unit test feeding datagrams by hand
            return
        if transport is None:
            return
        reader = sock.dup()
        cast(asyncio.ReadTransport, transport).pause_reading()
        loop.add_reader(reader.fileno(), self._readable)
        self._reader = (loop, reader)

    def _stop_reading(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        if self._reader is not None:
            loop, reader = self._reader
            self._reader = None
            loop.remove_reader(reader.fileno())
            reader.close()

    def _readable(self) -> None:
        """The socket is readable: read the batch, then (datagrams flowing) stop watching it
        and read it again on a timer (``_timed_read``): one wake-up per ``coalesce_s`` under
        load, not one per datagram."""
        if self._read() and self._coalesce_s > 0 and self._reader is not None:
            loop, reader = self._reader
            loop.remove_reader(reader.fileno())
            self._poll = loop.call_later(self._coalesce_s, self._timed_read)

    def _timed_read(self) -> None:
        """Timed read while datagrams flow: a full batch (more are waiting) reads again at the
        loop's next turn, a partial one after ``coalesce_s``, none goes back to readiness
        events (the socket went quiet)."""
        self._poll = None
        got = 0
        try:
            got = self._read()
        finally:  # even past a bug in the handling: the socket must stay watched
            if self._reader is not None and self._poll is None:
                loop, reader = self._reader
                if not got:
                    loop.add_reader(reader.fileno(), self._readable)
                elif got > DRAIN_LIMIT:
                    self._poll = loop.call_soon(self._timed_read)
                else:
                    self._poll = loop.call_later(self._coalesce_s, self._timed_read)

    def _read(self) -> int:
        """The first datagram, then the batch (as ``datagram_received``, looked up per call so
        a test can observe it): how many were read."""
        sock = self._sock
        if sock is None:
            return 0
        try:
            data, addr = sock.recvfrom(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:  # e.g. a queued ICMP error, as the transport reports it
            self.error_received(exc)
            return 1  # the socket is not quiet: read on
        self._batch = 0
        self.datagram_received(data, addr)
        return self._batch

    def read_pending(self) -> None:
        """Read what waits in the socket now, at most 4 batches (``ControlHandler``: why)."""
        for _ in range(4):
            if self._read() <= DRAIN_LIMIT:
                return

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable from a device that went away: count, never stop serving.
        self._dropped("socket_error")
        log.debug("UDP socket error: %s", exc)

    def _dropped(self, reason: str) -> None:
        counter = self._drop_counters.get(reason)
        if counter is None:
            counter = self._drop_counters[reason] = self._stats.udp_dropped.labels(reason)
        counter.inc()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        packets, size = 1, len(data)
        try:
            self._one(data, addr)
            sock = self._sock
            if sock is None:
                return
            recvfrom, one = sock.recvfrom, self._one
            for _ in range(DRAIN_LIMIT):
                try:
                    data, addr = recvfrom(_READ_SIZE)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:  # e.g. a queued ICMP error: the next event goes on
                    self.error_received(exc)
                    return
                packets += 1
                size += len(data)
                one(data, addr)
        finally:  # counted once per batch, not per datagram
            self._batch = packets
            self._stats.udp_packets_in.inc(packets)
            self._stats.udp_bytes_in.inc(size)
            if self._after_reads is not None:
                self._after_reads()

    def _one(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        fields = unpack_header(data)
        if isinstance(fields, DropReason):
            self._dropped(fields.value)
            return
        _, flags, _, ssrc, _, seq = fields
        live = self._lookup(ssrc)
        if live is None:
            self._dropped(DropReason.UNKNOWN_SSRC.value)
            return
        # asyncio gives (host, port) for IPv4 and (host, port, flow, scope) for IPv6.
        # (no typing.cast call here: it is a function call per datagram)
        source: Address = addr if len(addr) == 2 else (str(addr[0]), int(addr[1]))  # type: ignore[assignment]
        now = self._clock()
        binding = live.binding
        admission = binding.check(source, now)
        if admission is Admission.FOREIGN:
            self._dropped(FOREIGN_SOURCE)
            return
        receiver = live.receiver
        # Sequence rules before any budget: replays never drain the session's rate budget.
        refused = receiver.vet(ssrc, flags, seq)
        if refused is not None:
            self._dropped(refused.value)
            return
        pipeline = live.pipeline
        if admission is Admission.REBIND:
            payload = self._rebind(live, data, source, now)
            if payload is None:
                return
            lost_before = receiver.advance(data, seq, decrypt=False)[1]  # decrypted above
        else:
            if not live.bucket.allow(now):
                self._dropped(RATE_LIMITED)
                return
            # Nobody listens (no window open): sequence and binding rules still run, the AES
            # not (except until the session's TOC byte is known, for rebinding).
            decrypt = pipeline.listening or not binding.tocs
            payload, lost_before = receiver.advance(data, seq, decrypt=decrypt)
        binding.commit(source, now, admission, payload)
        if admission is not Admission.SAME:  # SAME: committed before, the address seen
            if admission is Admission.REBIND:
                self._stats.udp_rebinds.inc()
                log.info("session %s of %s moved to %s", live.session_id, live.dev, source)
            live.address_seen()
        self._on_activity(live.session, now)
        pipeline.receive(payload, seq, lost_before)

    def _rebind(self, live: LiveSession, data: bytes, source: Address, now: float) -> bytes | None:
        """A new source for a silent session: a few tries a second on a budget of their own,
        and only a frame of this session's stream (decrypted, checked) moves it. The
        decrypted payload, or ``None`` for a drop (counted)."""
        binding = live.binding
        if not live.rebind_bucket.allow(now):
            self._dropped(REBIND_LIMITED)
            return None
        payload = live.receiver.decrypt(data)
        if not (binding.familiar(payload) and plausible_frame(payload)):
            binding.refuse()
            self._dropped(DropReason.IMPLAUSIBLE.value)
            return None
        if not binding.confirm(source):
            self._dropped(DropReason.REBIND_PENDING.value)
            return None
        return payload

    # -- sending ---------------------------------------------------------------------------

    def send(self, live: LiveSession, opus_packet: bytes) -> bool:
        """Seal and send one downlink packet; ``False`` (counted) if it could not go out."""
        address = live.binding.address
        if address is None or self._transport is None:
            self._dropped(NO_ADDRESS)
            return False
        datagram = live.sender.seal(opus_packet)
        if isinstance(datagram, DropReason):
            self._dropped(f"out_{datagram.value}")
            return False
        self._transport.sendto(datagram, address)
        self._stats.udp_packets_out.inc()
        self._stats.udp_bytes_out.inc(len(datagram))
        return True

    def close(self) -> None:
        self._stop_reading()
        if self._transport is not None:
            self._transport.close()

    @property
    def local_port(self) -> int:
        if self._transport is None:
            raise RuntimeError("UDP endpoint not started")
        port: int = self._transport.get_extra_info("sockname")[1]
        return port
