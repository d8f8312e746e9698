"""The shared UDP audio socket: one non-blocking datagram socket for every session, bound, with
a receive buffer grown to absorb bursts (:class:`~gateway.xiaozhi.udp.UdpEndpoint` reads it)."""

from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)

RECEIVE_BUFFER = 4 * 1024 * 1024


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
