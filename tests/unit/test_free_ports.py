"""The dev stack's free ports: distinct, and out of the kernel's way."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from devstack.broker import PORT_SLICE_VAR, _slice, free_port, free_ports


def test_ports_picked_together_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(*[socket.SOCK_STREAM] * 50)
    assert len(set(ports)) == 50  # port 0 twice in a row may give one port twice
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= p < low for p in ports)  # no port-0 bind or connection is given these


def test_a_picked_port_can_be_bound_for_each_kind() -> None:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", free_port(kind)))


def test_parallel_workers_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_SLICE_VAR, "")
    whole = set(free_ports(*[socket.SOCK_STREAM] * 20))
    picked: list[set[int]] = []
    for index in range(3):
        monkeypatch.setenv(PORT_SLICE_VAR, f"{index}/3")
        picked.append(set(free_ports(*[socket.SOCK_STREAM] * 20)))
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= p < low for p in whole.union(*picked))
    slices = [_slice((1000, 1899), f"{index}/3") for index in range(3)]
    assert slices == [(1000, 1299), (1300, 1599), (1600, 1899)]
    for ports, (first, last) in zip(
        picked, [_slice((low - 12_000, low - 1), f"{i}/3") for i in range(3)], strict=True
    ):
        assert all(first <= p <= last for p in ports)


@pytest.mark.parametrize("spec", ["", "x", "3/3", "1/", "/2", "-1/2", "1/0", "0/999999"])
def test_no_slice_or_a_bad_one_means_the_whole_range(spec: str) -> None:
    assert _slice((1000, 1899), spec) == (1000, 1899)
