"""The CHAT downlink player: order kept, audio paced, tts stop after the audio, bounded queue;
callbacks on the loop (one timer at most, nothing after close, a failing item contained).

Most tests move a fake loop clock (exact due times); one runs on the real loop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.chat.player import Player
from gateway.xiaozhi.downlink import Pacing
from tests.unit.chat.fake_loop import FakeLoop

START = 100.0
LEAD = 0.01
FRAME = 0.005


class PlayerSink:
    """The player's Output; records (kind, value, time) and wakes a real-loop waiter."""

    def __init__(self, clock: FakeLoop | None = None) -> None:
        self.clock = clock
        self.out: list[tuple[str, object]] = []
        self.times: list[float] = []
        self.drops: list[str] = []
        self.failures = 0
        self.refuse = False
        self.boom: bytes | None = None  # publishing this payload raises
        self.on_stop: list[object] = []  # called on tts stop (re-entrant player calls)
        self.changed = asyncio.Event()

    def _note(self, kind: str, value: object) -> None:
        self.out.append((kind, value))
        self.times.append(self.clock.now if self.clock else 0.0)
        self.changed.set()

    def publish_down(self, payload: bytes) -> None:
        if payload == self.boom:
            raise RuntimeError("a bug in one item")
        self._note("json", payload)

    def send_audio(self, opus: bytes) -> bool:
        self._note("audio", opus)
        return not self.refuse

    def on_tts(self, state: str) -> None:
        self._note("tts", state)
        if state == "stop":
            for call in self.on_stop:
                call()  # type: ignore[operator]

    def count_drop(self, reason: str) -> None:
        self.drops.append(reason)

    def count_failure(self) -> None:
        self.failures += 1

    def kinds(self) -> list[str]:
        return [k for k, _ in self.out]

    async def until(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.out) < count:
                self.changed.clear()
                await self.changed.wait()


def player(
    sink: PlayerSink, loop: FakeLoop | None = None, capacity: int = 100, control: int = 256
) -> tuple[Player, FakeLoop]:
    loop = loop or FakeLoop(START)
    sink.clock = loop
    p = Player(
        out=sink,
        loop=loop,
        clock=loop.clock,
        pacing=Pacing(frame_ms=5, prebuffer=2),
        capacity=capacity,
        control_capacity=control,
        lead_s=LEAD,
    )
    return p, loop


def speech(p: Player, frames: int) -> None:
    p.json(b"start", tts="start")
    p.json(b"sentence")
    for i in range(frames):
        p.audio(bytes([i]))
    p.json(b"stop", tts="stop")


def test_order_pacing_and_stop_after_audio() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    speech(p, 6)
    assert sink.out == []  # queued: the drain runs in the next turn of the loop
    loop.run_until(START + 1)
    assert sink.kinds() == ["json", "tts", "json", *["audio"] * 6, "json", "tts"]
    assert [v for k, v in sink.out if k == "audio"] == [bytes([i]) for i in range(6)]
    # control at once; audio LEAD after tts start: the pre-buffer (2) together, then one per
    # frame; tts stop once the device had time to play them (last due + (prebuffer + 2) frames)
    first = START + LEAD
    audio = [first, first, first + FRAME, first + 2 * FRAME, first + 3 * FRAME, first + 4 * FRAME]
    expected = [START, START, START, *audio, audio[-1] + 4 * FRAME, audio[-1] + 4 * FRAME]
    assert sink.times == pytest.approx(expected)
    assert not p.speaking
    assert p.idle
    assert loop.live() == []  # nothing left scheduled


def test_one_timer_at_most_and_new_items_do_not_add_callbacks() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    speech(p, 10)
    assert len(loop.live()) == 1  # one drain for the whole burst of items
    loop.run_ready()
    assert len(loop.live()) == 1  # the head waits: one call_at handle
    for i in range(5):
        p.audio(bytes([i]))  # behind a waiting head: nothing new scheduled
    assert len(loop.live()) == 1
    loop.run_until(START + 1)
    assert sink.kinds().count("audio") == 15
    assert sink.kinds()[-7:] == ["json", "tts", *["audio"] * 5]  # queue order kept
    assert loop.live() == []


