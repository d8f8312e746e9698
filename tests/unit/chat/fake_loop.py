"""A loop clock the test moves (STYLE: time as an input for shell unit tests): ``call_soon`` and
``call_at`` handles run, in time order, only when the test advances the clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

SPIN_LIMIT = 10_000  # callbacks run by one run_until before it calls it a spin


@dataclass(order=True)
class FakeHandle:
    when: float
    seq: int
    callback: Callable[[], object] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.handles: list[FakeHandle] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def clock(self) -> float:  # the same clock as the shell's ``clock`` port
        return self.now

    def call_soon(self, callback: Callable[[], object]) -> FakeHandle:
        return self.call_at(self.now, callback)

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeHandle:
        handle = FakeHandle(when, next(self._seq), callback)
        self.handles.append(handle)
        return handle

    def live(self) -> list[FakeHandle]:
        """Handles scheduled and neither run nor cancelled."""
        return [h for h in self.handles if not h.cancelled]

    def run_until(self, t: float) -> None:
        """Run every handle due by ``t`` (including ones they schedule), the clock following.
        A callback that keeps re-arming itself without time moving fails the test at once."""
        for _ in range(SPIN_LIMIT):
            due = sorted(h for h in self.live() if h.when <= t)
            if not due:
                break
            handle = due[0]
            self.handles.remove(handle)
            self.now = max(self.now, handle.when)
            handle.callback()
        else:
            raise AssertionError(f"callbacks still due after {SPIN_LIMIT} runs: one spins")
        self.now = max(self.now, t)

    def run_ready(self) -> None:
        self.run_until(self.now)
