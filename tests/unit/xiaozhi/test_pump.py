"""The audio pump: every session's pipeline served in turn, a batch each, turns bounded."""

from __future__ import annotations

import asyncio

import pytest

from gateway.xiaozhi.pump import AudioPump
from tests.unit.xiaozhi.test_pipeline import pipeline


class StepClock:
    """Each reading is ``step`` seconds after the previous one."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_turn_gives_each_ready_pipeline_one_batch_round_robin() -> None:
    pump = AudioPump(batch=2)
    busy, busy_decoder, _, _ = pipeline(notify=pump.notify)
    quiet, quiet_decoder, _, _ = pipeline(notify=pump.notify)
    for seq in range(1, 6):
        busy.receive(b"x", seq, 0)
    quiet.receive(b"x", 1, 0)
    assert pump.pending == 2
    assert pump.turn() == 3  # 2 of the backlog, then the other session's 1
    assert (len(busy_decoder.calls), len(quiet_decoder.calls)) == (2, 1)
    assert pump.pending == 1  # only the backlog is still in line
    assert pump.turn() == 2
    assert pump.turn() == 1
    assert pump.pending == 0
    assert pump.turn() == 0


def test_a_turn_stops_when_its_time_is_used_and_the_rest_wait_their_turn() -> None:
    pump = AudioPump(batch=1, turn_s=0.010, clock=StepClock(0.004))
    pipes = [pipeline(notify=pump.notify)[0] for _ in range(5)]
    for p in pipes:
        p.receive(b"x", 1, 0)
    # Readings at 4, 8, 12, 16 ms: the deadline (4 + 10 ms) has passed after the third.
    assert pump.turn() == 3
    assert [p.queued for p in pipes] == [0, 0, 0, 1, 1]
    assert pump.turn() == 2
    assert pump.turn() == 0


def test_a_finished_session_is_forgotten() -> None:
    pump = AudioPump()
    p, decoder, _, _ = pipeline(notify=pump.notify)
    p.receive(b"x", 1, 0)
    p.finish()
    pump.forget(p)
    pump.forget(p)  # twice is harmless
    assert pump.turn() == 0
    assert len(decoder.calls) == 1


async def test_run_serves_offers_and_yields_between_turns() -> None:
    pump = AudioPump(batch=2)
    p, decoder, _, _ = pipeline(notify=pump.notify)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run(), name="test.pump")
        await asyncio.sleep(0)  # parked: nothing to do
        for seq in range(1, 6):
            p.receive(b"x", seq, 0)
        seen = []
        for _ in range(4):
            await asyncio.sleep(0)
            seen.append(len(decoder.calls))
        assert seen[-1] == 5
        assert seen == sorted(seen)
        assert seen[0] <= 2  # one batch per turn
        task.cancel()


def test_serve_does_nothing_until_run_starts() -> None:
    pump = AudioPump()
    p, decoder, _, _ = pipeline(notify=pump.notify)
    p.receive(b"x", 1, 0)
    pump.serve()
    assert decoder.calls == []
    assert pump.turn() == 1


async def test_serve_runs_a_turn_at_once_and_folds_the_scheduled_one() -> None:
    pump = AudioPump(batch=2)
    p, decoder, _, _ = pipeline(notify=pump.notify)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run(), name="test.pump")
        await asyncio.sleep(0)
        for seq in range(1, 4):
            p.receive(b"x", seq, 0)  # schedules a turn
        pump.serve()  # ... which runs now instead: one batch, in this callback
        assert len(decoder.calls) == 2
        await asyncio.sleep(0)  # the rest in the next turn, scheduled once
        assert len(decoder.calls) == 3
        await asyncio.sleep(0)
        assert len(decoder.calls) == 3
        task.cancel()


async def test_a_failing_turn_ends_run_with_its_error() -> None:
    pump = AudioPump()

    class BrokenOutbox:
        queued = 1

        def drain(self, limit: int | None = None) -> int:
            raise RuntimeError("bug")

    run = asyncio.create_task(pump.run(), name="test.pump")
    await asyncio.sleep(0)
    pump.notify(BrokenOutbox())
    with pytest.raises(RuntimeError, match="bug"):
        await run


def test_each_turn_ends_with_after_turn() -> None:
    ends: list[int] = []
    pump = AudioPump(after_turn=lambda: ends.append(1))
    p, _, _, _ = pipeline(notify=pump.notify)
    p.receive(b"x", 1, 0)
    assert pump.turn() == 1
    assert pump.turn() == 0
    assert ends == [1, 1]
