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

from codec.packet import MAX_DATAGRAM
from codec.udp import UplinkSender
from gateway.xiaozhi.udp import open_socket
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
