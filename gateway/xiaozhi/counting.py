"""Batched pipeline counters: per-frame counts as integer adds, metrics once per loop turn.

Every 60 ms frame of every listening session counts (frames decoded, concealed, ...); a
Prometheus counter's ``inc`` takes a lock each time. :class:`CounterBatch` hands the pipelines
:class:`~gateway.xiaozhi.pipeline.PipelineCounters` whose calls only add into plain integers
and passes the sums on once per event-loop iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import fields

from gateway.xiaozhi.pipeline import PipelineCounters


class _Sum:
    """One batched counter: calls add into ``n``; the first one since a flush reports due."""

    __slots__ = ("_batch", "_inc", "n")

    def __init__(self, batch: CounterBatch, inc: Callable[[int], None]) -> None:
        self.n = 0
        self._inc = inc
        self._batch = batch

    def __call__(self, n: int) -> None:
        pending = self.n
        self.n = pending + n
        if not pending:
            self._batch.due(self)

    def flush(self) -> None:
        n, self.n = self.n, 0
        if n:
            self._inc(n)


class CounterBatch:
    """:class:`PipelineCounters` whose calls are plain integer adds (every frame of every
    session counts): the sums reach the real counters (a metric lock each) once per
    event-loop iteration, in a callback scheduled by the first add of the iteration, so
    anything that runs after the work that counted (a scrape, a test reading metrics after
    an event) sees them. Without a running loop they go through at once."""

    def __init__(self, counters: PipelineCounters) -> None:
        self._due: list[_Sum] = []
        self._scheduled = False
        sums = {f.name: _Sum(self, getattr(counters, f.name)) for f in fields(PipelineCounters)}
        self.counters = PipelineCounters(**sums)

    def due(self, item: _Sum) -> None:
        self._due.append(item)
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        due, self._due = self._due, []
        for item in due:
            item.flush()
