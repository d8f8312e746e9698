"""One audio task for every session's pipeline: round-robin, a batch each, bounded turns.

A task per session cost the loop a wake-up, a future and two extra turns for every 60 ms frame
(each datagram woke its own session's task). The pump instead keeps the pipelines that have
queued frames in arrival order; each turn gives every one of them up to ``batch`` frames
(decode + VAD) and puts it back at the end if frames remain, so a session with a backlog gets
no more than its turn, and it yields to the loop (timers, MQTT, the UDP socket) as soon as a
turn has used ``turn_s`` of wall time. Per-session bounds stay where they were: each pipeline's
queue is bounded with its own overflow policy (:mod:`pipeline`).
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
    ) -> None:
        self._batch = batch
        self._turn_s = turn_s
        self._clock = clock
        self._ready: dict[Drainable, None] = {}  # insertion order = round-robin order
        self._wake = asyncio.Event()

    def notify(self, pipeline: Drainable) -> None:
        """``pipeline`` has queued frames (called from its ``offer``; O(1))."""
        self._ready[pipeline] = None
        self._wake.set()

    def forget(self, pipeline: Drainable) -> None:
        """The session ended (its pipeline was finished)."""
        self._ready.pop(pipeline, None)

    @property
    def pending(self) -> int:
        return len(self._ready)

    def turn(self) -> int:
        """Serve the ready pipelines once each (until the turn's time is used); frames done."""
        done = 0
        deadline = self._clock() + self._turn_s
        for pipeline in list(self._ready):
            del self._ready[pipeline]
            done += pipeline.drain(self._batch)
            if pipeline.queued:
                self._ready[pipeline] = None  # back of the line
            if self._clock() >= deadline:
                break
        return done

    async def run(self) -> None:
        """The channel's audio task; runs until cancelled."""
        while True:
            if not self._ready:
                self._wake.clear()
                await self._wake.wait()
            self.turn()
            await asyncio.sleep(0)  # yield: the socket, timers and MQTT get their turn
