"""The CHAT downlink player: order kept, audio paced, tts stop after the audio, bounded queue."""

from __future__ import annotations

import asyncio
import time

from gateway.chat.player import Player
from gateway.xiaozhi.downlink import Pacing


class PlayerSink:
    def __init__(self) -> None:
        self.out: list[tuple[str, object]] = []
        self.drops: list[str] = []
        self.refuse = False
        self.changed = asyncio.Event()

    def publish(self, payload: bytes) -> None:
        self.out.append(("json", payload))
        self.changed.set()

    def send(self, opus: bytes) -> bool:
        self.out.append(("audio", opus))
        self.changed.set()
        return not self.refuse

    def tts(self, state: str) -> None:
        self.out.append(("tts", state))

    async def until(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.out) < count:
                self.changed.clear()
                await self.changed.wait()


def player(sink: PlayerSink, capacity: int = 100, control: int = 256) -> Player:
    return Player(
        publish=sink.publish,
        send_audio=sink.send,
        on_tts=sink.tts,
        clock=time.monotonic,
        count_drop=sink.drops.append,
        pacing=Pacing(frame_ms=5, prebuffer=2),
        capacity=capacity,
        control_capacity=control,
        lead_s=0.01,
    )


async def test_order_pacing_and_stop_after_audio() -> None:
    sink = PlayerSink()
    p = player(sink)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(p.run())
        p.json(b"start", tts="start")
        p.json(b"sentence")
        for i in range(6):
            p.audio(bytes([i]))
        p.json(b"stop", tts="stop")
        await sink.until(11)
        task.cancel()
    kinds = [k for k, _ in sink.out]
    assert kinds == ["json", "tts", "json", *["audio"] * 6, "json", "tts"]
    assert [v for k, v in sink.out if k == "audio"] == [bytes([i]) for i in range(6)]
    assert not p.speaking
    assert p.idle


async def test_clear_drops_audio_keeps_control_and_overflow_is_counted() -> None:
    sink = PlayerSink()
    p = player(sink, capacity=3)
    p.json(b"a")
    for i in range(5):
        p.audio(bytes([i]))
    assert sink.drops == ["downlink_overflow", "downlink_overflow"]
    assert p.json(b"b")
    assert p.clear() == 3
    assert p.clear() == 0
    sink.refuse = True
    p.audio(b"x")
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(p.run())
        await sink.until(3)
        task.cancel()
    assert sink.out == [("json", b"a"), ("json", b"b"), ("audio", b"x")]
    assert sink.drops[-1] == "downlink_refused"


def test_control_flood_is_refused_not_dropped_silently() -> None:
    sink = PlayerSink()
    p = player(sink, control=2)
    p.audio(b"a")  # audio does not count against the control bound
    assert p.json(b"1")
    assert p.json(b"2")
    assert not p.json(b"3")
    assert sink.drops == ["downlink_control_overflow"]


def test_reset_drops_everything() -> None:
    sink = PlayerSink()
    p = player(sink)
    p.json(b"start", tts="start")
    p.audio(b"a")
    p.reset()
    assert p.idle
    assert not p.speaking
