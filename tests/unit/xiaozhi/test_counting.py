"""Batched counters: integer adds, passed on once per loop iteration (or at once, no loop)."""

from __future__ import annotations

import asyncio

from gateway.xiaozhi.counting import CounterBatch
from gateway.xiaozhi.voice_ports import PipelineCounters


class CountingSink:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def inc(self, n: int) -> None:
        self.calls.append(n)


def test_without_a_running_loop_counts_go_through_at_once() -> None:
    sink = CountingSink()
    count = CounterBatch().sum(sink.inc)
    count(2)
    count(3)
    assert sink.calls == [2, 3]


async def test_counts_of_one_iteration_reach_the_counter_once_in_the_next() -> None:
    batch = CounterBatch()
    a, b = CountingSink(), CountingSink()
    count_a, count_b = batch.sum(a.inc), batch.sum(b.inc)
    for _ in range(5):
        count_a(1)
    count_b(7)
    assert (a.calls, b.calls) == ([], [])
    await asyncio.sleep(0)  # the flush was scheduled before this task's wake-up
    assert (a.calls, b.calls) == ([5], [7])
    count_a(1)
    await asyncio.sleep(0)
    assert a.calls == [5, 1]
    await asyncio.sleep(0)
    assert (a.calls, b.calls) == ([5, 1], [7])  # nothing counted: nothing passed on


def test_pipeline_counters_are_batched_one_for_one() -> None:
    sinks = {name: CountingSink() for name in PipelineCounters.__dataclass_fields__}
    counters = CounterBatch().pipeline_counters(
        PipelineCounters(**{n: s.inc for n, s in sinks.items()})
    )
    counters.frames_decoded(4)
    counters.segments(1)
    assert sinks["frames_decoded"].calls == [4]
    assert sinks["segments"].calls == [1]
    assert sinks["frames_concealed"].calls == []


async def test_flush_passes_pending_sums_on_at_once() -> None:
    batch = CounterBatch()
    sink = CountingSink()
    count = batch.sum(sink.inc)
    count(3)
    batch.flush()  # the pump does this at the end of its turn
    assert sink.calls == [3]
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert sink.calls == [3]