def test_a_stalled_stream_starts_a_new_burst() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    p.json(b"start", tts="start")
    p.audio(b"a")
    loop.run_until(START + 1)
    p.audio(b"b")
    p.audio(b"c")
    p.audio(b"d")
    loop.run_until(START + 2)
    # long after the last frame's due time: a new burst from now (pre-buffer at once again)
    assert sink.times[-3:] == pytest.approx([START + 1, START + 1, START + 1 + FRAME])


def test_clear_drops_audio_keeps_control_and_overflow_is_counted() -> None:
    sink = PlayerSink()
    p, loop = player(sink, capacity=3)
    p.json(b"a")
    for i in range(5):
        p.audio(bytes([i]))
    assert sink.drops == ["downlink_overflow", "downlink_overflow"]
    assert p.json(b"b")
    assert p.clear() == 3
    assert p.clear() == 0
    sink.refuse = True
    p.audio(b"x")
    loop.run_until(START + 1)
    assert sink.out == [("json", b"a"), ("json", b"b"), ("audio", b"x")]
    assert sink.drops[-1] == "downlink_refused"


def test_clear_while_the_head_waits_sends_the_control_behind_it_at_once() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    p.json(b"start", tts="start")
    for i in range(20):
        p.audio(bytes([i]))
    loop.run_until(START + LEAD + 2 * FRAME)  # a few frames out, the next one waits
    waiting = loop.live()
    assert len(waiting) == 1
    sent = sink.kinds().count("audio")
    assert p.clear() == 20 - sent
    assert waiting[0].cancelled  # the stale timer is gone
    p.json(b"stop", tts="stop")  # abort: the speech ends properly ...
    loop.run_until(START + 1)
    assert sink.kinds().count("audio") == sent  # ... with no frame after the clear
    stop_at = sink.times[sink.out.index(("json", b"stop"))]
    last_due = START + LEAD + 2 * FRAME
    assert stop_at == pytest.approx(last_due + 4 * FRAME)  # still after what the device holds


def test_control_flood_is_refused_not_dropped_silently() -> None:
    sink = PlayerSink()
    p, _ = player(sink, control=2)
    p.audio(b"a")  # audio does not count against the control bound
    assert p.json(b"1")
    assert p.json(b"2")
    assert not p.json(b"3")
    assert sink.drops == ["downlink_control_overflow"]


def test_reset_drops_everything() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    p.json(b"start", tts="start")
    p.audio(b"a")
    p.reset()
    assert p.idle
    assert not p.speaking
    loop.run_until(START + 1)
    assert sink.out == []


def test_a_reset_from_inside_a_callback_is_seen_by_the_drain() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    sink.on_stop.append(p.reset)  # tts stop ends the session (a goodbye), which resets
    sink.on_stop.append(lambda: p.json(b"next"))  # and something new is queued meanwhile
    p.json(b"stop", tts="stop")
    p.json(b"stale")  # named the session that ended: never sent
    loop.run_until(START + 1)
    assert sink.out == [("json", b"stop"), ("tts", "stop"), ("json", b"next")]


def test_an_item_that_raises_is_counted_and_the_next_ones_still_go() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    sink.boom = b"bad"
    p.json(b"bad")
    p.json(b"after")
    p.audio(b"x")
    loop.run_until(START + 1)
    assert sink.failures == 1
    assert sink.out == [("json", b"after"), ("audio", b"x")]


def test_nothing_runs_after_close() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    speech(p, 6)
    loop.run_ready()  # the control went, the audio waits for its lead
    before = list(sink.out)
    p.close()
    assert loop.live() == []  # the timer cancelled
    assert not p.json(b"late")
    p.audio(b"late")
    assert loop.live() == []
    loop.run_until(START + 1)
    assert sink.out == before
    assert p.idle


def test_close_cancels_a_scheduled_drain() -> None:
    sink = PlayerSink()
    p, loop = player(sink)
    p.json(b"a")
    p.close()
    assert loop.live() == []  # the drain itself is cancelled, not only the queue emptied
    loop.run_until(START + 1)
    assert sink.out == []


async def test_on_the_real_loop() -> None:
    sink = PlayerSink()
    loop = asyncio.get_running_loop()
    p = Player(
        out=sink,
        loop=loop,
        clock=loop.time,
        pacing=Pacing(frame_ms=5, prebuffer=2),
        lead_s=LEAD,
    )
    speech(p, 6)
    await sink.until(11)
    assert sink.kinds() == ["json", "tts", "json", *["audio"] * 6, "json", "tts"]
    assert not p.speaking
    assert p.idle
