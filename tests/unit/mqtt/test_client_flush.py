"""When the client's buffered packets reach the socket: together at the end of a loop turn, and
within a long turn once the oldest has waited FLUSH_GAP_S (a fake transport records writes)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.mqtt import client as mqtt_client
from gateway.mqtt.client import FLUSH_GAP_S, Client
from gateway.mqtt.options import ClientOptions


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


class PacingClock:
    def __init__(self) -> None:
        self.now = time.monotonic() + 1.0  # past the client's own start-up stamps

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> PacingClock:
    c = PacingClock()
    monkeypatch.setattr(mqtt_client, "_now", c)
    return c


def client() -> tuple[Client, RecordingTransport]:
    c = Client(ClientOptions(client_id="t"), lambda message: None)
    transport = RecordingTransport()
    c.connection_made(transport)
    return c, transport


async def test_packets_of_one_turn_leave_in_one_write_at_its_end(clock: PacingClock) -> None:
    c, transport = client()
    for p in (b"a", b"b", b"c"):
        c._write(p)
    assert transport.writes == []
    await asyncio.sleep(0)
    assert transport.writes == [b"abc"]


async def test_a_long_turn_sends_what_waited_a_gap_without_waiting_for_its_end(
    clock: PacingClock,
) -> None:
    c, transport = client()
    c._write(b"a")
    clock.now += FLUSH_GAP_S / 2
    c._write(b"b")
    assert transport.writes == []  # still within the gap
    clock.now += FLUSH_GAP_S  # the same turn goes on (a thousand timers due together)
    c._write(b"c")
    assert transport.writes == [b"ab"]  # a and b left; c is the start of the next batch
    clock.now += FLUSH_GAP_S / 2
    c._write(b"d")
    await asyncio.sleep(0.01)
    assert transport.writes == [b"ab", b"cd"]
