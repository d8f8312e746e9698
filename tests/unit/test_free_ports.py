"""The dev stack's free ports: distinct, and out of the kernel's way."""

from __future__ import annotations

import socket
from pathlib import Path

from devstack.broker import free_port, free_ports


def test_ports_picked_together_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(*[socket.SOCK_STREAM] * 50)
    assert len(set(ports)) == 50  # port 0 twice in a row may give one port twice
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= p < low for p in ports)  # no port-0 bind or connection is given these


def test_a_picked_port_can_be_bound_for_each_kind() -> None:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", free_port(kind)))
