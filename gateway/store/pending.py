"""The store's bounded write queue, coalescing by key (no I/O here).

One entry per row key: an instance, or an ``(instance, step_index)`` step. A submit for a key
already pending is merged into that entry with the same rules as the SQL upsert
(:func:`~gateway.store.records.merge_instance` / :func:`~gateway.store.records.merge_step`),
so the latest state of every row survives however many updates arrive while a write is slow.

Overflow policy: the bound is on distinct pending rows (``limit``). A submit for a new key when
the queue is full drops the OLDEST pending row (returned to the caller, which counts it and fails
its waiters). With coalescing this needs ``limit`` distinct rows updated while one write is
stuck; the store alarms when it happens.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from gateway.store.errors import StoreError
from gateway.store.records import InstanceRecord, Record, StepRecord, merge_instance, merge_step

Key = tuple[str, int]  # (instance_id, step_index); -1 is the instance row itself


def key_of(record: Record) -> Key:
    if isinstance(record, InstanceRecord):
        return (record.instance_id, -1)
    return (record.instance_id, record.step_index)


@dataclass
class Entry:
    record: Record
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    first_seq: int = 0  # the store's submit number of the first update merged here

    def settle(self, error: StoreError | None) -> None:
        """Resolve the waiters: written (``error`` is ``None``) or failed with ``error``."""
        for waiter in self.waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


@dataclass(frozen=True, slots=True)
class PutResult:
    coalesced: bool
    dropped: Entry | None


class CoalescingQueue:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._entries: OrderedDict[Key, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def oldest_seq(self) -> int | None:
        """``first_seq`` of the oldest pending entry (entries are kept in that order)."""
        for entry in self._entries.values():
            return entry.first_seq
        return None

    def put(
        self, record: Record, waiter: asyncio.Future[None] | None = None, *, seq: int = 0
    ) -> PutResult:
        key = key_of(record)
        entry = self._entries.get(key)
        if entry is not None:
            entry.record = _merge(entry.record, record)
            if waiter is not None:
                entry.waiters.append(waiter)
            return PutResult(coalesced=True, dropped=None)
        dropped = None
        if len(self._entries) >= self.limit:
            _, dropped = self._entries.popitem(last=False)
        self._entries[key] = Entry(record, [waiter] if waiter is not None else [], seq)
        return PutResult(coalesced=False, dropped=dropped)

    def take(self, max_items: int) -> list[Entry]:
        """Remove and return up to ``max_items`` entries, oldest first."""
        out: list[Entry] = []
        while self._entries and len(out) < max_items:
            out.append(self._entries.popitem(last=False)[1])
        return out


def _merge(old: Record, new: Record) -> Record:
    if isinstance(old, InstanceRecord) and isinstance(new, InstanceRecord):
        return merge_instance(old, new)
    if isinstance(old, StepRecord) and isinstance(new, StepRecord):
        return merge_step(old, new)
    raise TypeError("records of one key always have one type")  # pragma: no cover
