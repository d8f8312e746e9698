"""gateway.ports: the bind test and the /proc owner lookup, on real loopback sockets."""

from __future__ import annotations

import os
import socket

import pytest

from gateway.ports import describe_holder, port_free, port_owner


@pytest.mark.parametrize(
    ("kind", "proto"), [(socket.SOCK_STREAM, "tcp"), (socket.SOCK_DGRAM, "udp")]
)
def test_a_held_port_is_not_free_and_names_its_owner(kind: int, proto: str) -> None:
    with socket.socket(socket.AF_INET, kind) as held:
        held.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            held.listen()
        port = held.getsockname()[1]
        assert not port_free("127.0.0.1", port, proto)
        owner = port_owner(port, proto)
        assert owner is not None
        assert owner.pid == os.getpid()
        assert f"pid {os.getpid()}" in describe_holder(port, proto)
    assert port_free("127.0.0.1", port, proto)
    assert port_owner(port, proto) is None
    assert "not visible" in describe_holder(port, proto)
