"""Batched counters: per-frame counts as integer adds, metrics once per loop iteration.

Every 60 ms frame of every listening session counts (frames decoded, concealed, ...); a
Prometheus counter's ``inc`` takes a lock each time. :class:`CounterBatch` hands the pipelines
:class:`~gateway.xiaozhi.voice_ports.PipelineCounters` (and the UDP endpoint its traffic
counters) whose calls only add into plain integers, and passes the sums on once per
event-loop iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import fields

from gateway.xiaozhi.voice_ports import PipelineCounters


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
    """Counters whose calls are plain integer adds (every frame of every session counts). The
    sums reach the real counters (a metric lock each) when :meth:`flush` runs: the audio pump
    calls it at the end of every turn, so what a turn (or the batch of reads before it)
    counted is on the metrics when its callback returns. Counts made anywhere else go through
    a flush the first of them schedules for the next loop iteration; without a running loop,
    at once."""

    def __init__(self) -> None:
        self._due: list[_Sum] = []
        self._scheduled = False

    def sum(self, inc: Callable[[int], None]) -> Callable[[int], None]:
        """A batched stand-in for ``inc`` (e.g. a Prometheus counter's)."""
        return _Sum(self, inc)

    def pipeline_counters(self, counters: PipelineCounters) -> PipelineCounters:
        """Batched stand-ins for every callback of ``counters``."""
        sums = {f.name: self.sum(getattr(counters, f.name)) for f in fields(PipelineCounters)}
        return PipelineCounters(**sums)

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
        loop.call_soon(self._scheduled_flush)

    def flush(self) -> None:
        """Pass every pending sum on."""
        if self._due:
            due, self._due = self._due, []
            for item in due:
                item.flush()

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        self.flush()
