"""The UDP endpoint reads its real socket itself (``UdpEndpoint.drain_from`` in a running loop).

asyncio's datagram transport would read each readiness event's first datagram into a fresh
256 KiB buffer; the endpoint pauses the transport's reading and watches a duplicate of the
socket's descriptor instead, reading ``MAX_DATAGRAM + 1`` bytes a datagram. These tests drive a
real socket and a real transport (no fakes but the channel's clock and broker link): datagrams
arrive and are routed, an oversized one is still refused as too large, the transport still
sends, and closing lets go of the duplicate descriptor.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from codec.packet import MAX_DATAGRAM
from codec.udp import UplinkSender
from gateway.xiaozhi.udp import COALESCE_S, DRAIN_LIMIT, UdpEndpoint
from gateway.xiaozhi.udp_socket import open_socket
from tests.support.udp_watch import DatagramWatch
from tests.unit.xiaozhi.fakes import DEV, HELLO, FakeClock, inbound, make_channel, sample


async def test_the_endpoint_reads_its_socket_itself_and_lets_go_of_it_on_close() -> None:
    clock = FakeClock(0.0)
    channel, _pub, metrics = make_channel(clock, ready=False)
    endpoint = channel.udp_endpoint
    sock = open_socket("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: endpoint, sock=sock)
    endpoint.drain_from(sock)
    channel.bound()
    channel.control.handle(inbound(DEV, HELLO))
    session = channel.core.by_dev(DEV)
    assert session is not None
    live = channel.route(session.ssrc)
    assert live is not None
    device = UplinkSender(key=session.key, ssrc=session.ssrc)
    watch = DatagramWatch(channel)
    watched = loop._selector.get_map()  # type: ignore[attr-defined]
    assert sock.fileno() not in watched  # the transport's reading is paused: ours reads
    fds_before = len(watched)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.bind(("127.0.0.1", 0))
        tx.sendto(device.seal(b"\xf8\xff\xfe"), sock.getsockname())
        tx.sendto(device.seal(bytes(MAX_DATAGRAM)), sock.getsockname())  # 1516 bytes

        def handled() -> bool:
            too_large = sample(metrics, "xiaozhi_udp_dropped_total", reason="too_large")
            return live.pipeline.queued == 1 and too_large == 1

        await watch.until(handled)
        assert live.binding.address == tx.getsockname()
        assert endpoint.send(live, b"\xf8\xff\xfe")  # the transport still sends
        tx.settimeout(5)
        reply, _ = tx.recvfrom(2048)
        assert len(reply) == 16 + 3
    endpoint.close()
    assert transport.is_closing()
    assert len(watched) == fds_before - 1  # our reader (on the duplicate) is gone


class TimedReads:
    """Wakes a test after each of the endpoint's timed reads (which may handle no datagram,
    so :class:`DatagramWatch` would not wake it)."""

    def __init__(self, endpoint: UdpEndpoint) -> None:
        self._ran = asyncio.Event()
        original = endpoint._timed_read

        def observed() -> None:
            try:
                original()
            finally:
                self._ran.set()

        endpoint._timed_read = observed  # type: ignore[method-assign]

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not condition():
                self._ran.clear()
                await self._ran.wait()


async def test_a_burst_is_read_in_timed_batches_and_a_quiet_socket_is_watched_again() -> None:
    """Coalesced reads: while datagrams flow the descriptor is not watched (timed reads, the
    full batches back to back, so a burst past DRAIN_LIMIT is read to the end); the first
    read that finds nothing watches it again, and the next datagram wakes it as before."""
    clock = FakeClock(0.0)
    channel, _pub, metrics = make_channel(clock, ready=False)
    endpoint = channel.udp_endpoint
    sock = open_socket("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(lambda: endpoint, sock=sock)
    endpoint.drain_from(sock)
    channel.bound()
    channel.control.handle(inbound(DEV, HELLO))
    session = channel.core.by_dev(DEV)
    assert session is not None
    device = UplinkSender(key=session.key, ssrc=session.ssrc)
    watch, timed = DatagramWatch(channel), TimedReads(endpoint)
    watched = loop._selector.get_map()  # type: ignore[attr-defined]
    fds_watching = len(watched)
    burst = 2 * DRAIN_LIMIT + 10
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.bind(("127.0.0.1", 0))
        for _ in range(burst):
            tx.sendto(device.seal(b"\xf8\xff\xfe"), sock.getsockname())

        def packets_in() -> float:
            return sample(metrics, "xiaozhi_udp_packets_in_total")

        await watch.until(lambda: packets_in() == burst)
        await timed.until(lambda: len(watched) == fds_watching)  # quiet: readiness events again
        tx.sendto(device.seal(b"\xf8\xff\xfe"), sock.getsockname())
        await watch.until(lambda: packets_in() == burst + 1)
        assert len(watched) == fds_watching - 1  # flowing again: a timed read is pending
    endpoint.close()  # cancels it; nothing is watched, nothing fires later
    assert len(watched) == fds_watching - 1
    await asyncio.sleep(2 * COALESCE_S)
    assert len(watched) == fds_watching - 1
    assert packets_in() == burst + 1
