"""The coalescing write queue: one entry per row, merged by the upsert rules, bounded."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import InstanceRecord, InstanceState, StepRecord, StoredMetric
from gateway.store.pending import CoalescingQueue

M = (StoredMetric("text_similarity_v0", 0.5),)


def test_updates_of_one_row_coalesce_with_merge_rules() -> None:
    q = CoalescingQueue(limit=10)
    assert not q.put(StepRecord("i", 0, metrics=M)).coalesced
    assert q.put(StepRecord("i", 0, asr_text="x")).coalesced
    assert not q.put(StepRecord("i", 1)).coalesced
    assert not q.put(InstanceRecord("i", state=InstanceState.RUNNING)).coalesced
    assert len(q) == 3
    first, second, third = q.take(10)
    assert first.record == StepRecord("i", 0, metrics=M, asr_text="x")
    assert second.record == StepRecord("i", 1)
    assert third.record == InstanceRecord("i", state=InstanceState.RUNNING)
    assert len(q) == 0


def test_take_is_bounded_and_oldest_first() -> None:
    q = CoalescingQueue(limit=10)
    for n in range(5):
        q.put(StepRecord("i", n))
    assert [e.record.step_index for e in q.take(2)] == [0, 1]  # type: ignore[union-attr]
    assert len(q) == 3


async def test_overflow_drops_the_oldest_row_with_its_waiters() -> None:
    q = CoalescingQueue(limit=2)
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    q.put(InstanceRecord("a"), waiter)
    q.put(InstanceRecord("b"))
    assert q.put(InstanceRecord("b", mode="SHADOWING")).dropped is None  # coalesced, no growth
    result = q.put(InstanceRecord("c"))
    assert result.dropped is not None
    assert result.dropped.record == InstanceRecord("a")
    assert result.dropped.waiters == [waiter]
    waiter.cancel()
    assert [e.record.instance_id for e in q.take(5)] == ["b", "c"]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        CoalescingQueue(limit=0)
