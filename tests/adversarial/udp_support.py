"""Shared pieces of the UDP adversarial tests: the attacker's datagrams and a view of the
gateway's session for a simulated device (all over real sockets)."""

from __future__ import annotations

import secrets
import socket
import struct

from codec.counter_space import UPLINK_SSRC_MASK
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.live import LiveSession

HEADER = struct.Struct(">BBHIII")


def ssrc_of(sim: XiaozhiDeviceSim) -> int:
    assert sim.hello is not None
    return int.from_bytes(sim.hello.nonce[4:8], "big")


def live_of(channel: XiaozhiChannel, sim: XiaozhiDeviceSim) -> LiveSession:
    """The gateway's state of ``sim``'s current session."""
    live = channel.route(ssrc_of(sim))
    assert live is not None
    return live


def forged(ssrc: int, seq: int, payload: bytes | None = None, *, ts: int = 0) -> bytes:
    """A well-framed datagram for ``ssrc`` sealed without the key: random ciphertext."""
    body = secrets.token_bytes(40) if payload is None else payload
    return HEADER.pack(1, 0, len(body), ssrc & 0xFFFFFFFF, ts, seq & 0xFFFFFFFF) + body


def random_ssrc() -> int:
    return secrets.randbits(31) & UPLINK_SSRC_MASK or 1


def attacker_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def target_of(sim: XiaozhiDeviceSim) -> tuple[str, int]:
    assert sim.hello is not None
    return (sim.hello.server, sim.hello.port)
