"""One audio task for every session's pipeline: round-robin, a batch each, bounded turns.

A task per session cost the loop a wake-up, a future and two extra turns for every 60 ms frame
(each datagram woke its own session's task). The pump instead keeps the pipelines that have
queued frames in arrival order; each turn gives every one of them up to ``batch`` frames
(decode + VAD) and puts it back at the end if frames remain, so a session with a backlog gets
no more than its turn, and it yields to the loop (timers, MQTT, the UDP socket) as soon as a
turn has used ``turn_s`` of wall time. Per-session bounds stay where they were: each pipeline's
queue is bounded with its own overflow policy (:mod:`pipeline`).

A turn is a plain loop callback, not a task step: while :meth:`AudioPump.run` runs, the first
``notify`` schedules one (``call_soon``), and a turn that leaves frames waiting schedules the
next, so the loop (the socket, timers, MQTT) runs between turns and an idle pump costs nothing;
no future, event or task wake-up per batch of datagrams. A turn that raises ends ``run`` with
that error, as a failing task would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Drainable(Protocol):
    def drain(self, limit: int | None = None) -> int: ...

    @property
    def queued(self) -> int: ...


class AudioPump:
    def __init__(
        self,
        *,
        batch: int = 4,
        turn_s: float = 0.005,
        clock: Callable[[], float] = time.perf_counter,
        after_turn: Callable[[], None] | None = None,
    ) -> None:
        self._batch = batch
        self._after_turn = after_turn  # e.g. the pipelines' CounterBatch.flush (counting.py)
        self._turn_s = turn_s
        self._clock = clock
        self._ready: dict[Drainable, None] = {}  # insertion order = round-robin order
        self._loop: asyncio.AbstractEventLoop | None = None  # set while run() runs
        self._handle: asyncio.Handle | None = None  # the scheduled turn
        self._parked: asyncio.Future[None] | None = None  # what run() waits on

    def notify(self, pipeline: Drainable) -> None:
        """``pipeline`` has queued frames (called from its ``receive``; O(1))."""
        self._ready[pipeline] = None
        if self._handle is None and self._loop is not None:
            self._handle = self._loop.call_soon(self._serve)

    def forget(self, pipeline: Drainable) -> None:
        """The session ended (its pipeline was finished)."""
        self._ready.pop(pipeline, None)

    @property
    def pending(self) -> int:
        return len(self._ready)

    def turn(self) -> int:
        """Serve the ready pipelines once each (until the turn's time is used); frames done."""
        done = 0
        ready, batch = self._ready, self._batch
        deadline = self._clock() + self._turn_s
        for pipeline in list(ready):
            del ready[pipeline]
            n = pipeline.drain(batch)
            done += n
            # Fewer than a batch taken: its queue is empty (no need to ask it).
            if n == batch and pipeline.queued:
                ready[pipeline] = None  # back of the line
            if self._clock() >= deadline:
                break
        if self._after_turn is not None:
            self._after_turn()
        return done

    def serve(self) -> None:
        """A turn now, if :meth:`run` runs (else nothing): the UDP endpoint calls this after
        each batch of reads, so frames are decoded in the callback that read them instead of
        one loop wake-up later. A turn already scheduled is folded into this one."""
        if self._loop is None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._serve()

    def _serve(self) -> None:
        self._handle = None
        try:
            self.turn()
        except Exception as exc:  # a bug: end run() with it, as a failing task would
            if self._parked is not None and not self._parked.done():
                self._parked.set_exception(exc)
            return
        if self._ready and self._loop is not None:
            self._handle = self._loop.call_soon(self._serve)  # after the loop turned once

    async def run(self) -> None:
        """The channel's audio task: turns run as loop callbacks while it runs (see above);
        runs until cancelled."""
        loop = asyncio.get_running_loop()
        self._loop, self._parked = loop, loop.create_future()
        try:
            if self._ready:
                self._handle = loop.call_soon(self._serve)
            await self._parked
        finally:
            if self._handle is not None:
                self._handle.cancel()
            self._loop = self._parked = self._handle = None
